#!/usr/bin/env bash
# Thirty-third session, run 5 (probe, jobs/s33_decode_small_ctas.patch applied to the tree): a
# grid the SMs hold only in more than one wave of 4-warp CTAs but in one wave of 2-warp CTAs
# (twice as many an SM, the same bytes in flight) runs those (decode_launch). Aims at b64 1k
# d128 (0.93x cuDNN: 512 CTAs at 2 an SM ramp up twice; kernel 67.9 us vs cuDNN 64.2) and d64
# b64 (padded to 2 an SM by 4c3f275, 1.94 waves). base = .base (HEAD f125adf).
# Builds d64 / d128 90a of both; the decode tests on the new one; A/B b32 / b48 / b64 (b32 and
# d64 b48 do not change), 1k-32k, sq 1 / 4, contiguous and paged 256, 2 rounds.
#   bash jobs/s33run5.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r5
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC: a d64 / d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
        -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build base /tmp/basesrc & build new . &
wait
PYTHONPATH=/tmp/new timeout 200 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider > "$R/tests_new.txt" 2>&1
grep -E "FAILED|passed|failed" "$R/tests_new.txt" | tail -n 12
A="--no-summary --parts decode --sq 1,4 --page-sizes 256 --batches 32,48,64 --cache-lens 1k,8k,32k"
for round in 1 2; do
    for name in base new; do
        impls=flashattn2
        [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor
        for g in 1 2; do
            d=$((g == 1 ? 128 : 64))
            echo "=== $(date -Is) bench $name d$d round $round"
            PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --headdim $d \
                --impls $impls --out "$R/envab${g}_${name}_$round" > "$R/dec${d}_${name}_$round.txt" 2>&1 \
                || echo "bench $name failed"
        done
    done
done
for g in 1 2; do
    python3 scripts/ab_compare.py $R --group $g --specs base,new > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
tar czf "$O/r5.tar.gz" -C /tmp r5
echo "=== $(date -Is) done"
