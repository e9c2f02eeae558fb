// The Hopper backward's producer warpgroup, shared by bwd_kernel (d64 / d128, bwd_kernel.cuh)
// and bwd_kernel_d256 (bwd_d256.cuh): the stages it fills and their mbarriers (BwdStages),
// warp 0's TMA loads (load_tiles: K, V once; Q, dO per step), warp 1's LSE / dsum rows
// (load_rows), and the deterministic dQ order: warp 2's (dq_order_warp: the kDqWarp and d256
// kDet instances) and the consumers' release of it otherwise (dq_release). All inlined
// (dq_release excepted, below): the producer warpgroup runs on 24 registers (setmaxnreg).
#pragma once
#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/workspace.h"
#include "sm90/bwd_traits.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"

namespace flashattn2 {
namespace sm90 {

// The stages in shared memory (base 1024-aligned): sK, sV [kBlockN x d], then per stage s
// sQ, sdO [kBlockM x d] at q + s kQBytes, dout + s kQBytes (each Traits::kChunks column chunks
// of TMA's 128-byte swizzle), then `own_bytes` of the kernel's own (its dS^T, ...: at own),
// then LSE, dsum [kBlockM] f32 of stage s at lse(s), dsum(s), then the mbarriers: kv_full
// (K, V landed), per stage q_full, do_full (TMA bytes), lse_full (warp 1's 32 lanes) and empty
// (the stage read by the consumers); the kernel's own from end() on.
template <typename Traits>
struct BwdStages {
  uint32_t k, v, q, dout, own, rows, bars;
  __device__ __forceinline__ BwdStages(uint32_t base, int own_bytes)
      : k(base),
        v(k + Traits::kKBytes),
        q(v + Traits::kKBytes),
        dout(q + Traits::kStages * Traits::kQBytes),
        own(dout + Traits::kStages * Traits::kQBytes),
        rows(own + own_bytes),
        bars(rows + Traits::kStages * 2 * Traits::kRowBytes) {}
  __device__ __forceinline__ uint32_t lse(int s) const { return rows + 2 * s * Traits::kRowBytes; }
  __device__ __forceinline__ uint32_t dsum(int s) const {
    return rows + (2 * s + 1) * Traits::kRowBytes;
  }
  __device__ __forceinline__ uint32_t kv_full() const { return bars; }
  __device__ __forceinline__ uint32_t q_full(int s) const { return bars + 8 * (1 + s); }
  __device__ __forceinline__ uint32_t do_full(int s) const {
    return bars + 8 * (1 + Traits::kStages + s);
  }
  __device__ __forceinline__ uint32_t lse_full(int s) const {
    return bars + 8 * (1 + 2 * Traits::kStages + s);
  }
  __device__ __forceinline__ uint32_t empty(int s) const {
    return bars + 8 * (1 + 3 * Traits::kStages + s);
  }
  __device__ __forceinline__ uint32_t end() const { return bars + 8 * (1 + 4 * Traits::kStages); }
  // Thread 0, before mbar_fence_init and the block's first barrier: `empty_arrivals` per
  // phase of a stage's empty barrier.
  __device__ __forceinline__ void init(int empty_arrivals) const {
    mbar_init(kv_full(), 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      mbar_init(q_full(s), 1);
      mbar_init(do_full(s), 1);
      mbar_init(lse_full(s), 32);
      mbar_init(empty(s), empty_arrivals);
    }
  }
};

// Warp 0, lane 0 (a CTA with steps): K, V of the key block (first row n0) once, then Q and dO
// of each step (the query heads of K/V head head_k, group each) into its stage once the
// consumers have released it.
template <typename Traits, bool kVarlen>
__device__ __forceinline__ void load_tiles(const BwdArgs& args, const BwdSeq<kVarlen>& seq,
                                           const BwdRange& range, const BwdStages<Traits>& st,
                                           int n0, int head_k, int group) {
  tma_prefetch(&args.q);
  tma_prefetch(&args.dout);
  mbar_arrive_expect_tx(st.kv_full(), 2 * Traits::kKBytes);
#pragma unroll
  for (int c = 0; c < Traits::kChunks; ++c) {
    tma_load(st.k + c * Traits::kKChunkBytes, &args.k, c * kChunkCols, seq.k_row0() + n0, head_k,
             seq.tma_batch_k(), st.kv_full());
    tma_load(st.v + c * Traits::kKChunkBytes, &args.v, c * kChunkCols, seq.k_row0() + n0, head_k,
             seq.tma_batch_k(), st.kv_full());
  }
  int head = head_k * group, m_block = range.m_start;
  for (int t = 0; t < range.steps; ++t) {
    const int s = t % Traits::kStages;
    mbar_wait(st.empty(s), ((t / Traits::kStages) & 1) ^ 1);
    mbar_arrive_expect_tx(st.q_full(s), Traits::kQBytes);
#pragma unroll
    for (int c = 0; c < Traits::kChunks; ++c)
      tma_load(st.q + s * Traits::kQBytes + c * Traits::kQChunkBytes, &args.q, c * kChunkCols,
               seq.q_row0() + m_block * Traits::kBlockM, head, seq.tma_batch_q(), st.q_full(s));
    mbar_arrive_expect_tx(st.do_full(s), Traits::kQBytes);
#pragma unroll
    for (int c = 0; c < Traits::kChunks; ++c)
      tma_load(st.dout + s * Traits::kQBytes + c * Traits::kQChunkBytes, &args.dout,
               c * kChunkCols, seq.q_row0() + m_block * Traits::kBlockM, head, seq.tma_batch_q(),
               st.do_full(s));
    range.next(head, m_block);
  }
}

// Warp 1: the LSE (+inf past seqlen_q, so that P = 0 on the zero-filled rows) and dsum of each
// step into its stage; every lane arrives after its stores (release / acquire).
// PDL (BwdParams::pdl, bwd_launch.cuh): every lane waits for the preprocess (dsum; the LSE is
// the forward's) in every CTA, also without steps, so that the grid ends after it. The
// consumers touch the preprocess's dq_accum and counters only after their first lse_full wait,
// which acquires what these lanes' arrivals release: they are ordered after this wait. Warp
// 0's TMA loads read only inputs (Q, dO, K, V) and do not wait.
template <typename Traits, bool kVarlen>
__device__ __forceinline__ void load_rows(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                          const BwdRange& range, const BwdStages<Traits>& st,
                                          int batch, int head0, int lane) {
  ptx::griddep_wait();
  int head = head0, m_block = range.m_start;
  for (int t = 0; t < range.steps; ++t) {
    const int s = t % Traits::kStages;
    mbar_wait(st.empty(s), ((t / Traits::kStages) & 1) ^ 1);
    const float* lse =
        p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_row0();
    const float* dsum = p.dsum + seq.ws_row0(head);
#pragma unroll
    for (int i = 0; i < Traits::kBlockM / 32; ++i) {
      const int r = 32 * i + lane, row = m_block * Traits::kBlockM + r;
      const bool valid = row < seq.seqlen_q();
      const float l = valid ? lse[row] : INFINITY;
      const float d = valid ? dsum[row] : 0.f;
      st_shared(st.lse(s) + 4 * r, l);
      st_shared(st.dsum(s) + 4 * r, d);
    }
    mbar_arrive(st.lse_full(s));
    range.next(head, m_block);
  }
}

// Deterministic mode, lane 0 of a consumer warp: once its last bulk reduce is complete, adds
// 1 (release) to the dQ-order counter whose address thread 128 left at shared address `slot`.
// Not inlined: inline, the address arithmetic sat in the step's register peak (with the dQ
// chains' term the plain d128 instance spilled 100 bytes; as a call it spills none).
static __device__ __noinline__ void dq_release(uint32_t slot) {
  tma_store_wait();
  fence_proxy_async_global();
  ptx::red_release_add(reinterpret_cast<int*>(ld_shared_u64(slot)), 1);
}

// kDqWarp: producer warp 2 issues the dQ reduces of every step, off the consumers' path. Per
// step, lane 0 waits (deterministic mode) for the query tile's turn (1 add per earlier visitor
// of the chain), then for the consumers' staged dQ (kBarDqFull), issues their bulk reduces
// (issue(dq_tile, rows, t): dq_tile the accumulator's first row of the tile in the step's
// head and chain, rows the tile's rows in the sequence), hands the staging back once it is
// read (read(t), then kBarDqEmpty) and (deterministic) releases the tile once the reduces are
// complete: the global round trips overlap the consumers' next step. Without deterministic
// mode only the reduces and the hand-back remain (measured: the deterministic d64 backward on
// this path ran at 0.88-0.99x the default one with the reduces on the consumers, H100
// 2026-11-26). Shared by bwd_kernel (a staging buffer of its own; read: nothing more) and
// bwd_kernel_d256's deterministic instance (staging in the stage's dead sQ / sdO chunks;
// read: the stage's release). kBlockM, kBlockN: the tile (the counters are per 64 query rows:
// d64's 128-row tiles use the first half of them). Inlined, with the counter and accumulator
// of the step's head stepped per head and everything else rebuilt from the params per step:
// the producer warpgroup has 24 registers (the consumers need their 240; at 232 ptxas
// serialises their wgmma, C7512).
// kFirstStore (BwdParams::dq_first_store_rows, dq_accum not zeroed): the first visitor of a
// tile in its chain stores (issue(..., t, true)), the others add. Deterministic: the visitor
// whose turn is 0. Otherwise lane 0 takes a ticket (atomic add of 1 to the tile's counter,
// which nothing else uses then) while the consumers compute; ticket 0 stores, then, once the
// store is complete, adds kStored (release); the others wait for kStored (acquire) before
// adding. No deadlock: a visitor waits only for one that took its ticket earlier, which is
// resident and itself waits only for earlier tickets. The convert reads a tile only where
// its counter is non-zero (a visitor came).
template <int kBlockM, int kBlockN, bool kVarlen, bool kFirstStore = false, typename Issue,
          typename Read>
__device__ __forceinline__ void dq_order_warp(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                              int head0, int n_block, const BwdRange& range,
                                              int lane, Issue&& issue, Read&& read) {
  int* counter = seq.dq_counter0(head0, n_block);  // the step's head's first tile
  float* dq = dq_chain(p, p.deterministic ? n_block & (p.dq_chains - 1) : 0) +
              seq.ws_row0(head0) * p.headdim;
  constexpr int kStored = 1 << 20;  // (more than any tile's visitors)
  int m_block = range.m_start;
  for (int t = 0; t < range.steps; ++t) {
    [[maybe_unused]] bool first = false;
    if (p.deterministic && lane == 0) {
      const DqOrder<kBlockM, kBlockN> order(
          p, seq.seqlen_q(), seq.seqlen_k(), (seq.seqlen_q() + kBlockM - 1) / kBlockM, true);
      const int turn = order.turn(n_block, m_block);
      while (ptx::ld_acquire(counter + m_block) != turn) __nanosleep(32);
      if constexpr (kFirstStore) first = turn == 0;
    } else if (kFirstStore && lane == 0) {
      first = atomicAdd(counter + m_block, 1) == 0;
      if (!first)
        while (ptx::ld_acquire(counter + m_block) < kStored) __nanosleep(32);
    }
    __syncwarp();
    named_sync(kBarDqFull, 256 + 32);
    if (lane == 0) {
      // after the turn's (or the stored flag's) acquire
      if (p.deterministic || kFirstStore) fence_proxy_async_global();
      if constexpr (kFirstStore)
        issue(dq + int64_t(m_block * kBlockM) * p.headdim, seq.seqlen_q() - m_block * kBlockM, t,
              first);
      else
        issue(dq + int64_t(m_block * kBlockM) * p.headdim, seq.seqlen_q() - m_block * kBlockM, t);
      tma_store_commit();
      tma_store_wait_read();
      read(t);
    }
    __syncwarp();
    if (t + 1 < range.steps) named_arrive(kBarDqEmpty, 256 + 32);
    if (p.deterministic && lane == 0) {
      tma_store_wait();
      fence_proxy_async_global();
      ptx::red_release_add(counter + m_block, 1);
    } else if (kFirstStore && first) {  // (lane 0)
      tma_store_wait();
      fence_proxy_async_global();
      ptx::red_release_add(counter + m_block, kStored);
    }
    if (++m_block == range.m_block_max) m_block = range.m_block_min;
    if (m_block == range.m_start) {  // range.next: the next head
      counter += seq.head_tiles();
      dq += seq.head_rows() * p.headdim;
    }
  }
  if (lane == 0) tma_store_wait();  // (not deterministic: the reduces complete before exit)
}

}  // namespace sm90
}  // namespace flashattn2
