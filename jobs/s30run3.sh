#!/usr/bin/env bash
# Thirtieth session, run 3 (the session's last ~5 minutes of device time): the CTA stamps of the
# landed d64 float32 backward (bb185ae: fragments from shared memory in 3xTF32, rows8 K / V
# loads), both precisions, to see where its fixed cost a CTA now goes (and why TF32 gained
# nothing from rows8). A d64-only probe build, then scripts/bwd_cta_times.py. Run directly
# (no gpu_detach: ~2 minutes):
#   OUT=$OUT bash jobs/s30run3.sh
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
echo "=== $(date -Is) probe build (d64, -DFLASHATTN2_PROBE_TIMES)"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/probe_whl . \
    -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=64" \
    -C "cmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN2_PROBE_TIMES" -C build-dir=/tmp/build-probe \
    > "$O/probe_build.txt" 2>&1 && rm -rf /tmp/probe && python3 -m zipfile -e /tmp/probe_whl/*.whl /tmp/probe ||
    { tail -n 20 "$O/probe_build.txt"; exit 1; }
for prec in ieee tf32; do
    echo "=== $(date -Is) CTA stamps ($prec)"
    PYTHONPATH=/tmp/probe timeout 90 python3 scripts/bwd_cta_times.py --seqlens 1024,4096 \
        --causal 0,1 --fp32-precision "$prec" 2>&1 | tee "$O/cta_times_$prec.txt"
done
echo "=== $(date -Is) done"
