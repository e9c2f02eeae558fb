#!/usr/bin/env bash
# Thirty-fifth session, run 2 (probe, ~150 s; .base = HEAD 0fc4b4d, the tree = HEAD +
# jobs/s35_decode_early.patch, second version): run 1's early prologue lost b1 / b4 8k 8-13 %
# (splits dealt tiles round-robin over all splits' warps) and b16 / b64 1-3 % (the
# cache_seqlens load issued after the prologue's copies, so behind them). Now: splits keep
# their contiguous shares (early prologue only for unsplit calls), warps walk their tiles
# upward, and cache_seqlens is requested first, used after the prologue. Same builds, tests
# and bench as run 1.
#   bash jobs/s35run2.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r2
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC: a d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
        -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
rm -rf /tmp/rowssrc && cp -r /tmp/basesrc /tmp/rowssrc && patch -d /tmp/rowssrc -p1 -s < jobs/s34_decode_epilogue_rows.patch
build base /tmp/basesrc & build rows /tmp/rowssrc & build new . &
wait
PYTHONPATH=/tmp/new timeout 150 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider > "$R/tests_new.txt" 2>&1
grep -E "FAILED|passed|failed" "$R/tests_new.txt" | tail -n 12
A="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --batches 1,4,16,64 --cache-lens 1k,8k"
for round in 1 2; do
    for name in base rows new; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 150 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$R/envab1_${name}_$round" > "$R/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 scripts/ab_compare.py $R --group 1 --specs base,rows,new > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
tar czf "$O/r2.tar.gz" -C /tmp r2
echo "=== $(date -Is) done"
