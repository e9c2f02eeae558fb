#!/usr/bin/env bash
# Thirty-fourth session, run 5 (probe, ~200 s): run 4's 8-warp CTAs lost 3-5 % (b16 and the
# split calls alike), so the other way: 2-warp CTAs (the instance the b48 / b64 grids run),
# one an SM, for grids of at most one CTA an SM (jobs/s34_decode_probe_warps.patch:
# -DFLASHATTN2_DECODE_PROBE_WARPS=2, _SPLITS=N: calls with at most N splits). Half the streams
# an SM and 32 KiB in flight: d64 b64 at 2 CTAs an SM read better than at 3 (thirty-third
# session), 8 warps worse than 4 (run 4). p1: unsplit calls (b16); p2: split calls too.
#   bash jobs/s34run5.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r5
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
for n in p1 p2; do
    rm -rf /tmp/src_$n && mkdir -p /tmp/src_$n && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/src_$n
    (cd /tmp/src_$n && patch -p1 -s < jobs/s34_decode_probe_warps.patch) || { echo "patch failed"; exit 1; }
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
build base . "" & build p1 /tmp/src_p1 "-DFLASHATTN2_DECODE_PROBE_WARPS=2 -DFLASHATTN2_DECODE_PROBE_SPLITS=1" &
build p2 /tmp/src_p2 "-DFLASHATTN2_DECODE_PROBE_WARPS=2 -DFLASHATTN2_DECODE_PROBE_SPLITS=64" &
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
tar czf "$O/r5.tar.gz" -C /tmp r5
echo "=== $(date -Is) done"
