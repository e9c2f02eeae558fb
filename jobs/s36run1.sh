#!/usr/bin/env bash
# Prepared in the thirty-fifth session for the next one (~150 s; no carry): the thirty-fifth
# session's run 4 found that the early prologue's code (jobs/s35_decode_early.patch), present
# but never run by split calls, cost them 2-3 us (b1 8k 20.7 vs 18.2 us). Is it instruction
# fetch at CTA start? Three d128 builds: head (this tree), early (+ the patch), noearly (+ the
# patch with its branch compiled out); ncu of our decode call at b1 8k, b4 8k and b16 1k: the
# per-warp stall cycles (no_instruction and branch_resolving among them), instructions,
# active cycles; and the names of ncu's instruction-cache metrics on this GPU, for a next probe.
#   bash jobs/s36run1.sh
set -u
O=${OUT:-gpu_logs}
R=/tmp/s36r1
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
build() {  # build NAME SRC [CUDA flags]: a d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=${3:-}
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
rm -rf /tmp/earlysrc && mkdir -p /tmp/earlysrc && tar --exclude=./.git -cf - . | tar -x -C /tmp/earlysrc \
    && (cd /tmp/earlysrc && git apply jobs/s35_decode_early.patch 2>/dev/null || patch -p1 -s < jobs/s35_decode_early.patch)
build head . & build early /tmp/earlysrc & build noearly /tmp/earlysrc -DFLASHATTN2_DECODE_NO_EARLY_PROBE &
wait
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
"$NCU" --query-metrics 2>/dev/null | grep -i -E "icc|icache|inst_cache|l0i|l1i|imc|instruction_fetch" \
    > "$O/ncu_icache_metric_names.txt"
m=gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum,sm__ctas_launched.max
# (the thirty-fourth session's run 3 used these stall names; the others go in a second pass, so
# that a name this ncu lacks cannot lose the first)
for st in long_scoreboard barrier short_scoreboard lg_throttle wait mio_throttle no_instruction; do
    m=$m,smsp__average_warp_latency_issue_stalled_$st
done
m2=gpu__time_duration.sum
for st in branch_resolving math_pipe_throttle dispatch_stall misc imc_miss sleeping selected not_selected; do
    m2=$m2,smsp__average_warp_latency_issue_stalled_$st
done
for cfg in "1 8192" "4 8192" "16 1024" "1 8192 extra"; do
    metrics=$m
    [ "${cfg#* * }" = extra ] && metrics=$m2 && cfg=${cfg% extra} && tag=_extra || tag=
    for name in head early noearly; do
        f="$O/ncu_${name}_${cfg// /_}$tag"
        PYTHONPATH=/tmp/$name timeout 120 "$NCU" --profile-from-start off --clock-control none \
            --metrics "$metrics" --csv --page raw --print-units base python3 jobs/s34_ncu_decode.py ours $cfg \
            > "$f.csv" 2> "$f.err"
        echo "=== $name b/cache $cfg$tag"
        python3 - "$f.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("ID", "").isdigit()]
for r in rows:
    print(r["Kernel Name"][:70])
    print("   " + "  ".join(f"{k.replace('smsp__average_warp_latency_issue_stalled_', 'stall_')}={v}"
                          for k, v in r.items() if "__" in k and v not in ("", "n/a")))
PY
    done
done
echo "=== $(date -Is) done"
