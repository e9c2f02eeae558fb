#!/usr/bin/env bash
# Tenth session, run 3: the job of jobs/run3.env, then compute-sanitizer on the fp32wg backward's
# small cases (scripts/sanitize_subset.py has none of them).
source jobs/run3.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
    echo "=== $(date -Is) fp32wg bwd $tool"
    FLASHATTN2_FP32WG_BWD=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 600 "$san" --tool $tool \
        --error-exitcode 1 python3 -m pytest tests/test_fp32wg_bwd.py -q -x -p no:cacheprovider \
        -k "single_step or 1x1- or 33x33 or 127x257" > "$O/fp32wgbwd_$tool.txt" 2>&1
    echo "$tool rc=$?"; tail -n 3 "$O/fp32wgbwd_$tool.txt"
done
