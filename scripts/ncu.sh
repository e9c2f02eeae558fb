#!/usr/bin/env bash
# Nsight Compute report of one forward or backward kernel launch (clocks left alone):
#   PASS=fwd HEAD_DIM=128 SEQLEN=4096 CAUSAL=0 bash scripts/ncu.sh > report.txt
#   PASS=bwd ...   (the backward main kernel)
# Sections: speed of light, occupancy, launch, warp states, compute, memory, scheduler, and
# the average stall cycles per instruction by reason.
set -euo pipefail
PASS=${PASS:-fwd} HEAD_DIM=${HEAD_DIM:-128} SEQLEN=${SEQLEN:-4096} CAUSAL=${CAUSAL:-0}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
script=$(mktemp --suffix=.py)
cat > "$script" <<PY
import torch, flashattn2
d, s, bwd = $HEAD_DIM, $SEQLEN, "$PASS" == "bwd"
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd)
           for _ in range(3))
for _ in range(2):
    out = flashattn2.flash_attn_func(q, k, v, causal=bool($CAUSAL))
    if bwd:
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
PY
stalls=barrier,long_scoreboard,short_scoreboard,math_pipe_throttle,lg_throttle,mio_throttle,wait
metrics=$(echo "$stalls" | tr ',' '\n' | sed 's/^/smsp__average_warp_latency_issue_stalled_/' | paste -sd,)
"$NCU" --clock-control none -k regex:"${PASS}_kernel" -s 1 -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics "$metrics" python3 "$script"
