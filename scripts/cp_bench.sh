#!/usr/bin/env bash
# Context-parallel benchmark on 2 GPUs of one host (benchmarks/bench_cp.py): ring,
# all-gather and Ulysses against 1 GPU, bf16, d128, 16 query heads, 16 or 4 K/V heads,
# 32k-256k tokens, fwd+bwd. Under 5 minutes on 2 H100s. Run from the repository root:
#
#   bash scripts/cp_bench.sh                         # the full sweep
#   bash scripts/cp_bench.sh --seqlens 32768 --causal true
#
# NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
set -euo pipefail
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
exec "${PYTHON:-python3}" benchmarks/bench_cp.py "$@"
