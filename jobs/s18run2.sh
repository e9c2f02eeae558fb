#!/usr/bin/env bash
# Eighteenth session, run 2: the job of jobs/s18run2.env, then dec8's decode tests on its
# build (/tmp/base: the parent runs with 4 warps, its child with FLASHATTN2_DECODE_WARPS=8),
# then the order-effect diagnostic (bwd + fwd_bwd, full 8k / 16k, as the seventeenth
# session's sweep) while nvidia-smi still logs.
source jobs/s18run2.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
echo "=== $(date -Is) dec8 decode tests"
rm -rf /tmp/dec8tests && cp -r tests /tmp/dec8tests && cp .base/tests/test_decode_kernel.py /tmp/dec8tests/
(cd /tmp && env -u FLASHATTN2_DECODE_WARPS PYTHONPATH=/tmp/base timeout 300 python3 -m pytest \
    /tmp/dec8tests/test_decode_kernel.py -q -p no:cacheprovider 2>&1 | tail -n 8)
echo "=== $(date -Is) mix (order effect)"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 100 > "$O/smi_mix.csv" 2>&1 &
SMI2=$!
python3 benchmarks/bench.py --no-summary --modes bwd,fwd_bwd --headdims 64,128,256 --dtypes bf16 \
    --seqlens 8192,16384 --causal false --impls flashattn2,sdpa_flash,sdpa_cudnn \
    --out "$O/mix" 2> /dev/null | tail -n 14
kill $SMI2
echo "=== $(date -Is) done"
