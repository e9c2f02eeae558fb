#!/usr/bin/env bash
# Twenty-seventh session, run 1 (prepared in the twenty-sixth, no device time left): why the d64
# single-TF32 forward moved +-10 % with prologue-only changes. The patch
# jobs/s27_fp32_tf32_fwd64_q_unroll4.patch reproduces run 3's build of the twenty-sixth session
# (cp.async Q prologue in both single instances, its split loop unrolled by 4; SASS of the d64
# unit byte-identical to run 3's; ptxas spills 8 bytes in its producer), which gained 1-7 % at
# d64 where run 4's rolled build lost 5-12 %. First:
#   rm -rf .base && mkdir .base && git archive HEAD cpp python | tar -x -C .base
#   git apply jobs/s27_fp32_tf32_fwd64_q_unroll4.patch
#   WAIT=<below budget_left_s> OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s27run1.sh
# A/B against HEAD (tf32 fwd d64 / d128, full and causal, 1k-8k, 2 rounds), then ncu of the d64
# single forward (full 4k, b16) on both builds: sections and source counters.
set -u
O=${JOB_OUT:-gpu_logs}
export SKIP="suite fwdab bwdab decab chains bwdprof fncu bncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest probe ptests power"
export SMOKE_TESTS="tests/test_fp32_tf32.py" SMOKE_STOP=1 SMOKE_TIMEOUT=300
export BASE_HEAD_DIMS="64;128"
export ENVAB_GROUPS="2"
export ENVAB_2="base=PYTHONPATH:/tmp/base new="
export ENVAB_2_ARGS="--no-summary --seqlens 1024,2048,4096,8192 --dtypes fp32 --modes fwd --impls flashattn2,sdpa_efficient,sdpa_math --headdims 64,128 --fp32-precision tf32"
export XNCU="fwd:ours:64:4096:0:16:fp32:tf32" XNCU_SOURCE=1
bash scripts/gpu_job.sh || exit 1
echo "=== $(date -Is) ncu of the base build"
export DTYPE=fp32 FP32_PRECISION=tf32
PYTHONPATH=/tmp/base PASS=fwd IMPL=ours HEAD_DIM=64 SEQLEN=4096 CAUSAL=0 BATCH=16 timeout 300 \
    bash scripts/ncu.sh > "$O/xncu_base_fwd64_tf32.txt" 2>&1
grep -E "Duration|Issue Slots Busy|stalled|pipe_tensor" "$O/xncu_base_fwd64_tf32.txt" | head -n 30
PYTHONPATH=/tmp/base SOURCE="$O/xsrc_base_fwd64_tf32.csv" PASS=fwd IMPL=ours HEAD_DIM=64 \
    SEQLEN=4096 CAUSAL=0 BATCH=16 timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
python3 scripts/sass_stalls.py "$O/xsrc_base_fwd64_tf32.csv" 2>&1 | head -n 30
echo "=== $(date -Is) done"
