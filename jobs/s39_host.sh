#!/usr/bin/env bash
# Prepared in the thirty-eighth session (NOTES' next list, item 1): the eager host time of
# flash_attn_func on one machine, in one call (~150 s with a cold start): a d64 / d128 90a
# build; the timeline and the A/B of the thirty-eighth session (jobs/s38_host_timeline.py,
# jobs/s38_host_ab.py); then, where nsys exists, its CUDA API and OS-runtime trace of 200
# forward + backward steps (which runtime calls, on which thread, for how long), else
# torch.profiler's table only (s38_host_ab.py prints it).
#   OUT=$OUT bash jobs/s39_host.sh
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
SRC=$PWD
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" -C "cmake.define.FLASHATTN2_EXPERIMENTAL=fp32;fp32wg" \
    -C build-dir=/tmp/b > "$O/build.txt" 2>&1 || { tail -20 "$O/build.txt"; exit 1; }
cd /tmp
timeout 120 python3 "$SRC/jobs/s38_host_timeline.py" > "$O/timeline.txt" 2>&1; echo "timeline rc $?"
FORWARD_PARTS=1 timeout 120 python3 "$SRC/jobs/s38_host_timeline.py" > "$O/timeline_fwd_parts.txt" 2>&1; echo "timeline (forward parts) rc $?"
timeout 240 python3 "$SRC/jobs/s38_host_ab.py" > "$O/host_ab.txt" 2>&1; echo "A/B rc $?"
grep -v Warn "$O/timeline.txt" | head -40
grep "fwd+bwd\|engine" "$O/host_ab.txt"
if command -v nsys > /dev/null; then
    cat > /tmp/steps.py <<'PY'
import torch, flashattn2
q, k, v = (torch.randn(1, 1024, 32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
g = torch.randn_like(q)
for _ in range(200):
    torch.autograd.grad(flashattn2.flash_attn_func(q, k, v, causal=True), (q, k, v), g)
torch.cuda.synchronize()
PY
    timeout 180 nsys profile -t cuda,osrt -o /tmp/steps --force-overwrite true python3 /tmp/steps.py > "$O/nsys.txt" 2>&1
    timeout 120 nsys stats -r cuda_api_sum,osrt_sum /tmp/steps.nsys-rep >> "$O/nsys.txt" 2>&1
    echo "nsys rc $?"; grep -A25 "cuda_api_sum" "$O/nsys.txt" | head -40
else
    echo "no nsys on this machine" | tee "$O/nsys.txt"
fi
