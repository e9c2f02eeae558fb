#!/usr/bin/env bash
# Nineteenth session, run 2 (run 1 wrote into $OUT, which the next device call emptied: its
# suite log, the power JSON and half the totals were lost; the job's files go to $JOB_OUT now).
#   default build -> bench_power.py (bwd d64/128/256 and fwd d128, full 8k, 10 s, 2 rounds)
#   -> TOTALS=1 ncu.sh (the raw page's device__* columns no longer break the sum)
#   -> ncu source counters: the d128 backward (bncu) and one decode call, b16 1k, ours and
#   cuDNN's sections -> the full suite + FORCE_SM80 test_bwd / test_kvcache.
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
stamp() { echo "=== $(date -Is) $*"; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 200 > "$O/smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2> /dev/null' EXIT
stamp build
OUT=$O/build SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh | tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { stamp "no module: stop"; exit 1; }
stamp power
python3 benchmarks/bench_power.py --out "$O/power" 2> "$O/power_err.txt" | tail -n 14
python3 benchmarks/bench_power.py --modes fwd --headdims 128 --out "$O/power_fwd" \
    2>> "$O/power_err.txt" | tail -n 5
for spec in bwd:ours:128 bwd:cudnn:128 bwd:ours:64 bwd:cudnn:64 bwd:ours:256 bwd:cudnn:256 \
            fwd:ours:128 fwd:cudnn:128; do
    IFS=: read -r p i d <<< "$spec"
    stamp "totals $spec"
    TOTALS=1 PASS=$p IMPL=$i HEAD_DIM=$d SEQLEN=8192 timeout 240 bash scripts/ncu.sh \
        > "$O/totals_${p}_${i}_d$d.txt" 2>&1
    tail -n 9 "$O/totals_${p}_${i}_d$d.txt"
done
stamp "ncu bwd d128 8k (sections, source)"
PASS=bwd HEAD_DIM=128 SEQLEN=8192 timeout 300 bash scripts/ncu.sh > "$O/ncu_bwd_d128.txt" 2>&1
grep -E "Duration|Issue Slots Busy|stalled|pipe_tensor" "$O/ncu_bwd_d128.txt" | head -n 16
SOURCE="$O/src_bwd_d128.csv" PASS=bwd HEAD_DIM=128 SEQLEN=8192 timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
python3 scripts/sass_stalls.py "$O/src_bwd_d128.csv" 2>&1 | head -n 30
for i in ours cudnn; do
    stamp "ncu decode b16 1k $i"
    PASS=decode IMPL=$i HEAD_DIM=128 SEQLEN=1024 BATCH=16 timeout 300 bash scripts/ncu.sh \
        > "$O/ncu_dec_$i.txt" 2>&1
    grep -E "Duration|Grid Size|Block Size|Registers Per|Achieved Occ|DRAM Throughput|stalled" \
        "$O/ncu_dec_$i.txt" | head -n 24
done
SOURCE="$O/src_dec_ours.csv" PASS=decode HEAD_DIM=128 SEQLEN=1024 BATCH=16 timeout 300 \
    bash scripts/ncu.sh > /dev/null 2>&1
stamp tests
OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 SKIP_SANITIZER=1 TEST_TIMEOUT=900 \
    PYTEST_ARGS=--ignore=tests/test_distributed.py TESTS=tests \
    SM80_TESTS="tests/test_bwd.py tests/test_kvcache.py" bash scripts/gpu_check.sh | tail -n 12
stamp done
