#!/usr/bin/env bash
# Nsight Compute report of one forward or backward kernel launch (clocks left alone):
#   PASS=fwd HEAD_DIM=128 SEQLEN=4096 CAUSAL=0 bash scripts/ncu.sh > report.txt
#   PASS=bwd ...   (the backward main kernel)
#   PASS=decode BATCH=16 SEQLEN=8192 ...  (flash_attn_with_kvcache, sq 1, 32 / 8 heads, the
#                  decode kernel; SPLITS=n forces a split count, 0 = the heuristic)
#   IMPL=sdpa ...  (the same problem through SDPA's flash backend: FA2's kernel)
#   IMPL=cudnn ... (PASS=fwd or decode: the same problem through SDPA's cuDNN backend; decode
#                  with enable_gqa)
#   SOURCE=out.csv ...  (instead: per-SASS-line executed instructions and stall samples,
#                        SourceCounters + WarpStateStats, as CSV; sum them by opcode)
# Sections: speed of light, occupancy, launch, warp states, compute, memory, scheduler, and
# the average stall cycles per instruction by reason, and the tensor pipe's active share.
set -euo pipefail
PASS=${PASS:-fwd} HEAD_DIM=${HEAD_DIM:-128} SEQLEN=${SEQLEN:-4096} CAUSAL=${CAUSAL:-0}
IMPL=${IMPL:-ours} SOURCE=${SOURCE:-} BATCH=${BATCH:-16} SPLITS=${SPLITS:-0}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
script=$(mktemp --suffix=.py)
cat > "$script" <<PY
import torch, flashattn2
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
d, s, bwd = $HEAD_DIM, $SEQLEN, "$PASS" == "bwd"
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd)
           for _ in range(3))
if "$PASS" == "decode":
    b = $BATCH
    q = torch.randn(b, 1, 32, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
backend = SDPBackend.CUDNN_ATTENTION if "$IMPL" == "cudnn" else SDPBackend.FLASH_ATTENTION
for _ in range(2):
    if "$PASS" == "decode" and "$IMPL" == "ours":
        out = flashattn2.flash_attn_with_kvcache(q, k, v, num_splits=$SPLITS)
    elif "$IMPL" != "ours":
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), is_causal=bool($CAUSAL),
                                                 enable_gqa="$PASS" == "decode")
    else:
        out = flashattn2.flash_attn_func(q, k, v, causal=bool($CAUSAL))
    if bwd:
        out.backward(torch.randn_like(out))
torch.cuda.synchronize()
PY
stalls=barrier,long_scoreboard,short_scoreboard,math_pipe_throttle,lg_throttle,mio_throttle,wait
metrics=$(echo "$stalls" | tr ',' '\n' | sed 's/^/smsp__average_warp_latency_issue_stalled_/' | paste -sd,)
# (and the tensor pipe's busy share: HGMMA counts there too)
metrics=$metrics,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
kernel="^${PASS}_kernel"
[ "$IMPL" = sdpa ] && kernel="flash_${PASS}(_dq_dk_dv|_kernel)"
if [ "$IMPL" = cudnn ]; then
    [ "$PASS" = bwd ] && { echo "ncu.sh: IMPL=cudnn profiles the forward and decode only" >&2; exit 2; }
    kernel="cudnn|sdpa"
fi
if [ -n "$SOURCE" ]; then
    rep=$(mktemp -u)
    "$NCU" --clock-control none -k regex:"$kernel" -s 1 -c 1 --section SourceCounters \
        --section WarpStateStats -o "$rep" python3 "$script"
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$SOURCE"
    exit
fi
"$NCU" --clock-control none -k regex:"$kernel" -s 1 -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics "$metrics" python3 "$script"
