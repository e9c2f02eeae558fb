#!/usr/bin/env bash
# Thirty-fourth session, run 6 (probe, ~200 s): bytes in flight at d128. Runs 4 / 5: one CTA an
# SM of 8 warps (128 KiB in flight) -3 to -5 %, of 2 warps (32 KiB) -37 % against 4 warps
# (64 KiB). Here 4 warps with deeper rings (jobs/s34_decode_stages_probe.patch,
# -DFLASHATTN2_DECODE_STAGES_D128=N): p1 4 stages (96 KiB, 135 KiB of smem: one CTA an SM),
# p2 5 stages (128 KiB, 168 KiB). The split rule and residencies follow from decode_stages.
#   bash jobs/s34run6.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
R=/tmp/r6
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
for n in p1 p2; do
    rm -rf /tmp/src_$n && mkdir -p /tmp/src_$n && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/src_$n
    (cd /tmp/src_$n && patch -p1 -s < jobs/s34_decode_stages_probe.patch) || { echo "patch failed"; exit 1; }
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
build base . "" & build p1 /tmp/src_p1 "-DFLASHATTN2_DECODE_STAGES_D128=4" &
build p2 /tmp/src_p2 "-DFLASHATTN2_DECODE_STAGES_D128=5" &
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
tar czf "$O/r6.tar.gz" -C /tmp r6
echo "=== $(date -Is) done"
