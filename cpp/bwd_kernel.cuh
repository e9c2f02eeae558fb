// FlashAttention-2 backward (Dao 2023, Algorithm 2): three kernels.
//
// 1. bwd_preprocess_kernel: dsum = rowsum(dO * O) in f32, and zero the f32 dQ accumulator.
// 2. bwd_kernel, one CTA per K/V tile:
//   grid   (ceil(seqlen_k / kBlockN), nheads_k, batch); dK, dV of the tile stay in f32
//          registers while the CTA walks every query tile that can see it, for each query
//          head of its GQA group (so the group sum is exact and rounded once).
//   block  4 warps. Warp w owns key rows [16w, 16w + 16) for S^T, dP^T, dV, dK (so those
//          GEMMs are warp-local) and query rows [16w, 16w + 16) for the dQ GEMM.
//   smem   sK, sV [kBlockN x d], sQ, sdO [kBlockM x d], sdS [kBlockN x kBlockM] (tile.cuh
//          swizzle), LSE and dsum of the query tile [kBlockM] f32.
//   step   (query tile m)
//            wait for Q_m, dO_m, LSE_m, dsum_m ; __syncthreads
//            S^T = K Q^T and dP^T = V dO^T (mma.m16n8k16; K, V rows of the warp as A)
//            mask (boundary tiles only) ; P^T = exp2(S^T scale log2e - LSE log2e)
//            dS^T = P^T o (dP^T - dsum)
//            dV += P^T dO, dK += dS^T Q (P^T, dS^T straight from the accumulators as A)
//            dS^T -> sdS ; __syncthreads   (sQ, sdO free; sdS complete)
//            issue cp.async of Q, dO, LSE, dsum of tile m + 1 (overlaps the dQ GEMM)
//            dQ_m += dS K in column chunks, f32 atomics into the accumulator
//   epilogue  dK * scale and dV staged through sK / sV, 16-byte stores.
// 3. bwd_convert_dq_kernel: dQ = accumulator * scale, cast, strided store.
//
// Masks, tails and windows follow the forward: key j is visible to query i iff i < seqlen_q,
// j < seqlen_k and the window bounds of FwdParams hold. Limits: d <= 128 (dK + dV take
// d registers per thread), d multiple of 8, 16-byte aligned pointers, strides multiples of 8.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "flash.h"
#include "ptx.cuh"
#include "seqlen.cuh"
#include "tile.cuh"

namespace flashattn2 {

constexpr int kBwdMaxHeadDim = 128;

template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kBlockN = 16 * kNWarps;  // key rows per CTA
  static constexpr int kBlockM = 16 * kNWarps;  // query rows per step
  // dQ is computed kDqChunk columns at a time to bound its accumulator registers.
  static constexpr int kDqChunk = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSmemBytes =
      2 * (2 * kBlockN * kHeadDim + 2 * kBlockM * kHeadDim + kBlockN * kBlockM) +
      2 * kBlockM * int(sizeof(float));
  static_assert(kHeadDim <= kBwdMaxHeadDim && kHeadDim % 32 == 0, "backward head dim");
};

// The dQ-order counters (deterministic mode) follow the dsum rows in the same workspace;
// layouts: ws_row0 / ws_tile0 (seqlen.cuh).
__device__ __forceinline__ int* dq_counters(const BwdParams& p) {
  return reinterpret_cast<int*>(p.dsum + ws_rows(p));
}

// dsum[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d]; zero dq_accum[b, h, i, :] and the
// counter of each 64-row query tile.
// grid (ceil(seqlen_q / 64), nheads, batch), 128 threads; warp w takes rows w, w + 4, ...
template <typename Element>
__global__ void __launch_bounds__(128) bwd_preprocess_kernel(const BwdParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  if (int(blockIdx.x) * 64 >= seq.seqlen_q) return;
  const int64_t ws0 = ws_row0(p, seq, batch, head);
  if (threadIdx.x == 0) dq_counters(p)[ws_tile0(p, seq, batch, head, 64) + blockIdx.x] = 0;
  for (int row = blockIdx.x * 64 + warp; row < min(seq.seqlen_q, blockIdx.x * 64 + 64); row += 4) {
    const int64_t grow = seq.q_row0 + row;
    const Element* o = static_cast<const Element*>(p.o) + batch * p.o_batch_stride +
                       grow * p.o_row_stride + head * p.o_head_stride;
    const Element* dout = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride +
                          grow * p.do_row_stride + head * p.do_head_stride;
    float acc = 0.f;
    for (int c = lane; c < p.headdim / 8; c += 32) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + c * 8);
      const uint4 b = *reinterpret_cast<const uint4*>(dout + c * 8);
      const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 x = ptx::unpack2<Element>(av[i]), y = ptx::unpack2<Element>(bv[i]);
        acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffff, acc, offset);
    if (lane == 0) p.dsum[ws0 + row] = acc;
    float4* dq = reinterpret_cast<float4*>(p.dq_accum + (ws0 + row) * p.headdim);
    for (int c = lane; c < p.headdim / 4; c += 32) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dq = dq_accum * softmax_scale in the output dtype. grid as the preprocess kernel.
template <typename Element>
__global__ void __launch_bounds__(128) bwd_convert_dq_kernel(const BwdParams p) {
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  const int64_t ws0 = ws_row0(p, seq, batch, head);
  const int chunks = p.headdim / 8;
  for (int idx = threadIdx.x; idx < 64 * chunks; idx += 128) {
    const int row = blockIdx.x * 64 + idx / chunks, c = idx % chunks;
    if (row >= seq.seqlen_q) break;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + (ws0 + row) * p.headdim + c * 8);
    const float4 a = src[0], b = src[1];
    const float s = p.softmax_scale;
    const uint4 out = {ptx::pack2<Element>(a.x * s, a.y * s), ptx::pack2<Element>(a.z * s, a.w * s),
                       ptx::pack2<Element>(b.x * s, b.y * s), ptx::pack2<Element>(b.z * s, b.w * s)};
    *reinterpret_cast<uint4*>(static_cast<Element*>(p.dq) + batch * p.dq_batch_stride +
                              (seq.q_row0 + row) * p.dq_row_stride + head * p.dq_head_stride +
                              c * 8) = out;
  }
}

template <typename Traits, typename Element>
__global__ void __launch_bounds__(Traits::kNThreads, 2) bwd_kernel(const BwdParams p) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kDqChunk = Traits::kDqChunk;
  constexpr int kNTilesM = kBlockM / 8;    // n8 column tiles of S^T (query columns)
  constexpr int kNTilesD = kHeadDim / 8;   // n8 column tiles of dK, dV
  constexpr int kKStepsD = kHeadDim / 16;  // k16 steps over d (S^T, dP^T)
  constexpr int kKStepsM = kBlockM / 16;   // k16 steps over queries (dV, dK)
  constexpr int kKStepsN = kBlockN / 16;   // k16 steps over keys (dQ)
  constexpr uint32_t kNSegBytes = kBlockN * 64;  // one 32-column segment of a kBlockN-row tile
  constexpr uint32_t kMSegBytes = kBlockM * 64;
  constexpr uint32_t kRow16Bytes = 16 * 64;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);
  Element* sV = sK + kBlockN * kHeadDim;
  Element* sQ = sV + kBlockN * kHeadDim;
  Element* sdO = sQ + kBlockM * kHeadDim;
  Element* sdS = sdO + kBlockM * kHeadDim;
  float* sLse = reinterpret_cast<float*>(sdS + kBlockN * kBlockM);
  float* sDsum = sLse + kBlockM;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;
  const int n_block = blockIdx.x, head_k = blockIdx.y, batch = blockIdx.z;
  const int group = p.nheads / p.nheads_k;
  const int n0 = n_block * kBlockN;
  const SeqInfo seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  if (n0 >= seqlen_k) return;  // varlen: the grid covers the longest sequence

  // Query rows that see at least one key of this tile.
  const int offset = seqlen_k - seqlen_q;
  const int n_last = min(n0 + kBlockN, seqlen_k) - 1;
  const int m_lo = p.window_right >= 0 ? max(0, n0 - offset - p.window_right) : 0;
  const int m_hi = p.window_left >= 0 ? min(seqlen_q - 1, n_last - offset + p.window_left)
                                      : seqlen_q - 1;
  const int m_block_min = m_lo / kBlockM;
  const int m_block_max = m_hi < m_lo ? m_block_min : m_hi / kBlockM + 1;
  // The first K/V tile that visits query tile m (from the same bounds: a tile visits m iff
  // its last key reaches m's first query through the left window).
  auto dq_first_n_block = [&](int m_block) {
    const int x = m_block * kBlockM + offset - p.window_left;
    return p.window_left >= 0 && x > 0 ? x / kBlockN : 0;
  };

  const Element* gK = static_cast<const Element*>(p.k) + batch * p.k_batch_stride +
                      head_k * p.k_head_stride + (seq.k_row0 + n0) * p.k_row_stride;
  const Element* gV = static_cast<const Element*>(p.v) + batch * p.v_batch_stride +
                      head_k * p.v_head_stride + (seq.k_row0 + n0) * p.v_row_stride;
  // The CTA's work: query tiles m_block_min .. m_block_max - 1 of each query head of the
  // group, as one sequence t = head_in_group * n_query_tiles + (m_block - m_block_min).
  const int n_query_tiles = m_block_max - m_block_min;
  const int n_steps = group * n_query_tiles;
  auto head_of = [&](int t) { return head_k * group + t / n_query_tiles; };
  auto m_block_of = [&](int t) { return m_block_min + t % n_query_tiles; };

  load_tile<kBlockN, kHeadDim, kNThreads>(sK, gK, p.k_row_stride, seqlen_k - n0, p.headdim, tid);
  load_tile<kBlockN, kHeadDim, kNThreads>(sV, gV, p.v_row_stride, seqlen_k - n0, p.headdim, tid);
  auto load_query_tile = [&](int t) {
    const int head = head_of(t), m0 = m_block_of(t) * kBlockM;
    const int64_t row0 = seq.q_row0 + m0;
    const Element* gQ = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                        head * p.q_head_stride;
    const Element* gdO = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride +
                         head * p.do_head_stride;
    const float* gLse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_row0;
    const float* gDsum = p.dsum + ws_row0(p, seq, batch, head);
    load_tile<kBlockM, kHeadDim, kNThreads>(sQ, gQ + row0 * p.q_row_stride, p.q_row_stride,
                                            seqlen_q - m0, p.headdim, tid);
    load_tile<kBlockM, kHeadDim, kNThreads>(sdO, gdO + row0 * p.do_row_stride,
                                            p.do_row_stride, seqlen_q - m0, p.headdim, tid);
    if (tid < kBlockM) {
      const bool valid = m0 + tid < seqlen_q;
      const int row = valid ? m0 + tid : 0;
      ptx::cp_async_4(ptx::smem_addr(sLse + tid), gLse + row, valid);
      ptx::cp_async_4(ptx::smem_addr(sDsum + tid), gDsum + row, valid);
    }
  };
  if (n_steps > 0) load_query_tile(0);
  ptx::cp_async_commit();

  // ldmatrix base addresses (see fwd_kernel.cuh): [j] is the lane's offset for chunk parity
  // j; a 16x16 block at (row r0, chunk 2k) adds (k / 2) * segment + r0 * 64 bytes.
  const uint32_t sK_addr = ptx::smem_addr(sK), sV_addr = ptx::smem_addr(sV);
  const uint32_t sQ_addr = ptx::smem_addr(sQ), sdO_addr = ptx::smem_addr(sdO);
  const uint32_t sdS_addr = ptx::smem_addr(sdS);
  uint32_t a_kv[2], b_qdo[2], bt_qdo[2], bt_k[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    // A from K / V rows of the warp (non-trans): rows lane % 16, chunk lane / 16.
    a_kv[j] = 2 * swizzle<kBlockN>(warp * 16 + (lane & 15), 2 * j + (lane >> 4));
    // B from Q / dO (non-trans, k = d): rows 8 (lane / 16) + lane % 8, chunk (lane / 8) % 2.
    b_qdo[j] = 2 * swizzle<kBlockM>(((lane >> 4) << 3) + (lane & 7), 2 * j + ((lane >> 3) & 1));
    // B from Q / dO (.trans, k = query rows): rows lane % 16, chunk lane / 16.
    bt_qdo[j] = 2 * swizzle<kBlockM>(lane & 15, 2 * j + (lane >> 4));
    // B from K (.trans, k = key rows): rows lane % 16, chunk lane / 16.
    bt_k[j] = sK_addr + 2 * swizzle<kBlockN>(lane & 15, 2 * j + (lane >> 4));
  }
  // A = dS (query rows of the warp x 16 keys) read transposed from sdS (key rows x query
  // columns): key rows 8 (lane / 16) + lane % 8, query chunk 2 warp + (lane / 8) % 2.
  const uint32_t at_ds =
      sdS_addr + 2 * swizzle<kBlockN>(((lane >> 4) << 3) + (lane & 7), 2 * warp + ((lane >> 3) & 1));

  float acc_dk[kNTilesD][4], acc_dv[kNTilesD][4];
#pragma unroll
  for (int i = 0; i < kNTilesD; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;  // log2(e)

  auto step = [&](auto mask_tag, int m_block) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const int m0 = m_block * kBlockM;

    // S^T = K Q^T and dP^T = V dO^T: the warp's 16 key rows x all kBlockM query columns.
    float acc_s[kNTilesM][4], acc_dp[kNTilesM][4];
#pragma unroll
    for (int i = 0; i < kNTilesM; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[i][e] = acc_dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKStepsD; ++kk) {
      uint32_t ak[4], av[4];
      ptx::ldmatrix_x4(ak, sK_addr + a_kv[kk % 2] + (kk / 2) * kNSegBytes);
      ptx::ldmatrix_x4(av, sV_addr + a_kv[kk % 2] + (kk / 2) * kNSegBytes);
#pragma unroll
      for (int mm = 0; mm < kBlockM / 16; ++mm) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, sQ_addr + b_qdo[kk % 2] + (kk / 2) * kMSegBytes + mm * kRow16Bytes);
        ptx::mma_16816<Element>(acc_s[2 * mm], ak, b[0], b[1]);
        ptx::mma_16816<Element>(acc_s[2 * mm + 1], ak, b[2], b[3]);
        ptx::ldmatrix_x4(b, sdO_addr + b_qdo[kk % 2] + (kk / 2) * kMSegBytes + mm * kRow16Bytes);
        ptx::mma_16816<Element>(acc_dp[2 * mm], av, b[0], b[1]);
        ptx::mma_16816<Element>(acc_dp[2 * mm + 1], av, b[2], b[3]);
      }
    }

    if constexpr (kMask) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = n0 + warp * 16 + g + 8 * r;
        // Visible queries of this key: [q_lo, q_hi] (empty when key >= seqlen_k).
        const int q_lo = p.window_right >= 0 ? key - offset - p.window_right : 0;
        const int q_hi = key >= seqlen_k ? -1
                         : p.window_left >= 0 ? min(seqlen_q - 1, key - offset + p.window_left)
                                              : seqlen_q - 1;
#pragma unroll
        for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const int query = m0 + nt * 8 + 2 * q + (e & 1);
            if (query < q_lo || query > q_hi) acc_s[nt][e] = -INFINITY;
          }
      }
    }

    // P^T and dS^T in place: acc_s becomes P^T, acc_dp becomes dS^T.
#pragma unroll
    for (int nt = 0; nt < kNTilesM; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * q + (e & 1);
        const float lse_log2 = sLse[col] * 1.4426950408889634f;
        acc_s[nt][e] = ptx::exp2_approx(fmaf(acc_s[nt][e], scale_log2, -lse_log2));
        acc_dp[nt][e] = acc_s[nt][e] * (acc_dp[nt][e] - sDsum[col]);
      }

    // dV += P^T dO and dK += dS^T Q (A from the accumulators, B via ldmatrix.trans).
#pragma unroll
    for (int kk = 0; kk < kKStepsM; ++kk) {
      uint32_t pa[4], da[4];
      ptx::acc_to_a<Element>(pa, acc_s[2 * kk], acc_s[2 * kk + 1]);
      ptx::acc_to_a<Element>(da, acc_dp[2 * kk], acc_dp[2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kKStepsD; ++dd) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, sdO_addr + bt_qdo[dd % 2] + (dd / 2) * kMSegBytes + kk * kRow16Bytes);
        ptx::mma_16816<Element>(acc_dv[2 * dd], pa, b[0], b[1]);
        ptx::mma_16816<Element>(acc_dv[2 * dd + 1], pa, b[2], b[3]);
        ptx::ldmatrix_x4_trans(b, sQ_addr + bt_qdo[dd % 2] + (dd / 2) * kMSegBytes + kk * kRow16Bytes);
        ptx::mma_16816<Element>(acc_dk[2 * dd], da, b[0], b[1]);
        ptx::mma_16816<Element>(acc_dk[2 * dd + 1], da, b[2], b[3]);
      }
      // dS^T rows of the warp -> sdS (query chunk 2kk, 2kk + 1 of key row).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key_row = warp * 16 + g + 8 * r;
        *reinterpret_cast<uint32_t*>(sdS + swizzle<kBlockN>(key_row, 2 * kk) + 2 * q) = da[r];
        *reinterpret_cast<uint32_t*>(sdS + swizzle<kBlockN>(key_row, 2 * kk + 1) + 2 * q) = da[2 + r];
      }
    }
  };

  for (int t = 0; t < n_steps; ++t) {
    const int m_block = m_block_of(t);
    const int head = head_of(t);
    // Q, dO, LSE, dsum of step t have landed; sdS is free (previous dQ GEMM done).
    ptx::cp_async_wait<0>();
    __syncthreads();
    const int m0 = m_block * kBlockM;
    const bool need_mask =
        m0 + kBlockM > seqlen_q || n0 + kBlockN > seqlen_k ||
        (p.window_right >= 0 && n0 + kBlockN - 1 > m0 + offset + p.window_right) ||
        (p.window_left >= 0 && n0 < m0 + kBlockM - 1 + offset - p.window_left);
    if (need_mask) {
      step(std::true_type{}, m_block);
    } else {
      step(std::false_type{}, m_block);
    }
    // sdS is complete, and every warp is done with sQ / sdO: prefetch the next query tile.
    __syncthreads();
    if (t + 1 < n_steps) load_query_tile(t + 1);
    ptx::cp_async_commit();

    // Deterministic: wait until the CTAs before this one in the tile's order have added
    // their dQ (the visiting CTAs are n_first .. in ascending order; see dq_first_n_block).
    int* counter = dq_counters(p) + ws_tile0(p, seq, batch, head, kBlockM) + m_block;
    if (p.deterministic) {
      if (tid == 0) {
        const int turn = n_block - dq_first_n_block(m_block);
        while (ptx::ld_acquire(counter) != turn) __nanosleep(32);
      }
      __syncthreads();
    }

    // dQ rows [16 warp, 16 warp + 16) of the tile += dS K, kDqChunk columns at a time.
#pragma unroll
    for (int c0 = 0; c0 < kHeadDim; c0 += kDqChunk) {
      float acc_dq[kDqChunk / 8][4];
#pragma unroll
      for (int i = 0; i < kDqChunk / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dq[i][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kKStepsN; ++kk) {
        uint32_t a[4];
        ptx::ldmatrix_x4_trans(a, at_ds + kk * kRow16Bytes);
#pragma unroll
        for (int dd = c0 / 16; dd < (c0 + kDqChunk) / 16; ++dd) {
          uint32_t b[4];
          ptx::ldmatrix_x4_trans(b, bt_k[dd % 2] + (dd / 2) * kNSegBytes + kk * kRow16Bytes);
          ptx::mma_16816<Element>(acc_dq[2 * (dd - c0 / 16)], a, b[0], b[1]);
          ptx::mma_16816<Element>(acc_dq[2 * (dd - c0 / 16) + 1], a, b[2], b[3]);
        }
      }
      // Lanes q and q ^ 1 swap a row pair, so each holds 4 consecutive columns of one row
      // (even q: row g, odd q: row g + 8) and adds them with one 16-byte reduction: the
      // L2 atomic traffic, the limit of this kernel (ncu: L2 91 % busy), is cut by 4.
      const bool even = (q & 1) == 0;
      const int row = m0 + warp * 16 + g + (even ? 0 : 8);
#pragma unroll
      for (int dt = 0; dt < kDqChunk / 8; ++dt) {
        const float send0 = even ? acc_dq[dt][2] : acc_dq[dt][0];
        const float send1 = even ? acc_dq[dt][3] : acc_dq[dt][1];
        const float recv0 = __shfl_xor_sync(0xffffffff, send0, 1);
        const float recv1 = __shfl_xor_sync(0xffffffff, send1, 1);
        const int col = c0 + dt * 8 + 4 * (q >> 1);
        if (row < seqlen_q && col < p.headdim) {
          float* dst = p.dq_accum + (ws_row0(p, seq, batch, head) + row) * p.headdim + col;
          if (even) {
            ptx::red_add_v4(dst, acc_dq[dt][0], acc_dq[dt][1], recv0, recv1);
          } else {
            ptx::red_add_v4(dst, recv0, recv1, acc_dq[dt][2], acc_dq[dt][3]);
          }
        }
      }
    }
    if (p.deterministic) {
      __threadfence();  // this CTA's adds are visible before the next CTA's turn
      __syncthreads();
      if (tid == 0) ptx::red_release_add(counter, 1);
    }
  }

  // Epilogue: dK * scale and dV through sK / sV (every warp is done reading them, and the
  // K/V copies have landed even when no query tile was visited).
  ptx::cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key_row = warp * 16 + g + 8 * r;
#pragma unroll
    for (int dt = 0; dt < kNTilesD; ++dt) {
      *reinterpret_cast<uint32_t*>(sK + swizzle<kBlockN>(key_row, dt) + 2 * q) =
          ptx::pack2<Element>(acc_dk[dt][2 * r] * p.softmax_scale,
                              acc_dk[dt][2 * r + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(sV + swizzle<kBlockN>(key_row, dt) + 2 * q) =
          ptx::pack2<Element>(acc_dv[dt][2 * r], acc_dv[dt][2 * r + 1]);
    }
  }
  __syncthreads();
  const SeqInfo seq_out(p, batch);  // re-read, not kept live across the mainloop
  Element* gdK = static_cast<Element*>(p.dk) + batch * p.dk_batch_stride +
                 head_k * p.dk_head_stride + (seq_out.k_row0 + n0) * p.dk_row_stride;
  Element* gdV = static_cast<Element*>(p.dv) + batch * p.dv_batch_stride +
                 head_k * p.dv_head_stride + (seq_out.k_row0 + n0) * p.dv_row_stride;
  store_tile<kBlockN, kHeadDim, kNThreads>(gdK, sK, p.dk_row_stride, seq_out.seqlen_k - n0,
                                           p.headdim, tid);
  store_tile<kBlockN, kHeadDim, kNThreads>(gdV, sV, p.dv_row_stride, seq_out.seqlen_k - n0,
                                           p.headdim, tid);
}

}  // namespace flashattn2
