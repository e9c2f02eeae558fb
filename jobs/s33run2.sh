#!/usr/bin/env bash
# Thirty-third session, run 2: the decode split heuristic by bytes in flight (one wave, d128 one
# CTA an SM, d64 two) against HEAD's (base = .base = 204c096: the SMs' resident slots filled,
# d128 two CTAs an SM). Run 1's probe: b1 32k 16 splits 40.5 us against auto's 32 at 42.5, b4
# 32k 4 against 8 127.1 / 130.0 (cuDNN 40.2 / 126.1). Batches 1-8 (b16+ never split), d128
# and d64, contiguous and paged 256, sq 1 / 4, 2 rounds; the decode tests on the new build.
#   bash jobs/s33run2.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC: a d64 / d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
        -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$O/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build base /tmp/basesrc & build new . &
wait
PYTHONPATH=/tmp/new timeout 200 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider > "$O/tests_new.txt" 2>&1
grep -E "FAILED|passed|failed" "$O/tests_new.txt" | tail -n 12
A="--no-summary --parts decode --sq 1,4 --page-sizes 256 --batches 1,2,4,8 --cache-lens 1k,8k,32k,128k"
for round in 1 2; do
    for name in base new; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        for g in 1 2; do
            d=$((g == 1 ? 128 : 64))
            echo "=== $(date -Is) bench $name d$d round $round"
            PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --headdim $d \
                --impls $impls --out "$O/envab${g}_${name}_$round" > "$O/dec${d}_${name}_$round.txt" 2>&1 \
                || echo "bench $name failed"
        done
    done
done
for g in 1 2; do
    python3 scripts/ab_compare.py "$O" --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
echo "=== $(date -Is) done"
