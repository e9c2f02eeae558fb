// flashattn2.merge: two attention results over disjoint key sets merged by their LSE
// (MergeParams, flash.h), with the per-row math of the split-KV combine (lse_merge.cuh).
// One warp per (batch, head, row); 128 threads = 4 rows per block, grid ceil(rows / 4).
// Lane l takes columns kVec * l + 32 * kVec * i: kVec = 4 (one 8- or 16-byte load per
// tensor) when every tensor's columns are contiguous and 4-aligned, else 1 (any strides).
// Each lane reads its columns of out_a / out_b before writing the same columns of out,
// and lane 0 writes the LSE after the warp has read both (__syncwarp), so out / lse may
// alias out_a / lse_a or out_b / lse_b (in-place accumulation). An LSE of +inf (the
// kernels' value for a row that sees no key) counts as empty, like -inf; a row empty in
// both gets out = 0 and lse = -inf.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/lse_merge.cuh"
#include "common/ptx.cuh"

namespace flashattn2 {

enum MergeDType : int { kMergeF16 = 0, kMergeBF16 = 1, kMergeF32 = 2 };

// x[0..kVec) = columns c.. of a row of element type `dtype` (as float).
template <int kVec>
__device__ __forceinline__ void merge_load(const void* row, int dtype, int64_t c,
                                           int64_t col_stride, float (&x)[kVec]) {
  if constexpr (kVec == 4) {
    if (dtype == kMergeF32) {
      const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(row) + c);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const __half*>(row) + c);
      const float2 lo = dtype == kMergeF16 ? ptx::unpack2<__half>(v.x)
                                           : ptx::unpack2<__nv_bfloat16>(v.x);
      const float2 hi = dtype == kMergeF16 ? ptx::unpack2<__half>(v.y)
                                           : ptx::unpack2<__nv_bfloat16>(v.y);
      x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
    }
  } else {
    const int64_t at = c * col_stride;
    x[0] = dtype == kMergeF32   ? static_cast<const float*>(row)[at]
           : dtype == kMergeF16 ? __half2float(static_cast<const __half*>(row)[at])
                                : __bfloat162float(static_cast<const __nv_bfloat16*>(row)[at]);
  }
}

template <int kVec>
__device__ __forceinline__ void merge_store(void* row, int dtype, int64_t c, int64_t col_stride,
                                            const float (&y)[kVec]) {
  if constexpr (kVec == 4) {
    if (dtype == kMergeF32) {
      *reinterpret_cast<float4*>(static_cast<float*>(row) + c) = make_float4(y[0], y[1], y[2], y[3]);
    } else {
      const uint2 v = dtype == kMergeF16
                          ? make_uint2(ptx::pack2<__half>(y[0], y[1]), ptx::pack2<__half>(y[2], y[3]))
                          : make_uint2(ptx::pack2<__nv_bfloat16>(y[0], y[1]),
                                       ptx::pack2<__nv_bfloat16>(y[2], y[3]));
      *reinterpret_cast<uint2*>(static_cast<__half*>(row) + c) = v;
    }
  } else {
    const int64_t at = c * col_stride;
    if (dtype == kMergeF32) {
      static_cast<float*>(row)[at] = y[0];
    } else if (dtype == kMergeF16) {
      static_cast<__half*>(row)[at] = __float2half_rn(y[0]);
    } else {
      static_cast<__nv_bfloat16*>(row)[at] = __float2bfloat16_rn(y[0]);
    }
  }
}

__device__ __forceinline__ int merge_elem_bytes(int dtype) { return dtype == kMergeF32 ? 4 : 2; }

template <int kVec>
__global__ void __launch_bounds__(128) merge_kernel(const MergeParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t idx = int64_t(blockIdx.x) * 4 + warp;  // (batch * nheads + head) * seqlen + row
  if (idx >= int64_t(p.batch) * p.nheads * p.seqlen) return;  // (no block barrier below)
  const int64_t row = idx % p.seqlen, head = idx / p.seqlen % p.nheads;
  const int64_t batch = idx / p.seqlen / p.nheads;
  auto lse_at = [&](int t) {
    return batch * p.lse_strides[t][0] + head * p.lse_strides[t][1] + row * p.lse_strides[t][2];
  };
  auto row_ptr = [&](const void* base, int t) {
    const int64_t offset = batch * p.out_strides[t][0] + row * p.out_strides[t][1] +
                           head * p.out_strides[t][2];
    return static_cast<const char*>(base) + offset * merge_elem_bytes(p.dtype[t]);
  };
  float lse_a = p.lse_a[lse_at(0)], lse_b = p.lse_b[lse_at(1)];
  if (lse_a == INFINITY) lse_a = -INFINITY;  // the kernels' empty row
  if (lse_b == INFINITY) lse_b = -INFINITY;
  const float lse_max = fmaxf(lse_a, lse_b);
  const float w_a = lse_merge::weight(lse_a, lse_max), w_b = lse_merge::weight(lse_b, lse_max);
  const float sum = w_a + w_b, inv = lse_merge::inv_sum(sum);
  const void* a = row_ptr(p.out_a, 0);
  const void* b = row_ptr(p.out_b, 1);
  void* o = const_cast<char*>(static_cast<const char*>(row_ptr(p.out, 2)));
  for (int64_t c = int64_t(lane) * kVec; c < p.headdim; c += 32 * kVec) {
    float x_a[kVec], x_b[kVec], y[kVec];
    merge_load<kVec>(a, p.dtype[0], c, p.out_strides[0][3], x_a);
    merge_load<kVec>(b, p.dtype[1], c, p.out_strides[1][3], x_b);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      // A weight-0 partial adds nothing, whatever its out holds (an empty row's garbage).
      const float acc = (w_a != 0.f ? w_a * x_a[i] : 0.f) + (w_b != 0.f ? w_b * x_b[i] : 0.f);
      y[i] = acc * inv;
    }
    merge_store<kVec>(o, p.dtype[2], c, p.out_strides[2][3], y);
  }
  __syncwarp();  // every lane has read lse_a / lse_b
  if (lane == 0) p.lse[lse_at(2)] = lse_merge::merged_lse(lse_max, sum, -INFINITY);
}

}  // namespace flashattn2
