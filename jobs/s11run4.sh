#!/usr/bin/env bash
# Eleventh session, run 4: the job of jobs/s11run4.env, then compute-sanitizer on the L2
# instance's small tests.
source jobs/s11run4.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
    echo "=== $(date -Is) fp32wg bwd128 l2 $tool"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$san" --tool $tool --error-exitcode 1 \
        python3 -m pytest tests/test_fp32wg_bwd128.py -q -x -p no:cacheprovider \
        -k "l2 and (single_step or 1x1- or 33x33 or 127x257)" > "$O/fp32wgbwd128l2_$tool.txt" 2>&1
    echo "$tool rc=$?"; grep -v "Host Frame" "$O/fp32wgbwd128l2_$tool.txt" | tail -n 4
done
