#!/usr/bin/env bash
# Thirty-seventh session, run 5 (~200 s, no carry): why paged 16 reads 2-4.5 % slower than
# contiguous (run 4's sweep): the same kernel on the same pages in order (--page-order
# sequential: the contiguous cache's addresses through the block table) against shuffled
# pages, 2 interleaved rounds; and the sweep's sq4 paged-256 outliers (b16 128k, b64 32k) again.
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
A="--no-summary --parts decode --impls flashattn2 --page-sizes 16,64,256 --sq 1 --batches 1,4,16,64 --cache-lens 1k,8k,32k --warmup 5 --rep 30"
for r in 1 2; do
    for order in shuffled sequential; do
        PYTHONPATH=/tmp/m timeout 120 python3 benchmarks/bench_decode.py $A --page-order $order \
            --out "$O/order_${order}_$r" > /dev/null 2>&1
    done
done
for r in 1 2; do
    for dt in bf16 fp16; do
        PYTHONPATH=/tmp/m timeout 120 python3 benchmarks/bench_decode.py --no-summary --parts decode \
            --impls flashattn2 --dtype $dt --page-sizes 256 --sq 4 --batches 16,64 --cache-lens 32k,128k \
            --out "$O/sq4_${dt}_$r" > /dev/null 2>&1
    done
done
tar czf "$O/r5.tar.gz" -C "$O" $(cd "$O" && ls -d order_* sq4_*)
echo "=== $(date -Is) done"
