#!/usr/bin/env bash
# Twenty-first session, run 2. Tree: the rotated walk (a18109f) + d128's double-buffered dQ
# staging (kDqWarp instances); `.base` = the rotated walk alone (`git archive a18109f cpp
# python`, carry [".base"]).
#   - the default build (all head dims) with the base build (d128) at once;
#   - the full suite, FORCE_SM80 test_kvcache / test_bwd, compute-sanitizer;
#   - bwdab: base vs this tree, d128 bwd and fwd_bwd, interleaved twice, SDPA-cuDNN in each;
#   - the forward d128 full 1k-16k, ours and SDPA-cuDNN, under both timers of bench.py
#     (do_bench: the L2 flushed before each call; events: back-to-back, no flush), twice,
#     with nvidia-smi's clocks / power every 20 ms (smi_fwd.csv): NOTES list item 3.
#   WAIT=585 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s21run2.sh   (then `wait`)
set -u
export SKIP="fwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu bncu mem host grid cp envsan envtest ptests envab power probe smoke"
export BASE_HEAD_DIMS="128" BWDAB_DIMS=128
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
echo "=== $(date -Is) forward d128 under both timers, nvidia-smi every 20 ms"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 20 > "$O/smi_fwd.csv" 2>&1 &
SMI=$!
for run in events do_bench events2 do_bench2; do
    python3 benchmarks/bench.py --modes fwd --headdims 128 --dtypes bf16 --causal false \
        --seqlens 1024,2048,4096,8192,16384 --impls flashattn2,sdpa_cudnn --timer "${run%2}" \
        --no-summary --out "$O/ftimer_$run" 2> /dev/null | tail -n 6
done
kill $SMI
echo "=== $(date -Is) done"
