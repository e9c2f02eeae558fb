// The float32 wgmma kernels' shared helpers (fp32/wg_kernel.cuh, the forward;
// fp32/wg_bwd_kernel.cuh and fp32/wg_bwd128_kernel.cuh, the backwards): the 128-byte swizzle of
// their float32 tiles, the tf32 split of a float4, the CTA's tile from its grid, bounds-checked
// 16-byte global loads.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "fp32/tf32.cuh"

namespace flashattn2 {
namespace fp32wg {

// Byte offset of element (r, c) of a [kRows x C] float32 tile in 32-column chunks of 128-byte
// rows, 128-byte swizzle (the chunk kRows x 128 bytes, 1024-byte aligned).
template <int kRows>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return (c / 32) * (kRows * 128) + r * 128 + ((((c % 32) / 4) ^ (r % 8)) * 16) + (c % 4) * 4;
}

// The split of a float4 as two float4 (hi, lo) of tf32 values.
struct Split4 {
  float4 hi, lo;
};
__device__ __forceinline__ Split4 split4(float4 x) {
  const tf32::Split a = tf32::split(x.x), b = tf32::split(x.y), c = tf32::split(x.z),
                    d = tf32::split(x.w);
  auto f = [](uint32_t u) { return __uint_as_float(u); };
  return {make_float4(f(a.hi), f(b.hi), f(c.hi), f(d.hi)),
          make_float4(f(a.lo), f(b.lo), f(c.lo), f(d.lo))};
}

// (4- and 16-byte shared loads; asm volatile: ordered with the thread's other shared accesses)
__device__ __forceinline__ float ld_shared_float(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_shared_float4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// The CTA's tile, head and batch from its grid (fp32wg_grid, fp32/launch.h): tiles along x,
// or, tile-major, along y with the heads along x. Only blockIdx, no arithmetic: the values stay
// in uniform registers (computed ones took vector registers, and the 3xTF32 d128 forward and
// d64 backward spilled).
struct GridTile {
  int tile, head, batch;
};
// kReread: the block indices read again (not the values of an earlier call, which the compiler
// would otherwise keep live across the kernel's loop).
template <bool kReread = false>
__device__ __forceinline__ GridTile grid_tile(bool tile_major) {
  int x = blockIdx.x, y = blockIdx.y;
  if constexpr (kReread) asm volatile("" : "+r"(x), "+r"(y));
  return tile_major ? GridTile{y, x, int(blockIdx.z)} : GridTile{x, y, int(blockIdx.z)};
}

// The position of key k within V^T's 8-key group (wg_kernel.cuh's file comment): key 2q -> q,
// 2q+1 -> q+4.
__device__ __forceinline__ int key_pos(int k) {
  return (k & ~7) | ((k & 7) >> 1) | ((k & 1) << 2);
}

// 16-byte load of row `row`, columns c..c+3 of a float32 matrix whose element (0, 0) is at g
// (g + row row_stride + c: g must not include the column c), zero past rows / cols. A
// volatile asm: the producer's batches of loads stay ahead of their stores (an __ldg may be
// moved past them, and ptxas then interleaved and spilled).
__device__ __forceinline__ float4 load4(const float* g, int64_t row_stride, int row, int rows,
                                        int c, int cols) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (row < rows && c < cols) {
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(g + row * row_stride + c));
  }
  return v;
}

}  // namespace fp32wg

}  // namespace flashattn2
