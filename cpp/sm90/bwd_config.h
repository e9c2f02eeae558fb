// Hopper backward (issue 18, first version, GPU-validated 2026-11-25; benchmarks/NOTES.md "Hopper
// backward"): the tile, its budgets, and the host's test of which backwards it serves.
#pragma once

#include "built_config.h"
#include "common/flash.h"

namespace flashattn2 {

// One CTA per (128-key block, KV head, batch): a producer warpgroup (TMA of K, V once and of
// Q, dO per query step; LSE and dsum by one warp) and two consumer warpgroups of 64 keys.
struct Sm90BwdTile {
  int block_m;        // query rows per step
  int block_n;        // keys per CTA = 64 per consumer warpgroup
  int stages;         // shared-memory stages of Q, dO, LSE, dsum
  int consumer_regs;  // setmaxnreg of a consumer warpgroup
  int producer_regs;  // setmaxnreg of the producer warpgroup
};

// Query rows per step: d128 64; d64 128, so that a step's GEMMs are as large as d128's (S^T,
// dP^T m64 n128 per warpgroup, dV / dK with K = 128) for the same per-step costs (barriers,
// stage hand-offs, dQ reduces): with 64 (0.88-0.92x the mma.sync backward on an H100,
// benchmarks/NOTES.md) those weighed twice as much as at d128.
// Registers (of 240): d128: dK + dV 128 f32, S^T + dP^T 64, P^T + dS^T A fragments 32, dQ 32
// (after S^T / dP^T die); d64: dK + dV 64, S^T + dP^T 128, P^T + dS^T 64, dQ 32. Producer
// 24: 24 + 2 x 240 = 3 x 168, the launch's allocation at 384 threads (the setmaxnreg rule of
// sm90/fwd_config.h).
// Shared memory (bf16): K, V 2 x 128 d; per stage Q, dO 2 x block_m d and LSE, dsum
// 2 x block_m f32; dS^T 2 x [128 keys x block_m] (double-buffered so that one named barrier
// per step suffices); dq_bulk staging; mbarriers and the deterministic order's counter
// address; 1 KiB alignment: d128 194 KiB, d64 195 KiB (kBias: below).
// d256 (the `d256` item, sm90/bwd_d256.cuh): 64 keys per CTA, 64 query rows per step; its
// two consumer warpgroups split dK / dV by columns (128 each: 64 + 64 f32).
constexpr Sm90BwdTile sm90_bwd_tile(int head_dim) {
  return head_dim == 256 ? Sm90BwdTile{64, 64, 2, 240, 24}
                         : Sm90BwdTile{head_dim == 64 ? 128 : 64, 128, 2, 240, 24};
}

// Kernel head dims of the sm90 backward (built: 128, and 64 with d64 of
// FLASHATTN2_SM90_BWD_EXPERIMENTAL; 256 with its d256; built_config.h
// FLASHATTN2_SM90_BWD_HEAD_DIMS).
constexpr bool sm90_bwd_head_dim(int kernel_head_dim) {
  return kernel_head_dim == 64 || kernel_head_dim == 128 ||
         (FLASHATTN2_SM90_BWD_D256 && kernel_head_dim == 256);
}

// d256 (sm90/bwd_d256.cuh): K, V [64 x 256]; per stage Q, dO [64 x 256], LSE, dsum [64] f32;
// sP^T, sdS^T 2 x [64 keys x 64 queries]; mbarriers; 1 KiB alignment: 231,496 B of 232,448.
constexpr int sm90_bwd_d256_smem_bytes() {
  return 2 * 256 * (2 * 64 + 2 * 2 * 64) + 2 * 2 * 64 * 64 * 2 + 2 * 64 * 8 + 8 * (1 + 4 * 2) +
         1024;
}

// dq_bulk (FLASHATTN2_SM90_BWD_EXPERIMENTAL, on by default): each consumer warp stages its
// 16 x 64 f32 block of dQ per step (4 KiB) for a bulk reduce-add (its own, or in the kDqWarp
// instances warp 2's, one per tile where it can: bwd_dq.cuh dq_reduce_staged).
constexpr int sm90_bwd_dq_stage_bytes(int head_dim) {
  return FLASHATTN2_SM90_BWD_DQ_BULK ? (sm90_bwd_tile(head_dim).block_n / 64) * 4 * 16 * 64 * 4
                                     : 0;
}

constexpr int sm90_bwd_smem_bytes(int head_dim) {
  if (head_dim == 256) return sm90_bwd_d256_smem_bytes();
  return 2 * head_dim * (2 * sm90_bwd_tile(head_dim).block_n +
                         2 * sm90_bwd_tile(head_dim).stages * sm90_bwd_tile(head_dim).block_m) +
         2 * 2 * sm90_bwd_tile(head_dim).block_n * sm90_bwd_tile(head_dim).block_m +
         sm90_bwd_dq_stage_bytes(head_dim) +
         sm90_bwd_tile(head_dim).stages * sm90_bwd_tile(head_dim).block_m * 8 +
         8 * (2 + 4 * sm90_bwd_tile(head_dim).stages) + 1024;
}

// kBias: each consumer warpgroup stages the bias of its 64 keys x the step's block_m queries
// (2-byte, 128-byte rows) after the barriers, + 128 bytes to align it. d128 fits (210 KiB);
// d64 with both dS^T buffers would need 227.2 KiB of the 227, so its bias instance keeps one
// (sm90_bwd_bias_one_ds; one more barrier hand-off per step, bwd_kernel.cuh): 195 KiB.
constexpr int sm90_bwd_bias_tiles_bytes(int head_dim) {
  return (sm90_bwd_tile(head_dim).block_n / 64) * 64 * sm90_bwd_tile(head_dim).block_m * 2 + 128;
}
constexpr bool sm90_bwd_bias_one_ds(int head_dim) {
  return sm90_bwd_smem_bytes(head_dim) + sm90_bwd_bias_tiles_bytes(head_dim) > 227 * 1024;
}
// Shared memory of the kBias instance beyond sm90_bwd_smem_bytes (negative: less).
constexpr int sm90_bwd_bias_bytes(int head_dim) {
  return sm90_bwd_bias_tiles_bytes(head_dim) -
         (sm90_bwd_bias_one_ds(head_dim)
              ? 2 * sm90_bwd_tile(head_dim).block_n * sm90_bwd_tile(head_dim).block_m
              : 0);
}

// The backwards the sm90 kernel serves (everything else runs the mma.sync backward of
// cpp/sm80): dense fp16 / bf16 of kernel head dims 128 (97-128) and, where built (d64),
// 64 (33-64), full or causal attention, MHA or GQA; and with the extensions of
// FLASHATTN2_SM90_BWD_EXPERIMENTAL (validated on an H100, on by default): window, any
// sliding window, not only causal or full (the kernel's masks and query-block range take
// both bounds); varlen, packed sequences (bwd_kernel.cuh BwdSeq<true>); mods, softcap and
// ALiBi; an attention bias (below); deterministic mode, in every dQ order and chain count of
// common/dq_order.cuh (with dq_bulk). Not served: dropout, other head dims.
// An attention bias on the Hopper backward (its kBias instance, with the mods one built):
// dense, rows 16-byte aligned with unit key stride (staged in shared memory by 16-byte
// copies); its gradient (dbias: the kDbias instance) only where BwdParams::sm90_dbias asks for
// it, without softcap (dbias is dS before the softcap factor, which the kernel folds into
// P^T), in the attention's dtype (with 16-byte aligned rows, below) or float32 (one instance
// each; a float16 gradient of a bfloat16 attention or the reverse does not); the rest runs the
// mma.sync backward. kernel_head_dim 256 (d256): no bias.
// has_dbias: a bias gradient is asked for; dbias_f32: in float32; dbias_add: added by atomics
// (each false without FLASHATTN2_BIAS).
inline bool has_dbias(const BwdParams& p) {
#if FLASHATTN2_BIAS
  return p.dbias != nullptr;
#else
  return (void)p, false;
#endif
}
inline bool dbias_f32(const BwdParams& p) {
#if FLASHATTN2_BIAS
  return p.dbias_dtype == static_cast<int>(DType::kFloat32);
#else
  return (void)p, false;
#endif
}
inline bool dbias_add(const BwdParams& p) {
#if FLASHATTN2_BIAS
  return p.dbias_add;
#else
  return (void)p, false;
#endif
}
// A dbias in the attention's dtype is stored 16 bytes at a time (sm90/bwd_consumer.cuh
// store_dbias_tile): 16-byte aligned rows of at least seqlen_k rounded up to 8 elements (the
// last chunk's keys past seqlen_k write 0 into the padding; bias.dbias_target pads so).
inline bool dbias_rows_16b(const BwdParams& p) {
#if FLASHATTN2_BIAS
  return reinterpret_cast<uintptr_t>(p.dbias) % 16 == 0 && p.dbias_row_stride % 8 == 0 &&
         p.dbias_head_stride % 8 == 0 && p.dbias_batch_stride % 8 == 0 &&
         p.dbias_row_stride >= (p.seqlen_k + 7) / 8 * 8;
#else
  return (void)p, false;
#endif
}
inline bool sm90_bwd_takes_bias(const BwdParams& p, int kernel_head_dim) {
#if FLASHATTN2_BIAS
  const bool dbias_ok =
      p.sm90_dbias && p.softcap == 0.f &&
      (dbias_f32(p) || (p.dbias_dtype == static_cast<int>(p.dtype) && dbias_rows_16b(p)));
  return FLASHATTN2_SM90_BWD_MODS && sm90_bwd_head_dim(kernel_head_dim) &&
         (!has_dbias(p) || dbias_ok) && !p.cu_seqlens_q && !p.cu_seqlens_k &&
         bias_rows_16b(p);
#else
  return (void)p, (void)kernel_head_dim, false;
#endif
}

// The d256 kernel: dense, no softcap / ALiBi / bias (design/bwd256.md); deterministic mode
// in builds with dq_bulk and dq_warp (its kDet instance: producer warp 2 runs the dQ order;
// it has no consumer-warp variant, so BwdParams::dq_warp does not apply).
inline bool sm90_bwd_d256_supports(const BwdParams& p) {
  return !p.cu_seqlens_q && !p.cu_seqlens_k && p.softcap == 0.f && !p.alibi_slopes &&
         !has_bias(p) &&
         (!p.deterministic || (FLASHATTN2_SM90_BWD_DQ_BULK && FLASHATTN2_SM90_BWD_DQ_WARP));
}

// kernel_head_dim: 64, 128 or 256 (sm90_bwd_head_dim), the tile's.
inline bool sm90_bwd_supports(const BwdParams& p, int kernel_head_dim) {
  const bool causal_or_full = p.window_left < 0 && p.window_right <= 0;
  const bool dense = !p.cu_seqlens_q && !p.cu_seqlens_k;
  return (dense || FLASHATTN2_SM90_BWD_VARLEN) && (causal_or_full || FLASHATTN2_SM90_BWD_WINDOW) &&
         ((p.softcap == 0.f && !p.alibi_slopes) || FLASHATTN2_SM90_BWD_MODS) &&
         p.dropout_threshold == 0 && (!has_bias(p) || sm90_bwd_takes_bias(p, kernel_head_dim)) &&
         (!p.deterministic || FLASHATTN2_SM90_BWD_DQ_BULK) &&
         (kernel_head_dim != 256 || sm90_bwd_d256_supports(p));
}

}  // namespace flashattn2
