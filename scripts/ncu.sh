#!/usr/bin/env bash
# Nsight Compute report of one forward or backward kernel launch (clocks left alone):
#   PASS=fwd HEAD_DIM=128 SEQLEN=4096 CAUSAL=0 bash scripts/ncu.sh > report.txt
#   PASS=bwd ...   (the backward main kernel)
#   PASS=decode BATCH=16 SEQLEN=8192 ...  (flash_attn_with_kvcache, sq 1, 32 / 8 heads, the
#                  decode kernel; SPLITS=n forces a split count, 0 = the heuristic)
#   DTYPE=fp32 ... (float32 inputs: the Hopper float32 kernels, fwd_fp32wg / bwd_fp32wg*;
#                  FP32_PRECISION=tf32 their single-TF32 instances, default ieee: 3xTF32)
#   IMPL=sdpa ...  (the same problem through SDPA's flash backend: FA2's kernel)
#   IMPL=cudnn ... (PASS=fwd or decode: the same problem through SDPA's cuDNN backend; decode
#                  with enable_gqa)
#   SOURCE=out.csv ...  (instead: per-SASS-line executed instructions and stall samples,
#                        SourceCounters + WarpStateStats, as CSV; sum them by opcode)
#   TOTALS=1 ...   (instead: every kernel of the last call's pass, between cudaProfilerStart /
#                  Stop, summed: DRAM, L2 and L2-reduction bytes, LSU shared-memory wavefronts
#                  (ld / st / ldmatrix / stmatrix; not wgmma's operand reads), instructions,
#                  tensor-pipe cycles, each also per GFLOP. Any IMPL and PASS, cuDNN's
#                  backward included: the eighteenth session's power question, where do our
#                  backward's extra joules go)
# Sections: speed of light, occupancy, launch, warp states, compute, memory, scheduler, and
# the average stall cycles per instruction by reason, and the tensor pipe's active share.
set -euo pipefail
PASS=${PASS:-fwd} HEAD_DIM=${HEAD_DIM:-128} SEQLEN=${SEQLEN:-4096} CAUSAL=${CAUSAL:-0}
IMPL=${IMPL:-ours} SOURCE=${SOURCE:-} BATCH=${BATCH:-16} SPLITS=${SPLITS:-0} TOTALS=${TOTALS:-0}
DTYPE=${DTYPE:-bf16} FP32_PRECISION=${FP32_PRECISION:-ieee}
case "$DTYPE" in bf16) tdtype=bfloat16 ;; fp32) tdtype=float32 ;;
    *) echo "ncu.sh: DTYPE bf16 or fp32" >&2; exit 2 ;; esac
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
script=$(mktemp --suffix=.py)
cat > "$script" <<PY
import torch, flashattn2
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
d, s, bwd = $HEAD_DIM, $SEQLEN, "$PASS" == "bwd"
b, h = 16384 // s, 2048 // d
dtype = torch.$tdtype
if dtype == torch.float32:  # (as bench.py --fp32-precision: ours and SDPA alike)
    try:
        torch.backends.cuda.matmul.fp32_precision = "$FP32_PRECISION"
    except (AttributeError, TypeError):
        torch.backends.cuda.matmul.allow_tf32 = "$FP32_PRECISION" == "tf32"
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=bwd)
           for _ in range(3))
if "$PASS" == "decode":
    b = $BATCH
    q = torch.randn(b, 1, 32, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
backend = SDPBackend.CUDNN_ATTENTION if "$IMPL" == "cudnn" else SDPBackend.FLASH_ATTENTION
profiler = torch.cuda.cudart()
for i in range(2):
    mark = $TOTALS and i == 1  # TOTALS: the range of the last call's pass
    if mark and not bwd:
        profiler.cudaProfilerStart()
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
        dout = torch.randn_like(out)
        torch.cuda.synchronize()
        if mark:
            profiler.cudaProfilerStart()
        out.backward(dout)
    torch.cuda.synchronize()
    if mark:
        profiler.cudaProfilerStop()
if "$PASS" != "decode":
    print(f"FLOP {4 * b * s * s * h * d * (0.5 if $CAUSAL else 1) * (2.5 if bwd else 1):.6e}")
PY
if [ "$TOTALS" = 1 ]; then
    m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
    m=$m,lts__t_sectors_op_red.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
    m=$m,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.sum
    csv=$(mktemp --suffix=.csv)
    "$NCU" --profile-from-start off --clock-control none --metrics "$m" --csv --page raw \
        --print-units base python3 "$script" > "$csv"
    python3 - "$csv" "$m" <<'SUM'
import csv, re, sys
text = open(sys.argv[1]).read()
wanted = sys.argv[2].split(",")
found = re.search(r"^FLOP (\S+)", text, re.M)
gflop = float(found.group(1)) / 1e9 if found else None
rows = [r for r in csv.DictReader(l for l in text.splitlines() if l.startswith('"'))
        if r.get("Kernel Name") and r.get("ID", "").isdigit()]
keys = [k for k in wanted if rows and k in rows[0]]  # (the raw page has device__* too)
num = lambda x: float(x.replace(",", "")) if x not in ("", "n/a") else 0.0
for r in rows:
    print(f"{r['Kernel Name'][:90]}: " + ", ".join(f"{k} {r[k]}" for k in keys))
print(f"\n{len(rows)} kernels" + (f", {gflop:.1f} GFLOP; totals (per GFLOP):" if gflop else
                                  "; totals:"))
for k in keys:
    tot = sum(num(r[k]) for r in rows)
    print(f"  {k:55s} {tot:.4e}" + (f"  ({tot / gflop:.4e})" if gflop else ""))
SUM
    rm -f "$csv" "$script"
    exit
fi
stalls=barrier,long_scoreboard,short_scoreboard,math_pipe_throttle,lg_throttle,mio_throttle,wait
metrics=$(echo "$stalls" | tr ',' '\n' | sed 's/^/smsp__average_warp_latency_issue_stalled_/' | paste -sd,)
# (and the tensor pipe's busy share: HGMMA counts there too)
metrics=$metrics,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
kernel="^${PASS}_kernel"
[ "$DTYPE" = fp32 ] && kernel="^${PASS}_fp32wg"
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
