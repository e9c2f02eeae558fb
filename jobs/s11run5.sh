#!/usr/bin/env bash
# Eleventh session, run 5: the job of jobs/s11run5.env, then compute-sanitizer on the float32
# wgmma backwards' small cases (d64 and d128; sanitize_subset has none of them).
source jobs/s11run5.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
    echo "=== $(date -Is) fp32wg backwards $tool"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$san" --tool $tool --error-exitcode 1 \
        python3 -m pytest tests/test_fp32wg_bwd.py tests/test_fp32wg_bwd128.py -q -x \
        -p no:cacheprovider -k "single_step or 1x1- or 33x33 or 127x257" > "$O/fp32wgbwd_$tool.txt" 2>&1
    echo "$tool rc=$?"; grep -v "Host Frame" "$O/fp32wgbwd_$tool.txt" | tail -n 4
done
