// Rotary embedding (RotaryParams, flash.h), and the per-pair math the KV-cache append
// (kvcache_kernel.cuh) shares with it.
//
// One thread per (token, head, unit): units j < rotary_dim / 2 rotate channel pair j (read
// both channels, math in float32, round once); out of place, units rotary_dim / 2 + k copy
// channel rotary_dim + k unchanged. In place only the rotated pairs are written.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/flash.h"

namespace flashattn2 {

// Channels (e0, e1) of rotary pair j < rotary_dim / 2: (2j, 2j + 1) interleaved (GPT-J),
// else (j, j + rotary_dim / 2) (GPT-NeoX).
__device__ __forceinline__ int2 rotary_channels(int j, int rotary_dim, bool interleaved) {
  return interleaved ? make_int2(2 * j, 2 * j + 1) : make_int2(j, j + rotary_dim / 2);
}

// (a, b) rotated by the angle whose cosine and sine are (c, s): (a c - b s, a s + b c).
__device__ __forceinline__ float2 rotate_pair_f32(float a, float b, float c, float s) {
  return make_float2(a * c - b * s, a * s + b * c);
}

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// T: x / out element; TC: cos / sin element.
template <typename T, typename TC>
__global__ void __launch_bounds__(256) rotary_kernel(const RotaryParams p, int units_per_row,
                                                     int64_t rows) {
  const int64_t unit = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = unit / units_per_row;  // token * nheads + head
  if (row >= rows) return;
  const int j = int(unit - row * units_per_row);
  const int head = int(row % p.nheads);
  const int64_t token = row / p.nheads;
  int b;
  int64_t i;  // row index of the token in x (batch b) and its index in its sequence
  int64_t in_seq;
  if (p.cu_seqlens) {
    int lo = 0, hi = p.batch - 1;  // the last b in [1, batch) with cu_seqlens[b] <= token
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.cu_seqlens[mid] <= token) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    b = lo;
    i = token;
    in_seq = token - p.cu_seqlens[b];
  } else {
    b = int(token / p.seqlen);
    i = token - int64_t(b) * p.seqlen;
    in_seq = i;
  }
  const T* x = static_cast<const T*>(p.x) + b * p.x_batch_stride + i * p.x_row_stride +
               head * p.x_head_stride;
  T* out = static_cast<T*>(p.out) + b * p.out_batch_stride + i * p.out_row_stride +
           head * p.out_head_stride;
  const int half = p.rotary_dim / 2;
  if (j >= half) {
    const int e = p.rotary_dim + (j - half);
    out[e] = x[e];
    return;
  }
  const int64_t pos = in_seq + (p.seqlen_offsets ? p.seqlen_offsets[b] : p.seqlen_offset);
  float c = 1.f, s = 0.f;  // outside the tables: unrotated, as flash-attn
  if (pos >= 0 && pos < p.seqlen_ro) {
    c = load_f32(static_cast<const TC*>(p.cos) + pos * p.cos_row_stride + j);
    s = load_f32(static_cast<const TC*>(p.sin) + pos * p.sin_row_stride + j);
  }
  if (p.conjugate) s = -s;
  const int2 e = rotary_channels(j, p.rotary_dim, p.interleaved);
  const float2 r = rotate_pair_f32(load_f32(x + e.x), load_f32(x + e.y), c, s);
  store_f32(out + e.x, r.x);
  store_f32(out + e.y, r.y);
}

template <typename T, typename TC>
void run_rotary(const RotaryParams& p, cudaStream_t stream) {
  const bool inplace = p.out == p.x;
  const int units_per_row = inplace ? p.rotary_dim / 2 : p.headdim - p.rotary_dim / 2;
  const int64_t tokens = p.cu_seqlens ? int64_t(p.seqlen) : int64_t(p.batch) * p.seqlen;
  const int64_t rows = tokens * p.nheads;
  const int64_t units = rows * units_per_row;
  if (units == 0) return;
  rotary_kernel<T, TC><<<unsigned((units + 255) / 256), 256, 0, stream>>>(p, units_per_row, rows);
}

}  // namespace flashattn2
