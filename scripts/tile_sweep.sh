#!/usr/bin/env bash
# Build one variant of the forward kernel per tile config and time each with the benchmark,
# all in one call on the GPU machine. Each variant gets its own build dir and install target,
# so the main install is untouched.
#
#   HEAD_DIM=128 bash scripts/tile_sweep.sh "128 64 4 2 0 2" "128 32 4 2 0 2"
#   KIND=sm90 HEAD_DIM=128 bash scripts/tile_sweep.sh "128 128 2" "128 176 2"
#
# A tile is FwdTile's fields (cpp/sm80/fwd_config.h), space separated: block_m block_n n_warps
# m_tiles q_in_regs(0/1) min_blocks; with KIND=sm90, Sm90FwdTile's (cpp/sm90/fwd_config.h)
# block_m block_n stages. Env: KIND (sm80), HEAD_DIM (default 128), ARCHS (90-real; sm90:
# 90a-real), SEQLENS, CAUSAL (both), OUT (gpu_logs), EXPERIMENTAL (the variants' build's
# FLASHATTN2_EXPERIMENTAL, default none: the forward's timing needs none of them, and the
# float32 units are the slowest to compile), REPEAT (bench runs of each variant, default 1).
set -uo pipefail
KIND=${KIND:-sm80}
HEAD_DIM=${HEAD_DIM:-128}
if [ "$KIND" = sm90 ]; then ARCHS=${ARCHS:-90a-real}; else ARCHS=${ARCHS:-90-real}; fi
SEQLENS=${SEQLENS:-1024,4096,16384}
CAUSAL=${CAUSAL:-both}
OUT=${OUT:-gpu_logs}
EXPERIMENTAL=${EXPERIMENTAL:-none}
REPEAT=${REPEAT:-1}
mkdir -p "$OUT" /tmp/tile_sweep
i=0
for tile in "$@"; do
    i=$((i + 1))
    site=/tmp/tile_sweep/site$i
    rm -rf "$site"
    echo "=== variant $i: d$HEAD_DIM tile $tile"
    if [ "$KIND" = sm90 ]; then
        read -r m n st <<< "$tile"
        flags="-DFLASHATTN2_SM90_TILE_M=$m -DFLASHATTN2_SM90_TILE_N=$n -DFLASHATTN2_SM90_TILE_STAGES=$st"
    else
        read -r m n w mt qr mb <<< "$tile"
        flags="-DFLASHATTN2_FWD_TILE_M=$m -DFLASHATTN2_FWD_TILE_N=$n -DFLASHATTN2_FWD_TILE_WARPS=$w"
        flags+=" -DFLASHATTN2_FWD_TILE_MTILES=$mt -DFLASHATTN2_FWD_TILE_QREGS=$qr -DFLASHATTN2_FWD_TILE_MINB=$mb"
    fi
    if ! CUDAFLAGS="$flags" python3 -m pip install -q --no-build-isolation --no-deps \
        --target "$site" . -C build-dir=/tmp/tile_sweep/build$i \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS="$ARCHS" \
        -C cmake.define.FLASHATTN2_HEAD_DIMS="$HEAD_DIM" \
        -C cmake.define.FLASHATTN2_EXPERIMENTAL="$EXPERIMENTAL" \
        -C cmake.define.FLASHATTN2_PTXAS_VERBOSE=ON > "/tmp/tile_sweep/build$i.log" 2>&1; then
        echo "build failed:"; tail -n 30 "/tmp/tile_sweep/build$i.log"; continue
    fi
    grep -E "spill" "/tmp/tile_sweep/build$i.log" | sort | uniq -c | head -n 4
    for r in $(seq "$REPEAT"); do
        PYTHONPATH="$site" python3 benchmarks/bench.py --impls flashattn2,sdpa_cudnn --dtypes bf16 \
            --headdims "$HEAD_DIM" --seqlens "$SEQLENS" --causal "$CAUSAL" --no-summary \
            --out "/tmp/tile_sweep/bench$i.$r" > "/tmp/tile_sweep/bench$i.$r.log" 2>&1 || tail -n 20 "/tmp/tile_sweep/bench$i.$r.log"
        python3 - "/tmp/tile_sweep/bench$i.$r/results.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
ref = {(r["seqlen_q"], r["causal"]): r["ms"] for r in rows if r["impl"] == "sdpa_cudnn"}
for r in rows:
    if r["impl"] == "flashattn2":
        c = ref.get((r["seqlen_q"], r["causal"]))
        print(f"  s{r['seqlen_q']:<6} causal={r['causal']!s:<5} {r['ms']:8.3f} ms "
              f"{r['tflops']:6.1f} TFLOP/s  cudnn/ours {c / r['ms'] if c else float('nan'):.3f}")
PY
    done
    mkdir -p "$OUT" && cp -r /tmp/tile_sweep/bench$i.* "$OUT/" 2>/dev/null
done
