#!/usr/bin/env bash
# Prepared in the thirty-sixth session for the next one (~120 s, no carry): where do the decode
# kernel's warps wait at b1 8k? Run 4/5 of the thirty-sixth session cut a tile's instructions
# 40 % and added Q K^T chains, yet the kernel moved 3 % and ncu's per-warp 'wait' stalls
# (6.2k of ~19k cycles) did not move. PC sampling per SASS instruction says which instructions
# carry them (DEPBAR on the ring? the HMMAs? the MUFU / shuffle chain?). A d128 build of this
# tree; ncu with SourceCounters at b1 8k and b16 1k; the top instructions by stall samples with
# their reasons (ncu --page source), and the report files.
#   bash jobs/s37run1.sh
set -u
O=${OUT:-gpu_logs}
R=/tmp/s37r1
mkdir -p "$O" $R
export PYTHONUNBUFFERED=1
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w128 . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b128 -C cmake.define.CMAKE_CUDA_FLAGS=-lineinfo \
    > "$R/build.txt" 2>&1 && python3 -m zipfile -e /tmp/w128/*.whl /tmp/m128 || { tail -20 "$R/build.txt"; exit 1; }
echo "=== $(date -Is) built"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
for cfg in "1 8192" "16 1024"; do
    tag=${cfg// /_}
    PYTHONPATH=/tmp/m128 timeout 120 "$NCU" --profile-from-start off --clock-control none \
        -k regex:decode_kernel --section SourceCounters --section WarpStateStats --import-source no \
        -f -o "$R/src_$tag" python3 jobs/s34_ncu_decode.py ours $cfg > "$R/ncu_$tag.txt" 2>&1
    "$NCU" -i "$R/src_$tag.ncu-rep" --page source --csv --print-source sass > "$R/sass_$tag.csv" 2> "$R/sass_$tag.err"
    "$NCU" -i "$R/src_$tag.ncu-rep" --page details --csv > "$R/details_$tag.csv" 2>&1
    echo "=== b/cache $cfg: the instructions with the most stall samples"
    python3 - "$R/sass_$tag.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r)), None)
if hdr is None:
    print(open(sys.argv[1]).read()[:2000]); sys.exit()
h, body = rows[hdr], [r for r in rows[hdr + 1:] if len(r) == len(rows[hdr])]
print("columns:", h)
def col(name):
    return next((i for i, c in enumerate(h) if name in c), None)
tot = col("Warp Stall Sampling (All")
if tot is None:
    sys.exit()
num = lambda x: float(x.replace(",", "") or 0)
total = sum(num(r[tot]) for r in body) or 1
stall_cols = [i for i, c in enumerate(h) if c.startswith("stall_") or "Stall" in c and i != tot]
src = col("Source")
for r in sorted(body, key=lambda r: -num(r[tot]))[:40]:
    reasons = sorted(((num(r[i]), h[i]) for i in stall_cols if num(r[i]) > 0), reverse=True)[:3]
    print(f"{100 * num(r[tot]) / total:5.1f}%  {r[src][:60]:60s} " + ", ".join(f"{n} {v:.0f}" for v, n in reasons))
PY
done
tar czf "$O/s37r1.tar.gz" -C /tmp s37r1
echo "=== $(date -Is) done"
