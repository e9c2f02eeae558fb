#!/usr/bin/env bash
# Thirty-fifth session, run 4 (probe, ~150 s; .base = HEAD 0fc4b4d + the rows epilogue patch,
# the tree = that + the early prologue, upward walk): run 3 showed split calls (no early
# prologue) losing 2-3 us at 8k / 32k whichever way the warps walk. Builds rows (.base), new,
# noearly (new with FLASHATTN2_DECODE_NO_EARLY_PROBE: the early branch compiled out), b1 / 4 x
# 1k / 8k / 32k, sq 1, 2 rounds: does the early prologue's code cost the split calls?
#   bash jobs/s35run4.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r4
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC [CUDA flags]: a d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=${3:-}
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
rm -rf /tmp/nesrc && mkdir -p /tmp/nesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/nesrc
build rows /tmp/basesrc & build new . & build noearly /tmp/nesrc -DFLASHATTN2_DECODE_NO_EARLY_PROBE &
wait
A="--no-summary --parts decode --headdim 128 --sq 1 --page-sizes 256 --batches 1,4 --cache-lens 1k,8k,32k"
for round in 1 2; do
    for name in rows new noearly; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 150 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$R/envab1_${name}_$round" > "$R/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 scripts/ab_compare.py $R --group 1 --specs rows,new,noearly > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
tar czf "$O/r4.tar.gz" -C /tmp r4
echo "=== $(date -Is) done"
