#!/usr/bin/env bash
# Thirty-third session, run 3 (probe): the decode grid's order. HEAD's grid is (splits, groups,
# batch): the CTAs the scheduler starts together are one KV head's splits, far apart in the
# sequence, while a (b, s, h_k, d) cache interleaves the 8 KV heads' rows (d64: 128-byte rows at a
# 1 KiB stride). hm (-DFLASHATTN2_PROBE_DECODE_HEAD_MAJOR): (groups, splits, batch), so CTAs
# started together read the same rows' other heads. d64 reads 94 % of the floor at b8 128k
# (run 2; cuDNN ~100 %, on a (b, h, s, d) copy). Also: HEAD on a (b, h_k, s, d) cache (--bhsd),
# and d64 b16 with 2 splits (48 KiB in flight an SM unsplit). 2 rounds, d128 and d64.
#   bash jobs/s33run3.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r3
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
build() {  # build NAME FLAGS: a d64 / d128 90a wheel of this tree, unpacked into /tmp/NAME
    local name=$1 flags=$2
    ( python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$R/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build new "" & build hm "-DFLASHATTN2_PROBE_DECODE_HEAD_MAJOR" &
wait
PYTHONPATH=/tmp/hm timeout 200 python3 -m pytest -q -x tests/test_decode_kernel.py -p no:cacheprovider \
    > "$R/tests_hm.txt" 2>&1; tail -n 1 "$R/tests_hm.txt"
A="--no-summary --parts decode --sq 1 --page-sizes 256 --batches 1,4,16,64 --cache-lens 1k,8k,32k,128k"
for round in 1 2; do
    for name in new hm; do
        for g in 1 2; do
            d=$((g == 1 ? 128 : 64))
            impls=flashattn2; extra=""
            [ $name = new ] && impls=flashattn2,sdpa_cudnn,read_floor && extra="--bhsd"
            echo "=== $(date -Is) bench $name d$d round $round"
            PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --headdim $d $extra \
                --impls $impls --out "$R/envab${g}_${name}_$round" > "$R/dec${d}_${name}_$round.txt" 2>&1 \
                || echo "bench $name failed"
        done
    done
    PYTHONPATH=/tmp/new timeout 100 python3 benchmarks/bench_decode.py --no-summary --parts decode --sq 1 \
        --page-sizes "" --batches 16 --cache-lens 1k,8k,32k,128k --headdim 64 --splits 2 --impls flashattn2 \
        --out "$R/d64s2_$round" > "$R/d64s2_$round.txt" 2>&1
    grep -E "^flashattn2" "$R/d64s2_$round.txt"
done
for g in 1 2; do
    python3 scripts/ab_compare.py $R --group $g --specs new,hm > "$O/ab$g.txt" 2>&1
    sed -n '/^geomean/,$p' "$O/ab$g.txt"
done
tar czf "$O/r3.tar.gz" -C /tmp r3
echo "=== $(date -Is) done"
