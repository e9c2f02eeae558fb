#!/usr/bin/env bash
# Prepared in the eighteenth session for the next one (NOTES next list, items 1-2): build
# d64 / d128 / d256 (90a), then the backward's steady state at the power cap against cuDNN
# (bench_power.py: 10 s a run, two rounds in alternating order, d64 / d128 / d256, full 8k),
# then the backward sweep of d256 on its staged dQ (two rounds, both SDPA backends).
# OUT=$OUT bash jobs/s19power.sh (about 110 s build + 150 s power + 60 s sweep).
set -u
O=${OUT:-gpu_logs}; mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128;256" -C build-dir=/tmp/bpow > "$O/build.txt" 2>&1 \
    || { tail -20 "$O/build.txt"; exit 1; }
cd /tmp || exit 1
R=$OLDPWD/benchmarks
python3 "$R/bench_power.py" --out "$O/power" 2> "$O/power_err.txt" | tail -n 20
for r in 1 2; do
    python3 "$R/bench.py" --no-summary --modes bwd,fwd_bwd --headdims 256 --dtypes bf16 \
        --impls flashattn2,sdpa_flash,sdpa_cudnn --out "$O/d256_$r" 2> /dev/null | tail -n 26
done
