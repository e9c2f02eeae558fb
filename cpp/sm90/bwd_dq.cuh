// The dQ path of the Hopper backward's d64 / d128 kernel (bwd_kernel, bwd_kernel.cuh), per
// step: a consumer warpgroup's dQ GEMM (dq_gemm: dS K over the block's 128 keys, from sdS[s]
// and sK), thread 128's wait for the query tile's turn in deterministic mode (dq_wait_turn),
// the warps' dQ into dq_accum (dq_accumulate: dq_bulk's staging and one bulk reduce-add per
// warp, or red.add.v4) and, in the kDqWarp instances, producer warp 2's reduces of that
// staging, one per tile where it can (dq_reduce_staged, dq_order_warp's `issue`). The dQ
// order itself (the releases, warp 2's waits): bwd_producer.cuh, common/dq_order.cuh. All
// inlined into the kernel.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// The staging slot (4 KiB, from sDq) of consumer warp (c, w)'s 16 x 64 block of the step's dQ:
// the block's place in the tile's rows of dq_accum (ws_dq_index, a row stride of the kernel's
// head dim): d128 row block w, column chunk c at (2 w + c) 4 KiB; d64 rows 64 c + 16 w at
// (4 c + w) 4 KiB. So a whole tile of a head dim without padding is one bulk op.
template <typename Traits>
__device__ __forceinline__ int dq_slot(int c, int w) {
  return Traits::kDqSplitsRows ? 4 * c + w : 2 * w + c;
}

// kDqWarp, producer warp 2 (lane 0): the dQ reduces of a query tile (dq_tile: the tile's first
// row in the accumulator of the step's head and chain; rows: the tile's rows in the sequence).
// The consumer warps' staged 16 x 64 blocks (dq_slot), one bulk reduce for the whole tile
// where all its rows exist and the head dim is the kernel's (the accumulator's rows then as
// contiguous as the staging), else one per block (kFirstStore and `store`: bulk stores, the
// tile's first visitor).
template <typename Traits, bool kFirstStore>
__device__ __forceinline__ void dq_reduce_staged(const BwdParams& p, uint32_t sDq, float* dq_tile,
                                                 int rows, bool store) {
  auto bulk = [&](float* dst, uint32_t src, int bytes) {
    if (kFirstStore && store)
      bulk_store_f32(dst, src, bytes);
    else
      bulk_reduce_add_f32(dst, src, bytes);
  };
  if (rows >= Traits::kBlockM && p.headdim == Traits::kHeadDim) {
    bulk(dq_tile, sDq, Traits::kDqStageBytes);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4 * Traits::kConsumers; ++i) {  // consumer warp i: 4 c + w
    const int c = i / 4, w = i % 4;
    const int dq_chunk = Traits::kDqSplitsRows ? 0 : c;
    const int row = (Traits::kDqSplitsRows ? 64 * c : 0) + 16 * w;
    const int tiles = min(8, (p.headdim - 64 * dq_chunk) / 8);
    if (row < rows && tiles > 0)
      bulk(dq_tile + row * p.headdim + 16 * 64 * dq_chunk,
           sDq + dq_slot<Traits>(c, w) * Traits::kDqWarpBytes, tiles * 128 * 4);
  }
}

// dQ (query rows dq_q0..+64 x columns 64 dq_chunk..+64) = dS K over the block's 128
// keys: A = dS^T's query chunk read M-major (k16 step kk: keys 16 kk..+15), B = K's
// column chunk (MN-major). sdS_t: the step's sdS buffer. Committed, not waited for.
template <typename Traits, typename Element>
__device__ __forceinline__ void dq_gemm(float (&acc_dq)[32], uint32_t sdS_t, uint32_t sK,
                                        int dq_q0, int dq_chunk) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockN / 16; ++kk) {
    const int key = 16 * kk;
    const uint64_t a = desc_mn_major(sdS_t + (dq_q0 / 64) * Traits::kDSChunkBytes +
                                     key * kSwizzleBytes, Traits::kDSChunkBytes);
    const uint64_t b = desc_mn_major(sK + dq_chunk * Traits::kKChunkBytes +
                                     key * kSwizzleBytes, Traits::kKChunkBytes);
    Wgmma<64, Element>::template ss<1, 1>(acc_dq, a, b, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// Deterministic (while the dQ GEMM runs): thread 128 waits for this query tile's
// turn in the CTA's chain (every warp of the chain's visitors before this CTA has
// released) and leaves the counter's address for the releases (dq_release); the
// second barrier passes both on.
template <typename Traits, bool kVarlen>
__device__ __forceinline__ void dq_wait_turn(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                             uint32_t sDqCounter, int head, int n_block,
                                             int m_block) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  // (the order rebuilt here from the params rather than kept live across the loop)
  const DqOrder<kBlockM, kBlockN> order_t(p, seq.seqlen_q(), seq.seqlen_k(),
                                          (seq.seqlen_q() + kBlockM - 1) / kBlockM, true);
  int* const counter = seq.dq_counter0(head, n_block) + m_block;
  st_shared_u64(sDqCounter, reinterpret_cast<uint64_t>(counter));
  dq_order_step(nullptr, counter, 4 * Traits::kConsumers * order_t.turn(n_block, m_block));
}

// The warp's dQ (acc_dq of the warpgroup's tile: query rows m0 + dq_q0..+64, columns
// 64 dq_chunk..+64) into dq_accum, in step t (t > 0: step t - 1's staging may still be read).
template <typename Traits, bool kDqWarp, bool kVarlen>
__device__ __forceinline__ void dq_accumulate(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                              const float (&acc_dq)[32], uint32_t sDq, int m0,
                                              int dq_q0, int dq_chunk, int consumer,
                                              int warp_in_wg, int lane, int head, int n_block,
                                              int t) {
  // dq_accum: 16 x 8 blocks in accumulator order (ws_dq_index): the warp's 16 rows x 64
  // columns are 8 n8 tiles of 128 floats, contiguous, the lane's 4 floats of a tile at
  // 4 lane. Rows past seqlen_q in a 16-row block add zeros (P = 0) to the padding; blocks
  // past it and columns past a padded head dim are skipped.
  const int dq_row = m0 + dq_q0 + 16 * warp_in_wg;
  if constexpr (Traits::kDqBulk) {
    // Stage the 4 KiB in shared memory (each store: the warp's 512 contiguous bytes) and
    // add them with one bulk reduce from lane 0; before the stores, lane 0 waits until
    // the previous step's reduce has read the staging buffer.
    const uint32_t sdq = sDq + dq_slot<Traits>(consumer, warp_in_wg) * Traits::kDqWarpBytes;
    if (kDqWarp) {
      if (t > 0) named_sync(kBarDqEmpty, 256 + 32);  // warp 2's reduces read step t - 1's
    } else {
      if (lane == 0) tma_store_wait_read();
      __syncwarp();
    }
    if (dq_row < seq.seqlen_q()) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        st_shared_v4(sdq + 4 * (128 * nt + 4 * lane), acc_dq[4 * nt], acc_dq[4 * nt + 1],
                     acc_dq[4 * nt + 2], acc_dq[4 * nt + 3]);
      fence_proxy_async();  // the generic-proxy stores, before the async-proxy read
      __syncwarp();
      const int tiles = min(8, (p.headdim - 64 * dq_chunk) / 8);
      if (!kDqWarp && lane == 0 && tiles > 0) {
        float* dq =
            p.dq_accum + (seq.ws_row0(head) + dq_row) * p.headdim + 16 * 64 * dq_chunk;
        if (p.deterministic) {
          fence_proxy_async_global();  // after the turn's acquire
          dq += (n_block & (p.dq_chains - 1)) * ws_rows(p) * p.headdim;  // dq_chain's
        }
        bulk_reduce_add_f32(dq, sdq, tiles * 128 * 4);
        tma_store_commit();
      }
    }
    if (kDqWarp) named_arrive(kBarDqFull, 256 + 32);  // staged (and fenced) for warp 2
  } else if (dq_row < seq.seqlen_q()) {
    float* const dq = p.dq_accum + (seq.ws_row0(head) + dq_row) * p.headdim +
                      16 * 64 * dq_chunk + 4 * lane;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if (64 * dq_chunk + 8 * nt < p.headdim) {
        ptx::red_add_v4(dq + 128 * nt, acc_dq[4 * nt], acc_dq[4 * nt + 1],
                        acc_dq[4 * nt + 2], acc_dq[4 * nt + 3]);
      }
    }
  }
}

}  // namespace sm90
}  // namespace flashattn2
