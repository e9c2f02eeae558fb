#!/usr/bin/env bash
# Thirty-second session, run 4: issue 20's default decode sweep (bench_decode.py, no flags but
# --out) on a1e5991, a d128 90a build. Prepared in the thirty-second session (its device time
# ran out): `bash jobs/s32run4.sh` in one device call (~200 s).
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/m python3 benchmarks/bench_decode.py --out "$O/sweep" 2>&1 | tail -n 60
