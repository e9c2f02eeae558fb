#!/usr/bin/env bash
# Nineteenth session, run 1 (commit 2eb9b57+: flash_api.cpp split by concern). Diagnosis first,
# so that the first call's files bring it back while the suite runs:
#   default build (all head dims, 90a + 80) -> bench_power.py defaults (bwd, d64/128/256, full
#   8k, 10 s a run, 2 rounds, ours and cuDNN) -> TOTALS=1 ncu.sh (one whole backward: bytes,
#   shared wavefronts, instructions, tensor cycles per GFLOP; ours and cuDNN, d64 / d128, 8k;
#   the d128 forward too) -> the full suite + the FORCE_SM80 backward / kvcache files (the
#   moved host code: mha_bwd, the split heuristics) -> one d256 bwd / fwd_bwd sweep.
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"  # (not $OUT: the device call empties it between calls)
stamp() { echo "=== $(date -Is) $*"; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 200 > "$O/smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2> /dev/null' EXIT
stamp build
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 14
(cd /tmp && python3 -c "import flashattn2._C") || { stamp "no module: stop"; exit 1; }
stamp power
python3 benchmarks/bench_power.py --out "$O/power" 2> "$O/power_err.txt" | tail -n 20
for spec in bwd:ours:128 bwd:cudnn:128 bwd:ours:64 bwd:cudnn:64 fwd:ours:128 fwd:cudnn:128; do
    IFS=: read -r p i d <<< "$spec"
    stamp "totals $spec"
    TOTALS=1 PASS=$p IMPL=$i HEAD_DIM=$d SEQLEN=8192 timeout 240 bash scripts/ncu.sh \
        > "$O/totals_${p}_${i}_d$d.txt" 2>&1
    tail -n 12 "$O/totals_${p}_${i}_d$d.txt"
done
stamp tests
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 SKIP_SANITIZER=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_bwd.py tests/test_kvcache.py" bash scripts/gpu_check.sh | tail -n 12
stamp "d256 sweep"
python3 benchmarks/bench.py --no-summary --modes bwd,fwd_bwd --headdims 256 --dtypes bf16 \
    --impls flashattn2,sdpa_flash,sdpa_cudnn --out "$O/d256" 2> /dev/null | tail -n 26
stamp done
