// Backward tile sizes: constexpr functions read by the host (launch, the shared-memory
// check) and by the kernel (BwdTraits, bwd_kernel.cuh), so the two agree.
#pragma once
#include <cstdint>

#include "common/workspace.h"
#include "sm80/fwd_config.h"

namespace flashattn2 {

// One CTA owns block_n key rows; each step walks block_m query rows. The warps tile the
// three products (bwd_kernel.cuh): S^T / dP^T and dK / dV as (block_n / 32 warps along the
// keys, 32 keys each) x (the rest along queries resp. head-dim columns); dQ as dq_warps_m
// warps along queries x the rest along columns.
struct BwdTile {
  int block_m;     // query rows per step
  int block_n;     // key rows per CTA
  int n_warps;
  int min_blocks;  // CTAs per SM the register allocation must allow (__launch_bounds__)
  int dq_warps_m;  // warps along the query rows of dQ
  int q_stages;    // buffers of the query tile (Q, dO, LSE, dsum): 2 prefetch a step ahead
  bool stmatrix;   // sm_90: P^T / dS^T to shared memory by stmatrix.x4 (else 4-byte stores)
};

// The tile of head dim d. `small_smem`: the variant for GPUs whose blocks get at most 99 KiB
// (sm_86 / sm_89); it differs only where the full tile needs more (d <= 64, d128). H100
// bf16 figures in benchmarks/NOTES.md.
//  - d <= 64: 128 keys x 128 queries, 8 warps (32 x 64 blocks of S^T / dP^T per warp), two
//    query-tile stages: twice the MMAs per step of a 64-query step for the same per-step
//    overhead (+5 %, deterministic mode 1.05-1.29x instead of 1.14-1.38x). Small-smem
//    variant: 64-query steps.
//  - d128: 128 keys x 64 queries, 8 warps, two stages. 128 keys halve the dQ atomics and
//    the Q / dO reads from L2 per key against 64-key tiles (+10-18 %); the second stage
//    lets the next tile's copy start at the top of a step and saves a barrier (+2-4 %).
//  - d96, and d128 on small-smem GPUs: 64 x 64, 4 warps, 2 CTAs per SM, one stage (a
//    128-key tile would take 104.5 KiB at d96; the d128 one 161 KiB).
//  - d192, d256: 64 x 64, 8 warps, one stage (each warp's dK + dV: 32 keys x d / 4 columns).
//  - d16: the d <= 64 tile; each warp's dK / dV are all 16 columns over its own 64 queries
//    (BwdTraits::kKvSplitQ), dQ 8 warps x 16 rows. Small-smem variant: one query-tile stage.
// Tried and slower at d64: 16 warps (128 registers), 64-key tiles with 2 CTAs per SM.
// stmatrix (H100 A/B): d64 -5.5 % backward time (16 stmatrix instead of 64 stores per
// warp-step, spills 56 -> 28 B), d128 +2.7 % (8 instead of 32), d256 +-0: d <= 64 only.
constexpr BwdTile bwd_tile(int head_dim, bool small_smem = false) {
  return head_dim <= 16                  ? BwdTile{128, 128, 8, 1, 8, small_smem ? 1 : 2, true}
         : head_dim <= 64 && !small_smem ? BwdTile{128, 128, 8, 1, 4, 2, true}
         : head_dim <= 64                 ? BwdTile{64, 128, 8, 1, head_dim <= 32 ? 4 : 2, 2, true}
         : head_dim == 128 && !small_smem ? BwdTile{64, 128, 8, 1, 2, 2, false}
         : head_dim <= 128                ? BwdTile{64, 64, 4, 2, 2, 1, false}
                                          : BwdTile{64, 64, 8, 1, 2, 1, false};
}

// sK, sV [block_n x d], sP, sdS [block_n x block_m] (2-byte elements), and per query-tile
// stage sQ, sdO [block_m x d] and LSE, dsum [block_m] f32 (d: smem_cols, 32 for d16): d16
// 114 KiB (small-smem 97 KiB), d64 162 KiB, d128 161 KiB (small-smem variants 97 KiB,
// 80.5 KiB), d192 112.5 KiB, d256 144.5 KiB.
constexpr int bwd_smem_bytes(int head_dim, bool small_smem = false) {
  return 2 * (2 * bwd_tile(head_dim, small_smem).block_n * smem_cols(head_dim) +
              2 * bwd_tile(head_dim, small_smem).block_n * bwd_tile(head_dim, small_smem).block_m) +
         bwd_tile(head_dim, small_smem).q_stages * bwd_tile(head_dim, small_smem).block_m *
             (4 * smem_cols(head_dim) + 2 * int(sizeof(float)));
}

// The bias instance's staged bias tile (bwd_kernel.cuh kBiasStaged), past bwd_smem_bytes:
// block_m queries x block_n keys of 2-byte elements (d64 32 KiB, d128 16 KiB). Only where the
// GPU's blocks have room for both (not the small-smem tiles; d64 needs an H100's 227 KiB).
constexpr int bwd_bias_smem_bytes(int head_dim, bool small_smem = false) {
  return 2 * bwd_tile(head_dim, small_smem).block_m * bwd_tile(head_dim, small_smem).block_n;
}

}  // namespace flashattn2
