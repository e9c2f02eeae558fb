#!/usr/bin/env bash
# Tenth session, run 4: the submitted commit, default build (all head dims, 16 included): the
# full suite, FORCE_SM80 test_bwd, compute-sanitizer on sanitize_subset (gpu_job's check step),
# then compute-sanitizer on the fp32wg backward's small tests and a d256 one-split diagnostic.
export SKIP="base probe fwdab bwdab decab chains bwdprof bncu fncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envtest envsan envab"
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
    echo "=== $(date -Is) fp32wg bwd $tool"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 600 "$san" --tool $tool \
        --error-exitcode 1 python3 -m pytest tests/test_fp32wg_bwd.py -q -x -p no:cacheprovider \
        -k "single_step or 1x1- or 33x33 or 127x257" > "$O/fp32wgbwd_$tool.txt" 2>&1
    echo "$tool rc=$?"; tail -n 3 "$O/fp32wgbwd_$tool.txt"
    echo "=== $(date -Is) d256 one split $tool"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$san" --tool $tool --error-exitcode 1 \
        python3 jobs/diag_d256.py > "$O/diag_d256_$tool.txt" 2>&1
    echo "$tool rc=$?"; grep -v "Host Frame" "$O/diag_d256_$tool.txt" | head -n 12
done
