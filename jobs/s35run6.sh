#!/usr/bin/env bash
# Thirty-fifth session, run 6 (~150 s; .base = 0fc4b4d, the tree = 129226e): the query-rows
# epilogue at d64 (run 5 measured d128): d64 builds base and new, b1 / 4 / 16 / 64 x 1k / 8k,
# sq 1 / 4, contiguous and paged 256, 2 rounds.
#   bash jobs/s35run6.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r6
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC [CUDA flags]: a d64 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=${3:-}
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build base /tmp/basesrc & build new . &
wait
A="--no-summary --parts decode --headdim 64 --sq 1,4 --page-sizes 256 --batches 1,4,16,64 --cache-lens 1k,8k"
for round in 1 2; do
    for name in base new; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 150 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$R/envab1_${name}_$round" > "$R/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 scripts/ab_compare.py $R --group 1 --specs base,new > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
tar czf "$O/r6.tar.gz" -C /tmp r6
echo "=== $(date -Is) done"
