#!/usr/bin/env bash
# Thirty-fifth session, run 3 (probe, ~170 s; .base = HEAD 0fc4b4d, the tree = HEAD + the early
# prologue with FLASHATTN2_DECODE_DOWN_PROBE): run 2 left split calls without the early
# prologue, yet b1 / b4 8k lost 7-12 % while 1k (one tile a warp) did not: the warps now walk
# their tiles upward. Here d128 builds base, new (upward everywhere) and down (split calls walk
# downward as before, unsplit early calls upward), b1 / 4 / 16 x 1k / 8k / 32k, 2 rounds.
#   bash jobs/s35run3.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r3
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
rm -rf /tmp/downsrc && mkdir -p /tmp/downsrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/downsrc
build base /tmp/basesrc & build new . & build down /tmp/downsrc -DFLASHATTN2_DECODE_DOWN_PROBE &
wait
PYTHONPATH=/tmp/down timeout 150 python3 -m pytest -q tests/test_decode_kernel.py -p no:cacheprovider \
    > "$R/tests_down.txt" 2>&1
grep -E "FAILED|passed|failed" "$R/tests_down.txt" | tail -n 12
A="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --batches 1,4,16 --cache-lens 1k,8k,32k"
for round in 1 2; do
    for name in base new down; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 150 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$R/envab1_${name}_$round" > "$R/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 scripts/ab_compare.py $R --group 1 --specs base,new,down > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
tar czf "$O/r3.tar.gz" -C /tmp r3
echo "=== $(date -Is) done"
