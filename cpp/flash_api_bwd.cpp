// Host API, the backward: argument checks, arch check and dispatch of mha_bwd (and its
// float32 path) to the compiled template instances, its workspace sizes and dQ chains.
#include "flash_api.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "built_config.h"
#include "flash_api_internal.h"
#include "sm80/bwd_config.h"
#include "sm90/bwd_config.h"
#include "common/launch.h"
#include "fp32/fwd_config.h"
#include "fp32/launch.h"
#include "fp32/wg_bwd_config.h"

namespace flashattn2 {
namespace {

#if FLASHATTN2_FP32WG
// Whether the Hopper float32 backward (fp32/wg_bwd_kernel.cuh) takes `p` (checked, float32):
// built, asked for (BwdParams::fp32wg_bwd) and allowed, an sm_90 GPU with the shared memory,
// kernel head dim 64, dense, full or a right window only (causal), no softcap / ALiBi, not
// deterministic (require_fp32_supported has refused dropout and a bias).
bool fp32wg_bwd_supports(const BwdParams& p, int kd, int device, bool allow) {
  return FLASHATTN2_FP32WG && allow && p.fp32wg_bwd && fp32wg_bwd_head_dim(kd) &&
         !p.cu_seqlens_q && !p.cu_seqlens_k && p.window_left < 0 && p.softcap <= 0.f &&
         !p.alibi_slopes && !p.deterministic && compute_capability(device) == 90 &&
         fp32wg_bwd_smem_bytes(kd, p.fp32_tf32) <= max_smem_per_block(device);
}
// The same for the d128 one (fp32/wg_bwd128_kernel.cuh, BwdParams::fp32wg_bwd128): the same
// cases at kernel head dim 128.
bool fp32wg_bwd128_supports(const BwdParams& p, int kd, int device, bool allow) {
  return FLASHATTN2_FP32WG && allow && p.fp32wg_bwd128 && kd == 128 && !p.cu_seqlens_q &&
         !p.cu_seqlens_k && p.window_left < 0 && p.softcap <= 0.f && !p.alibi_slopes &&
         !p.deterministic && compute_capability(device) == 90 &&
         fp32wg_bwd128_smem_bytes(kd, p.fp32_tf32) <= max_smem_per_block(device);
}
#endif

int mha_bwd_fp32(const BwdParams& params, int device, void* stream, bool allow_sm90) {
  require_fp32_supported(params);
  require(params.dq_chains == 1, "float32 runs one dq accumulator (dq_chains 1)");
  const BwdParams p = checked(params);
  DeviceGuard guard(device);
  require_supported_device(device);
  const int kd = fp32_kernel_head_dim(p.headdim);
  const int smem = fp32_bwd_smem_bytes(kd);
  require(smem <= max_smem_per_block(device),
          "the float32 backward for head dim " + std::to_string(p.headdim) + " needs " +
              std::to_string(smem) + " bytes of shared memory per block; GPU " +
              std::to_string(device) + " allows " + std::to_string(max_smem_per_block(device)));
  auto s = static_cast<cudaStream_t>(stream);
#if FLASHATTN2_FP32WG
  const bool single = p.fp32_tf32;
  if (fp32wg_bwd_supports(p, kd, device, allow_sm90)) {
    single ? run_bwd_fp32wg<64, true>(p, s) : run_bwd_fp32wg<64, false>(p, s);
    return single ? kBwdKernelFp32WgTf32 : kBwdKernelFp32Wg;
  }
  if (fp32wg_bwd128_supports(p, kd, device, allow_sm90)) {
    single ? run_bwd_fp32wg128<128, true>(p, s) : run_bwd_fp32wg128<128, false>(p, s);
    return single ? kBwdKernelFp32Wg128Tf32 : kBwdKernelFp32Wg128;
  }
#else
  (void)allow_sm90;
#endif
  if (!p.dq_accum) return kBwdNeedsDqAccum;  // (nothing ran)
#if FLASHATTN2_FP32
  switch (kd) {  // (workspaces: seqlen.cuh's layouts, as bwd_workspace_floats sizes them)
    case 32: run_bwd_fp32<32>(p, s); break;
    case 64: run_bwd_fp32<64>(p, s); break;
    default: run_bwd_fp32<128>(p, s); break;
  }
#else
  (void)s;
#endif
  return 80;
}

}  // namespace

int bwd_max_head_dim() {
  const std::vector<int> dims = BwdHeadDims::vec();
  return dims.empty() ? 0 : dims.back();
}

namespace {

// Smallest backward kernel head dim >= headdim, or -1 if none.
int bwd_kernel_head_dim(int headdim) {
  const bool d16 = g_native_d16.load(std::memory_order_relaxed);
  for (int d : BwdHeadDims::vec()) {
    if (d >= headdim && (d != 16 || d16)) return d;
  }
  return -1;
}

}  // namespace

int bwd_smem_per_block(int headdim) {
  const int kd = bwd_kernel_head_dim(headdim);
  return kd > 0 ? std::min(bwd_smem_bytes(kd, false), bwd_smem_bytes(kd, true)) : 0;
}

namespace {
bool valid_dq_chains(int chains) {
  return chains >= 1 && chains <= kBwdMaxDqChains && (chains & (chains - 1)) == 0;
}
}  // namespace

std::pair<int64_t, int64_t> bwd_workspace_floats(int batch, int nheads, int seqlen_q,
                                                 int headdim, int total_q, int dq_chains) {
  // The layouts of seqlen.cuh (ws_rows, ws_tiles): dense, or varlen when total_q >= 0.
  if (!valid_dq_chains(dq_chains)) {
    throw std::invalid_argument("dq_chains must be a power of two in [1, " +
                                std::to_string(kBwdMaxDqChains) + "], got " +
                                std::to_string(dq_chains));
  }
  const int64_t rows = bwd_ws_rows(batch, nheads, seqlen_q, total_q);
  const int64_t query_tiles = total_q >= 0 ? int64_t(nheads) * (total_q / 64 + batch)
                                           : int64_t(batch) * nheads * ((seqlen_q + 63) / 64);
  return {dq_chains * rows * headdim, rows + dq_chains * query_tiles};
}

int bwd_dq_chains(int seqlen_q, int seqlen_k, int headdim, bool deterministic, int window_left,
                  int window_right, int num_sms) {
  // The one choice for both backwards (their d64 / d128 tiles are the same: 128 keys x 128 /
  // 64 queries). A chain beyond the first costs its accumulator's traffic, ~16 bytes per dQ
  // element (zeroed, read into L2 by the first reduce, written back, read by the convert
  // kernel) against a backward of 10 seqlen_k d FLOPs per element: on an H100 (3 TB/s, the
  // Hopper backward ~450 TFLOP/s) 16 / 3e12 / (10 seqlen_k / 450e12) = 240 / seqlen_k of its
  // time, 1.5 % at 16k keys, 6 % at 4k.
  // Descending (a right window bound): each visitor's predecessor reached the query tile a
  // step before it (d128: two), so one accumulator.
  if (!deterministic || window_right >= 0) return 1;
  // Full attention in the rotated walk (at most as many K/V tiles as query tiles and no
  // more than the SMs, dq_order.cuh): with one chain each head's n_tiles CTAs form a ring in
  // which every CTA waits for the next one's previous step, so one late CTA stalls them
  // all; the Hopper backward measured 1.2-1.3x the default time up to 32 K/V tiles (4k
  // keys), 1.33x at 64, 1.80x at 128 (H100, d128, benchmarks/NOTES.md). With c chains a
  // CTA waits for its chain's previous visitor, which came c steps before it (c - 1 steps
  // of slack): 2 chains from 8k keys (3 % cost), 4 from 16k (3 x 1.5 %); below 8k keys the
  // ring costs less than a chain would.
  const int kd = bwd_kernel_head_dim(headdim);
  if (window_left < 0 && kd > 0) {
    const BwdTile tile = bwd_tile(kd);
    const int n_tiles = (seqlen_k + tile.block_n - 1) / tile.block_n;
    if (n_tiles <= (seqlen_q + tile.block_m - 1) / tile.block_m && n_tiles <= num_sms) {
      return seqlen_k >= 16384 ? 4 : seqlen_k >= 8192 ? 2 : 1;
    }
  }
  // The ascending order, where every K/V tile starts at the same query tile and each CTA
  // runs a step behind its predecessor: chains divide that stagger, and pay from 1024 keys
  // (at 512, 8 tiles, the extra accumulators cost as much memory traffic as the stagger
  // they save: H100, mma.sync backward, benchmarks/NOTES.md).
  return seqlen_k < 1024 ? 1 : kBwdMaxDqChains;
}

int mha_bwd(const BwdParams& params, int device, void* stream, int smem_limit, bool allow_sm90) {
  if (params.dtype == DType::kFloat32) return mha_bwd_fp32(params, device, stream, allow_sm90);
  require(!params.seqused_k && !params.leftpad_k && !params.kv_batch_idx && !params.block_table,
          "the backward takes no KV-cache layout (seqused_k, leftpad, cache batch index, pages)");
  require(!has_bias(params) || (!params.cu_seqlens_q && !params.cu_seqlens_k),
          "an attention bias runs dense attention only: no varlen");

  BwdParams p = checked(params);
  const int kd = bwd_kernel_head_dim(p.headdim);
  require(kd > 0, "the backward supports head dims up to " + std::to_string(bwd_max_head_dim()) +
                      " in this build; got " + std::to_string(p.headdim));
  DeviceGuard guard(device);
  require_supported_device(device);
  require(valid_dq_chains(p.dq_chains),
          "dq_chains must be a power of two in [1, " + std::to_string(kBwdMaxDqChains) + "]");
  p.dq_rotate_tiles = sm_count(device);
  const int smem = bwd_smem_per_block(kd);
  const int smem_max = smem_limit > 0 ? std::min(smem_limit, max_smem_per_block(device))
                                      : max_smem_per_block(device);
  require(smem <= smem_max,
          "the backward for head dim " + std::to_string(p.headdim) + " needs " +
              std::to_string(smem) + " bytes of shared memory per block; GPU " +
              std::to_string(device) + " allows " + std::to_string(smem_max) +
              " (head dims above 128 need an sm_80 or sm_90 class GPU, e.g. A100 or H100)");
  auto s = static_cast<cudaStream_t>(stream);
  // The Hopper backward (unless !allow_sm90) for what it supports
  // (sm90/bwd_config.h) on an sm_90 GPU; the mma.sync backward for everything else, and
  // whatever TMA cannot describe.
  if (allow_sm90 && Sm90BwdHeadDims::dispatch(kd, [](auto) {}) && sm90_bwd_head_dim(kd) &&
      compute_capability(device) == 90 && sm90_bwd_supports(p, kd) &&
      sm90_bwd_smem_bytes(kd) <= smem_max) {
    bool ran = false;
    Sm90BwdHeadDims::dispatch(kd, [&](auto head_dim) {
      dispatch_dtype(p.dtype, [&](auto element) {
        ran = run_bwd_sm90<decltype(element), decltype(head_dim)::value>(p, s);
      });
    });
    if (ran) return 90;
  }
  const bool found = BwdHeadDims::dispatch(kd, [&](auto head_dim) {
    dispatch_dtype(p.dtype, [&](auto element) {
      run_bwd<decltype(element), decltype(head_dim)::value>(p, smem_max, s);
    });
  });
  if (!found) throw std::logic_error("flashattn2: no backward kernel for head dim " + std::to_string(kd));
  return 80;
}

}  // namespace flashattn2
