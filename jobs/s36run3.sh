#!/usr/bin/env bash
# Prepared in the thirty-fifth session for the next one (~120 s, no carry, no code change): is
# the d64 split count off? The thirty-fifth session's run 6 had d64 at 0.93x cuDNN at b1 1k,
# 0.96x at b4 1k, 0.93x at b64 8k (d128: 0.98-1.02x). A d64 build of this tree; bench_decode
# at d64 sq 1, contiguous, b1 / 4 / 16 x 1k / 8k / 32k with the heuristic (auto) and forced
# num_splits 2-48, cuDNN and the floor in the same run, 2 rounds; the table per round.
#   bash jobs/s36run3.sh
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w64 . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64" -C build-dir=/tmp/b64 > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w64/*.whl /tmp/m64 || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
for round in 1 2; do
    PYTHONPATH=/tmp/m64 timeout 240 python3 benchmarks/bench_decode.py --no-summary --parts decode \
        --headdim 64 --sq 1 --page-sizes '' --batches 1,4,16 --cache-lens 1k,8k,32k \
        --splits 2,4,8,12,16,24,32,48 --impls flashattn2,sdpa_cudnn,read_floor \
        --out "$O/splits_$round" > "$O/splits_$round.txt" 2>&1 || echo "bench round $round failed"
done
sed -n '1,200p' "$O/splits_2.txt"
echo "=== $(date -Is) done"
