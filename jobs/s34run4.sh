#!/usr/bin/env bash
# Thirty-fourth session, run 4 (probe, ~250 s): 8-warp decode CTAs, one an SM, for grids of at
# most one CTA an SM (jobs/s34_decode_warps8_probe.patch, -DFLASHATTN2_DECODE_WARPS8=N: calls
# with at most N splits). Run 3's ncu: at b16 1k (128 CTAs, one 4-warp CTA an SM, 16 tiles a
# warp) ours is 22.4 us against cuDNN's 21.3, with twice its instructions and its warps
# stalled mostly on short-scoreboard / wait (their own tile's math), not on memory: each warp
# must finish a tile every ~1800 cycles to keep its SM at its share of HBM. 8 warps halve each
# warp's chain and double the bytes in flight (196 KiB of rings at d128; 187 / 222 registers,
# no spills). p1: unsplit calls only (b16); p2: split calls too (b1-8). base = HEAD.
# Builds d128 90a of all three; the decode tests on p2; A/B b1 / 4 / 8 / 16, 1k-32k, sq 1 / 4,
# contiguous and paged 256, 2 rounds.
#   bash jobs/s34run4.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r4
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
for n in p1 p2; do
    rm -rf /tmp/src_$n && mkdir -p /tmp/src_$n && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/src_$n
    (cd /tmp/src_$n && patch -p1 -s < jobs/s34_decode_warps8_probe.patch) || { echo "patch failed"; exit 1; }
done
build() {  # build NAME SRC FLAGS: a d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=$3
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags" -C "cmake.define.CMAKE_CXX_FLAGS=$flags"} \
        -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build base . "" & build p1 /tmp/src_p1 "-DFLASHATTN2_DECODE_WARPS8=1" &
build p2 /tmp/src_p2 "-DFLASHATTN2_DECODE_WARPS8=64" &
wait
PYTHONPATH=/tmp/p2 timeout 150 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
    -p no:cacheprovider -x > "$R/tests_p2.txt" 2>&1
grep -E "FAILED|passed|failed|rror" "$R/tests_p2.txt" | tail -n 8
A="--no-summary --parts decode --headdim 128 --sq 1,4 --page-sizes 256 --batches 1,4,8,16 --cache-lens 1k,8k,32k"
for round in 1 2; do
    for name in base p1 p2; do
        impls=flashattn2
        [ $name = p2 ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 150 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$R/envab1_${name}_$round" > "$R/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 scripts/ab_compare.py $R --group 1 --specs base,p1,p2 > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
tar czf "$O/r4.tar.gz" -C /tmp r4
echo "=== $(date -Is) done"
