// The Hopper backward's tile constants (BwdTraits), kernel arguments, named barriers, and
// the per-CTA walk: a batch entry's sequences (BwdSeq) and the query blocks a key block
// visits (BwdRange). The kernel and its tiling block: sm90/bwd_kernel.cuh.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/seqlen.cuh"
#include "common/workspace.h"
#include "sm90/bwd_config.h"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr Sm90BwdTile kTile = sm90_bwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumers = kBlockN / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * kSwizzleBytes;
  static constexpr int kKChunkBytes = kBlockN * kSwizzleBytes;
  static constexpr int kQBytes = kChunks * kQChunkBytes;   // one of sQ, sdO per stage
  static constexpr int kKBytes = kChunks * kKChunkBytes;   // one of sK, sV
  static constexpr int kDSChunkBytes = kBlockN * kSwizzleBytes;  // dS^T of 64 queries
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;   // one dS^T buffer
  static constexpr int kRowBytes = kBlockM * 4;            // one of LSE, dsum per stage
  // dq_bulk: dQ staged per consumer warp (16 rows x 64 columns f32) for one bulk reduce-add.
  static constexpr bool kDqBulk = FLASHATTN2_SM90_BWD_DQ_BULK != 0;
  static constexpr int kDqWarpBytes = 16 * 64 * 4;
  // dq_warp (deterministic mode, an opt-in build item): producer warp 2 waits for the dQ
  // turns, issues the consumers' staged reduces and releases the counters (bwd_producer.cuh).
  static constexpr bool kDqWarpBuilt = kDqBulk && FLASHATTN2_SM90_BWD_DQ_WARP != 0;
  static constexpr int kDqStageBytes = sm90_bwd_dq_stage_bytes(kHeadDim);
  static_assert(kDqStageBytes == (kDqBulk ? 4 * kConsumers * kDqWarpBytes : 0), "dQ staging");
  static constexpr int kSmemBytes = sm90_bwd_smem_bytes(kHeadDim);
  // kBias: each consumer warpgroup stages the bias of its 64 keys x the step's queries
  // (128-byte rows) after the barriers; d64 then has one dS^T buffer (sm90_bwd_bias_one_ds).
  static constexpr int kBiasWgBytes = 64 * kBlockM * 2;
  static_assert(kConsumers * kBiasWgBytes + 128 == sm90_bwd_bias_tiles_bytes(kHeadDim),
                "bias tile");
  static constexpr int ds_buffers(bool bias) {
    return bias && sm90_bwd_bias_one_ds(kHeadDim) ? 1 : 2;
  }
  static constexpr int smem_bytes(bool bias) {
    return kSmemBytes + (bias ? sm90_bwd_bias_bytes(kHeadDim) : 0);
  }
  static_assert(smem_bytes(true) <= 227 * 1024, "smem budget with the staged bias");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "kernel head dims 64 and 128");
  // dQ = dS K: each consumer warpgroup computes one 64 x 64 tile of it over the block's 128
  // keys (an m64 n64 GEMM, 32 f32 per thread): d128 (64 query rows) the rows x its column
  // chunk c; d64 (128 query rows, one column chunk) its query rows 64 c..+64 x all columns.
  // So no dQ element is added by two warpgroups.
  static constexpr bool kDqSplitsRows = kChunks == 1;
  static_assert(kDqSplitsRows ? kBlockM == 64 * kConsumers : kChunks == kConsumers && kBlockM == 64,
                "dQ split: query rows (d64) or column chunks (d128)");
  static_assert(kBlockM % 64 == 0 && kBlockN == 128 && kConsumers == 2, "tile of this version");
  // sdS: dS^T as kBlockM / 64 chunks of [128 keys x 64 queries] (a 128-byte swizzled row of
  // 64 queries per key), kDSChunkBytes apart.
  static_assert(kDSBytes == (kBlockM / 64) * kDSChunkBytes, "dS^T chunks");
  // sdS has 2 buffers indexed by the stage (t % kStages): its reuse argument (one named
  // barrier per step) and the smem layout below hold for 2 stages only.
  static_assert(kStages == 2, "sdS buffer = stage index: 2 stages");
  static_assert(2 * kKBytes + kStages * (2 * kQBytes + 2 * kRowBytes) + 2 * kDSBytes +
                        kDqStageBytes + 8 * (2 + 4 * kStages) + 1024 <= kSmemBytes &&
                    kSmemBytes <= 227 * 1024,
                "smem budget");
  static_assert(setmaxnreg_fits(kConsumers, kTile.producer_regs, kTile.consumer_regs),
                "register budget: setmaxnreg.inc would hang");
};

// Arguments: TMA maps of q, k, v, dout (tma_map.h) and the backward params.
struct BwdArgs {
  CUtensorMap q, k, v, dout;
  BwdParams p;
};

// Named barriers (0 is __syncthreads): of the two consumer warpgroups, sdS complete and, in
// deterministic mode, the dQ turn reached; of consumer warpgroup c (kBias), its staged bias
// tile landed (kBarBias + c).
constexpr int kBarDS = 1;
constexpr int kBarDqTurn = 2;
constexpr int kBarBias = 3;
// Of the two consumer warpgroups, d64's kBias instance (one sdS buffer): warpgroup c's dQ GEMM
// of the step is complete (kBarDsFree + c: c arrives, the other one waits before its dS^T
// stores of the next step).
constexpr int kBarDsFree = 5;
// kDqWarp, deterministic: of the consumer warpgroups and producer warp 2 (288 threads), the
// step's dQ staged (kBarDqFull: consumers arrive, warp 2 waits) and the staging read by the
// reduces (kBarDqEmpty: warp 2 arrives, consumers wait before the next step's stores).
constexpr int kBarDqFull = 7;
constexpr int kBarDqEmpty = 8;

// The batch entry's sequences, each its own kernel instance (kVarlen). Dense (BwdSeq<false>,
// what dense calls run): the params' lengths, rows from 0 of batch entry `batch`, read
// straight from the params. Varlen (BwdSeq<true>, varlen calls only): SeqInfo's lengths and
// first rows; packed tensors are one batch entry of the TMA maps (bwd_launch.cuh), and the
// workspaces use ws_row0's per-sequence layout.
template <bool kVarlen>
struct BwdSeq {
  const BwdParams& p;
  const int batch;
  __device__ __forceinline__ BwdSeq(const BwdParams& params, int b) : p(params), batch(b) {}
  __device__ __forceinline__ int seqlen_q() const { return p.seqlen_q; }
  __device__ __forceinline__ int seqlen_k() const { return p.seqlen_k; }
  __device__ __forceinline__ int q_row0() const { return 0; }
  __device__ __forceinline__ int k_row0() const { return 0; }
  __device__ __forceinline__ int tma_batch_q() const { return batch; }
  __device__ __forceinline__ int tma_batch_k() const { return batch; }
  __device__ __forceinline__ int64_t ws_row0(int head) const {
    return (int64_t(batch) * p.nheads + head) * round16(p.seqlen_q);
  }
  // The dQ-order counter of the head's first query tile in K/V block n_block's chain
  // (deterministic mode). The workspace has one per 64 rows (the mma.sync backward's tiles,
  // bwd_workspace_floats); with tiles of 128 rows (d64) the kernel uses the first half of
  // each head's (or sequence's) counters.
  __device__ __forceinline__ int* dq_counter0(int head, int n_block) const {
    return dq_chain_counters(p, n_block) +
           (int64_t(batch) * p.nheads + head) * ((p.seqlen_q + 63) / 64);
  }
  // From one head to the next: workspace rows, counters (ws_row0, dq_counter0).
  __device__ __forceinline__ int64_t head_rows() const { return round16(p.seqlen_q); }
  __device__ __forceinline__ int head_tiles() const { return (p.seqlen_q + 63) / 64; }
};
template <>
struct BwdSeq<true> {
  const BwdParams& p;
  const int batch;
  const SeqInfo seq;
  __device__ __forceinline__ BwdSeq(const BwdParams& params, int b)
      : p(params), batch(b), seq(params, b) {}
  __device__ __forceinline__ int seqlen_q() const { return seq.seqlen_q; }
  __device__ __forceinline__ int seqlen_k() const { return seq.seqlen_k; }
  __device__ __forceinline__ int q_row0() const { return int(seq.q_row0); }
  __device__ __forceinline__ int k_row0() const { return int(seq.k_row0); }
  __device__ __forceinline__ int tma_batch_q() const { return p.cu_seqlens_q ? 0 : batch; }
  __device__ __forceinline__ int tma_batch_k() const { return p.cu_seqlens_k ? 0 : batch; }
  __device__ __forceinline__ int64_t ws_row0(int head) const {
    return flashattn2::ws_row0(p, seq, batch, head);
  }
  __device__ __forceinline__ int* dq_counter0(int head, int n_block) const {
    return dq_chain_counters(p, n_block) + ws_tile0(p, seq, batch, head, 64);
  }
  __device__ __forceinline__ int64_t head_rows() const {
    return p.cu_seqlens_q ? round16(int64_t(p.total_q) + 16 * p.batch)
                          : round16(p.seqlen_q);
  }
  __device__ __forceinline__ int head_tiles() const {
    return p.cu_seqlens_q ? p.total_q / 64 + p.batch : (p.seqlen_q + 63) / 64;
  }
};

// The CTA's query blocks: m_block_min .. m_block_max - 1 (those with a row that sees one of
// the block's keys; bounds as the sm80 backward's), for each of the group's query heads,
// from m_start on (the rotated walk of deterministic full attention: common/dq_order.cuh),
// wrapping around. A key block at or past seqlen_k (varlen: past this sequence's keys) has
// none.
struct BwdRange {
  int m_block_min, m_block_max, m_start, steps;
  template <bool kVarlen>
  __device__ __forceinline__ BwdRange(const BwdParams& p, const BwdSeq<kVarlen>& seq, int n0,
                                      int block_m, int group, bool rotate, int n_block,
                                      int block_n = 128) {
    const int offset = seq.seqlen_k() - seq.seqlen_q();
    const int n_last = min(n0 + block_n, seq.seqlen_k()) - 1;
    const int m_lo = p.window_right >= 0 ? max(0, n0 - offset - p.window_right) : 0;
    const int m_hi = p.window_left >= 0
                         ? min(seq.seqlen_q() - 1, n_last - offset + p.window_left)
                         : seq.seqlen_q() - 1;
    m_block_min = m_lo / block_m;
    m_block_max = m_hi < m_lo ? m_block_min : m_hi / block_m + 1;
    if constexpr (kVarlen) {
      if (n0 >= seq.seqlen_k()) m_block_max = m_block_min;
    }
    steps = group * (m_block_max - m_block_min);
    m_start = rotate ? n_block : m_block_min;
  }
  // (head, m_block) of the next step.
  __device__ __forceinline__ void next(int& head, int& m_block) const {
    if (++m_block == m_block_max) m_block = m_block_min;
    if (m_block == m_start) ++head;
  }
};

}  // namespace sm90
}  // namespace flashattn2
