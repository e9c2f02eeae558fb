// Deterministic backward: the fixed order in which the K/V tiles that visit a query tile add
// their dQ into the f32 accumulators. Shared by the mma.sync backward (sm80/bwd_kernel.cuh)
// and the Hopper one (sm90/bwd_kernel.cuh), which both walk, per CTA (one K/V tile of a KV
// head), the query tiles m_block_min .. m_block_max - 1 of each query head of the group.
//
// The visitors of query tile m are the K/V tiles first(m) .. last(m). Three orders, each
// chosen so that CTAs running in step never wait, and a CTA only waits for CTAs that
// launched before it (or, rotating, that are resident with it):
//  - descending (a right window bound, e.g. causal): tile n + 1 reaches m one step before
//    tile n; the kernel launches the tiles last first (n = gridDim.x - 1 - blockIdx.x);
//  - rotated (full attention, at most as many K/V tiles as query tiles, all of a head's
//    tiles resident at once: BwdParams::dq_rotate_tiles): tile n starts its walk at query
//    tile n and wraps around, so each query tile has one visitor per step, in step order;
//  - ascending otherwise (each CTA then runs one step behind the one before it in the
//    order of its chain).
// Chains (BwdParams::dq_chains, a power of two, chosen by the host: bwd_dq_chains): tile n
// adds into accumulator n % chains, in the order above restricted to its chain, and the
// convert kernel sums the chains in chain order. So a visitor waits only for the visitor
// `chains` places before it: the ascending order's stagger shrinks by that factor, and in the
// rotated walk that visitor came `chains` steps earlier, chains - 1 steps of slack (with one
// chain, all of a head's CTAs form one ring in lockstep, each waiting for the next one's
// previous step).
// The counter of each 64-row query tile (in every chain) follows the dsum rows in the
// workspace (seqlen.cuh layouts); the preprocess kernel zeroes it, each visitor adds 1 (or
// its adders' count) once its dQ adds are performed, and a visitor's turn comes when the
// counter reaches its turn (times that count).
#pragma once

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"

namespace flashattn2 {

template <typename Params>
__device__ __forceinline__ int* dq_counters(const Params& p) {
  return reinterpret_cast<int*>(p.dsum + ws_rows(p));
}
// Chain c's f32 dQ accumulator, and the counters of K/V tile n_block's chain (the chains'
// counters one after the other, ws_tiles(p, 64) each).
__device__ __forceinline__ float* dq_chain(const BwdParams& p, int c) {
  return p.dq_accum + c * ws_rows(p) * p.headdim;
}
__device__ __forceinline__ int* dq_chain_counters(const BwdParams& p, int n_block) {
  return dq_counters(p) + (n_block & (p.dq_chains - 1)) * ws_tiles(p, 64);
}

// One thread of a CTA once per step: release the previous step's dQ adds (release !=
// nullptr), then wait until `counter` reaches `turn`. Not inlined, so that the mainloop's
// register allocation and schedule do not see it (inlined it cost the sm80 default path 3 %).
static __device__ __noinline__ void dq_order_step(int* release, const int* counter, int turn) {
  if (release) ptx::red_release_add(release, 1);
  while (ptx::ld_acquire(counter) != turn) __nanosleep(32);
}

template <int kBlockM, int kBlockN>
struct DqOrder {
  const BwdParams& p;
  const int seqlen_k, offset;  // offset = seqlen_k - seqlen_q (bottom-right alignment)
  const bool descending, rotate;
  const int n_tiles;

  // m_blocks: the query tiles of the sequence; the walk may rotate only with full attention.
  __device__ __forceinline__ DqOrder(const BwdParams& params, int seqlen_q, int seqlen_k_,
                                     int m_blocks, bool may_rotate)
      : p(params),
        seqlen_k(seqlen_k_),
        offset(seqlen_k_ - seqlen_q),
        descending(params.deterministic && params.window_right >= 0),
        rotate(may_rotate && params.window_left < 0 && params.window_right < 0 &&
               (seqlen_k_ + kBlockN - 1) / kBlockN <= m_blocks &&
               (!params.deterministic ||
                (seqlen_k_ + kBlockN - 1) / kBlockN <= params.dq_rotate_tiles)),
        n_tiles((seqlen_k_ + kBlockN - 1) / kBlockN) {}

  // The CTA's K/V tile: launched last first in the descending order.
  __device__ __forceinline__ int n_block() const {
    return descending ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  }
  // The first K/V tile that visits query tile m: its last key reaches m's first query
  // through the left window.
  __device__ __forceinline__ int first_n_block(int m_block) const {
    const int x = m_block * kBlockM + offset - p.window_left;
    return p.window_left >= 0 && x > 0 ? x / kBlockN : 0;
  }
  // The last one (window_right >= 0): its first key reaches m's last query.
  __device__ __forceinline__ int last_n_block(int m_block) const {
    const int x = (m_block + 1) * kBlockM - 1 + offset + p.window_right;
    return min((seqlen_k - 1) / kBlockN, max(x, 0) / kBlockN);
  }
  // K/V tile n's place among the visitors of query tile m (rotating: by the step of the
  // visit, (m - n) mod the query tiles).
  __device__ __forceinline__ int rank(int n_block, int m_block) const {
    return descending ? last_n_block(m_block) - n_block
           : rotate   ? (n_block <= m_block ? min(m_block, n_tiles - 1) - n_block
                                            : m_block + n_tiles - n_block)
                      : n_block - first_n_block(m_block);
  }
  // K/V tile n's turn at query tile m: the visitors before it in its chain. The visitors in
  // order are consecutive tiles, so every chains-th one is a chain-mate; except rotating,
  // where the order m .. 0, n_tiles - 1 .. m + 1 wraps from tile 0 to n_tiles - 1: the
  // chain-mates of 0 .. m and of n_tiles - 1 .. n + 1 are counted apart.
  __device__ __forceinline__ int turn(int n_block, int m_block) const {
    const int shift = 31 - __clz(p.dq_chains);
    if (rotate && n_block > m_block) {
      const int chain = n_block & (p.dq_chains - 1);
      return ((m_block + p.dq_chains - chain) >> shift) + ((n_tiles - 1 - n_block) >> shift);
    }
    return rank(n_block, m_block) >> shift;
  }
};

}  // namespace flashattn2
