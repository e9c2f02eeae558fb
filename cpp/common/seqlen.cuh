// Per-batch sequence geometry (SeqLayout of flash.h) as every kernel sees it: one place that
// knows about varlen, KV caches and pages.
#pragma once
#include <cstdint>

#include "common/flash.h"
#include "common/workspace.h"

namespace flashattn2 {

struct SeqInfo {
  int seqlen_q;    // query rows of this batch entry
  int seqlen_k;    // visible keys (after the left padding)
  int64_t q_row0;  // first row of the sequence in q / o / dq / dout / lse (varlen)
  int64_t k_row0;  // first visible K/V row: varlen start + left padding
  int kv_batch;    // K/V batch (cache batch index)

  SeqInfo() = default;  // (fields set by hand: the sm90 forward's published tile work)
  // Every length is clamped so that no kernel reads or writes outside the tensors, whatever
  // the index vectors hold (they cannot be checked on the host without a sync).
  template <typename Params>
  __device__ __forceinline__ SeqInfo(const Params& p, int batch) {
    if (p.cu_seqlens_q) {
      const int start = clamp(p.cu_seqlens_q[batch], 0, p.total_q);
      q_row0 = start;
      seqlen_q = clamp(p.cu_seqlens_q[batch + 1], start, min(p.total_q, start + p.seqlen_q)) - start;
    } else {
      q_row0 = 0;
      seqlen_q = p.seqlen_q;
    }
    if (p.cu_seqlens_k) {
      const int start = clamp(p.cu_seqlens_k[batch], 0, p.total_k);
      k_row0 = start;
      seqlen_k = clamp(p.cu_seqlens_k[batch + 1], start, min(p.total_k, start + p.seqlen_k)) - start;
    } else {
      k_row0 = 0;
      seqlen_k = p.seqused_k ? clamp(p.seqused_k[batch] + p.seqlen_k_new, 0, p.seqlen_k)
                             : p.seqlen_k;
    }
    if (p.leftpad_k) {
      const int pad = clamp(p.leftpad_k[batch], 0, seqlen_k);
      k_row0 += pad;
      seqlen_k -= pad;
    }
    kv_batch = p.kv_batch_idx ? p.kv_batch_idx[batch] : batch;
  }

 private:
  __device__ __forceinline__ static int clamp(int x, int lo, int hi) { return min(max(x, lo), hi); }
};

// K/V row addressing for one (batch, kv head). `base` gives the tensor pointer the rows are
// relative to: dense, at the batch entry's first visible row; paged, at the head offset
// only, rows then looked up in the batch entry's block-table row from key row `row0` (the
// left padding). KvRows<false> is dense only and keeps no state (the main forward kernel
// runs at the 255-register limit); KvRows<true> also pages.
template <bool kPaged>
struct KvRows {
  template <typename Params>
  __device__ __forceinline__ KvRows(const Params&, const SeqInfo&, int) {}
  template <typename Element>
  __device__ __forceinline__ static const Element* base_dense(const Element* head_base,
                                                              const SeqInfo& seq,
                                                              int64_t batch_stride,
                                                              int64_t row_stride) {
    return head_base + seq.kv_batch * batch_stride + seq.k_row0 * row_stride;
  }
  template <typename Element>
  __device__ __forceinline__ const Element* base(const Element* head_base, const SeqInfo& seq,
                                                 int64_t batch_stride, int64_t row_stride) const {
    return base_dense(head_base, seq, batch_stride, row_stride);
  }
  // Address of visible key row `row` (0 = first visible key); `page` as fetch_pages gave it.
  template <typename Params, typename Element>
  __device__ __forceinline__ const Element* operator()(const Params&, const Element* base,
                                                       int64_t, int64_t row_stride, int row,
                                                       int /*page*/) const {
    return base + row * row_stride;
  }
};

// A block-table entry clamped to [0, num_pages) (the host checks num_pages >= 1).
__device__ __forceinline__ int clamp_page(int entry, int num_pages) {
  return min(max(entry, 0), num_pages - 1);
}

// The KV-cache kernel's addressing: paged when the params have a block table, else dense.
// A thread looks up the pages of its rows of a K/V tile once (fetch_pages: one block-table
// read per row slot of the tile copy, TileThreadRows), for K and V alike. (The decode kernel
// reads its tiles' entries itself, 32 steps ahead, and uses `pages`, `row0` and operator().)
template <>
struct KvRows<true> {
  const int* pages;  // null: dense
  int row0;          // paged: the first visible key row (dense: 0, in `base` already)
  template <typename Params>
  __device__ __forceinline__ KvRows(const Params& p, const SeqInfo& seq, int batch)
      : pages(p.block_table ? p.block_table + batch * p.block_table_batch_stride : nullptr),
        row0(p.block_table ? int(seq.k_row0) : 0) {}
  template <typename Element>
  __device__ __forceinline__ const Element* base(const Element* head_base, const SeqInfo& seq,
                                                 int64_t batch_stride, int64_t row_stride) const {
    return pages ? head_base : KvRows<false>::base_dense(head_base, seq, batch_stride, row_stride);
  }
  // page[s] = the block-table entry of key row n0 + TileRows::row(s, tid) (visible-key
  // numbering) for the rows below seqlen_k; the others are left alone (their rows are never
  // read). Dense: no-op (page stays 0). The entry is clamped where it is used (operator()),
  // not here: a consumer right after the load would wait for it, and the kernels fetch a
  // tile's pages a step before its copies so that the load's latency is spent in that step
  // (the decode kernel's 16-key pages cost b16 +10 % while the clamp stood here: NOTES,
  // twenty-third session).
  template <typename TileRows, typename Params>
  __device__ __forceinline__ void fetch_pages(const Params& p, int n0, int seqlen_k, int tid,
                                              int (&page)[TileRows::kSlots]) const {
    if (!pages) return;
#pragma unroll
    for (int s = 0; s < TileRows::kSlots; ++s) {
      const int row = n0 + TileRows::row(s, tid);
      if (row < seqlen_k) page[s] = pages[(row0 + row) >> p.page_size_log2];
    }
  }
  // Branch-free (dense: page 0, no wrap), so the tile copy needs no branch per chunk. The
  // entry is clamped to [0, num_pages) here (dense: num_pages 0, page 0 stays 0).
  template <typename Params, typename Element>
  __device__ __forceinline__ const Element* operator()(const Params& p, const Element* base,
                                                       int64_t batch_stride, int64_t row_stride,
                                                       int row, int page) const {
    const int r = row0 + row;
    const int in_page = r & (pages ? (1 << p.page_size_log2) - 1 : -1);
    const int pg = min(max(page, 0), max(p.num_pages - 1, 0));
    return base + pg * batch_stride + in_page * row_stride;
  }
};

// Backward workspaces (dsum, dq_accum rows, dQ-order counters), laid out per (head, row),
// each sequence's rows starting at a multiple of 16 (dq_accum is stored in 16-row blocks,
// ws_dq_index):
//   dense   row index ((batch * nheads + head) * round16(seqlen_q) + row), counters per
//           64-row tile
//   varlen  row index (head * round16(total_q + 16 batch) + round16(q_row0 + 15 batch) +
//           row): sequence b starts at a multiple of 16 at least round16(its predecessor's
//           length) after it; the counters of a head get total_q / 64 + batch slots,
//           sequence b's tiles starting at q_row0 / 64 + b, so tiles of different sequences
//           never share a slot.
// Deterministic chains (BwdParams::dq_chains): chain c's accumulator rows start at
// c * ws_rows * headdim floats, its counters at c * ws_tiles.
template <typename Params>
__device__ __forceinline__ int64_t ws_row0(const Params& p, const SeqInfo& seq, int batch,
                                           int head) {
  return p.cu_seqlens_q
             ? int64_t(head) * round16(int64_t(p.total_q) + 16 * p.batch) +
                   round16(seq.q_row0 + 15 * int64_t(batch))
             : (int64_t(batch) * p.nheads + head) * round16(p.seqlen_q);
}
template <typename Params>
__device__ __forceinline__ int64_t ws_rows(const Params& p) {
  return bwd_ws_rows(p.batch, p.nheads, p.seqlen_q, p.cu_seqlens_q ? p.total_q : -1);
}
// Index of dq_accum element (row, col), row a workspace row (ws_row0 + row in sequence):
// each 16-row x 8-column block is 128 consecutive floats in the order of an m16n8 mma
// accumulator, lane 4 g + q holding rows g, g + 8 x columns 2 q, 2 q + 1 as 4 consecutive
// floats. So a warp adds one such block with one coalesced 16-byte reduction per lane
// (512 contiguous bytes), and 16 rows x headdim are contiguous: zeroing is row-block-wise.
__device__ __forceinline__ int64_t ws_dq_index(int64_t row, int col, int headdim) {
  return (row >> 4) * (16 * int64_t(headdim)) + (col >> 3) * 128 +
         (((row & 7) * 4 + ((col & 7) >> 1)) * 4) + ((row >> 3) & 1) * 2 + (col & 1);
}
template <typename Params>
__device__ __forceinline__ int64_t ws_tiles(const Params& p, int tile_rows) {
  return p.cu_seqlens_q ? int64_t(p.nheads) * (p.total_q / tile_rows + p.batch)
                        : int64_t(p.batch) * p.nheads * ((p.seqlen_q + tile_rows - 1) / tile_rows);
}
template <typename Params>
__device__ __forceinline__ int64_t ws_tile0(const Params& p, const SeqInfo& seq, int batch,
                                            int head, int tile_rows) {
  return p.cu_seqlens_q
             ? int64_t(head) * (p.total_q / tile_rows + p.batch) + seq.q_row0 / tile_rows + batch
             : (int64_t(batch) * p.nheads + head) * ((p.seqlen_q + tile_rows - 1) / tile_rows);
}

// a / b for 0 <= a < 2^20 and b >= 1, by a float reciprocal (I2F, MUFU.RCP, FMUL, F2I: ~6
// instructions against ~20 for an int division, on a kernel's first-load path). Exact:
// (a + 0.5) / b lies at least 0.5 / b from an integer, and __fdividef's error (2 ulp, at most
// 2^-22 (a + 0.5) / b < 0.25 / b) stays below that.
__device__ __forceinline__ int small_div(int a, int b) {
  return __float2int_rz(__fdividef(float(a) + 0.5f, float(b)));
}

// Key blocks of kBlockN keys that query positions i_first .. i_last see (the bottom-right
// aligned window of FwdParams; offset = seqlen_k - seqlen_q): [min, max).
struct KeyBlocks {
  int min, max;
  // This split's share (split-KV): consecutive equal parts of the visible blocks.
  __device__ __forceinline__ void take_split(int split, int num_splits) {
    const int blocks = max - min + num_splits - 1;
    const int per_split = blocks < (1 << 20) ? small_div(blocks, num_splits) : blocks / num_splits;
    min = ::min(max, min + split * per_split);
    max = ::min(max, min + per_split);
  }
};
template <int kBlockN, typename Params>
__device__ __forceinline__ KeyBlocks visible_key_blocks(const Params& p, int i_first, int i_last,
                                                        int seqlen_k, int offset) {
  KeyBlocks b{0, (seqlen_k + kBlockN - 1) / kBlockN};
  if (p.window_right >= 0) {
    const int col_hi = i_last + offset + p.window_right;
    b.max = col_hi < 0 ? 0 : ::min(b.max, col_hi / kBlockN + 1);
  }
  if (p.window_left >= 0) {
    const int col_lo = i_first + offset - p.window_left;
    b.min = col_lo <= 0 ? 0 : col_lo / kBlockN;
  }
  return b;
}

}  // namespace flashattn2
