// Split-KV combine: merges the num_splits partial results of the forward (FwdParams'
// o_accum / lse_accum, each split normalised by its own softmax sum) into o and lse:
//   lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s
// A row that no split saw (every lse_s = -inf) gets o = 0, lse = +inf, as the forward.
// grid ceil(batch * nheads * seqlen_q / 4), 128 threads: one warp per (batch, head, row);
// lanes take the splits for the weights, then 4-column groups of the row.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "flash.h"
#include "flash_api.h"
#include "ptx.cuh"
#include "seqlen.cuh"

namespace flashattn2 {

template <typename Element>
__global__ void __launch_bounds__(128) combine_kernel(const FwdParams p) {
  __shared__ float s_weight[4][kMaxSplits];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t idx = int64_t(blockIdx.x) * 4 + warp;  // ((batch * nheads) + head) * sq + row
  if (idx >= int64_t(p.batch) * p.nheads * p.seqlen_q) return;
  const int row = int(idx % p.seqlen_q);
  const int head = int(idx / p.seqlen_q % p.nheads);
  const int batch = int(idx / p.seqlen_q / p.nheads);
  const SeqInfo seq(p, batch);
  if (row >= seq.seqlen_q) return;  // varlen: past this sequence

  const int64_t split_stride = int64_t(p.batch) * p.nheads * p.seqlen_q;  // rows per split
  float lse_max = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) lse_max = fmaxf(lse_max, p.lse_accum[s * split_stride + idx]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffff, lse_max, o));
  float sum = 0.f;
  for (int s = lane; s < p.num_splits; s += 32) {
    const float w = lse_max == -INFINITY ? 0.f : expf(p.lse_accum[s * split_stride + idx] - lse_max);
    s_weight[warp][s] = w;
    sum += w;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
  __syncwarp();
  const float inv = sum == 0.f ? 0.f : 1.f / sum;
  if (lane == 0) {
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_row0 + row] =
        sum == 0.f ? INFINITY : lse_max + logf(sum);
  }
  Element* out = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                 head * p.o_head_stride + (seq.q_row0 + row) * p.o_row_stride;
  // The split loop is unrolled with independent loads (no branch on the weight): a serial
  // loop waits one L2 round trip per split (measured: 10 us for 32 splits at b=1).
  for (int c = lane * 4; c < p.headdim; c += 128) {
    const float* src = p.o_accum + idx * p.headdim + c;
    const int64_t step = split_stride * p.headdim;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    int s = 0;
    for (; s + 8 <= p.num_splits; s += 8) {
      float4 x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) x[u] = *reinterpret_cast<const float4*>(src + (s + u) * step);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float w = s_weight[warp][s + u];
        acc = make_float4(fmaf(w, x[u].x, acc.x), fmaf(w, x[u].y, acc.y), fmaf(w, x[u].z, acc.z),
                          fmaf(w, x[u].w, acc.w));
      }
    }
    for (; s < p.num_splits; ++s) {
      const float4 x = *reinterpret_cast<const float4*>(src + s * step);
      const float w = s_weight[warp][s];
      acc = make_float4(fmaf(w, x.x, acc.x), fmaf(w, x.y, acc.y), fmaf(w, x.z, acc.z),
                        fmaf(w, x.w, acc.w));
    }
    *reinterpret_cast<uint2*>(out + c) = make_uint2(ptx::pack2<Element>(acc.x * inv, acc.y * inv),
                                                    ptx::pack2<Element>(acc.z * inv, acc.w * inv));
  }
}

}  // namespace flashattn2
