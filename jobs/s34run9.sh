#!/usr/bin/env bash
# Thirty-fourth session, run 9 (probe, ~150 s; jobs/s34_decode_epilogue_rows.patch applied to
# the tree, .base = HEAD): run 8's one-barrier epilogue gave sq1 b1 / b4 +1.7 % but sq4 -1 %
# (each O-pass thread then weighs 4 warps per pass, 16 rows at sq4). Here the old two-barrier
# epilogue, with only the query rows (rows_q of 16: 4 at GQA 4 sq1) scaled into sO.
#   bash jobs/s34run9.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r9
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
build base /tmp/basesrc & build new . &
wait
PYTHONPATH=/tmp/new timeout 150 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider > "$R/tests_new.txt" 2>&1
grep -E "FAILED|passed|failed" "$R/tests_new.txt" | tail -n 12
A="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --batches 1,4,16,64 --cache-lens 1k,8k"
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
tar czf "$O/r9.tar.gz" -C /tmp r9
echo "=== $(date -Is) done"
