#!/usr/bin/env bash
# Thirty-seventh session, run 6 (~250 s, no carry): issue 21's grid (bench.py --grid: batch 1,
# causal, d16 / 32 / 64 / 128, bf16 and fp32, fwd / bwd / fwd_bwd, against torch_eager and SDPA)
# end to end on a 90a build of those head dims, seqlens 128-2048 only (the device time left;
# the full grid to 64k is jobs/s38_grid.sh), shorter timings. results.json / .csv, results.png
# and the new latency.png come back in grid.tar.gz.
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=16;32;64;128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
(cd /tmp && python3 -c "import flashattn2; print(flashattn2.build_info())") | tail -3
timeout ${GRID_TIMEOUT:-170} python3 benchmarks/bench.py --grid --seqlens 128,256,512,1024,2048 \
    --warmup 10 --rep 40 --out "$O/grid" > "$O/grid.txt" 2>&1
echo "grid rc $?"; tail -n 30 "$O/grid.txt"
tar czf "$O/grid.tar.gz" -C "$O" grid grid.txt
echo "=== $(date -Is) done"
