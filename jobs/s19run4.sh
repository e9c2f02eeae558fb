#!/usr/bin/env bash
# Nineteenth session, run 4: issue 20's full decode sweep (bench_decode.py defaults: batch
# 1-64, cache 1k-128k, sq 1 and 4, contiguous and 256-token pages, varlen; SDPA flash / cuDNN
# and the read floor in the same run) on the submitted kernels (694ffa9: the decode prologue
# of eea30b5), d128 build (90a).
set -u
O=${JOB_OUT:-gpu_logs}; mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/bdec > "$O/build.txt" 2>&1 \
    || { tail -20 "$O/build.txt"; exit 1; }
cd /tmp || exit 1
echo "=== $(date -Is) decode sweep"
python3 "$OLDPWD/benchmarks/bench_decode.py" --out "$O/decode" 2> "$O/decode_err.txt" | tail -n 40
echo "=== $(date -Is) done"
