#!/usr/bin/env bash
# Thirty-second session, run 2. Run 1 landed the compile-time copy switches (6534eaa); paged 16
# at b16 still runs +11 % over contiguous (8k, 32k) where paged 256 is within 1.5-2.7 %. The
# decode kernel reads one block-table entry per row slot of a tile (8 a lane with whole rows),
# a step before the tile's copies. Probe (this tree, sm80/decode_kernel.cuh): a 16-key tile
# lies on at most 2 pages (page_size >= 16), so each lane reads the entries of the tile's first
# and last rows (2 loads, not 8) and picks per slot; `a1` reads them one step ahead (as now),
# `a2` two steps (-DFLASHATTN2_PROBE_DECODE_PAGES_AHEAD=2: the loop unrolled by 2, 230 / 238
# registers, no spills). base = .base (HEAD). Also base with --page-order sequential, to split
# the pages' placement from their handling on this GPU (the H100: placement ~2 %).
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s32run2.sh   (carry .base)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
rm -rf /tmp/basesrc && mkdir -p /tmp/basesrc && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/basesrc \
    && rm -rf /tmp/basesrc/cpp /tmp/basesrc/python && cp -r .base/cpp .base/python /tmp/basesrc/
build() {  # build NAME SRC CUDA_FLAGS: a d128 90a wheel, unpacked into /tmp/NAME
    local name=$1 src=$2 flags=$3
    ( cd "$src" && python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$O/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"
build base /tmp/basesrc "" & build a1 . "" & build a2 . "-DFLASHATTN2_PROBE_DECODE_PAGES_AHEAD=2" &
wait
for name in a1 a2; do  # (in parallel)
    PYTHONPATH=/tmp/$name timeout 200 python3 -m pytest -q tests/test_decode_kernel.py tests/test_kvcache.py \
        -p no:cacheprovider > "$O/tests_$name.txt" 2>&1 &
done
wait
for name in a1 a2; do tail -n 1 "$O/tests_$name.txt" | sed "s/^/$name: /"; done
A="--no-summary --parts decode --sq 1,4 --page-sizes 16,64,256 --batches 1,4,16,64 --cache-lens 1k,8k,32k"
for round in 1 2; do
    for name in base a1 a2; do
        impls=flashattn2
        [ $name = base ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$O/envab8_${name}_$round" > "$O/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
for name in base a1 a2; do
    echo "=== $(date -Is) bench $name sequential pages"
    PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --impls flashattn2 --page-order sequential \
        --out "$O/envab9_${name}_1" > "$O/seq_${name}.txt" 2>&1 || echo "bench $name failed"
done
python3 scripts/ab_compare.py "$O" --group 8 --specs base,a1,a2 > "$O/ab8.txt" 2>&1
python3 scripts/ab_compare.py "$O" --group 9 --specs base,a1,a2 > "$O/ab9.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab8.txt"; sed -n '/^geomean/,$p' "$O/ab9.txt"
echo "=== $(date -Is) done"
