// Hopper float32 backward at kernel head dim 128 (issue 21; FLASHATTN2_EXPERIMENTAL=fp32wg
// builds, taken where BwdParams::fp32wg_bwd128 asks for it): the d64 kernel's GEMMs, 3xTF32
// scheme, producer and barriers (fp32/wg_bwd_kernel.cuh: read its comment first; the shared
// pieces are fp32/wg_bwd_common.cuh's), cut so that d128's operands fit. Design count:
// scripts/fp32wg_bwd128_count.py (design R).
//
// Why another cut: at d128 a warpgroup of 64 keys holding dK and dV (128 registers) has no
// room for both K hi and V hi (64 each), and 128 keys' K lo, V lo, K^T hi / lo take 256 KiB.
// So the CTA owns 64 keys and its two consumer warpgroups split the roles:
//   warpgroup 0 ("K side"): K hi in registers; S^T = K Q^T; P^T (masked exp2) -> sPT (fp32,
//            each thread's accumulator registers, read back by the same thread index of
//            warpgroup 1); dV += P^T dO (B: dO^T); dQ^T rows [0, 64) of d.
//   warpgroup 1 ("V side"): V hi in registers; dP^T = V dO^T; P^T <- sPT; dS^T = P^T (dP^T -
//            dsum) -> sdS [q x keys] hi / lo; dK += dS^T Q (B: Q^T); dQ^T rows [64, 128).
//   dQ^T [d x queries] = K^T dS^T: M = d split between the warpgroups, A = K^T: hi from
//            registers (the lane's fragments of its 64 rows of d, 32 registers), lo from
//            smem (SS), B = sdS; red.global.add of dQ * scale into dq, each element once.
// Each warpgroup: 160 registers live (64 + dK or dV 64 + K^T hi 32), 960 tensor clocks a step
// (S^T or dP^T 384, dV or dK 384, dQ^T 192). 16 queries a step (S^T, dP^T, dQ^T: wgmma N
// 16), so that the tiles fit one buffer set (fp32/wg_bwd_config.h).
//
// Hand-offs between the consumer warpgroups (named barriers of 256 threads: one side
// arrives, the other syncs; the empty ones only between consecutive steps, so that every
// arrival has its sync):
//   kBarPtFull  0 -> 1: sPT written          kBarPtEmpty 1 -> 0: sPT read (step t + 1 may write)
//   kBarDsFull  1 -> 0: sdS written, fenced  kBarDsEmpty 0 -> 1: 0's dQ^T wgmma completed
//   kBarDsOwn   warpgroup 1's 128 threads: its own sdS stores, before its dQ^T wgmma.
//
// Producer: Q, dO natural (hi / lo) from global; Q^T, dO^T from a read-back of its own stores.
// kSingle stages them (fp32wg::bwd_stage_natural): each thread's chunks of the next step's Q,
// dO, lse and dsum by cp.async into sRaw (32.3 KiB), issued once it has read this step's, so
// that their global latency runs under the transposes and the consumers' step, not between
// empty_nat and full_nat (ncu, twenty-fifth session: the consumers' wait for full_nat and the
// producer's for its loads were 14 / 15 % of the stall samples). Measured (run 4): single +6-14
// %; 3xTF32 full +1-8 % but causal -1 to -3 %, so the 3xTF32 instance loads as before.
// (Measured and dropped, eleventh session: Q^T / dO^T from a second, L2, load of Q / dO, 32 KiB
// a step less shared-memory traffic: 0.89-0.99x, the producer's L2 latency on the path.)
//
// Layouts: fp32/wg_common.cuh's 128-byte swizzled 32-column chunks (fp32wg::swz); Q^T, dO^T
// [d x 16 queries] each use the first 64 bytes of a chunk's 128-byte rows (the descriptors'
// k8 steps 0 and 1), queries permuted in 8-groups as d64's (the accumulators as A).
//   limits d multiple of 8, 65..128 (kernel head dim 128); 16-byte aligned pointers, strides
//          multiples of 4 elements; dense, full or a right window (causal); GQA. The host sends
//          varlen, left windows, softcap, ALiBi and deterministic runs to bwd_kernel.cuh.
//   kSingle  (BwdParams::fp32_tf32) one tf32 product per multiply, as wg_bwd_kernel.cuh's: no
//          K lo / V lo / K^T lo, no lo tiles per step, so 32 queries a step (wgmma N 32) in
//          113 KiB (+ the staging); dQ^T one chain over the 64 keys with K^T hi from shared
//          memory (SS: 32 registers fewer, and no register A that lives across the loop other
//          than K hi / V hi); producer 72 / consumers 216 registers (40 / 232 spilled 136
//          bytes, 56 / 224 12: the producer's 8 float4 of Q or dO a thread at 32 rows).
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "fp32/seq.cuh"
#include "fp32/tf32.cuh"
#include "fp32/wg_bwd_common.cuh"
#include "fp32/wg_bwd_config.h"
#include "fp32/wg_common.cuh"
#include "fp32/wg_config.h"
#include "sm90/mbarrier.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_tf32.cuh"

namespace flashattn2 {

template <int kHeadDim_, bool kSingle_ = false>
struct Fp32WgBwd128Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSingle = kSingle_;  // one tf32 product (the file comment)
  static constexpr int kBlockN = kFp32WgBwd128BlockN;  // keys per CTA
  static constexpr int kBlockM = fp32wg_bwd128_block_m(kSingle_);  // queries per step
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kDkvN = 64;  // columns of dK / dV per wgmma (a fresh accumulator of 32)
  static constexpr bool kTileMajor = false;  // causal grids head-major (fp32wg_tile_major)
  static constexpr int kSmemBytes = fp32wg_bwd128_smem_bytes(kHeadDim, kSingle_);
  static constexpr int kProducerRegs = kSingle_ ? 72 : 40;
  static constexpr int kConsumerRegs = kSingle_ ? 216 : 232;
  static constexpr int kKBytes = kBlockN * kHeadDim * 4;  // K lo, V lo, K^T lo
  static constexpr int kQBytes = kBlockM * kHeadDim * 4;  // Q / dO hi, lo (natural)
  static constexpr int kQTBytes = 32 * kHeadDim * 4;      // Q^T / dO^T hi, lo (padded rows)
  static constexpr int kSBytes = kBlockM * kBlockN * 4;   // P^T, dS hi, dS lo
  static constexpr int kLo = kSingle_ ? 0 : 1;             // lo tiles (kSingle: none)
  static_assert(kHeadDim == 128 && kBlockN == 64 && kBlockM == (kSingle_ ? 32 : 16), "the cut");
  // The producer's staging (fp32wg::bwd_stage_natural): kSingle only (the file comment)
  static constexpr bool kStaged = kSingle_;
  static constexpr int kRawBytes = kStaged ? fp32wg_bwd_raw_bytes(kBlockM, kHeadDim) : 0;
  static_assert((1 + 2 * kLo) * kKBytes + 2 * (1 + kLo) * kQBytes + 2 * (1 + kLo) * kQTBytes +
                        (2 + kLo) * kSBytes + 8 * kBlockM + 32 + kRawBytes +
                        1024 <= kSmemBytes,
                "smem budget");
  static_assert(sm90::setmaxnreg_fits(kConsumers, kProducerRegs, kConsumerRegs), "registers");
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_fp32wg128_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using fp32wg::ld_shared_float4;
  using fp32wg::swz;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kDkvN = Traits::kDkvN;
  constexpr int kKSteps = kHeadDim / 8;  // k8 steps over d
  constexpr int kQSteps = kBlockM / 8;   // k8 steps over the queries = n8 tiles of S^T
  constexpr int kNSteps = kBlockN / 8;   // k8 steps over the keys (dQ^T)
  constexpr int kS = kBlockM / 2;        // S^T accumulator registers [64 x kBlockM]
  constexpr bool kSingle = Traits::kSingle;
  constexpr int kBarPtFull = 1, kBarPtEmpty = 2, kBarDsFull = 3, kBarDsEmpty = 4, kBarDsOwn = 5;
  constexpr int kBarKv = 6;  // (the consumers' K / V tiles)

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  // (kSingle: the lo tiles take no room; their addresses, never accessed, alias the next tile)
  constexpr int kLo = Traits::kLo;
  // (sKTlo: K^T hi in kSingle)
  const uint32_t sKlo = smem, sVlo = sKlo + kLo * Traits::kKBytes;
  const uint32_t sKTlo = sVlo + kLo * Traits::kKBytes;
  const uint32_t sQhi = sKTlo + Traits::kKBytes, sQlo = sQhi + Traits::kQBytes;
  const uint32_t sdOhi = sQlo + kLo * Traits::kQBytes, sdOlo = sdOhi + Traits::kQBytes;
  const uint32_t sQThi = sdOlo + kLo * Traits::kQBytes, sQTlo = sQThi + Traits::kQTBytes;
  const uint32_t sdOThi = sQTlo + kLo * Traits::kQTBytes, sdOTlo = sdOThi + Traits::kQTBytes;
  const uint32_t sdShi = sdOTlo + kLo * Traits::kQTBytes, sdSlo = sdShi + Traits::kSBytes;
  const uint32_t sPT = sdSlo + kLo * Traits::kSBytes;
  const uint32_t sLse = sPT + Traits::kSBytes, sDsum = sLse + 4 * kBlockM;
  const uint32_t bars = sDsum + 4 * kBlockM;
  const uint32_t bar_full_nat = bars, bar_full_tr = bars + 8;
  const uint32_t bar_empty_nat = bars + 16, bar_empty_tr = bars + 24;
  const uint32_t sRaw = bars + 32;  // the producer's staging (bwd_stage_natural)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const fp32wg::BwdCta cta = fp32wg::bwd_cta<kBlockM, kBlockN, Traits::kTileMajor>(p);
  const int head_k = cta.head_k, batch = cta.batch, group = cta.group, n0 = cta.n0;
  const int seqlen_q = cta.seqlen_q, seqlen_k = cta.seqlen_k, offset = cta.offset;
  const int m_block_min = cta.m_block_min, n_m = cta.n_m, n_steps = cta.n_steps;
  const float* gK = cta.gK;
  const float* gV = cta.gV;

  if (tid == 0) fp32wg::bwd_init_bars(bars, Traits::kConsumers);
  __syncthreads();  // (the mbarriers' init; the K / V tiles are the consumers' own, below)

  if (warp < 4) {
    // ---- producer: Q, dO (natural and transposed, split), lse, dsum of each step ----
    // (wg_bwd_kernel.cuh's, at 16 rows: a thread per query row and 4 float4 of each source)
    regs_decrease<Traits::kProducerRegs>();
    const int q_row0 = tid % kBlockM, q_col0 = 4 * (tid / kBlockM);
    const int q_pos0 = fp32wg::key_pos(q_row0);
    // Step t's Q, dO, lse, dsum staged by cp.async during step t - 1 (step 0's here).
    constexpr auto stage = fp32wg::bwd_stage_step<kBlockM, kHeadDim>;
    if (Traits::kStaged && n_steps > 0) stage(p, cta, tid, 0, q_row0, q_col0, sRaw);
    for (int t = 0; t < n_steps; ++t) {
      uint32_t base = smem;
      int q_row = q_row0, q_col = q_col0, q_pos = q_pos0;
      asm volatile("" : "+r"(base), "+r"(q_row), "+r"(q_col), "+r"(q_pos));
      auto at = [&](uint32_t addr) { return base + (addr - smem); };
      const int head = head_k * group + t / n_m;
      const int m0 = (m_block_min + t % n_m) * kBlockM;
      fp32wg::bwd_store_natural<kBlockM, kHeadDim, kSingle, Traits::kStaged>(
          p, tid, batch, head, m0, seqlen_q - m0, t, q_row, q_col, at(sQhi), at(sQlo), at(sdOhi),
          at(sdOlo), at(sLse), at(sDsum), bar_empty_nat, bar_full_nat, at(sRaw));
      // (this thread's staged chunks are read: the next step's copies land under the
      // transposes and the consumers' step)
      if (Traits::kStaged && t + 1 < n_steps) stage(p, cta, tid, t + 1, q_row, q_col, at(sRaw));
      // Transposed tiles, from this thread's own natural stores.
      fp32wg::bwd_transpose_natural<kBlockM, kHeadDim, kSingle>(
          t, q_row, q_col, q_pos, {at(sQhi), at(sQlo), at(sdOhi), at(sdOlo)},
          {at(sQThi), at(sQTlo), at(sdOThi), at(sdOTlo)}, bar_empty_tr);
      fence_proxy_async();
      mbar_arrive(bar_full_tr);
    }
  } else {
    // ---- consumers: 0 the K side, 1 the V side ----
    regs_increase<Traits::kConsumerRegs>();
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int lane_key0 = 16 * warp_in_wg + g;                   // + 8 r: the lane's keys
    const int lane_d0 = 64 * consumer + 16 * warp_in_wg + g;     // + 8 r: its dQ^T rows (d)
    const int tt = tid % 128;                                    // sPT: this thread's slots

    // K hi (consumer 0) or V hi (1): the lane's A fragments of S^T / dP^T (k8 step kk over
    // d); K^T hi: its A fragments of dQ^T (rows lane_d0 + 8 r of d, k8 step kk over keys).
    uint32_t x_hi[kKSteps][4], kt_hi[kNSteps][4];
    {
      const float* gX = consumer == 0 ? gK : gV;
      const int64_t x_stride = consumer == 0 ? p.k_row_stride : p.v_row_stride;
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = lane_key0 + 8 * (i & 1), col = 8 * kk + lane % 4 + 4 * (i >> 1);
          const bool in = n0 + key < seqlen_k && col < p.headdim;
          x_hi[kk][i] = tf32::split(in ? __ldg(gX + int64_t(key) * x_stride + col) : 0.f).hi;
        }
#pragma unroll
      for (int kk = 0; kk < (kSingle ? 0 : kNSteps); ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int d = lane_d0 + 8 * (i & 1), key = 8 * kk + lane % 4 + 4 * (i >> 1);
          const bool in = n0 + key < seqlen_k && d < p.headdim;
          kt_hi[kk][i] = tf32::split(in ? __ldg(gK + int64_t(key) * p.k_row_stride + d) : 0.f).hi;
        }
    }

    // K lo and K^T lo (consumer threads 0-127), V lo (128-255), while the producer already
    // builds step 0's tiles: a thread per key row and half of d (kSingle: K^T hi only, in sKTlo's
    // place, consumer threads 0-127); then the consumers' barrier (the producer is not in it).
    {
      const int ct = tid - 128;
      if (ct < (kSingle ? 128 : 256)) {
        fp32wg::bwd_store_kv<kBlockN, kHeadDim, !kSingle, kSingle, !kSingle>(
            p, ct, gK, gV, seqlen_k - n0, sKlo, sVlo, sKTlo, sKTlo);
      }
      named_sync(kBarKv, 256);
    }

    uint32_t step_base = smem;
    const fp32wg::KDesc kdesc{step_base};
    // (fp32wg::gemm_d: S^T / dP^T, two fresh accumulators alternating)
    constexpr auto gemm_d = fp32wg::gemm_d<kBlockM, kBlockN, kKSteps, 2, kSingle>;
    // (fp32wg::gemm_q, each FADD pinned: sY^T [d x 16], padded rows)
    constexpr auto gemm_q = fp32wg::gemm_q<kHeadDim, kQSteps, kDkvN, true, kSingle>;

    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = p.softmax_scale * kLog2e;
    float acc_d[kHeadDim / 2];  // dV (consumer 0) or dK (1)
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_d[i] = 0.f;

    for (int t = 0; t < n_steps; ++t) {
      // (wg_bwd_kernel.cuh: addresses and lane indices rebuilt per step, not hoisted)
      uint32_t base = smem;
      asm volatile("" : "+r"(base));
      auto at = [&](uint32_t addr) { return base + (addr - smem); };
      step_base = base;
      int q = lane % 4, lane_key = lane_key0, lane_d = lane_d0, slot = tt;
      asm volatile("" : "+r"(q), "+r"(lane_key), "+r"(lane_d), "+r"(slot));
      const int head = head_k * group + t / n_m;
      const int m0 = (m_block_min + t % n_m) * kBlockM;
      mbar_wait(bar_full_nat, t & 1);

      // acc: P^T (consumer 0), dS^T (1); the A of this warpgroup's dV / dK GEMM.
      float acc[kS];
      if (consumer == 0) {
        // P^T = exp2(S^T scale log2e - lse log2e), 0 where the key is hidden from the query.
        gemm_d(acc, x_hi, kdesc, 0, at(sKlo), at(sQhi), at(sQlo));
        const bool edge = m0 + kBlockM > seqlen_q || n0 + kBlockN > seqlen_k ||
                          (p.window_right >= 0 && n0 + kBlockN - 1 > m0 + offset + p.window_right);
#pragma unroll
        for (int nt = 0; nt < kQSteps; ++nt) {
          const float2 lse = ld_shared_float2(at(sLse) + 4 * (8 * nt + 2 * q));
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = m0 + 8 * nt + 2 * q + (e & 1), j = n0 + lane_key + 8 * (e >> 1);
            const bool visible =
                !edge || (i < seqlen_q && j < seqlen_k &&
                          (p.window_right < 0 || j <= i + offset + p.window_right));
            const float l = (e & 1) ? lse.y : lse.x;
            acc[4 * nt + e] =
                visible ? ptx::exp2_approx(fmaf(acc[4 * nt + e], scale_log2, -l * kLog2e)) : 0.f;
          }
        }
        mbar_arrive(bar_empty_nat);  // (S^T's wgmma completed; lse read: every thread)
        if (t > 0) named_sync(kBarPtEmpty, 256);  // (warpgroup 1 read step t - 1's P^T)
#pragma unroll
        for (int h = 0; h < kS / 4; ++h) {
          st_shared_v4(at(sPT) + h * 2048 + 16 * slot, acc[4 * h], acc[4 * h + 1], acc[4 * h + 2],
                       acc[4 * h + 3]);
        }
        named_arrive(kBarPtFull, 256);
      } else {
        // dS^T = P^T (dP^T - dsum), split into sdS [q x keys].
        gemm_d(acc, x_hi, kdesc, 0, at(sVlo), at(sdOhi), at(sdOlo));
        float2 dsum[kQSteps];
#pragma unroll
        for (int nt = 0; nt < kQSteps; ++nt) {
          dsum[nt] = ld_shared_float2(at(sDsum) + 4 * (8 * nt + 2 * q));
        }
        mbar_arrive(bar_empty_nat);  // (dP^T's wgmma completed; dsum read)
        named_sync(kBarPtFull, 256);
        float pt[kS];
#pragma unroll
        for (int h = 0; h < kS / 4; ++h) {
          const float4 v = ld_shared_float4(at(sPT) + h * 2048 + 16 * slot);
          pt[4 * h] = v.x;
          pt[4 * h + 1] = v.y;
          pt[4 * h + 2] = v.z;
          pt[4 * h + 3] = v.w;
        }
        if (t + 1 < n_steps) named_arrive(kBarPtEmpty, 256);
        if (t > 0) named_sync(kBarDsEmpty, 256);  // (both dQ^T of step t - 1 read sdS)
#pragma unroll
        for (int nt = 0; nt < kQSteps; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float& x = acc[4 * nt + e];
            x = pt[4 * nt + e] * (x - ((e & 1) ? dsum[nt].y : dsum[nt].x));
            const tf32::Split sp = tf32::split(x);
            const uint32_t off = swz<kBlockM>(8 * nt + 2 * q + (e & 1), lane_key + 8 * (e >> 1));
            st_shared(at(sdShi) + off, sp.hi);
            if constexpr (!kSingle) st_shared(at(sdSlo) + off, sp.lo);
          }
        }
        fence_proxy_async();  // (the sdS stores, then the dQ^T wgmma of the async proxy)
        named_arrive(kBarDsFull, 256);
      }

      // dV += P^T dO (0) or dK += dS^T Q (1): the accumulator as A fragments (c0, c2, c1, c3).
      mbar_wait(bar_full_tr, t & 1);
      {
        uint32_t a_hi[kQSteps][4], a_lo[kQSteps][4];
        fp32wg::acc_to_frags(acc, a_hi, a_lo);
        if (consumer == 0) {
          gemm_q(acc_d, a_hi, a_lo, kdesc, at(sdOThi), at(sdOTlo));
        } else {
          gemm_q(acc_d, a_hi, a_lo, kdesc, at(sQThi), at(sQTlo));
        }
      }
      fp32wg::release_elected(bar_empty_tr);

      // dQ^T rows [64 consumer, + 64) of d = K^T dS^T over the 64 keys: two 32-key
      // chains of 4 k8 steps x 3 products (K^T lo from smem, K^T hi from registers) into fresh
      // accumulators, summed with FADD (kSingle: one chain of hi products).
      if (consumer == 0) {
        named_sync(kBarDsFull, 256);
      } else {
        named_sync(kBarDsOwn, 128);
      }
      float q_sum[kS];
      if constexpr (kSingle) {
        // (kSingle: one chain of the 8 k8 steps' hi products into q_sum, K^T hi from shared
        // memory)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kNSteps; ++kk) {
          const uint32_t ka = (kk / 4) * (kHeadDim * 128) + consumer * (64 * 128) + (kk % 4) * 32;
          const uint32_t sb = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
          WgmmaTf32<kBlockM>::ss(q_sum, kdesc(at(sKTlo) + ka), kdesc(at(sdShi) + sb),
                                 kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(q_sum);
      } else {
        // (one chain in flight: 8 registers fewer at this phase's peak)
        float t_q[kS];
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const uint32_t ka = ch * (kHeadDim * 128) + consumer * (64 * 128) + kk * 32;
            const uint32_t sb = ch * (kBlockM * 128) + kk * 32;
            const uint64_t b_hi = kdesc(at(sdShi) + sb);
            WgmmaTf32<kBlockM>::ss(t_q, kdesc(at(sKTlo) + ka), b_hi, kk > 0 ? 1 : 0);
            WgmmaTf32<kBlockM>::rs(t_q, kt_hi[4 * ch + kk], kdesc(at(sdSlo) + sb), 1);
            WgmmaTf32<kBlockM>::rs(t_q, kt_hi[4 * ch + kk], b_hi, 1);
          }
          wgmma_commit();
          wgmma_wait<0>();
          fence_regs(t_q);
#pragma unroll
          for (int i = 0; i < kS; ++i) q_sum[i] = ch == 0 ? t_q[i] : q_sum[i] + t_q[i];
        }
      }
      if (consumer == 0 && t + 1 < n_steps) named_arrive(kBarDsEmpty, 256);
      fp32wg::red_dq<kS>(p, batch, head, m0, q, lane_d, seqlen_q,
                         [&](int i) { return q_sum[i]; });
    }

    // Epilogue: dV (consumer 0) or dK times the softmax scale (1), the lane's keys.
    const bool is_dv = consumer == 0;
    float* gD = is_dv ? static_cast<float*>(p.dv) + batch * p.dv_batch_stride +
                            head_k * p.dv_head_stride
                      : static_cast<float*>(p.dk) + batch * p.dk_batch_stride +
                            head_k * p.dk_head_stride;
    const int64_t d_stride = is_dv ? p.dv_row_stride : p.dk_row_stride;
    const float mul = is_dv ? 1.f : p.softmax_scale;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = n0 + lane_key0 + 8 * r;
      if (j < seqlen_k) {
#pragma unroll
        for (int dt = 0; dt < kKSteps; ++dt) {
          const int c = 8 * dt + 2 * (lane % 4);
          if (c < p.headdim) {
            *reinterpret_cast<float2*>(gD + int64_t(j) * d_stride + c) =
                make_float2(acc_d[4 * dt + 2 * r] * mul, acc_d[4 * dt + 2 * r + 1] * mul);
          }
        }
      }
    }
  }
#endif
}

}  // namespace flashattn2
