#!/usr/bin/env bash
# Nsight Compute report of one backward main-kernel launch (clocks left alone):
#   HEAD_DIM=128 SEQLEN=4096 CAUSAL=0 bash scripts/ncu_bwd.sh > report.txt
set -euo pipefail
HEAD_DIM=${HEAD_DIM:-128} SEQLEN=${SEQLEN:-4096} CAUSAL=${CAUSAL:-0}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
script=$(mktemp --suffix=.py)
cat > "$script" <<PY
import torch, flashattn2
d, s = $HEAD_DIM, $SEQLEN
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
for _ in range(2):
    flashattn2.flash_attn_func(q, k, v, causal=bool($CAUSAL)).backward(torch.randn_like(q))
torch.cuda.synchronize()
PY
"$NCU" --clock-control none -k regex:"bwd_kernel" -s 1 -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_lg_throttle,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_membar,smsp__average_warp_latency_issue_stalled_drain \
    python3 "$script"
