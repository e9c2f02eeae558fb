// KV-cache append with rotary embedding (AppendKvParams, flash.h): one launch writes the new
// keys (rotated) and values into the cache, contiguous or paged, and the rotated q.
//
// One thread per (row, column pair): rows are first the batch * seqlen_new * nheads_k new
// K/V rows, then (rotary only) the batch * seqlen_q * nheads query rows. Column pair j of a
// row of width d is, for j < rotary_dim / 2, the rotated pair (2j, 2j + 1) (interleaved,
// GPT-J) or (j, j + rotary_dim / 2) (GPT-NeoX), at angle j; for larger j the plain pair
// (rotary_dim + 2 (j - rotary_dim / 2), + 1). Values are copied as plain pairs (2j, 2j + 1).
// The pair math (rotary_channels, rotate_pair_f32) is the rotary kernel's (rotary_kernel.cuh).
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/rotary_kernel.cuh"
#include "common/seqlen.cuh"

namespace flashattn2 {

template <typename Element>
__device__ __forceinline__ float to_float(Element x) {
  return ptx::unpack2<Element>(uint32_t(*reinterpret_cast<const uint16_t*>(&x))).x;
}

// Writes pair j of a row from src to dst, rotated at position `pos` when in the rotary range.
template <typename Element>
__device__ __forceinline__ void rotate_pair(const AppendKvParams& p, Element* dst,
                                            const Element* src, int j, int pos) {
  const int half = p.rotary_dim / 2;
  if (j >= half) {
    const int e = p.rotary_dim + 2 * (j - half);
    *reinterpret_cast<uint32_t*>(dst + e) = *reinterpret_cast<const uint32_t*>(src + e);
    return;
  }
  const int2 e = rotary_channels(j, p.rotary_dim, p.interleaved);
  float c = NAN, s = NAN;  // a position past the cos/sin tables gives NaN, never a stray read
  if (pos >= 0 && pos < p.seqlen_ro) {
    c = to_float(static_cast<const Element*>(p.rotary_cos)[pos * p.rotary_row_stride + j]);
    s = to_float(static_cast<const Element*>(p.rotary_sin)[pos * p.rotary_row_stride + j]);
  }
  const float2 r = rotate_pair_f32(to_float(src[e.x]), to_float(src[e.y]), c, s);
  const uint32_t out = ptx::pack2<Element>(r.x, r.y);
  dst[e.x] = reinterpret_cast<const Element*>(&out)[0];
  dst[e.y] = reinterpret_cast<const Element*>(&out)[1];
}

template <typename Element>
__global__ void __launch_bounds__(256) append_kv_kernel(const AppendKvParams p) {
  const int pairs = p.headdim / 2;
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = unit / pairs;
  const int j = int(unit % pairs);
  const int64_t kv_rows = int64_t(p.batch) * p.seqlen_new * p.nheads_k;
  if (row < kv_rows) {
    const int head = int(row % p.nheads_k);
    const int i = int(row / p.nheads_k % p.seqlen_new);
    const int batch = int(row / p.nheads_k / p.seqlen_new);
    const int dst_row = p.cache_seqlens[batch] + i;
    if (dst_row < 0 || dst_row >= p.cache_capacity) return;
    int64_t kc, vc;  // element offsets of the destination rows
    if (p.block_table) {
      const int page = clamp_page(
          p.block_table[batch * p.block_table_batch_stride + (dst_row >> p.page_size_log2)],
          p.num_pages);
      const int r = dst_row & ((1 << p.page_size_log2) - 1);
      kc = page * p.kc_batch_stride + r * p.kc_row_stride;
      vc = page * p.vc_batch_stride + r * p.vc_row_stride;
    } else {
      const int cb = p.kv_batch_idx ? p.kv_batch_idx[batch] : batch;
      kc = cb * p.kc_batch_stride + int64_t(dst_row) * p.kc_row_stride;
      vc = cb * p.vc_batch_stride + int64_t(dst_row) * p.vc_row_stride;
    }
    Element* k_dst = static_cast<Element*>(p.k_cache) + kc + head * p.kc_head_stride;
    Element* v_dst = static_cast<Element*>(p.v_cache) + vc + head * p.vc_head_stride;
    const Element* k_src = static_cast<const Element*>(p.k_new) + batch * p.knew_batch_stride +
                           int64_t(i) * p.knew_row_stride + head * p.knew_head_stride;
    const Element* v_src = static_cast<const Element*>(p.v_new) + batch * p.vnew_batch_stride +
                           int64_t(i) * p.vnew_row_stride + head * p.vnew_head_stride;
    rotate_pair(p, k_dst, k_src, j, dst_row);
    *reinterpret_cast<uint32_t*>(v_dst + 2 * j) = *reinterpret_cast<const uint32_t*>(v_src + 2 * j);
    return;
  }
  if (p.rotary_dim == 0) return;
  const int64_t qr = row - kv_rows;
  if (qr >= int64_t(p.batch) * p.seqlen_q * p.nheads) return;
  const int head = int(qr % p.nheads);
  const int i = int(qr / p.nheads % p.seqlen_q);
  const int batch = int(qr / p.nheads / p.seqlen_q);
  const Element* src = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                       int64_t(i) * p.q_row_stride + head * p.q_head_stride;
  Element* dst = static_cast<Element*>(p.q_out) + qr * p.headdim;
  const int pos = p.cache_seqlens[batch] + (p.q_positions_increment ? i : 0);
  rotate_pair(p, dst, src, j, pos);
}

template <typename Element>
void run_append_kv(const AppendKvParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.seqlen_new * p.nheads_k +
                       (p.rotary_dim ? int64_t(p.batch) * p.seqlen_q * p.nheads : 0);
  const int64_t units = rows * (p.headdim / 2);
  if (units == 0) return;
  append_kv_kernel<Element><<<unsigned((units + 255) / 256), 256, 0, stream>>>(p);
}

}  // namespace flashattn2
