#!/usr/bin/env bash
# Thirty-fourth session, run 7 (probe, ~150 s): where a decode CTA's cycles go
# (jobs/s34_decode_times_probe.patch, -DFLASHATTN2_DECODE_PROBE_TIMES; jobs/s34_decode_times.py).
# Runs 4-6 left the CTA shape and ring depth where they are (4 warps, 3 stages at d128); the
# gap at 1k caches (b16 0.94x cuDNN) is then a per-CTA fixed cost: this says which phase.
#   bash jobs/s34run7.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
rm -rf /tmp/src_t && mkdir -p /tmp/src_t && tar --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/src_t
(cd /tmp/src_t && patch -p1 -s < jobs/s34_decode_times_probe.patch) || { echo "patch failed"; exit 1; }
( cd /tmp/src_t && python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/t_whl . \
    -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
    -C "cmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN2_DECODE_PROBE_TIMES" -C build-dir=/tmp/build-t \
  && rm -rf /tmp/t && python3 -m zipfile -e /tmp/t_whl/*.whl /tmp/t ) > "$O/build_t.txt" 2>&1 \
  || { tail -20 "$O/build_t.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/t timeout 120 python3 jobs/s34_decode_times.py 16:1024 16:8192 64:1024 64:8192 32:1024 48:1024 2>&1 | tee "$O/times.txt"
echo "=== $(date -Is) done"
