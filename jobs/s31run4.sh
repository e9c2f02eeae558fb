#!/usr/bin/env bash
# Thirty-first session, run 4 (run 3's script with other probes): fr (FLASHATTN2_DECODE_FULLROWS:
# each warp copy instruction covers 2 whole 256-byte rows, 16 lanes a row, instead of 8 rows x
# 64 bytes; 8 row slots a lane) and frfixed (fr + both switches compile-time on).
# Run 3's header follows.
# Thirty-first session, run 3. Run 2 ruled out bytes in flight on the H200 (5 / 6 stages or 8
# warps: within -3 / +5 %, forced splits the same): the decode kernel tops out at ~4.0 TB/s
# against a 4.5 TB/s floor that cuDNN reaches. Its loop issues ~480 instructions a 16-key
# tile and warp, ~215 of them the copy (64-bit address math per 16-byte chunk, and each
# LDGSTS twice, once per value of the runtime L2-prefetch switch). Probes (d128 builds,
# sm80/decode_kernel.cuh's macros): imm (one row pointer, chunk offsets as immediates: copy
# 215 -> 160), fixed (imm + the two switches on at compile time: copy 134), lazy (fixed + O
# rescaled only when a row max of the warp grew: bit-identical, 64 FMUL a tile saved). Also
# the two runtime switches on main, and ncu (sections, then DRAM / L2 totals) of ours and
# cuDNN at b16 8k.
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
echo "=== $(date -Is) builds"
build main "" & build fr "-DFLASHATTN2_DECODE_FULLROWS" &
build frfixed "-DFLASHATTN2_DECODE_FULLROWS -DFLASHATTN2_DECODE_FIXED" &
wait
for name in main fr frfixed; do  # (in parallel)
    PYTHONPATH=/tmp/$name timeout 200 python3 -m pytest -q -x tests/test_decode_kernel.py tests/test_kvcache.py \
        -p no:cacheprovider > "$O/tests_$name.txt" 2>&1 &
done
wait
for name in main fr frfixed; do tail -n 1 "$O/tests_$name.txt" | sed "s/^/$name: /"; done
A="--parts decode --sq 1 --page-sizes=256 --batches 1,4,16,64 --cache-lens 1k,8k,32k --rep 40 --no-summary"
for round in 1 2; do
    for name in main fr frfixed; do
        impls=flashattn2
        [ $name = main ] && impls=flashattn2,sdpa_cudnn,read_floor
                echo "=== $(date -Is) bench $name round $round"
        PYTHONPATH=/tmp/$name timeout 200 python3 benchmarks/bench_decode.py $A --impls $impls \
            --out "$O/dec_${name}_$round" > "$O/dec_${name}_$round.txt" 2>&1 || echo "bench $name failed"
    done
done
python3 - "$O" <<'PY'
import glob, json, sys
o = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{o}/dec_*_[12]/decode.json")):
    name = f.split("/")[-2][4:-2]
    for r in json.load(open(f))["rows"]:
        if r.get("layout") not in ("contiguous", "paged256") or r.get("num_splits", 0) or r.get("seqlen_q", 1) > 1:
            continue
        impl = r["impl"].replace("flashattn2", name) if r["impl"].startswith("flashattn2") else r["impl"]
        if r["layout"] == "paged256":
            impl += "_p"
        k = (impl, r["batch"], r["seqlen_k"])
        rows[k] = min(rows.get(k, 1e9), r["us"])
cfgs = sorted({(b, c) for (_, b, c) in rows})
names = ["main", "fr", "frfixed", "sdpa_cudnn", "read_floor", "main_p", "fr_p", "frfixed_p"]
print("b cache | " + " ".join(f"{n[:10]:>10}" for n in names) + " | floor/main floor/best")
for b, c in cfgs:
    v = [rows.get((n, b, c)) for n in names]
    fa = [x for x in v[:3] if x]
    print(f"{b} {c} | " + " ".join(f"{x:10.1f}" if x else " " * 10 for x in v)
          + (f" | {v[4] / v[0]:.3f} {v[4] / min(fa):.3f}" if v[4] and v[0] else ""))
PY
echo "=== $(date -Is) done"
