// Warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors and the fence / commit /
// wait that bracket the asynchronous MMAs of wgmma_ops.cuh.
//
// Shared-memory tiles of the sm90 kernels are stored as column chunks of 64 2-byte elements
// (128-byte rows) in the 128-byte swizzle that TMA writes (CU_TENSOR_MAP_SWIZZLE_128B): the
// 16-byte unit u of row r sits at unit u ^ (r % 8). A chunk is 8-row groups of 1024 bytes,
// each chunk 1024-byte aligned, so that pattern is the one the descriptors below describe.
//   K-major operand (Q and K for S = Q K^T: the reduction dim, d, is contiguous): a k16 step
//     reads 32 bytes of each row; the descriptor starts at the step's 32-byte column in the
//     chunk, 8-row groups are 1024 bytes apart (stride byte offset), the leading byte offset
//     is unused (1).
//   MN-major operand (V for O = P V: the reduction dim, keys, is the row): a k16 step reads
//     16 rows (2 groups of 8 rows, 1024 bytes apart: stride byte offset) and N = d columns,
//     64 per chunk, chunks `chunk_bytes` apart (leading byte offset).
#pragma once
#include <cstdint>

#include "common/ptx.cuh"
#include "sm90/wgmma_ops.cuh"

namespace flashattn2 {
namespace sm90 {

constexpr int kSwizzleBytes = 128;          // one smem row of a chunk
constexpr int kChunkCols = kSwizzleBytes / 2;  // 2-byte elements per chunk row

// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4, 62-63 swizzle (1 = 128 B).
__device__ __forceinline__ uint64_t smem_desc(uint32_t smem_addr, uint32_t lead_bytes,
                                              uint32_t stride_bytes) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t(lead_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32) | (uint64_t(1) << 62);
}
// K-major operand rows starting at smem_addr (a 1024-byte aligned 8-row group plus the k16
// step's 32-byte column offset).
__device__ __forceinline__ uint64_t desc_k_major(uint32_t smem_addr) {
  return smem_desc(smem_addr, 16, 8 * kSwizzleBytes);
}
// MN-major operand: k16 step starting at row group smem_addr, N columns in chunks
// `chunk_bytes` apart.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t smem_addr, uint32_t chunk_bytes) {
  return smem_desc(smem_addr, chunk_bytes, 8 * kSwizzleBytes);
}

// The descriptor of `bytes` (a multiple of 16) past the start of `desc`'s: its start address
// field plus bytes >> 4, one 32-bit add (smem addresses stay below 2^18, so the 14-bit field
// never carries into the leading byte offset).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}

// A warp's 16 rows of an accumulator in the mma.sync C layout (element [4 dt + 2 r + e] of
// lane (g, q): row g + 8 r, column 8 dt + 2 q + e; kCols columns), times scale[r], as 2-byte
// Element into shared memory in the layout above: the warp's row i at rows + i kSwizzleBytes
// (rows: a whole 8-row group of its chunk), its columns in chunks `chunk_bytes` apart (the
// epilogues' staging: O for its TMA store, dK / dV for 16-byte row stores). One stmatrix.x4
// per pair of 8-column blocks (dt, dt + 1): matrix m is rows 8 (m % 2)..+7, block dt + m / 2,
// so lane l gives the address of row l % 8 of matrix l / 8 (its 16-byte unit in the swizzle:
// (dt % 8) ^ (l / 16) ^ (l % 8), dt even).
template <typename Element, int kCols>
__device__ __forceinline__ void stmatrix_acc_rows(uint32_t rows, uint32_t chunk_bytes, int lane,
                                                  const float (&acc)[kCols / 2],
                                                  const float (&scale)[2]) {
  static_assert(kCols % 16 == 0, "whole stmatrix.x4 column pairs");
  const uint32_t row_addr = rows + (8 * ((lane / 8) % 2) + lane % 8) * kSwizzleBytes;
  const int unit = (lane / 16) ^ (lane % 8);
#pragma unroll
  for (int dt = 0; dt < kCols / 8; dt += 2) {
    uint32_t v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 4 * (dt + m / 2) + 2 * (m % 2);
      v[m] = ptx::pack2<Element>(acc[i] * scale[m % 2], acc[i + 1] * scale[m % 2]);
    }
    ptx::stmatrix_x4(row_addr + (dt / 8) * chunk_bytes + (((dt % 8) ^ unit) * 16), v);
  }
}

// wgmma.fence.sync.aligned: orders this warpgroup's earlier register accesses (accumulators,
// A fragments) before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// wgmma.commit_group.sync.aligned: the wgmma issued since the last commit form one group.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// wgmma.wait_group.sync.aligned N: wait until at most N groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of `r` across the asynchronous wgmma (an empty asm
// that reads and writes it).
template <int kN>
__device__ __forceinline__ void fence_regs(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

}  // namespace sm90
}  // namespace flashattn2
