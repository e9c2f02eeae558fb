#!/usr/bin/env bash
# Context-parallel benchmark on 2 or more GPUs of one host (benchmarks/bench_cp.py): ring,
# all-gather and Ulysses against 1 GPU, bf16, d128, 16 query heads, 16 or 4 K/V heads,
# 32k-256k tokens, fwd+bwd. Under 5 minutes on 2 H100s. Run from the repository root:
#
#   bash scripts/cp_bench.sh                         # the full sweep, 2 GPUs
#   bash scripts/cp_bench.sh --seqlens 32768 --causal true
#   bash scripts/cp_bench.sh --world-sizes 2,4 --seqlens 131072,262144,524288,1048576 \
#       --nheads-k 4 --causal true --long-iters 1 --max-tokens-per-gpu 262144   # issue 22
#
# NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
set -euo pipefail
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
exec "${PYTHON:-python3}" benchmarks/bench_cp.py "$@"
