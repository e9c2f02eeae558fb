#!/usr/bin/env bash
# Thirty-third session, run 1 (~150 s): jobs/s33_probe.py on a d128 90a build of HEAD (where the
# decode calls that lose to cuDNN spend their time; no kernel change).
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/m python3 jobs/s33_probe.py "$O" 2>&1 | tail -n 120
