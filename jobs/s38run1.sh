#!/usr/bin/env bash
# Thirty-eighth session, run 1 (detached): a 90a build of d16-128, then the host-time breakdown
# of flash_attn_func (jobs/s38_host_breakdown.py) and host_profile.py --attn (bf16, fp32), then
# issue 21's full grid (jobs/s38_grid.sh's bench.py --grid, default timings).
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s38run1.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$O/gpu.txt" 2>&1
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=16;32;64;128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
cd /tmp  # (the installed package, not the source tree)
SRC=$OLDPWD
timeout 300 python3 "$SRC/jobs/s38_host_breakdown.py" > "$O/host_breakdown.txt" 2>&1
echo "breakdown rc $?"
for dt in bf16 fp32; do
    timeout 120 python3 "$SRC/scripts/host_profile.py" --attn --dtype $dt > "$O/host_profile_$dt.txt" 2>&1
    echo "host_profile $dt rc $?"
done
echo "=== $(date -Is) host done"
cd "$SRC"
timeout 1500 python3 benchmarks/bench.py --grid --out "$O/grid" > "$O/grid.txt" 2>&1
echo "grid rc $?"; tail -n 40 "$O/grid.txt"
tar czf "$O/grid.tar.gz" -C "$O" grid grid.txt
echo "=== $(date -Is) done"
