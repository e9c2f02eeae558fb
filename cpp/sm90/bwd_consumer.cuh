// Pieces of the Hopper backward's consumer warpgroups that bwd_kernel (d64 / d128,
// bwd_kernel.cuh) and bwd_kernel_d256 (bwd_d256.cuh) share: the mask of a warpgroup's S^T
// tile (mask_tile) and the epilogue's dK / dV stores (store_dk_dv, staged in shared memory).
// Both work on accumulators in the mma.sync C layout (a warp's 16 keys x n8 tiles: lane
// (g, q) holds keys g, g + 8 and columns 2 q, 2 q + 1 of each tile), inlined into the
// consumers' 240 registers.
#pragma once
#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// The mask of a warpgroup's S^T tile that crosses seqlen_k or the window (causal:
// window_right 0, bottom-right aligned; offset seqlen_k - seqlen_q): those elements to -inf.
// Element acc[4 nt + 2 r + e] of lane (g, q): key key_lane + 8 r (key_lane: the lane's first
// key), query q0 + 8 nt + 2 q + e. (The test of whether the tile crosses them stays in the
// kernels: as a part of this function it compiled to other branches, d64 / d128 SASS.)
template <int kQueries, bool kVarlen>
__device__ __forceinline__ void mask_tile(float (&acc)[kQueries / 2], const BwdParams& p,
                                          const BwdSeq<kVarlen>& seq, int key_lane, int q0,
                                          int q, int offset) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_lane + 8 * r;
    const int q_lo = (p.window_right >= 0 ? key - offset - p.window_right : 0) - q0 - 2 * q;
    const int q_hi = (key >= seq.seqlen_k()   ? -1
                      : p.window_left >= 0 ? key - offset + p.window_left
                                           : seq.seqlen_q() - 1) - q0 - 2 * q;
#pragma unroll
    for (int nt = 0; nt < kQueries / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * nt + e;
        if (col < q_lo || col > q_hi) acc[4 * nt + 2 * r + e] = -INFINITY;
      }
  }
}

// The kDbias instances' targets (bwd_kernel.cuh): none, dbias in the attention's dtype (stored),
// float32 dbias stored, float32 dbias added by red.add (BwdParams::dbias_add).
constexpr int kDbiasNone = 0, kDbiasElement = 1, kDbiasF32 = 2, kDbiasF32Add = 3;

// kDbiasElement, in two parts. stage_dbias: the warp's dS^T (keys 16 w..+15 of the warpgroup's
// 64 x kQueries queries: the dK GEMM's A fragments rdS) transposed by stmatrix into its own two
// 16-byte chunks 2 w, 2 w + 1 of every query row of the warpgroup's staged bias tile (row r at
// r * 128 bytes, chunk c at (c ^ r % 8) * 16: conflict-free), which no other warp touches
// until the next step's copies (issued after the sdS barrier): A fragment [kk][i] holds keys
// 16 w + 8 (i & 1) + g, queries 16 kk + 8 (i >> 1) + 2 q, + 1, so stored transposed its row j
// is query 16 kk + 8 (i >> 1) + j, keys of chunk 2 w + (i & 1). The warp's own bias reads of
// those rows (the logits) come before it in program order; __syncwarp orders the lanes. k16
// steps kk_begin..kk_end - 1; called before the dK GEMM that reads them is issued (the A
// registers of an RS wgmma in flight are not to be touched, reads included: PTX ISA).
template <int kQueries>
__device__ __forceinline__ void stage_dbias(uint32_t tile, const uint32_t (&rdS)[kQueries / 16][4],
                                            int warp_in_wg, int lane, int kk_begin, int kk_end) {
  const int i = lane / 8, j = lane % 8;
  const uint32_t addr = tile + (8 * (i >> 1) + j) * 128 + (((2 * warp_in_wg + (i & 1)) ^ j) * 16);
  __syncwarp();
#pragma unroll
  for (int kk = kk_begin; kk < kk_end; ++kk)
    ptx::stmatrix_x4_trans(addr + kk * 16 * 128, rdS[kk]);
  __syncwarp();
}
// store_dbias_tile: the warp's chunks back, one 16-byte load and store per lane and 16 rows
// (lane t: row t % 16 + 16 it, chunk 2 w + t / 16: lanes t, t + 16 write one 32-byte sector of
// a row; a quarter warp reads 8 rows of one chunk, distinct banks) to `dst` (dbias of the
// step's first query and the warpgroup's first key, rows row_stride elements apart, 16-byte
// aligned: sm90_bwd_takes_bias). Rows from `rows` on are skipped, chunks from `keys` on too;
// a chunk across seqlen_k writes its keys past it (dS = 0) into the row's padding.
template <typename Element, int kQueries>
__device__ __forceinline__ void store_dbias_tile(uint32_t tile, Element* dst, int64_t row_stride,
                                                 int rows, int keys, int warp_in_wg, int lane) {
  const int row = lane % 16, chunk = 2 * warp_in_wg + lane / 16;
  if (8 * chunk >= keys) return;
  const uint32_t src = tile + row * 128 + ((chunk ^ (row % 8)) * 16);
  dst += row * row_stride + 8 * chunk;
  // (all loads first: one load-to-store latency per step, not one per row block)
  uint4 v[kQueries / 16];
#pragma unroll
  for (int it = 0; it < kQueries / 16; ++it) v[it] = ld_shared_v4(src + it * 16 * 128);
#pragma unroll
  for (int it = 0; it < kQueries / 16; ++it) {
    if (row + 16 * it < rows) *reinterpret_cast<uint4*>(dst + 16 * it * row_stride) = v[it];
  }
}

// Float32 dbias (kDbiasF32 / kDbiasF32Add): dS of one key pair, as the mma.sync backward
// (ScoreMod::store_dbias2): the lane holds queries i, i + 1 of key j, the lane 4 apart (xor)
// the same queries of key j ^ 1; after one shuffle lanes of even j hold (i, j), (i, j + 1),
// lanes of odd j (i + 1, j - 1), (i + 1, j), the pair at `at`. Every lane of the warp calls it
// (the shuffle); `valid`: the pair's query < seqlen_q and its first key < seqlen_k.
template <int kTarget>
__device__ __forceinline__ void store_dbias_pair(char* at, bool odd, bool valid, float ds0,
                                                 float ds1) {
  const float got = __shfl_xor_sync(0xffffffffu, odd ? ds0 : ds1, 4);
  const float lo = odd ? got : ds0, hi = odd ? ds1 : got;
  static_assert(kTarget == kDbiasF32 || kTarget == kDbiasF32Add, "float32 targets");
  if constexpr (kTarget == kDbiasF32Add) {
    ptx::red_add_v2_if(reinterpret_cast<float*>(at), lo, hi, valid);
  } else if (valid) {
    *reinterpret_cast<float2*>(at) = make_float2(lo, hi);
  }
}

// Epilogue: dK * softmax_scale and dV in the input dtype, through shared memory. The warp's
// 16 key rows x kCols columns (from col0) of an accumulator (element [4 dt + 2 r + e] of lane
// (g, q): key warp_key0 + g + 8 r, column col0 + 8 dt + 2 q + e) go by stmatrix into `stage`
// (the warp's row 0 of its first 128-byte swizzled chunk, chunks chunk_bytes apart: rows of
// the K/V tile that no other thread reads any more, see the callers), then back 16 bytes a
// lane, each warp instruction whole row segments (kCols 128: 2 rows of 256 bytes), into K/V
// head head_k of batch entry `batch`: dV first, then dK into the same rows. Keys past
// seqlen_k and columns past a padded head dim are skipped (the API keeps dk / dv rows 16-byte
// aligned). The 4-byte stores straight from the accumulators that this replaces touched 8
// rows per warp instruction: 8x the write requests.
template <typename Element, int kCols, bool kVarlen>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                            int batch, int head_k, int warp_key0, int col0,
                                            uint32_t stage, uint32_t chunk_bytes, int lane,
                                            const float (&acc_dk)[kCols / 2],
                                            const float (&acc_dv)[kCols / 2]) {
  static_assert(kCols <= 256, "at most 16 units a row");
  auto stage_rows = [&](const float (&acc)[kCols / 2], float scale) {
    const float scales[2] = {scale, scale};
    stmatrix_acc_rows<Element, kCols>(stage, chunk_bytes, lane, acc, scales);
  };
  // Read back: lane l takes 16-byte unit l % kUnits of row l / kUnits (+ kRowsPerPass per
  // pass); 8 lanes read one 128-byte chunk row (distinct banks).
  constexpr int kUnits = kCols / 8, kRowsPerPass = 32 / kUnits, kPasses = 16 / kRowsPerPass;
  const int unit = lane % kUnits;
  const bool col_ok = col0 + 8 * unit < p.headdim;
  const int rows = seq.seqlen_k() - warp_key0;  // (rows from it on are past seqlen_k)
  auto store_rows = [&](Element* dst, int64_t row_stride) {
    uint4 v[kPasses];  // (all loads first: one load-to-store latency)
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int row = kRowsPerPass * it + lane / kUnits;
      v[it] = ld_shared_v4(stage + (unit / 8) * chunk_bytes + row * kSwizzleBytes +
                           (((unit % 8) ^ (row % 8)) * 16));
    }
    dst += int64_t(warp_key0) * row_stride + col0 + 8 * unit;
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int row = kRowsPerPass * it + lane / kUnits;
      if (col_ok && row < rows) *reinterpret_cast<uint4*>(dst + row * row_stride) = v[it];
    }
  };
  Element* const dk = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                      head_k * p.dk_head_stride + int64_t(seq.k_row0()) * p.dk_row_stride;
  Element* const dv = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                      head_k * p.dv_head_stride + int64_t(seq.k_row0()) * p.dv_row_stride;
  stage_rows(acc_dv, 1.f);
  __syncwarp();  // (the lanes' stmatrix before the other lanes' reads)
  store_rows(dv, p.dv_row_stride);
  __syncwarp();  // (every lane's reads before the rows are written again)
  stage_rows(acc_dk, p.softmax_scale);
  __syncwarp();
  store_rows(dk, p.dk_row_stride);
}

}  // namespace sm90
}  // namespace flashattn2
