// Hopper float32 backward (issue 21; FLASHATTN2_EXPERIMENTAL=fp32wg builds, taken where
// BwdParams::fp32wg_bwd asks for it): 3xTF32 on tf32 wgmma (sm_90a) with the error model of
// fp32/tf32.cuh (x = hi + lo, three products small terms first, two-level accumulation), for
// dense attention, full or with a right window (causal), GQA, kernel head dim 64. Everything
// else runs fp32/bwd_kernel.cuh. The preprocess (dsum, dq zeroed: fp32_dq_direct, no convert) is
// fp32/bwd_prepost.cu's; the pieces shared with the d128 kernel, fp32/wg_bwd_common.cuh's.
//
// tf32 wgmma reads both shared-memory operands K-major (the reduced dim contiguous) and an A
// operand from registers in the m16n8k8 A fragment layout, so (keys as M, as fp32/bwd_kernel):
//   S^T  = K Q^T     A: K hi (registers), K lo (smem, natural)   B: Q (natural [q x d])
//   dP^T = V dO^T    A: V hi (registers), V lo (smem)            B: dO (natural)
//   dV  += P^T dO    A: P^T (S^T's accumulator)                  B: dO^T [d x q]
//   dK  += dS^T Q    A: dS^T (accumulator)                       B: Q^T [d x q]
//   dQ^T = K^T dS^T  A: K^T [d x keys] (smem)                    B: dS [q x keys] (smem)
// The accumulators as A fragments: S^T's C fragment gives lane (g, q) the queries 2q, 2q + 1
// of each 8-query group, A wants k = q, q + 4; so Q^T and dO^T store their 8-query groups
// permuted (position q holds query 2q, q + 4 query 2q + 1: wg_common.cuh's key_pos) and the
// A fragment is (c0, c2, c1, c3) of the n8 tile (the forward's P V).
//
// Tiling
//   grid   (ceil(seqlen_k / 128), nheads_k, batch); the CTA walks the query tiles (32 rows)
//          that see its keys, for every query head of its GQA group (dK / dV summed in
//          registers), ascending; causal with up to 32 KV heads: (nheads_k, key blocks,
//          batch), tile-major (fp32wg_tile_major, wg_config.h: key block 0, the longest walk,
//          first).
//   block  384 threads. The consumers first store K lo and K^T hi / lo (their threads
//          0-127), V lo (128-255; a thread per key), and load their own K hi / V hi A
//          fragments, while the producer builds step 0. Warpgroup 0, the producer (setmaxnreg
//          40): per step Q and dO loaded (a thread per query row, 4 float4 each), split,
//          stored natural (hi, lo), then transposed (hi, lo: read back from its own natural
//          stores, so that no data register lives across the second wait), lse / dsum to
//          smem. Consumer warpgroup c (232 registers) owns keys [64 c, 64 c + 64): dK, dV
//          [64 x d] in registers.
//   registers  one buffer set makes every smem address loop-invariant: nvcc hoisted the
//          ~112 wgmma descriptors and the lanes' store / red offsets out of the loop and
//          spilled (804 bytes); the smem base and lane indices pass an empty asm volatile
//          at the top of each step so that they are rebuilt (0 spills), and each descriptor
//          is the step's base descriptor plus the tile offset (kdesc).
//   smem   fp32/wg_config.h's 128-byte swizzled 32-column chunks (fp32wg::swz); budget:
//          fp32/wg_bwd_config.h. One buffer set, two barrier pairs: nat (Q, dO natural,
//          lse, dsum: free after dP^T) and tr (Q^T, dO^T: free after dK), so that the
//          producer writes step t + 1's natural tiles under dV / dK / dQ of step t and its
//          transposed ones under dQ of t and S^T / dP^T of t + 1.
//   step   wait nat; S^T two-level (per k8 step 3 wgmma into a fresh accumulator, FADD, two
//          alternating); P^T = exp2(S^T scale log2e - lse log2e), masked to 0; dP^T alike;
//          release nat; dS^T = P^T (dP^T - dsum); dS^T split into sdS [q x keys] (its own
//          key chunks); wait tr; dV += P^T dO, dK += dS^T Q, per 32-column half of d (4 k8
//          steps x 3 wgmma into a fresh accumulator, FADD); release tr; warpgroup barrier;
//          dQ^T over its 64 keys (two 32-key chains into fresh accumulators, FADD);
//          red.global.add of dQ * scale into dq (both warpgroups add).
//   epilogue  dK * softmax_scale and dV (float2 stores of the accumulators).
//   limits d multiple of 8, <= 64; 16-byte aligned pointers, strides multiples of 4 elements
//          (host API); ragged tails zero-filled and masked; window_left < 0, no varlen,
//          softcap, ALiBi or deterministic order (the host sends those to bwd_kernel.cuh).
//   kSingle  (BwdParams::fp32_tf32: PyTorch allows TF32 for float32 matmuls) one tf32 product
//          per multiply: no lo tile stored or read, each GEMM one wgmma chain into its
//          accumulator (wg_bwd_common.cuh), dQ^T one chain over the warpgroup's 64 keys; no
//          room for the lo tiles (97.5 KiB), and the producer stages the next step's Q, dO, lse
//          and dsum by cp.async (fp32wg::bwd_stage_natural, as the d128 kernel's; 56 / 224
//          registers: at 40 it spilled 16 bytes).
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
struct Fp32WgBwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSingle = kSingle_;  // one tf32 product (the file comment)
  static constexpr int kBlockN = kFp32WgBwdBlockN;  // keys per CTA
  static constexpr int kBlockM = kFp32WgBwdBlockM;  // queries per step
  static constexpr int kConsumers = kBlockN / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kDkvN = 32;  // columns of dK / dV per wgmma (a fresh accumulator of 16)
  static constexpr bool kTileMajor = true;  // causal grids (fp32wg_tile_major)
  static constexpr int kSmemBytes = fp32wg_bwd_smem_bytes(kHeadDim, kSingle_);
  // (kSingle: the producer's staging needs 16 more; its consumers fit 224)
  static constexpr int kProducerRegs = kSingle_ ? 56 : 40;
  static constexpr int kConsumerRegs = kSingle_ ? 224 : 232;
  static constexpr int kGemmDBufs = 2;  // fresh S^T / dP^T accumulators (gemm_d below)
  // Tile bytes.
  static constexpr int kKBytes = kBlockN * kHeadDim * 4;  // K lo, V lo, K^T hi, K^T lo
  static constexpr int kQBytes = kBlockM * kHeadDim * 4;  // Q / dO (hi, lo), natural or ^T
  static constexpr int kSBytes = kBlockM * kBlockN * 4;   // dS hi, dS lo
  static_assert(kHeadDim % 32 == 0 && kBlockM == 32 && kBlockN % 32 == 0, "whole chunks");
  static_assert(kHeadDim % kDkvN == 0, "dK / dV in whole halves");
  static constexpr int kLo = kSingle_ ? 0 : 1;  // lo tiles (kSingle: none)
  // The producer's staging (fp32wg::bwd_stage_natural): kSingle only, as the d128 kernel's
  static constexpr bool kStaged = kSingle_;
  static constexpr int kRawBytes = kStaged ? fp32wg_bwd_raw_bytes(kBlockM, kHeadDim) : 0;
  static_assert((1 + 3 * kLo) * kKBytes + 4 * (1 + kLo) * kQBytes + (1 + kLo) * kSBytes +
                        8 * kBlockM + 32 + kRawBytes + 1024 <= kSmemBytes,
                "smem budget");
  static_assert(sm90::setmaxnreg_fits(kConsumers, kProducerRegs, kConsumerRegs), "registers");
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_fp32wg_kernel(const BwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using fp32wg::swz;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kDkvN = Traits::kDkvN;
  constexpr int kKSteps = kHeadDim / 8;  // k8 steps over d
  constexpr int kQSteps = kBlockM / 8;   // k8 steps over the queries = n8 tiles of S^T
  constexpr int kS = kBlockM / 2;        // S^T accumulator registers [64 x kBlockM]
  constexpr int kGemmDBufs = Traits::kGemmDBufs;
  constexpr bool kSingle = Traits::kSingle;
  // Named barriers: 1 + c, consumer warpgroup c's sdS stores; kBarKv, the consumers' K / V tiles.
  constexpr int kBarKv = 3;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  // (kSingle: the lo tiles take no room; their addresses, never accessed, alias the next tile)
  constexpr int kLo = Traits::kLo;
  const uint32_t sKlo = smem, sVlo = sKlo + kLo * Traits::kKBytes;
  const uint32_t sKThi = sVlo + kLo * Traits::kKBytes, sKTlo = sKThi + Traits::kKBytes;
  const uint32_t sQhi = sKTlo + kLo * Traits::kKBytes, sQlo = sQhi + Traits::kQBytes;
  const uint32_t sdOhi = sQlo + kLo * Traits::kQBytes, sdOlo = sdOhi + Traits::kQBytes;
  const uint32_t sQThi = sdOlo + kLo * Traits::kQBytes, sQTlo = sQThi + Traits::kQBytes;
  const uint32_t sdOThi = sQTlo + kLo * Traits::kQBytes, sdOTlo = sdOThi + Traits::kQBytes;
  const uint32_t sdShi = sdOTlo + kLo * Traits::kQBytes, sdSlo = sdShi + Traits::kSBytes;
  const uint32_t sLse = sdSlo + kLo * Traits::kSBytes, sDsum = sLse + 4 * kBlockM;
  const uint32_t bars = sDsum + 4 * kBlockM;
  const uint32_t bar_full_nat = bars, bar_full_tr = bars + 8;
  const uint32_t bar_empty_nat = bars + 16, bar_empty_tr = bars + 24;
  const uint32_t sRaw = bars + 32;  // the producer's staging (kStaged)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const fp32wg::BwdCta cta = fp32wg::bwd_cta<kBlockM, kBlockN, Traits::kTileMajor>(p);
  const int head_k = cta.head_k, batch = cta.batch, group = cta.group, n0 = cta.n0;
  const int seqlen_q = cta.seqlen_q, seqlen_k = cta.seqlen_k, offset = cta.offset;
  const int m_block_min = cta.m_block_min, n_m = cta.n_m, n_steps = cta.n_steps;
  const float* gK = cta.gK;
  const float* gV = cta.gV;

  if (fp32wg::kProbeTimes && tid == 128) fp32wg::bwd_probe_start(p);
  if (tid == 0) fp32wg::bwd_init_bars(bars, Traits::kConsumers);
  __syncthreads();  // (the mbarriers' init; the K / V tiles are the consumers' own, below)

  if (warp < 4) {
    // ---- producer: Q, dO (natural and transposed, split), lse, dsum of each step ----
    regs_decrease<Traits::kProducerRegs>();
    // (thread: query row q_row of the tile, columns q_col + 16 i; a warp's 32 rows at one
    // column: the transposed stores hit one 128-byte row, the natural 16-byte stores of a
    // quarter warp 8 rows of one unit: conflict-free)
    const int q_row0 = tid % kBlockM, q_col0 = 4 * (tid / kBlockM);
    // kStaged: step t's Q, dO, lse, dsum staged by cp.async during step t - 1 (step 0's here).
    constexpr auto stage = fp32wg::bwd_stage_step<kBlockM, kHeadDim>;
    if (Traits::kStaged && n_steps > 0) stage(p, cta, tid, 0, q_row0, q_col0, sRaw);
    for (int t = 0; t < n_steps; ++t) {
      // (addresses and lane offsets recomputed per step, not kept live: 40 registers)
      uint32_t base = smem;
      int q_row = q_row0, q_col = q_col0;
      asm volatile("" : "+r"(base), "+r"(q_row), "+r"(q_col));
      const int q_pos = fp32wg::key_pos(q_row);
      auto at = [&](uint32_t addr) { return base + (addr - smem); };
      const int head = head_k * group + t / n_m;
      const int m0 = (m_block_min + t % n_m) * kBlockM;
      // Natural tiles (the previous step's S^T and dP^T are done with them), lse, dsum.
      fp32wg::bwd_store_natural<kBlockM, kHeadDim, kSingle, Traits::kStaged>(
          p, tid, batch, head, m0, seqlen_q - m0, t, q_row, q_col, at(sQhi), at(sQlo), at(sdOhi),
          at(sdOlo), at(sLse), at(sDsum), bar_empty_nat, bar_full_nat, at(sRaw));
      if (Traits::kStaged && t + 1 < n_steps) stage(p, cta, tid, t + 1, q_row, q_col, at(sRaw));
      // Transposed tiles (the previous step's dV and dK are done with them).
      fp32wg::bwd_transpose_natural<kBlockM, kHeadDim, kSingle>(
          t, q_row, q_col, q_pos, {at(sQhi), at(sQlo), at(sdOhi), at(sdOlo)},
          {at(sQThi), at(sQTlo), at(sdOThi), at(sdOTlo)}, bar_empty_tr);
      fence_proxy_async();
      mbar_arrive(bar_full_tr);
    }
  } else {
    // ---- consumers ----
    regs_increase<Traits::kConsumerRegs>();
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int wg_key0 = 64 * consumer;                          // within the CTA's keys
    const int lane_key0 = wg_key0 + 16 * warp_in_wg + g;  // + 8 r: the lane's keys
    const int lane_d0 = 16 * warp_in_wg + g;              // + 8 r: dQ^T rows (d)

    // K hi, V hi: the lane's A fragments ((g, q), (g+8, q), (g, q+4), (g+8, q+4) of k8 step
    // kk). kSingle: split from 64 scalar global loads a thread (before the shared tiles);
    // else read back from K^T hi and a V hi scratch in sdS (after them: the tiles come from
    // global memory once; the scratch would cost kSingle 32 KiB more shared memory, and that
    // measured -2 %, twenty-ninth session).
    uint32_t k_hi[kKSteps][4], v_hi[kKSteps][4];
    auto fragments = [&](auto&& at) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = lane_key0 + 8 * (i & 1), col = 8 * kk + lane % 4 + 4 * (i >> 1);
          at(k_hi[kk][i], v_hi[kk][i], key, col);
        }
    };
    if constexpr (kSingle) {
      fragments([&](uint32_t& kh, uint32_t& vh, int key, int col) {
        const bool in = n0 + key < seqlen_k && col < p.headdim;
        kh = tf32::split(in ? __ldg(gK + int64_t(key) * p.k_row_stride + col) : 0.f).hi;
        vh = tf32::split(in ? __ldg(gV + int64_t(key) * p.v_row_stride + col) : 0.f).hi;
      });
    }
    // K lo and K^T hi / lo (consumer threads 0-127), V lo and (!kSingle) V hi (128-255), while
    // the producer already builds step 0's tiles; the consumers' barrier (the producer is not
    // in it).
    static_assert(2 * kBlockN == 128 * Traits::kConsumers, "a consumer thread per K / V row");
    static_assert(kSingle || 2 * Traits::kSBytes >= Traits::kKBytes, "V hi fits sdS hi and lo");
    const uint32_t sVhi = sdShi;
    fp32wg::bwd_store_kv<kBlockN, kHeadDim, !kSingle, true, !kSingle, !kSingle, true>(
        p, tid - 128, gK, gV, seqlen_k - n0, sKlo, sVlo, sKThi, sKTlo, sVhi);
    named_sync(kBarKv, 128 * Traits::kConsumers);
    if (fp32wg::kProbeTimes && tid == 128) fp32wg::bwd_probe(p, 1);
    if constexpr (!kSingle) {
      fragments([&](uint32_t& kh, uint32_t& vh, int key, int col) {
        kh = __float_as_uint(fp32wg::ld_shared_float(sKThi + swz<kHeadDim>(col, key)));
        vh = __float_as_uint(fp32wg::ld_shared_float(sVhi + swz<kBlockN>(key, col)));
      });
      named_sync(kBarKv, 128 * Traits::kConsumers);  // (the scratch is sdS: step 0 writes it)
      if (fp32wg::kProbeTimes && tid == 128) fp32wg::bwd_probe(p, 3);
    }

    uint32_t step_base = smem;
    const fp32wg::KDesc kdesc{step_base};
    // (fp32wg::gemm_d over the warpgroup's 64 keys: kGemmDBufs 2, ptxas 0 spills at 232)
    constexpr auto gemm_d = fp32wg::gemm_d<kBlockM, kBlockN, kKSteps, kGemmDBufs, kSingle>;
    constexpr auto gemm_q = fp32wg::gemm_q<kHeadDim, kQSteps, kDkvN, false, kSingle>;

    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = p.softmax_scale * kLog2e;
    float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;

    if (fp32wg::kProbeTimes && n_steps > 0) {  // (step 0's tiles in: the loop waits again)
      mbar_wait(bar_full_nat, 0);
      if (tid == 128) fp32wg::bwd_probe(p, 2);
    }
    for (int t = 0; t < n_steps; ++t) {
      // The tiles' addresses from a base the compiler cannot see through, so that the wgmma
      // descriptors (constant over the loop: one buffer set) are rebuilt in each step rather
      // than hoisted out of the loop into ~100 registers.
      uint32_t base = smem;
      asm volatile("" : "+r"(base));
      auto at = [&](uint32_t addr) { return base + (addr - smem); };
      step_base = base;
      // (the lane's indices likewise: offsets derived from them, e.g. the 16 sdS store
      // offsets and the dQ reds', are recomputed per step, not kept live across the loop)
      int q = lane % 4, lane_key = lane_key0, lane_d = lane_d0;
      asm volatile("" : "+r"(q), "+r"(lane_key), "+r"(lane_d));
      const int head = head_k * group + t / n_m;
      const int m0 = (m_block_min + t % n_m) * kBlockM;
      mbar_wait(bar_full_nat, t & 1);

      // P^T = exp2(S^T scale log2e - lse log2e), 0 where the key is hidden from the query.
      float acc_s[kS];
      gemm_d(acc_s, k_hi, kdesc, wg_key0, at(sKlo), at(sQhi), at(sQlo));
      const bool edge = m0 + kBlockM > seqlen_q || n0 + kBlockN > seqlen_k ||
                        (p.window_right >= 0 && n0 + kBlockN - 1 > m0 + offset + p.window_right);
#pragma unroll
      for (int nt = 0; nt < kQSteps; ++nt) {
        const float2 lse = ld_shared_float2(at(sLse) + 4 * (8 * nt + 2 * q));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + 8 * nt + 2 * q + (e & 1), j = n0 + lane_key + 8 * (e >> 1);
          const bool visible = !edge || (i < seqlen_q && j < seqlen_k &&
                                         (p.window_right < 0 || j <= i + offset + p.window_right));
          const float l = (e & 1) ? lse.y : lse.x;
          acc_s[4 * nt + e] =
              visible ? ptx::exp2_approx(fmaf(acc_s[4 * nt + e], scale_log2, -l * kLog2e)) : 0.f;
        }
      }
      float acc_dp[kS];
      gemm_d(acc_dp, v_hi, kdesc, wg_key0, at(sVlo), at(sdOhi), at(sdOlo));
      // dS^T = P^T (dP^T - dsum); split into sdS [q x keys] (the warpgroup's own key chunks:
      // its dQ^T reads them; the previous step's dQ^T wgmma completed before its red).
#pragma unroll
      for (int nt = 0; nt < kQSteps; ++nt) {
        const float2 ds = ld_shared_float2(at(sDsum) + 4 * (8 * nt + 2 * q));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float& x = acc_dp[4 * nt + e];
          x = acc_s[4 * nt + e] * (x - ((e & 1) ? ds.y : ds.x));
          const tf32::Split sp = tf32::split(x);
          const uint32_t off = swz<kBlockM>(8 * nt + 2 * q + (e & 1), lane_key + 8 * (e >> 1));
          st_shared(at(sdShi) + off, sp.hi);
          if constexpr (!kSingle) st_shared(at(sdSlo) + off, sp.lo);
        }
      }
      // (both GEMMs over Q, dO natural, and lse / dsum, are done) Every thread arrives, not one
      // lane after __syncwarp as for tr: the lse / dsum loads are generic, as are the next
      // step's stores, and that __syncwarp is a NOP in SASS, so racecheck saw the other lanes'
      // loads unordered with those stores (a hazard per LDS.64 and step; H100, tenth session).
      mbar_arrive(bar_empty_nat);
      fence_proxy_async();  // (the sdS stores, then the dQ^T wgmma of the async proxy)

      mbar_wait(bar_full_tr, t & 1);
      {
        uint32_t a_hi[kQSteps][4], a_lo[kQSteps][4];
        fp32wg::acc_to_frags(acc_s, a_hi, a_lo);
        gemm_q(acc_dv, a_hi, a_lo, kdesc, at(sdOThi), at(sdOTlo));
        fp32wg::acc_to_frags(acc_dp, a_hi, a_lo);
        gemm_q(acc_dk, a_hi, a_lo, kdesc, at(sQThi), at(sQTlo));
      }
      fp32wg::release_elected(bar_empty_tr);

      // dQ^T [d x kBlockM] = K^T dS^T over the warpgroup's 64 keys: two 32-key chains of 4 k8
      // steps x 3 products into fresh accumulators, summed with FADD (kSingle: one chain of 8
      // k8 steps, hi products only, into t_q[0]).
      named_sync(1 + consumer, 128);  // (every lane's sdS stores of this step)
      float t_q[2][kS];
      wgmma_fence();
#pragma unroll
      for (int ch = 0; ch < 2; ++ch) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const int chunk = 2 * consumer + ch;
          const uint32_t ka = chunk * (kHeadDim * 128) + kk * 32;
          const uint32_t sb = chunk * (kBlockM * 128) + kk * 32;
          const uint64_t a_hi = kdesc(at(sKThi) + ka), b_hi = kdesc(at(sdShi) + sb);
          if constexpr (kSingle) {
            WgmmaTf32<kBlockM>::ss(t_q[0], a_hi, b_hi, ch + kk > 0 ? 1 : 0);
          } else {
            WgmmaTf32<kBlockM>::ss(t_q[ch], kdesc(at(sKTlo) + ka), b_hi, kk > 0 ? 1 : 0);
            WgmmaTf32<kBlockM>::ss(t_q[ch], a_hi, kdesc(at(sdSlo) + sb), 1);
            WgmmaTf32<kBlockM>::ss(t_q[ch], a_hi, b_hi, 1);
          }
        }
        if constexpr (!kSingle) wgmma_commit();
      }
      if constexpr (kSingle) wgmma_commit();
      wgmma_wait<0>();
      fence_regs(t_q[0]);
      if constexpr (!kSingle) fence_regs(t_q[1]);
      fp32wg::red_dq<kS>(p, batch, head, m0, q, lane_d, seqlen_q, [&](int i) {
        if constexpr (kSingle) {
          return t_q[0][i];
        } else {
          return t_q[0][i] + t_q[1][i];
        }
      });
    }

    // Epilogue: dK (times the softmax scale) and dV of the lane's keys.
    float* gdK = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head_k * p.dk_head_stride;
    float* gdV = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head_k * p.dv_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = n0 + lane_key0 + 8 * r;
      if (j < seqlen_k) {
#pragma unroll
        for (int dt = 0; dt < kKSteps; ++dt) {
          const int c = 8 * dt + 2 * (lane % 4);
          if (c < p.headdim) {
            *reinterpret_cast<float2*>(gdK + int64_t(j) * p.dk_row_stride + c) =
                make_float2(acc_dk[4 * dt + 2 * r] * p.softmax_scale,
                            acc_dk[4 * dt + 2 * r + 1] * p.softmax_scale);
            *reinterpret_cast<float2*>(gdV + int64_t(j) * p.dv_row_stride + c) =
                make_float2(acc_dv[4 * dt + 2 * r], acc_dv[4 * dt + 2 * r + 1]);
          }
        }
      }
    }
    if (fp32wg::kProbeTimes && tid == 128) fp32wg::bwd_probe_end(p, n_steps);
  }
#endif
}

}  // namespace flashattn2
