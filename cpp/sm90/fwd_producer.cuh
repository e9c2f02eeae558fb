// The Hopper forward's producer (fwd_kernel.cuh's tiling block): one thread of warpgroup 0
// walks the CTA's tiles, publishes each tile's work to the consumers and issues its TMA loads
// (Q once per tile into the Q ring, then K and V per key step into the stages), each behind
// the barrier that frees its buffer.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/flash.h"
#include "sm90/fwd_tile.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

template <typename Traits, typename Smem>
__device__ __forceinline__ void produce_tiles(const FwdArgs& args, const Smem& sm) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kQBufs = Traits::kQBufs;
  using Work = FwdTileWork<kBlockM, kBlockN>;
  const FwdParams& p = args.p;
  tma_prefetch(&args.q);
  tma_prefetch(&args.k);
  tma_prefetch(&args.v);
  const int group = p.nheads / p.nheads_k;
  int j = 0, t = 0;  // key steps and tiles of this CTA so far
  // The walk: tile blockIdx.x first, then the next of a static stride (grid) or of the
  // shared counter (dynamic: whichever CTA is free takes it); each index is published
  // to the consumers, the past-the-end one too (they stop on it). The next tile is claimed
  // once this one's loads are issued (kStages steps before its end: the next Q still loads
  // under this tile), not as this one starts: a CTA then never holds a claimed tile for a
  // whole long tile while others run dry at the tail.
  for (int walk = 0, tile = blockIdx.x;; ++walk) {
    if (walk > 0) {
      if (args.tile_counter) {
        // One claim per tile the grid runs, so the claim of value tiles - 1 is the
        // launch's last: it sets the counter back to 0 for the next launch (the host keeps
        // one per stream instead of zeroing a fresh one before every launch).
        const int claim = atomicAdd(args.tile_counter, 1);
        if (claim == args.tiles - 1) atomicExch(args.tile_counter, 0);
        tile = int(gridDim.x) + claim;
      } else {
        tile += int(gridDim.x);
      }
    }
    mbar_wait(sm.tile_empty(walk), ((walk >> 1) & 1) ^ 1);
    if (tile >= args.tiles) {
      Work::template store<0>(sm.pub_slot(walk), -1);  // (the end)
      mbar_arrive(sm.tile_full(walk));
      break;
    }
    const Work w(args, tile, sm.pub_slot(walk));
    mbar_arrive(sm.tile_full(walk));
    if (w.empty()) continue;
    // Dense tensors are 4-D (d, rows, heads, batch); varlen ones have one batch entry
    // and the sequence's rows start at its offset (SeqInfo).
    const int q_batch = p.cu_seqlens_q ? 0 : w.batch;
    const int k_batch = p.cu_seqlens_k ? 0 : w.seq.kv_batch;
    const int qb = t % kQBufs;
    mbar_wait(sm.q_empty(qb), ((t++ / kQBufs) & 1) ^ 1);
    mbar_arrive_expect_tx(sm.q_full(qb), Traits::kQBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      tma_load(sm.q + qb * Traits::kQBytes + c * Traits::kQChunkBytes, &args.q, c * kChunkCols,
               int(w.seq.q_row0) + w.m_block * kBlockM, w.head, q_batch, sm.q_full(qb));
    for (int n_block = w.n_block_max - 1; n_block >= w.n_block_min; --n_block, ++j) {
      const int s = j % kStages;
      const uint32_t phase = (j / kStages) & 1;
      const int row = int(w.seq.k_row0) + n_block * kBlockN;
      // K, then V, each into stage s of its buffers once the consumers freed it.
      auto load = [&](const CUtensorMap* map, uint32_t buffers, uint32_t empty, uint32_t full) {
        mbar_wait(empty, phase ^ 1);
        mbar_arrive_expect_tx(full, Traits::kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load(buffers + s * Traits::kKVBytes + c * Traits::kKVChunkBytes, map,
                   c * kChunkCols, row, w.head / group, k_batch, full);
      };
      load(&args.k, sm.k, sm.k_empty(s), sm.k_full(s));
      load(&args.v, sm.v, sm.v_empty(s), sm.v_full(s));
    }
  }
}

}  // namespace sm90
}  // namespace flashattn2
