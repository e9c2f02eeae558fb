#!/usr/bin/env bash
# Seventeenth session, diagnostic: run 4's sweep (default build; bwd and fwd_bwd interleaved
# per config) measured the backward of full attention at 16k 13-15 % below the bwd-only A/Bs
# of runs 2-3 (limited builds). Default build, then bwd only, the run-4 mix, bwd only again.
set -u
O=${OUT:-gpu_logs}; mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C build-dir=/tmp/bdiag > "$O/build.txt" 2>&1 || { tail -20 "$O/build.txt"; exit 1; }
cd /tmp
B=$OLDPWD/benchmarks/bench.py
A="--headdims 64,128,256 --seqlens 8192,16384 --causal false --dtypes bf16 --no-summary"
python3 $B --modes bwd --impls flashattn2,sdpa_cudnn $A --out "$O/bwd_only_1" 2>/dev/null | tail -n 8
python3 $B --modes bwd,fwd_bwd --impls flashattn2,sdpa_flash,sdpa_cudnn $A --out "$O/mix" 2>/dev/null | tail -n 14
python3 $B --modes bwd --impls flashattn2,sdpa_cudnn $A --out "$O/bwd_only_2" 2>/dev/null | tail -n 8
