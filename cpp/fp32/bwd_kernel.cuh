// FlashAttention-2 backward for float32 inputs (issue 21): 3xTF32 on mma.sync, as the forward
// (fwd_kernel.cuh); FA2 Algorithm 2 with dQ through float32 atomics.
//
// Kernels (bwd_launch.cuh runs them in this order)
//   preprocess  (bwd_prepost.cu) dsum = rowsum(dO o O), dq_accum zeroed (and the dQ order
//               counters when deterministic); workspace rows of fp32/seq.cuh fp32_ws_row0,
//               dq_accum row-major (row * headdim + column).
//   main        below.
//   convert     (bwd_prepost.cu) dq = dq_accum * softmax_scale at dq's strides.
// Tiling of the main kernel
//   grid   (ceil(seqlen_k / kBlockN), nheads_k, batch): one CTA per K/V tile and KV head; it
//          walks the query tiles of every query head of its GQA group, so dK / dV are summed
//          over the group in registers (exactly once, no per-head temporaries).
//   block  4 warps; warp w owns keys [16w, 16w + 16) of the tile: S^T, P^T, dP^T, dS^T are
//          [16 keys x kBlockM queries] per warp (m16 = keys; kBlockM 32 at d32, else 16),
//          dK / dV [16 keys x d] in registers.
//   smem   sK, sV [kBlockN x d], sQ, sdO [kBlockM x d], sdS [kBlockN x kBlockM], lse / dsum
//          [kBlockM], float32, SwzTile (tf32.cuh): conflict-free 32-bit LDS for both the
//          n-major (row g, col q) and the k-major (row q, col g) fragment reads (sdS at
//          kBlockM 16: padded rows). d <= 64 (kPreSplit): sK, sV, sQ, sdO hold the tf32 hi
//          halves once split, with lo arrays beside them (K, V split at the first step, Q,
//          dO at every step, one extra barrier), so no warp splits them in registers; sQ,
//          sdO are then PairTiles (tf32.cuh): each column pair (c, c + 4) of a B fragment
//          of S^T / dP^T one 64-bit LDS (hi) and one (lo), 4% fewer SASS instructions a step.
//          fwd_config.h fp32_bwd_smem_bytes: d32 56 KiB, d64 85 KiB, d128 85 KiB.
//   queries S^T's n8 column p of each 8-query group holds query p / 2 + 4 (p % 2) (the
//          forward's key permutation, on queries): lane g reads Q / dO row perm(g) for the B
//          fragments of S^T = K Q^T and dP^T = V dO^T, and P^T / dS^T's accumulators are the
//          A fragments of dV += P^T dO and dK += dS^T Q as they stand.
//   step   (query tiles of the visible range, per query head of the group)
//            wait Q_i, dO_i, lse_i, dsum_i ; __syncthreads (kPreSplit: split ; __syncthreads)
//            S^T = K Q^T ; P^T = exp2(S^T scale log2e - lse log2e), masked to 0
//            dV += P^T dO ; dP^T = V dO^T ; dS^T = P^T o (dP^T - dsum) ; dK += dS^T Q
//            (softcap / ALiBi: P^T from the logit, dS^T times d logit / d(scale s))
//            (two-level, tf32.cuh: S^T, dP^T and dQ per k8 step, dV and dK per step,
//            through a fresh accumulator added with FADD)
//            dS^T -> sdS (natural query order) ; __syncthreads
//            cp.async of the next Q, dO, lse, dsum (overlaps the dQ GEMM)
//            dQ_i += dS K: warp w one m16 query tile and a share of the d columns, float32
//            atomics into dq_accum
//   epilogue  dK * softmax_scale and dV written from the accumulators (float2 stores).
//   kGeneral the instance for varlen (cu_seqlens_q / cu_seqlens_k: the grid covers the longest
//          sequence, rows offset by the sequence's first row, fp32/seq.cuh) and for the
//          deterministic dQ order (common/dq_order.cuh, per 64-row group of query rows, whose
//          16 / 32-row tiles a CTA visits in consecutive steps: thread 0 waits for the
//          group's counter to reach the CTA's rank before the group's first dQ adds, and
//          releases it after the group's last; descending with a right window bound, else
//          ascending, one accumulator, no rotated walk), and for softcap / ALiBi
//          (fp32/mods.cuh). The plain instance, dense, unordered and without modifiers,
//          keeps the code it had without them (255 registers).
//   limits as the forward (no dropout, no bias).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/dq_order.cuh"
#include "fp32/fwd_config.h"
#include "fp32/mods.cuh"
#include "fp32/seq.cuh"
#include "fp32/tf32.cuh"

namespace flashattn2 {

template <int kHeadDim_>
struct Fp32BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = fp32_bwd_block_m(kHeadDim);
  static constexpr int kBlockN = kFp32BwdBlockN;
  static constexpr int kNWarps = kBlockN / 16;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kMinBlocks = fp32_bwd_min_blocks(kHeadDim);
  static constexpr bool kPreSplit = fp32_bwd_presplit(kHeadDim);  // lo halves in smem
  using KTile = SwzTile<kBlockN, kHeadDim>;  // sK, sV
  // sQ, sdO: split, a PairTile (their B fragments of S^T, dP^T as 64-bit pairs; the A
  // fragments of K, V stay 32-bit: a pair there costs register moves into the MMA's operand
  // quad (a0 a1 a2 a3), measured 2 per pair in SASS).
  using QTile = std::conditional_t<kPreSplit, PairTile<kBlockM, kHeadDim>,
                                   SwzTile<kBlockM, kHeadDim>>;
  // sdS: swizzled at 32 columns; at 16, rows padded to 20 floats (n-major stores conflict
  // free, k-major reads 2-way on a quarter of the lanes).
  using STile = std::conditional_t<kBlockM % 32 == 0, SwzTile<kBlockN, kBlockM>,
                                   RowTile<kBlockN, kBlockM>>;
  static constexpr int kSmemFloats = (kPreSplit ? 2 : 1) * 2 * (KTile::kFloats + QTile::kFloats) +
                                     STile::kFloats + 2 * kBlockM;
  static_assert(4 * kSmemFloats == fp32_bwd_smem_bytes(kHeadDim), "bwd config and tiles agree");
  // The dQ GEMM: warp w takes m16 query tile w % kMTiles and 1 / (4 / kMTiles) of the columns.
  static constexpr int kMTiles = kBlockM / 16;
  static_assert(kNWarps == 4 && (kBlockM == 16 || kBlockM == 32), "dQ GEMM warp split");
};

// The deterministic order's query-row groups: DqOrder and the workspace counters (seqlen.cuh
// ws_tile0) count 64-row tiles.
constexpr int kFp32DqGroupRows = 64;

template <typename Traits, bool kGeneral>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocks)
    bwd_fp32_kernel(const BwdParams p) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kNTilesM = kBlockM / 8;  // n8 query tiles of S^T = k8 steps of dV, dK
  constexpr int kNTilesD = kHeadDim / 8;
  using KTile = typename Traits::KTile;
  using QTile = typename Traits::QTile;
  using STile = typename Traits::STile;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr bool kPreSplit = Traits::kPreSplit;
  // sK, sV, sQ, sdO hold K, V, Q, dO; with kPreSplit their tf32 hi halves once split (K, V
  // at the first step, Q, dO at every step), the lo halves in sKlo, sVlo, sQlo, sdOlo.
  constexpr int kLo = kPreSplit ? 1 : 0;
  float* const sK = reinterpret_cast<float*>(smem_raw);
  float* const sV = sK + KTile::kFloats;
  float* const sQ = sV + KTile::kFloats;
  float* const sdO = sQ + QTile::kFloats;
  float* const sKlo = sdO + QTile::kFloats;
  float* const sVlo = sKlo + kLo * KTile::kFloats;
  float* const sQlo = sVlo + kLo * KTile::kFloats;
  float* const sdOlo = sQlo + kLo * QTile::kFloats;
  float* const sdS = sdOlo + kLo * QTile::kFloats;
  float* const sLse = sdS + STile::kFloats;
  float* const sDsum = sLse + kBlockM;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = p.nheads / p.nheads_k;
  const Fp32Seq<kGeneral> seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  using Order = DqOrder<kFp32DqGroupRows, kBlockN>;
  auto dq_order = [&] {
    return Order(p, seqlen_q, seqlen_k, (seqlen_q + kFp32DqGroupRows - 1) / kFp32DqGroupRows,
                 false);
  };
  // (deterministic, descending: the last K/V tile launched first)
  const int n_block = kGeneral ? dq_order().n_block() : int(blockIdx.x);
  const int n0 = n_block * kBlockN;
  if (kGeneral && n0 >= seqlen_k) return;  // (the grid covers the longest sequence)
  const int offset = seqlen_k - seqlen_q;

  // Query tiles that see a key of this tile (bottom-right aligned window, FwdParams).
  int m_block_min = 0, m_block_max = (seqlen_q + kBlockM - 1) / kBlockM;
  if (p.window_right >= 0) {
    const int i_lo = n0 - offset - p.window_right;
    m_block_min = i_lo <= 0 ? 0 : min(m_block_max, i_lo / kBlockM);
  }
  if (p.window_left >= 0) {
    const int i_hi = min(seqlen_k, n0 + kBlockN) - 1 + p.window_left - offset;
    m_block_max = i_hi < 0 ? 0 : min(m_block_max, i_hi / kBlockM + 1);
  }
  const int n_m = max(0, m_block_max - m_block_min);
  const int n_steps = n_m * group;
  // kGeneral, deterministic: the order counter of (query head, 64-row group) (generic, so
  // that only the kGeneral instance compiles it).
  auto dq_counter = [&](auto head, int g64) {
    return dq_counters(p) + ws_tile0(p, seq, batch, head, kFp32DqGroupRows) + g64;
  };

  // Row `row` of head `head` of a (batch, seqlen, heads, d) tensor (row: of the sequence,
  // which starts at row0).
  auto row_ptr = [&](const void* base, int64_t batch_stride, int64_t head_stride,
                     int64_t row_stride, int head, int64_t row0, int row) {
    return static_cast<const float*>(base) + batch * batch_stride + head * head_stride +
           (row0 + row) * row_stride;
  };
  auto load_q_tile = [&](int t) {  // step t: query head head_k * group + t / n_m
    const int head = head_k * group + t / n_m;
    const int m0 = (m_block_min + t % n_m) * kBlockM;
    const int rows = seqlen_q - m0;
    load_tile_f32<QTile, kBlockM, kHeadDim, kNThreads>(
        sQ, row_ptr(p.q, p.q_batch_stride, p.q_head_stride, p.q_row_stride, head, seq.q_row0, m0),
        p.q_row_stride, rows, p.headdim, tid);
    load_tile_f32<QTile, kBlockM, kHeadDim, kNThreads>(
        sdO,
        row_ptr(p.dout, p.do_batch_stride, p.do_head_stride, p.do_row_stride, head, seq.q_row0, m0),
        p.do_row_stride, rows, p.headdim, tid);
    if (tid < kBlockM) {
      const bool in = tid < rows;
      const float* lse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride +
                         seq.q_row0 + m0 + tid;
      const float* dsum = p.dsum + fp32_ws_row0(p, seq, batch, head) + m0 + tid;
      ptx::cp_async_4(ptx::smem_addr(sLse + tid), in ? lse : p.lse, in);
      ptx::cp_async_4(ptx::smem_addr(sDsum + tid), in ? dsum : p.dsum, in);
    }
  };

  // Prologue: K, V and the first query tile.
  const float* gK =
      row_ptr(p.k, p.k_batch_stride, p.k_head_stride, p.k_row_stride, head_k, seq.k_row0, n0);
  const float* gV =
      row_ptr(p.v, p.v_batch_stride, p.v_head_stride, p.v_row_stride, head_k, seq.k_row0, n0);
  load_tile_f32<KTile, kBlockN, kHeadDim, kNThreads>(sK, gK, p.k_row_stride, seqlen_k - n0,
                                                     p.headdim, tid);
  load_tile_f32<KTile, kBlockN, kHeadDim, kNThreads>(sV, gV, p.v_row_stride, seqlen_k - n0,
                                                     p.headdim, tid);
  if (n_steps > 0) load_q_tile(0);
  ptx::cp_async_commit();

  const int g = lane / 4;
  const int q = lane % 4;
  const int key_row = warp * 16 + g;         // the lane's key rows: key_row, key_row + 8
  const int perm_g = (g >> 1) + 4 * (g & 1);  // the query of S^T column g of an n8 tile
  // SwzTile offsets of the lane's fragment reads. Within a 32-column group the swizzle is
  // an XOR on column bits 2-4 and a lane's column is a loop constant C (a multiple of 4 or 8)
  // plus q or g on the low bits, so (C + q) ^ f = C ^ (q ^ f): one lane register and an
  // XOR with a compile-time value per address. Rows: key_row + x8 (n-major A), perm_g + x8
  // (n-major B), q + 4 jj + x8 (k-major); x8 a multiple of 8.
  auto swz = [](int r) { return ((r & 3) << 3) | (r & 4); };
  const int lane_a = q ^ swz(g), lane_b = q ^ swz(perm_g);
  const int lane_k[2] = {g ^ swz(q), g ^ swz(q + 4)};
  auto off_a = [&](int kcols, int x8, int c4) {  // rows key_row + x8, column 4 c4 + q
    return (key_row + x8) * kcols + 32 * (c4 / 8) + ((4 * (c4 % 8)) ^ lane_a);
  };
  auto off_b = [&](int kcols, int x8, int c4) {  // rows perm_g + x8, column 4 c4 + q
    return (perm_g + x8) * kcols + 32 * (c4 / 8) + ((4 * (c4 % 8)) ^ lane_b);
  };
  auto off_k = [&](int kcols, int x8, int jj, int c8) {  // rows q + 4 jj + x8, column 8 c8 + g
    return (q + 4 * jj + x8) * kcols + 32 * (c8 / 4) + ((8 * (c8 % 4)) ^ lane_k[jj]);
  };
  // kPreSplit: the same in sQ / sdO's PairTile (tf32.cuh), the XOR on column bits 3-4:
  // n-major, the 64-bit pair of columns 8 kk + q, 8 kk + q + 4 (rows perm_g + x8); k-major,
  // column 8 c8 + g (rows q + 4 jj + x8).
  using PTile = PairTile<1, kHeadDim>;
  const int pair_b = (2 * q) ^ (PTile::h(perm_g) << 3);
  const int pair_k[2] = {PTile::pos(g) ^ (PTile::h(q) << 3),
                         PTile::pos(g) ^ (PTile::h(q + 4) << 3)};
  auto pair_off = [&](int row, int lane_off, int c8) {
    return row * kHeadDim + 32 * (c8 / 4) + ((8 * (c8 % 4)) ^ lane_off);
  };
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale_log2 = p.softmax_scale * kLog2e;

  float acc_dk[kNTilesD][4], acc_dv[kNTilesD][4];
#pragma unroll
  for (int dt = 0; dt < kNTilesD; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[dt][e] = acc_dv[dt][e] = 0.f;

  // acc[16 keys of the warp x kBlockM queries] = A (sA rows key_row.., the warp's keys) B^T
  // (sB rows: queries, permuted), over the head dim; kPreSplit: read split from the hi / lo
  // arrays.
  auto gemm_keys_queries = [&](float (&acc)[kNTilesM][4], const float* sA, const float* sAlo,
                               const float* sB, const float* sBlo) {
#pragma unroll
    for (int kk = 0; kk < kNTilesD; ++kk) {
      const int a0 = off_a(kHeadDim, 0, 2 * kk), a1 = off_a(kHeadDim, 8, 2 * kk);
      const int a2 = off_a(kHeadDim, 0, 2 * kk + 1), a3 = off_a(kHeadDim, 8, 2 * kk + 1);
      tf32::FragA fa;
      if constexpr (kPreSplit) {
        fa = tf32::FragA(tf32::split_at(sA, sAlo, a0), tf32::split_at(sA, sAlo, a1),
                         tf32::split_at(sA, sAlo, a2), tf32::split_at(sA, sAlo, a3));
      } else {
        fa = tf32::FragA(sA[a0], sA[a1], sA[a2], sA[a3]);
      }
#pragma unroll
      for (int nt = 0; nt < kNTilesM; ++nt) {
        if constexpr (kPreSplit) {
          const int b = pair_off(perm_g + 8 * nt, pair_b, kk);
          tf32::mma3_add(acc[nt], fa, tf32::split_pair_at(sB, sBlo, b), kk == 0);
        } else {
          const int b0 = off_b(kHeadDim, 8 * nt, 2 * kk), b1 = off_b(kHeadDim, 8 * nt, 2 * kk + 1);
          tf32::mma3_add(acc[nt], fa, tf32::FragB(sB[b0], sB[b1]), kk == 0);
        }
      }
    }
  };
  // acc_d[16 keys x d] += X^T (the warp's [16 keys x kBlockM] accumulators, A fragments as
  // they stand) sB (rows: queries in natural order; kPreSplit: split in sB / sBlo), in two
  // levels: each n8 tile's kBlockM / 8 k8 steps into a fresh accumulator (tf32::mma3_chain),
  // then added to acc_d with FADD, so that acc_d, summed over every query tile, is never an
  // MMA's (truncating) accumulator.
  auto gemm_accumulate = [&](float (&acc_d)[kNTilesD][4], const float (&x)[kNTilesM][4],
                             const float* sB, const float* sBlo) {
    tf32::FragA fa[kNTilesM];
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
      fa[nt] = tf32::FragA(x[nt][0], x[nt][2], x[nt][1], x[nt][3]);
#pragma unroll
    for (int dt = 0; dt < kNTilesD; ++dt) {
      tf32::FragB fb[kNTilesM];
#pragma unroll
      for (int nt = 0; nt < kNTilesM; ++nt) {
        if constexpr (kPreSplit) {
          const int b0 = pair_off(q + 8 * nt, pair_k[0], dt);
          const int b1 = pair_off(q + 4 + 8 * nt, pair_k[1], dt);
          fb[nt] = tf32::FragB(tf32::split_at(sB, sBlo, b0), tf32::split_at(sB, sBlo, b1));
        } else {
          const int b0 = off_k(kHeadDim, 8 * nt, 0, dt), b1 = off_k(kHeadDim, 8 * nt, 1, dt);
          fb[nt] = tf32::FragB(sB[b0], sB[b1]);
        }
      }
      float t[4];
      tf32::mma3_chain<kNTilesM>(t, fa, fb);
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_d[dt][e] += t[e];
    }
  };

  for (int t = 0; t < n_steps; ++t) {
    const int head = head_k * group + t / n_m;
    const int m0 = (m_block_min + t % n_m) * kBlockM;
    // Q, dO, lse, dsum of step t have landed; every warp is done with the last dQ GEMM.
    ptx::cp_async_wait<0>();
    __syncthreads();
    if constexpr (kPreSplit) {
      // Each operand split once for all warps (else every warp splits every element it
      // reads): K, V at the first step, Q, dO at every step.
      if (t == 0) {
        tf32::split_in_place<KTile::kFloats, kNThreads>(sK, sKlo, tid);
        tf32::split_in_place<KTile::kFloats, kNThreads>(sV, sVlo, tid);
      }
      tf32::split_pairs<QTile::kFloats, kNThreads>(sQ, sQlo, tid);
      tf32::split_pairs<QTile::kFloats, kNThreads>(sdO, sdOlo, tid);
      __syncthreads();
    }

    float acc_s[kNTilesM][4];
    gemm_keys_queries(acc_s, sK, sKlo, sQ, sQlo);
    // P^T = exp2(S^T scale log2e - lse log2e), 0 where the key is hidden from the query;
    // kGeneral with softcap / ALiBi: exp2((logit - lse) log2e), the logit (fp32/mods.cuh) and
    // its d logit / d(scale s) of the forward's definition.
    const Fp32Mods mods = kGeneral ? Fp32Mods(p, batch, head) : Fp32Mods{};
    float dlogit[kNTilesM][4];  // (softcap only)
    // (a flag rather than a generic lambda: that cost the plain instance 16 SASS instructions)
    const bool with_mods = kGeneral && mods.on;
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = 8 * nt + q + 4 * (e & 1);  // the permuted query of the element
        const int i = m0 + ql, j = n0 + key_row + 8 * (e >> 1);
        const bool visible = i < seqlen_q && j < seqlen_k &&
                             (p.window_right < 0 || j <= i + offset + p.window_right) &&
                             (p.window_left < 0 || j >= i + offset - p.window_left);
        if (with_mods) {
          const float x = mods.logit(p, acc_s[nt][e], float(i + offset - j), &dlogit[nt][e]);
          acc_s[nt][e] = visible ? ptx::exp2_approx((x - sLse[ql]) * kLog2e) : 0.f;
        } else {
          acc_s[nt][e] =
              visible ? ptx::exp2_approx(fmaf(acc_s[nt][e], scale_log2, -sLse[ql] * kLog2e)) : 0.f;
        }
      }
    gemm_accumulate(acc_dv, acc_s, sdO, sdOlo);
    float acc_dp[kNTilesM][4];
    gemm_keys_queries(acc_dp, sV, sVlo, sdO, sdOlo);
    // dS^T = P^T o (dP^T - dsum), also to sdS in natural query order for the dQ GEMM.
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = 8 * nt + q + 4 * (e & 1);
        acc_dp[nt][e] = acc_s[nt][e] * (acc_dp[nt][e] - sDsum[ql]);
        if constexpr (kGeneral) {
          if (p.softcap > 0.f) acc_dp[nt][e] *= dlogit[nt][e];
        }
        sdS[STile::offset(key_row + 8 * (e >> 1), ql)] = acc_dp[nt][e];
      }
    gemm_accumulate(acc_dk, acc_dp, sQ, sQlo);
    if constexpr (kGeneral) {
      // Deterministic: at the first step of a 64-row group (of a head), thread 0 releases
      // the CTA's previous group (whose dQ adds were made before the barrier at this step's
      // top) and waits for its turn; the barrier below passes the acquire on to every
      // thread before its dQ adds.
      const int g64 = m0 / kFp32DqGroupRows;
      const int t_prev = t - 1;
      const int head_prev = head_k * group + t_prev / n_m;
      const int g64_prev = (m_block_min + t_prev % n_m) * kBlockM / kFp32DqGroupRows;
      if (p.deterministic && tid == 0 && (t == 0 || head_prev != head || g64_prev != g64)) {
        dq_order_step(t > 0 ? dq_counter(head_prev, g64_prev) : nullptr, dq_counter(head, g64),
                      dq_order().rank(n_block, g64));
      }
    }
    // sdS is complete; sQ, sdO, lse and dsum are free for the next step's copies.
    __syncthreads();
    if (t + 1 < n_steps) load_q_tile(t + 1);
    ptx::cp_async_commit();

    // dQ[kBlockM x d] += dS K over the tile's keys: warp w the m16 tile w % kMTiles and
    // n8 tiles [kHalfD j, kHalfD (j + 1)), j = w / kMTiles. A = dS (row query, col key) read
    // from sdS (key-major).
    constexpr int kMTiles = Traits::kMTiles;
    constexpr int kHalfD = kNTilesD * kMTiles / 4;
    const int mq = 16 * (warp % kMTiles);
    const int dt0 = kHalfD * (warp / kMTiles);
    float acc_dq[kHalfD][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 8; ++kk) {
      const int r = 8 * kk + q;
      const tf32::FragA fa(sdS[STile::offset(r, mq + g)], sdS[STile::offset(r, mq + g + 8)],
                           sdS[STile::offset(r + 4, mq + g)], sdS[STile::offset(r + 4, mq + g + 8)]);
#pragma unroll
      for (int i = 0; i < kHalfD; ++i) {
        const int dt = dt0 + i;
        // (dt is not a compile-time value here: the swizzle XOR at run time)
        const int b0 = KTile::offset(r, 8 * dt + g), b1 = KTile::offset(r + 4, 8 * dt + g);
        if constexpr (kPreSplit) {
          tf32::mma3_add(acc_dq[i], fa,
                         tf32::FragB(tf32::split_at(sK, sKlo, b0), tf32::split_at(sK, sKlo, b1)),
                         kk == 0);
        } else {
          tf32::mma3_add(acc_dq[i], fa, tf32::FragB(sK[b0], sK[b1]), kk == 0);
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int row = m0 + mq + g + 8 * rr;
      if (row < seqlen_q) {
        float* dq = p.dq_accum + (fp32_ws_row0(p, seq, batch, head) + row) * p.headdim;
#pragma unroll
        for (int i = 0; i < kHalfD; ++i) {
          const int c = 8 * (dt0 + i) + 2 * q;
          if (c < p.headdim) {
            atomicAdd(dq + c, acc_dq[i][2 * rr]);
            atomicAdd(dq + c + 1, acc_dq[i][2 * rr + 1]);
          }
        }
      }
    }
  }
  ptx::cp_async_wait<0>();
  if constexpr (kGeneral) {
    if (p.deterministic && n_steps > 0) {  // the last group's dQ adds: release it
      __syncthreads();
      const int t = n_steps - 1;
      if (tid == 0) {
        ptx::red_release_add(dq_counter(head_k * group + t / n_m,
                                        (m_block_min + t % n_m) * kBlockM / kFp32DqGroupRows),
                             1);
      }
    }
  }

  // Epilogue: dK (times the softmax scale) and dV of the lane's key rows (varlen: the
  // sequence's first key row re-read, not kept live across the mainloop).
  const int64_t k_row0 = Fp32Seq<kGeneral>(p, batch).k_row0;
  float* gdK = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head_k * p.dk_head_stride +
               k_row0 * p.dk_row_stride;
  float* gdV = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head_k * p.dv_head_stride +
               k_row0 * p.dv_row_stride;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int j = n0 + key_row + 8 * rr;
    if (j < seqlen_k) {
#pragma unroll
      for (int dt = 0; dt < kNTilesD; ++dt) {
        const int c = 8 * dt + 2 * q;
        if (c < p.headdim) {
          *reinterpret_cast<float2*>(gdK + int64_t(j) * p.dk_row_stride + c) = make_float2(
              acc_dk[dt][2 * rr] * p.softmax_scale, acc_dk[dt][2 * rr + 1] * p.softmax_scale);
          *reinterpret_cast<float2*>(gdV + int64_t(j) * p.dv_row_stride + c) =
              make_float2(acc_dv[dt][2 * rr], acc_dv[dt][2 * rr + 1]);
        }
      }
    }
  }
}

}  // namespace flashattn2
