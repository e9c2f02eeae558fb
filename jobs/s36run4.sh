#!/usr/bin/env bash
# Thirty-sixth session, run 4 (probe, ~400 s; .base = decode as of c8fa667, the tree = the decode
# copy addressing + the lazy row max): run 1's ncu had b1 8k per warp at 5.6k instructions for
# 8 tiles, issue + fixed-latency waits 2/3 of its cycles, long-scoreboard 15 %; SASS: a tile's
# copy was 321 of ~570 instructions (64-bit address math per row slot), the rescale 64 FMUL.
# Builds (d64 + d128): base, new, eager (new with FLASHATTN2_DECODE_EAGER_PROBE: every tile
# rescales, to split the two effects). The decode + kvcache tests on new; ncu instruction counts
# at b1 8k; bench_decode A/B 2 rounds: group 1 d128, group 2 d64, sq 1 / 4, contiguous and
# paged 256, b1 / 4 / 16 / 64 x 1k / 8k / 32k, cuDNN and the floor with new.
#   bash jobs/s36run4.sh   (carry .base, .xdist)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r4
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps .xdist/*.whl > /dev/null 2>&1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC [CUDA flags]: a d64 + d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=${3:-}
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
rm -rf /tmp/eagersrc && mkdir -p /tmp/eagersrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/eagersrc
build base /tmp/basesrc & build new . & build eager /tmp/eagersrc -DFLASHATTN2_DECODE_EAGER_PROBE &
wait
PYTHONPATH=/tmp/new timeout 240 python3 -m pytest -q -n 4 tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider > "$R/tests_new.txt" 2>&1
grep -E "FAILED|passed|failed|Error" "$R/tests_new.txt" | tail -n 15
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
m=gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum
for st in long_scoreboard short_scoreboard wait no_instruction selected; do
    m=$m,smsp__average_warp_latency_issue_stalled_$st
done
for name in base new eager; do
    for cfg in "1 8192" "16 1024"; do
        PYTHONPATH=/tmp/$name timeout 60 "$NCU" --profile-from-start off --clock-control none --metrics "$m" \
            --csv --page raw --print-units base python3 jobs/s34_ncu_decode.py ours $cfg > "$R/ncu_${name}_${cfg// /_}.csv" 2>&1
        echo "=== ncu $name $cfg"
        python3 - "$R/ncu_${name}_${cfg// /_}.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')) if r.get("ID", "").isdigit()]
for r in rows:
    if "decode" in r["Kernel Name"]:
        print("  " + "  ".join(f"{k.replace('smsp__average_warp_latency_issue_stalled_', '')}={v}"
                               for k, v in r.items() if "__" in k and not k.endswith(("pct", "max_rate"))))
PY
    done
done
for round in 1 2; do
    for g in 1 2; do
        hd=$([ $g = 1 ] && echo 128 || echo 64)
        A="--no-summary --parts decode --headdim $hd --sq 1,4 --page-sizes 256 --batches 1,4,16,64 --cache-lens 1k,8k,32k --warmup 5 --rep 30"
        for name in base new eager; do
            impls=flashattn2
            [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
            echo "=== $(date -Is) bench d$hd $name round $round"
            PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --impls $impls \
                --out "$R/envab${g}_${name}_$round" > "$R/dec${g}_${name}_$round.txt" 2>&1 || echo "bench $name failed"
        done
    done
done
for g in 1 2; do
    python3 scripts/ab_compare.py $R --group $g --specs base,new,eager > "$O/ab$g.txt" 2>&1
    echo "=== group $g"; sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
tar czf "$O/r4.tar.gz" -C /tmp r4
echo "=== $(date -Is) done"
