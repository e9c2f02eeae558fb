// The consumer's per-step math of the Hopper forward on a wgmma accumulator fragment: score
// modifiers, mask, online softmax, P as A fragments. The fragment of a 64 x kBlockN tile
// holds, per thread, rows r0 + 8 r (r = 0, 1) of its warp's 16 and columns 8 nt + 2 q + e
// (acc[4 nt + 2 r + e]), the mma.sync C layout (sm90/wgmma_ops.cuh), so the row
// reductions run over the thread's column pairs and then the quad, as in the sm80 kernel.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/score_mod.cuh"
#include "sm90/warpgroup.cuh"

namespace flashattn2 {
namespace sm90 {

// kBias (with kMods; FLASHATTN2_BIAS builds): the instance that also adds an attention bias.
template <int kBlockN, bool kMods, bool kBias = false>
struct FwdSoftmax {
  static constexpr int kNTiles = kBlockN / 8;  // n8 column tiles
  static constexpr float kLog2e = 1.4426950408889634f;
  ScoreMod mod;
  float scale_log2;  // exp2(scale_log2 (s - max)) is p
  float lse_scale;   // LSE = max * lse_scale + ln(sum)
  float row_max[2], row_sum[2];

  // Base 2 (common/score_mod.cuh): with an ALiBi bias S becomes base-2 logits (scale 1);
  // otherwise S holds the (capped) scores and mult() is the scale.
  __device__ __forceinline__ FwdSoftmax(const FwdParams& p, int batch, int head) {
    scale_log2 = p.softmax_scale * kLog2e;
    lse_scale = p.softmax_scale;
    if constexpr (kMods) {
      mod = ScoreMod(p, batch, head);
      if constexpr (kBias) mod.init_bias(p, batch, head);
      scale_log2 = mod.slope_log2 != 0.f || (kBias && mod.has_bias()) ? 1.f : mod.mult();
      lse_scale = scale_log2 * 0.6931471805599453f;
    }
  }

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Softcap / ALiBi, then the attention bias (before the mask, which then sets -inf). dist0:
  // row + offset - col of the thread's element (r = 0, nt = 0, e = 0); row0 / col0: its
  // query and key (bias instance only, with the sequence's lengths for the tails; the bias
  // is of the attention's Element type). kBiasSmem (16-byte aligned biases at d64 / d128): the
  // tile's bias is staged in shared memory (fwd_kernel.cuh, zero past the tails): sbias is
  // the address of the thread's row r = 0 plus 4 q, row r = 1 is 8 rows (2 KiB) on, and n8
  // tile nt of a row sits at chunk nt ^ g (gx = 16 g), so that the 8 rows of a warp's reads
  // fall in distinct banks.
  template <typename Element, bool kBiasSmem = false>
  __device__ __forceinline__ void apply_mods(float (&s)[kBlockN / 2], int dist0, int row0 = 0,
                                             int col0 = 0, int seqlen_q = 0, int seqlen_k = 0,
                                             uint32_t sbias = 0, uint32_t gx = 0) const {
    if constexpr (kMods) {
      if (mod.softcap > 0.f) {
#pragma unroll
        for (int i = 0; i < kBlockN / 2; ++i) s[i] = mod.capped(s[i]);
      }
      if (mod.slope_log2 != 0.f) {
        const float mult = mod.mult();
        // dist = dist0 + 8 r - 8 nt - (e & 1)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[4 * nt + e] = fmaf(s[4 * nt + e], mult,
                                 mod.bias(float(dist0 + 8 * (e >> 1) - 8 * nt - (e & 1))));
      }
      if constexpr (kBias) {
        if (mod.has_bias()) {
          // fmaf(bias, log2 e, logit) as the sm80 kernels (and their backward) compute it.
          const float mult = mod.slope_log2 != 0.f ? 1.f : mod.mult();
          if constexpr (kBiasSmem) {
            static_assert(kBlockN == 128, "staged bias rows: 16 chunks of 8 keys");
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const uint32_t pair =
                    ld_shared_b32(sbias + r * 8 * 256 + ((uint32_t(nt) << 4) ^ gx));
                const float2 b = ptx::unpack2<Element>(pair);
                s[4 * nt + 2 * r] = fmaf(b.x, kLog2e, s[4 * nt + 2 * r] * mult);
                s[4 * nt + 2 * r + 1] = fmaf(b.y, kLog2e, s[4 * nt + 2 * r + 1] * mult);
              }
          } else {
#pragma unroll
            for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int i = row0 + 8 * (e >> 1), j = col0 + 8 * nt + (e & 1);
                const float b =
                    i < seqlen_q && j < seqlen_k ? mod.template bias_at<Element>(i, j) : 0.f;
                s[4 * nt + e] = fmaf(b, kLog2e, s[4 * nt + e] * mult);
              }
          }
        }
      }
    }
  }

  // -inf outside [lo[r], hi[r]], the visible columns of row r relative to the thread's
  // first column, so each test compares with a compile-time offset.
  // (kLen: the fragment's floats, kBlockN / 2; fewer for the first columns only, the
  // narrow step of fwd_kernel.cuh kNarrowStep.)
  template <int kLen = kBlockN / 2>
  __device__ __forceinline__ static void mask(float (&s)[kLen], const int (&lo)[2],
                                              const int (&hi)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int nt = 0; nt < kLen / 4; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const int col = 8 * nt + (e & 1);
          if (col < lo[r] || col > hi[r]) s[4 * nt + e] = -INFINITY;
        }
  }

  // Online softmax in base 2: s becomes p; returns O's correction per row. Max and sum are
  // pairwise trees over the thread's column pairs (any count), then the quad.
  template <int kLen = kBlockN / 2>
  __device__ __forceinline__ void online(float (&s)[kLen], float (&correction)[2]) {
    constexpr int kNTiles = kLen / 4;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float part[kNTiles];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) part[nt] = fmaxf(s[4 * nt + 2 * r], s[4 * nt + 2 * r + 1]);
#pragma unroll
      for (int stride = 1; stride < kNTiles; stride *= 2)
#pragma unroll
        for (int i = 0; i + stride < kNTiles; i += 2 * stride) part[i] = fmaxf(part[i], part[i + stride]);
      float m = fmaxf(row_max[r], part[0]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      // A row that has seen only masked scores keeps max -inf: use 0 so that -inf - -inf
      // never happens (its p and correction are then exp2(-inf) = 0).
      const float max_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      correction[r] = ptx::exp2_approx(row_max[r] * scale_log2 - max_scaled);
      row_max[r] = m;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e)
          s[4 * nt + e] = ptx::exp2_approx(fmaf(s[4 * nt + e], scale_log2, -max_scaled));
        part[nt] = s[4 * nt + 2 * r] + s[4 * nt + 2 * r + 1];
      }
#pragma unroll
      for (int stride = 1; stride < kNTiles; stride *= 2)
#pragma unroll
        for (int i = 0; i + stride < kNTiles; i += 2 * stride) part[i] += part[i + stride];
      row_sum[r] = row_sum[r] * correction[r] + part[0];
    }
  }

  // P as the A fragments of the P V wgmma (C layout of n8 tiles 2 kk, 2 kk + 1).
  // (kLen: the fragment's floats; fewer than kBlockN / 2 fill p's first kLen / 8 k16
  // blocks only: kNarrowStep.)
  template <typename Element, int kLen = kBlockN / 2>
  __device__ __forceinline__ static void to_p(const float (&s)[kLen],
                                              uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kLen / 8; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) p[kk][i] = ptx::pack2<Element>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  }

  // Stream-K: folds another piece's state of the same rows (its row max and this thread's
  // partial sums) into this one; returns the factors of this piece's O and of the other's.
  // `tail`: this piece holds the tile's first key blocks (the other its last ones); each
  // sum is head x its factor + tail x its factor in one order (combine()), so the result is
  // the same whichever piece merges.
  __device__ __forceinline__ void merge(const float (&max_b)[2], const float (&sum_b)[2],
                                        bool tail, float (&scale_a)[2], float (&scale_b)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m = fmaxf(row_max[r], max_b[r]);
      const float max_scaled = m == -INFINITY ? 0.f : m * scale_log2;  // (as online())
      scale_a[r] = ptx::exp2_approx(row_max[r] * scale_log2 - max_scaled);
      scale_b[r] = ptx::exp2_approx(max_b[r] * scale_log2 - max_scaled);
      row_sum[r] = combine(row_sum[r], scale_a[r], sum_b[r], scale_b[r], tail);
      row_max[r] = m;
    }
  }
  // a x + b y, as fma(head, its factor, tail x its factor): (a, x) is the tail's if `tail`.
  __device__ __forceinline__ static float combine(float a, float x, float b, float y, bool tail) {
    return tail ? fmaf(b, y, a * x) : fmaf(a, x, b * y);
  }

  // Row sums over the quad; 1 / sum (0 for a row that saw no key) and the LSE (+inf for
  // such a row, or `empty_lse` for a split that saw none of its keys).
  __device__ __forceinline__ void finish(float (&inv)[2], float (&lse)[2], float empty_lse) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      inv[r] = sum == 0.f ? 0.f : 1.f / sum;
      lse[r] = sum == 0.f ? empty_lse : row_max[r] * lse_scale + logf(sum);
    }
  }
};

}  // namespace sm90
}  // namespace flashattn2
