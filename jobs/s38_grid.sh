#!/usr/bin/env bash
# Prepared in the thirty-seventh session: issue 21's full grid (bench.py --grid: batch 1,
# causal, seqlen 128-65536, d16 / 32 / 64 / 128, bf16 and fp32, fwd / bwd / fwd_bwd, against
# torch_eager (where it fits) and SDPA's backends) on a 90a build of those head dims, with the
# default timings; results.json / .csv, results.png and latency.png in grid.tar.gz. Run 6 of
# the thirty-seventh session ran the same to 2k in ~100 s; the long cells (fp32 at 32k / 64k)
# take seconds each, so this is meant to be started detached and waited on:
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s38_grid.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=16;32;64;128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
timeout 1500 python3 benchmarks/bench.py --grid --out "$O/grid" > "$O/grid.txt" 2>&1
echo "grid rc $?"; tail -n 40 "$O/grid.txt"
tar czf "$O/grid.tar.gz" -C "$O" grid grid.txt
echo "=== $(date -Is) done"
