// FlashAttention-2 forward for float32 inputs (issue 21): 3xTF32 on mma.sync (sm_80 code,
// also run on sm_90), float32 q, k, v, o and LSE.
//
// Tiling
//   grid   (ceil(seqlen_q / kBlockM), nheads, batch), m blocks in reverse order (the longest
//          causal rows first), as the 2-byte kernel (sm80/fwd_kernel.cuh).
//   block  4 warps; warp w owns kMTiles m16 query tiles (rows [16 kMTiles w, +16 kMTiles);
//          kMTiles 2 up to d64, 1 at d128: fwd_config.h) and all kBlockN keys of a tile, so
//          row max / row sum reduce inside a quad, and each K / V fragment is split once for
//          the warp's kMTiles tiles.
//   smem   sQ RowTile [kBlockM x d] + 2 stages x (sK RowTile, sV KRowTile) [kBlockN x d],
//          float32 (tf32.cuh: padded / swizzled so every fragment LDS is conflict free), + at
//          d <= 64 a third stage-sized buffer for the lo halves of the split K / V (kPreSplit;
//          sK then a PairTile: a B fragment's (b0, b1) one 64-bit LDS from hi, one from lo):
//          66 / 82 / 98 KiB at d32 / d64 / d128 (fits the 99 KiB of sm_86 / sm_89).
//   keys   S's n8 column p of each 8-key group holds key p / 2 + 4 (p % 2): lane g reads K
//          row perm(g) for the B fragment of S = Q K^T, and then the C fragment of P is the
//          A fragment of P V as it stands (a0 = c0, a1 = c2, a2 = c1, a3 = c3; keys q, q+4).
//          Masks use the permuted key of each element.
//   step   (K/V tiles from the last visible one down)
//            wait tile n ; __syncthreads ; cp.async tile n-1 into the other stage
//            (kPreSplit: split tile n into hi (in place) / lo ; __syncthreads)
//            S = Q K^T: per k8 step, Q's A fragments (4 LDS each) split once into hi/lo,
//            each n8 tile's B (2 LDS, split once; 2 LDS.64 presplit), 3 MMAs (lo*hi, hi*lo,
//            hi*hi) per m tile into a fresh accumulator, FADD into S (tf32.cuh: two-level
//            accumulation) ;
//            mask if the tile needs it
//            online softmax in base 2 (exact row max, rescale every step)
//            O = O correction + P V: P's A fragments split, V's B as K's; per n8 tile of O
//            the 3 MMAs of 4 k8 steps (32 keys) into a fresh accumulator, FFMA into O
//   epilogue  quad-reduce the row sums, O = acc_o / sum written from the accumulators
//          (float2 stores); LSE = max * scale + ln(sum), +inf for a row that sees no key.
//   general  the kGeneral instance, for varlen (cu_seqlens_q / cu_seqlens_k, fp32/seq.cuh: the
//          grid covers the longest sequence, a CTA past its sequence's rows returns, rows
//          are offset by the sequence's first row) and softcap / ALiBi (fp32/mods.cuh: the
//          scores turned into natural-unit logits before the mask; the softmax then takes
//          exp2((x - max) log2e), as it does without modifiers in this instance). The plain
//          instance, dense without modifiers, keeps the code it had without them.
//   limits d multiple of 8, <= kHeadDim (32, 64, 128); 16-byte aligned pointers and strides
//          a multiple of 4 elements (host API); ragged tails zero-filled and masked. No KV
//          cache / split-KV / dropout / bias (mha_fwd refuses them for float32).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"
#include "fp32/fwd_config.h"
#include "fp32/mods.cuh"
#include "fp32/seq.cuh"
#include "fp32/tf32.cuh"

namespace flashattn2 {

template <int kHeadDim_>
struct Fp32FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kMTiles = fp32_fwd_m_tiles(kHeadDim);
  static constexpr int kBlockM = fp32_fwd_block_m(kHeadDim);
  static constexpr int kBlockN = fp32_fwd_block_n(kHeadDim);
  static constexpr int kNWarps = kBlockM / (16 * kMTiles);
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr bool kPreSplit = fp32_fwd_presplit(kHeadDim);
  using QTile = RowTile<kBlockM, kHeadDim>;
  // sK: split, a PairTile (tf32.cuh: a B fragment's columns q, q + 4 one 64-bit LDS).
  using KTile = std::conditional_t<kPreSplit, PairTile<kBlockN, kHeadDim>,
                                   RowTile<kBlockN, kHeadDim>>;
  using VTile = KRowTile<kBlockN, kHeadDim>;
  static constexpr int kStageFloats = KTile::kFloats + VTile::kFloats;
  static constexpr int kSmemBytes = 4 * (QTile::kFloats + (kPreSplit ? 3 : 2) * kStageFloats);
  static_assert(kStageFloats % 4 == 0 && QTile::kFloats % 4 == 0, "stages 16-byte aligned");
  static_assert(kSmemBytes == fp32_fwd_smem_bytes(kHeadDim), "fwd_config.h and the tiles agree");
};

template <typename Traits, bool kGeneral>
__global__ void __launch_bounds__(Traits::kNThreads) fwd_fp32_kernel(const FwdParams p) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kMTiles = Traits::kMTiles;  // m16 tiles per warp
  constexpr int kNTilesN = kBlockN / 8;  // n8 tiles of S = k8 steps of P V
  constexpr int kNTilesD = kHeadDim / 8;  // n8 tiles of O = k8 steps of Q K^T
  constexpr int kPVSteps = 4;  // k8 steps of P V per two-level step (below)
  static_assert(kNTilesN % kPVSteps == 0, "P V in whole two-level steps");
  using QTile = typename Traits::QTile;
  using KTile = typename Traits::KTile;
  using VTile = typename Traits::VTile;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* const sQ = reinterpret_cast<float*>(smem_raw);
  float* const sKV0 = sQ + QTile::kFloats;  // stage s: K at sKVs, V at sKVs + KTile::kFloats
  float* const sKV1 = sKV0 + Traits::kStageFloats;
  // kPreSplit: the tf32 lo halves of the current stage's K and V (same layout as a stage; the
  // hi halves replace the values in place).
  float* const sKVlo = sKV1 + Traits::kStageFloats;
  constexpr bool kPreSplit = Traits::kPreSplit;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int head_k = head / (p.nheads / p.nheads_k);
  const int row0 = m_block * kBlockM;
  const Fp32Seq<kGeneral> seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  if (kGeneral && row0 >= seqlen_q) return;  // (the grid covers the longest sequence)

  const float* gQ = static_cast<const float*>(p.q) + batch * p.q_batch_stride +
                    head * p.q_head_stride + (seq.q_row0 + row0) * p.q_row_stride;
  const float* gK = static_cast<const float*>(p.k) + batch * p.k_batch_stride +
                    head_k * p.k_head_stride + seq.k_row0 * p.k_row_stride;
  const float* gV = static_cast<const float*>(p.v) + batch * p.v_batch_stride +
                    head_k * p.v_head_stride + seq.k_row0 * p.v_row_stride;

  // Visible key range of the tile (bottom-right aligned window, FwdParams).
  const int offset = seqlen_k - seqlen_q;
  const int i_first = row0;
  const int i_last = min(row0 + kBlockM, seqlen_q) - 1;
  const KeyBlocks blocks = visible_key_blocks<kBlockN>(p, i_first, i_last, seqlen_k, offset);
  const int n_block_min = blocks.min, n_block_max = blocks.max;

  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    float* const sK = stage ? sKV1 : sKV0;
    load_tile_f32<KTile, kBlockN, kHeadDim, kNThreads>(sK, gK + int64_t(n0) * p.k_row_stride,
                                                       p.k_row_stride, seqlen_k - n0, p.headdim, tid);
    load_tile_f32<VTile, kBlockN, kHeadDim, kNThreads>(sK + KTile::kFloats,
                                                       gV + int64_t(n0) * p.v_row_stride,
                                                       p.v_row_stride, seqlen_k - n0, p.headdim, tid);
  };
  // Prologue: Q and the first K/V tile in one cp.async group.
  load_tile_f32<QTile, kBlockM, kHeadDim, kNThreads>(sQ, gQ, p.q_row_stride, seqlen_q - row0,
                                                     p.headdim, tid);
  if (n_block_max > n_block_min) load_kv(n_block_max - 1, 0);
  ptx::cp_async_commit();

  const int g = lane / 4;
  const int q = lane % 4;
  const int warp_row0 = warp * 16 * kMTiles;
  const int key_g = (g >> 1) + 4 * (g & 1);  // the key of S column g of an n8 tile
  // The lane's word offsets (tf32.cuh layouts): Q A fragment (row g of m tile 0, col q);
  // K B fragment (key row perm(g), col q; kPreSplit: the PairTile's XOR on column bits 3-4
  // with the pair 2q); V B fragment (key row q, col g) for each column group parity class
  // (col / 8) % 4 of the swizzle.
  const int q_off = QTile::offset(warp_row0 + g, q);
  const int k_off = kPreSplit ? (2 * q) ^ (PairTile<1, kHeadDim>::h(key_g) << 3)
                              : RowTile<kBlockN, kHeadDim>::offset(key_g, q);
  int v_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v_off[j] = KTile::kFloats + VTile::offset(q, 8 * j + g);

  constexpr float kLog2e = 1.4426950408889634f;
  // kGeneral: the modifiers of (batch, head); the softmax's scores are then logits (unit 1).
  const Fp32Mods mods = kGeneral ? Fp32Mods(p, batch, head) : Fp32Mods{};
  const float scale_log2 = (kGeneral ? mods.unit(p) : p.softmax_scale) * kLog2e;
  float acc_o[kMTiles][kNTilesD][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kNTilesD; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  }

  auto step = [&](auto mask_tag, int n_block, const float* sK) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const float* sV = sK;  // (v_off includes the K tile)
    float acc_s[kMTiles][kNTilesN][4];
    // S = Q K^T over the d / 8 k steps.
#pragma unroll
    for (int kk = 0; kk < kNTilesD; ++kk) {
      tf32::FragA fa[kMTiles];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const float* a = sQ + q_off + 16 * mt * QTile::kStride + 8 * kk;
        fa[mt] = tf32::FragA(a[0], a[8 * QTile::kStride], a[4], a[8 * QTile::kStride + 4]);
      }
#pragma unroll
      for (int nt = 0; nt < kNTilesN; ++nt) {
        tf32::FragB fb;
        if constexpr (kPreSplit) {
          const int b = (key_g + 8 * nt) * kHeadDim + 32 * (kk / 4) + ((8 * (kk % 4)) ^ k_off);
          fb = tf32::split_pair_at(sK, sKVlo, b);
        } else {
          const int b = k_off + 8 * nt * KTile::kStride + 8 * kk;
          fb = tf32::FragB(sK[b], sK[b + 4]);
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) tf32::mma3_add(acc_s[mt][nt], fa[mt], fb, kk == 0);
      }
    }

    if constexpr (kGeneral) {
      if (mods.on) {  // scores -> logits (natural units), before the masks (tanh(-inf) = -1)
        const int col0 = n_block * kBlockN;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + warp_row0 + 16 * mt + g + 8 * r;
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const int col = col0 + 8 * nt + q + 4 * (e & 1);  // the permuted key
              float dlogit;
              acc_s[mt][nt][e] = mods.logit(p, acc_s[mt][nt][e], float(row + offset - col), &dlogit);
            }
        }
      }
    }

    if constexpr (kMask) {
      const int col0 = n_block * kBlockN;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + warp_row0 + 16 * mt + g + 8 * r;
        const int col_hi = p.window_right >= 0 ? min(seqlen_k - 1, row + offset + p.window_right)
                                               : seqlen_k - 1;
        const int col_lo = p.window_left >= 0 ? row + offset - p.window_left : 0;
#pragma unroll
        for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const int col = col0 + 8 * nt + q + 4 * (e & 1);  // the permuted key
            if (col < col_lo || col > col_hi) acc_s[mt][nt][e] = -INFINITY;
          }
      }
    }

    // Online softmax (base 2) per row r (g, g + 8): max over the quad, the sum rescaled
    // (O with the P V below), p in place.
    float correction[kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = row_max[mt][r];
#pragma unroll
      for (int nt = 0; nt < kNTilesN; ++nt)
        m = fmaxf(m, fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
      // A row with only masked scores so far keeps max -inf: use 0 so that -inf - -inf
      // never happens (its p and correction are then exp2(-inf) = 0).
      float sum = 0.f;
      const float m0 = m == -INFINITY ? 0.f : m;
      // The correction from the difference of the maxima: exactly 1 for an unchanged max
      // (row_max scale_log2 - m scale_log2, contracted to an FFMA, is the rounding error of
      // m scale_log2: 1 +- 1 ulp at every key tile, whose random walk of the sum cancels in
      // O / sum but not in the LSE: ~1.2e-5 at 4k keys; scripts/fp32wg_lse.py).
      correction[mt][r] = ptx::exp2_approx((row_max[mt][r] - m0) * scale_log2);
      if constexpr (kGeneral) {
        // (x - max) log2e: the difference before the scaling, so that large logits (ALiBi)
        // cost no more than PyTorch's softmax (fp32/mods.cuh)
#pragma unroll
        for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            acc_s[mt][nt][e] = ptx::exp2_approx((acc_s[mt][nt][e] - m0) * scale_log2);
            sum += acc_s[mt][nt][e];
          }
      } else {
        const float max_scaled = m0 * scale_log2;
#pragma unroll
        for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            acc_s[mt][nt][e] = ptx::exp2_approx(fmaf(acc_s[mt][nt][e], scale_log2, -max_scaled));
            sum += acc_s[mt][nt][e];
          }
      }
      row_max[mt][r] = m;
      row_sum[mt][r] = row_sum[mt][r] * correction[mt][r] + sum;
    }

    // O = O correction + P V, in two levels: per n8 tile of O, the k chain of kPVSteps k8
    // steps (32 keys) into a fresh accumulator (tf32::mma3_chain), then one FFMA into acc_o,
    // so that acc_o, summed over every key tile, is never an MMA's (truncating) accumulator.
    // k8 step nt is S's n8 tile nt (keys 8nt + q, 8nt + q + 4 in the lane's c0/c1).
#pragma unroll
    for (int nt0 = 0; nt0 < kNTilesN; nt0 += kPVSteps) {
      tf32::FragA fa[kMTiles][kPVSteps];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int i = 0; i < kPVSteps; ++i) {
          const float(&x)[4] = acc_s[mt][nt0 + i];
          fa[mt][i] = tf32::FragA(x[0], x[2], x[1], x[3]);
        }
#pragma unroll
      for (int dt = 0; dt < kNTilesD; ++dt) {
        tf32::FragB fb[kPVSteps];
#pragma unroll
        for (int i = 0; i < kPVSteps; ++i) {
          const int b = v_off[dt % 4] + 8 * (nt0 + i) * kHeadDim + 32 * (dt / 4);
          fb[i] = kPreSplit ? tf32::FragB(tf32::split_at(sV, sKVlo, b),
                                          tf32::split_at(sV, sKVlo, b + 4 * kHeadDim))
                            : tf32::FragB(sV[b], sV[b + 4 * kHeadDim]);
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          float t[4];
          tf32::mma3_chain<kPVSteps>(t, fa[mt], fb);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_o[mt][dt][e] = nt0 == 0 ? fmaf(acc_o[mt][dt][e], correction[mt][e / 2], t[e])
                                        : acc_o[mt][dt][e] + t[e];
        }
      }
    }
  };

  for (int n_block = n_block_max - 1, stage = 0; n_block >= n_block_min; --n_block, stage ^= 1) {
    // Tile n_block has landed in `stage`, and every warp is done with the other stage.
    ptx::cp_async_wait<0>();
    __syncthreads();
    if (n_block > n_block_min) load_kv(n_block - 1, stage ^ 1);
    ptx::cp_async_commit();
    if constexpr (kPreSplit) {
      // K and V split once for all warps (else every warp splits every element it reads);
      // the lo buffer is free: every warp is past the last step.
      float* const sK = stage ? sKV1 : sKV0;
      tf32::split_pairs<KTile::kFloats, kNThreads>(sK, sKVlo, tid);
      tf32::split_in_place<VTile::kFloats, kNThreads>(sK + KTile::kFloats,
                                                      sKVlo + KTile::kFloats, tid);
      __syncthreads();
    }
    const int col0 = n_block * kBlockN;
    const bool need_mask =
        col0 + kBlockN > seqlen_k ||
        (p.window_right >= 0 && col0 + kBlockN - 1 > i_first + offset + p.window_right) ||
        (p.window_left >= 0 && col0 < i_last + offset - p.window_left);
    const float* sK = stage ? sKV1 : sKV0;
    if (need_mask) {
      step(std::true_type{}, n_block, sK);
    } else {
      step(std::false_type{}, n_block, sK);
    }
  }
  ptx::cp_async_wait<0>();  // (Q may be in flight when no K/V tile was visible)

  // Epilogue: O and LSE straight from the accumulators (varlen: the sequence's first row
  // re-read, not kept live across the mainloop).
  const int64_t q_row0 = Fp32Seq<kGeneral>(p, batch).q_row0;
  const float unit = kGeneral ? Fp32Mods(p, batch, head).unit(p) : p.softmax_scale;
  float* gO = static_cast<float*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
              q_row0 * p.o_row_stride;
  float* gLse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + q_row0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[mt][r];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const float inv = sum == 0.f ? 0.f : 1.f / sum;
    const int row = row0 + warp_row0 + 16 * mt + g + 8 * r;
    if (row < seqlen_q) {
      float* o_row = gO + int64_t(row) * p.o_row_stride;
#pragma unroll
      for (int dt = 0; dt < kNTilesD; ++dt) {
        const int col = 8 * dt + 2 * q;
        if (col < p.headdim) {
          *reinterpret_cast<float2*>(o_row + col) =
              make_float2(acc_o[mt][dt][2 * r] * inv, acc_o[mt][dt][2 * r + 1] * inv);
        }
      }
      if (q == 0) gLse[row] = sum == 0.f ? INFINITY : row_max[mt][r] * unit + logf(sum);
    }
  }
}

}  // namespace flashattn2
