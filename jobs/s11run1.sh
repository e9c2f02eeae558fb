#!/usr/bin/env bash
# Eleventh session, run 1: the job of jobs/s11run1.env, then synccheck / racecheck on the d256
# one-split diagnostic (the staged-O barriers of both step orders).
source jobs/s11run1.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in synccheck racecheck; do
    for order in 1 0; do
        echo "=== $(date -Is) d256 one split $tool FA3 order $order"
        FLASHATTN2_SM90_FA3_ORDER=$order PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$san" \
            --tool $tool --error-exitcode 1 python3 jobs/diag_d256.py > "$O/diag_d256_${tool}_$order.txt" 2>&1
        echo "$tool rc=$?"; grep -v "Host Frame" "$O/diag_d256_${tool}_$order.txt" | head -n 8
    done
done
