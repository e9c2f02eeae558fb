#!/usr/bin/env bash
# Thirty-first session, run 2: why the decode kernel streams at 84-90 % of the read floor on an
# H200 (run 1's sweep: b16 8k 149.0 us, cuDNN 125.8, floor 122.4) where it was at 96-97 % on
# the H100. The H200 reads ~1.4x faster with about the same latency, so Little's law asks ~1.4x
# the bytes in flight per SM; at b16 (128 CTAs, no split) one CTA keeps 4 warps x 2 tiles x
# 8 KiB = 64 KiB in flight. Four d128-only builds of this tree, differing only in
# sm80/decode_config.h's probe knobs: main (3 stages, 4 warps: HEAD's kernel), s5 / s6 (5 / 6
# stages: 1 CTA an SM, 128 / 160 KiB in flight), w8 (8 warps x 3 stages: 1 CTA, 128 KiB).
# Then bench_decode.py (contiguous, sq 1, b 1-64, cache 1k-32k) on each, interleaved twice,
# and on main: forced splits 1,2,4 and the (b, h_k, s, d) layout.
#   OUT=$OUT bash jobs/s31run2.sh   (or through scripts/gpu_detach.sh)
set -u
O=${JOB_OUT:-${OUT:-gpu_logs}}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
build() {  # build NAME CUDA_FLAGS: a d128 90a wheel of this tree, unpacked into /tmp/NAME
    local name=$1 flags=$2
    ( python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" \
        ${flags:+-C "cmake.define.CMAKE_CUDA_FLAGS=$flags"} -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$O/${name}_build.txt" 2>&1
    echo "=== $(date -Is) build $name rc $?"
}
echo "=== $(date -Is) builds"; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
build main "" & build s5 "-DFLASHATTN2_DECODE_STAGES128=5" &
build s6 "-DFLASHATTN2_DECODE_STAGES128=6" & build w8 "-DFLASHATTN2_DECODE_WARPS=8" &
wait
A="--parts decode --sq 1 --page-sizes= --batches 1,4,16,64 --cache-lens 1k,8k,32k --rep 40 --no-summary"
PYTHONPATH=/tmp/main timeout 120 python3 -m pytest -q -x tests/test_decode_kernel.py -p no:cacheprovider 2>&1 | tail -3
for name in w8 s5 s6; do
    PYTHONPATH=/tmp/$name timeout 120 python3 -m pytest -q -x tests/test_decode_kernel.py -p no:cacheprovider 2>&1 | tail -2 | sed "s/^/$name: /"
done
for round in 1 2; do
    for name in main s5 s6 w8; do
        impls=flashattn2; [ "$name$round" = main1 ] && impls=flashattn2,sdpa_cudnn,read_floor
        echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$O/dec_${name}_$round" > "$O/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
echo "=== $(date -Is) main: splits 1,2,4 and bhsd"
PYTHONPATH=/tmp/main timeout 200 python3 benchmarks/bench_decode.py $A --batches 4,16,64 \
    --splits 1,2,4 --bhsd --impls flashattn2 --out "$O/dec_main_splits" > "$O/dec_main_splits.txt" 2>&1
python3 - "$O" <<'PY'
import glob, json, os, sys
o = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{o}/dec_*_[12]/decode.json")):
    name = f.split("/")[-2][4:-2]
    for r in json.load(open(f))["rows"]:
        if r.get("layout") != "contiguous" or r.get("num_splits", 0) or r.get("seqlen_q", 1) > 1:
            continue
        k = (r["impl"] if r["impl"] != "flashattn2" else name, r["batch"], r["seqlen_k"])
        rows[k] = min(rows.get(k, 1e9), r["us"])
cfgs = sorted({(b, c) for (_, b, c) in rows})
names = ["main", "s5", "s6", "w8", "sdpa_cudnn", "read_floor"]
print("b cache | " + " ".join(f"{n:>10}" for n in names) + " | floor/main floor/best")
for b, c in cfgs:
    v = [rows.get((n, b, c)) for n in names]
    fa = [x for x in v[:4] if x]
    print(f"{b} {c} | " + " ".join(f"{x:10.1f}" if x else " " * 10 for x in v)
          + (f" | {v[5] / v[0]:.3f} {v[5] / min(fa):.3f}" if v[5] and v[0] else ""))
PY
tail -n 40 "$O/dec_main_splits.txt"
echo "=== $(date -Is) done"
