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
  // Stream-K (args.sk_units > 0, a static walk): from tile sk_first on, this CTA's share of
  // the units [u, u_end), whole tiles and at most a piece at each end (fwd_config.h), kept in
  // shared memory (sm.sk_cursor()) rather than in two of the producer's 24 registers.
  auto cursor = [&](int& u, int& u_end) {
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(u), "=r"(u_end)
                 : "r"(sm.sk_cursor()) : "memory");
  };
  if (args.sk_units > 0) {
    // (units x grid < 2^31: fwd_config.h)
    const int u = int(blockIdx.x) * args.sk_units / int(gridDim.x);
    const int u_end = (int(blockIdx.x) + 1) * args.sk_units / int(gridDim.x);
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(sm.sk_cursor()), "r"(u), "r"(u_end)
                 : "memory");
  }
  // The walk: tile blockIdx.x first, then the next of a static stride (grid; with a stream-K
  // tail, this CTA's pieces from sk_first on) or of the
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
    const bool stream_k = args.sk_units > 0 && tile >= args.sk_first;
    if (stream_k) {  // (the tile of this CTA's next unit, or the end)
      int u, u_end;
      cursor(u, u_end);
      tile = u < u_end ? args.sk_first + u / args.sk_blocks : args.tiles;
    }
    mbar_wait(sm.tile_empty(walk), ((walk >> 1) & 1) ^ 1);
    if (tile >= args.tiles) {
      Work::template store<0>(sm.pub_slot(walk), -1);  // (the end)
      mbar_arrive(sm.tile_full(walk));
      break;
    }
    Work w(args, tile, sm.pub_slot(walk));
    if (stream_k) {  // (its units of the tile, from the cursor again: fewer live registers)
      int u, u_end;
      cursor(u, u_end);
      const int blocks = args.sk_blocks;
      const int k_lo = u - (tile - args.sk_first) * blocks;
      const int k_hi = min(blocks, k_lo + u_end - u);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sm.sk_cursor()), "r"(u + k_hi - k_lo)
                   : "memory");
      w.take_units(k_lo, k_hi, blocks, sm.pub_slot(walk));
    }
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
