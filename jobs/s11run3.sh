#!/usr/bin/env bash
# Eleventh session, run 3: the job of jobs/s11run3.env, then synccheck on sanitize_subset twice
# more (run 2's synccheck process aborted at exit after all its cases passed).
source jobs/s11run3.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for i in 1 2; do
    echo "=== $(date -Is) synccheck sanitize_subset again ($i)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 300 "$san" --tool synccheck --error-exitcode 1 \
        python3 scripts/sanitize_subset.py > "$O/synccheck_again_$i.txt" 2>&1
    echo "synccheck rc=$?"; tail -n 4 "$O/synccheck_again_$i.txt"
done
