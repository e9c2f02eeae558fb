// Hopper float32 forward (issue 21; FLASHATTN2_EXPERIMENTAL=fp32wg builds): 3xTF32 on tf32
// wgmma (sm_90a), the error model of fp32/tf32.cuh (x = hi + lo, three products small terms
// first, two-level accumulation), for dense attention, full or with a right window (causal),
// GQA, kernel head dims 64 and 128. Everything else runs fp32/fwd_kernel.cuh (mha_fwd_fp32).
//
// Tiling
//   grid   (ceil(seqlen_q / kBlockM), nheads, batch), m blocks in reverse order (the longest
//          causal rows first), as fp32/fwd_kernel.cuh; d128 causal with up to 32 heads:
//          (nheads, m blocks, batch), tile-major (fp32wg_tile_major, wg_config.h).
//   block  384 threads (128 query rows). Warpgroup 0, the producer, loads each K / V tile
//          from global memory (16-byte loads), splits every value into tf32 hi / lo and
//          stores them in the wgmma layouts: K as it is (K-major: S = Q K^T reduces over d,
//          contiguous), V transposed (P V reduces over the keys: tf32 wgmma has no MN-major
//          B, so V^T rows of keys). Consumer warpgroup c (c = 0, 1) owns query rows
//          [64 c, 64 c + 64).
//   smem   kStages x (K hi, K lo [kBlockN x d], V^T hi, V^T lo [d x kBlockN]); !kQRegs (d128):
//          Q lo [kBlockM x d]; kSingle: kStages x (K hi, V^T hi), 64-key tiles at d128 too
//          (wg_config.h). Each tile as 32-column chunks of 128-byte rows in the 128-byte
//          swizzle (16-byte unit u of row r at u ^ (r % 8): swz below), the layout
//          sm90/wgmma.cuh's K-major descriptors describe (a k8 step of tf32 is a k16 step's 32
//          bytes). Then per stage the mbarriers full (the producer's 128 threads arrive) and
//          empty (one arrival per consumer warp). Budget: fp32/wg_config.h.
//   keys   S's C fragment gives lane (g, q) keys 2q, 2q + 1 of each 8-key group; the A
//          fragment of P V wants k = q, q + 4. So V^T's 8-key groups are stored permuted
//          (position q holds key 2q, q + 4 key 2q + 1), and P's A fragment is (c0, c2, c1,
//          c3) of S's n8 tile, as in the mma.sync kernel.
//   step   (key tiles from the last visible one down; stage j % kStages)
//            producer: wait empty; load, split, store K and V^T; fence.proxy.async; arrive full
//            consumer: wait full; S = Q K^T: per k8 step the three wgmma (Qlo Khi, Qhi Klo,
//            Qhi Khi) into a fresh accumulator (two alternate, so that the FADD into S of one
//            step runs under the next step's wgmma); mask; online softmax (base 2, exact row
//            max); P split into A fragments; O = O corr + P V: per 4 k8 steps (32 keys) and
//            64 columns of O (kPVN) the three wgmma per step (Plo VThi, Phi VTlo, Phi VThi)
//            into a fresh accumulator, then FFMA / FADD into O; release the stage.
//   Q      hi in registers (RS for Qhi Klo, Qhi Khi); lo in registers at d64 (kQRegs), in
//          shared memory at d128 (SS for Qlo Khi): wg_config.h. kSingle: Q hi in shared
//          memory (SS; at d128 its rows come by cp.async and are rounded in place).
//   epilogue  O / sum from the accumulators (float2 stores), LSE = max * scale + ln(sum),
//          +inf for a row that sees no key.
//   limits d multiple of 8, <= kHeadDim; 16-byte aligned pointers, strides multiples of 4
//          elements (host API); ragged tails zero-filled and masked; window_left < 0.
//   kSingle  (FwdParams::fp32_tf32: PyTorch allows TF32 for float32 matmuls) one tf32 product
//          per multiply, as cuBLAS's TF32 GEMMs: no lo parts (none stored, no lo buffers:
//          wg_config.h), S one wgmma chain over d into acc_s, O rescaled in its registers and P V
//          one chain over the tile's keys into it (no fresh accumulators: their second level
//          is 3xTF32's error model).
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"
#include "fp32/tf32.cuh"
#include "fp32/wg_common.cuh"
#include "fp32/wg_config.h"
#include "sm90/mbarrier.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_tf32.cuh"

namespace flashattn2 {

template <int kHeadDim_, bool kSingle_ = false>
struct Fp32WgTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSingle = kSingle_;  // one tf32 product (the file comment)
  static constexpr int kBlockM = kFp32WgBlockM;
  static constexpr int kBlockN = fp32wg_block_n(kHeadDim, kSingle);
  static constexpr bool kQRegs = fp32wg_q_regs(kHeadDim);  // Q lo (Q hi always)
  static constexpr bool kTileMajor = kHeadDim == 128;  // causal grids (fp32wg_tile_major)
  static constexpr int kPVN = kFp32WgPVN;                  // O columns per P V
  static constexpr int kStages = kFp32WgStages;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kTileBytes = kBlockN * kHeadDim * 4;  // K hi, K lo, V^T hi or V^T lo
  static constexpr int kStageTiles = kSingle ? 2 : 4;        // (kSingle: K hi, V^T hi)
  // Q lo (!kQRegs), or kSingle Q hi, in shared memory
  static constexpr int kQBytes = kQRegs && !kSingle ? 0 : kBlockM * kHeadDim * 4;
  static constexpr int kSmemBytes = fp32wg_smem_bytes(kHeadDim, kSingle);
  // setmaxnreg. d64: the producer's loads 4 float4 deep (its per-thread smem offsets and
  // addresses, hoisted out of the key loop, spilled at 56-72 registers; the consumers fit 208
  // without spills). d128: producer 72, consumers 216 (kLean; kSingle too, Q hi in shared
  // memory: 0 spills).
  static constexpr int kProducerRegs = kHeadDim > 64 ? 72 : 80;
  static constexpr int kConsumerRegs = kHeadDim > 64 ? 216 : 208;
  static constexpr int kLoadDepth = 4;  // the producer loops' unroll
  // d128 saves registers where d64 keeps its code: the producer's bounds tests against
  // per-thread remainders (rows - k_row, d - v_col), each unrolled load comparing with an
  // immediate (tests against k_row + 4 i, v_col + 16 i kept those values live: 2 spilled),
  // and the key loops end at block 0 (window_left < 0 here: blocks.min is 0; kept live, it
  // spilled).
  static constexpr bool kLean = kHeadDim > 64;
  static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0 && kBlockM % 64 == 0, "whole chunks");
  static_assert(128 % kBlockN == 0, "the V^T store: a thread per key, 128 / kBlockN columns");
  static_assert(kHeadDim % kPVN == 0 && kPVN % 8 == 0, "P V in whole n8 tiles");
  static_assert(kQBytes + kStages * kStageTiles * kTileBytes + 16 * kStages + 1024 <= kSmemBytes,
                "smem budget");
  static_assert(sm90::setmaxnreg_fits(kConsumers, kProducerRegs, kConsumerRegs), "registers");
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_fp32wg_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kTileBytes = Traits::kTileBytes;
  constexpr bool kQRegs = Traits::kQRegs;
  constexpr bool kSingle = Traits::kSingle;
  constexpr int kPVN = Traits::kPVN;
  constexpr int kLoadDepth = Traits::kLoadDepth;
  constexpr int kKSteps = kHeadDim / 8;  // k8 steps of S = n8 tiles of O
  constexpr int kPSteps = kBlockN / 8;   // k8 steps of P V = n8 tiles of S
  constexpr int kPVChain = 4;            // k8 steps of P V per fresh accumulator (32 keys)
  static_assert(kPSteps % kPVChain == 0, "P V in whole chains");

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t sQlo = smem;  // (!kQRegs; kSingle: Q hi)
  const uint32_t sStages = smem + Traits::kQBytes;
  // Stage s: K hi, K lo, V^T hi, V^T lo (kSingle: K hi, V^T hi).
  constexpr int kStageTiles = Traits::kStageTiles;
  auto sKhi = [&](int s) { return sStages + s * kStageTiles * kTileBytes; };
  auto sKlo = [&](int s) { return sKhi(s) + kTileBytes; };  // (!kSingle)
  auto sVhi = [&](int s) { return sKhi(s) + (kSingle ? 1 : 2) * kTileBytes; };
  auto sVlo = [&](int s) { return sKhi(s) + 3 * kTileBytes; };  // (!kSingle)
  const uint32_t bars = sStages + kStages * kStageTiles * kTileBytes;
  auto bar_full = [&](int s) { return bars + 8 * s; };
  auto bar_empty = [&](int s) { return bars + 8 * (kStages + s); };

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  // (head-major kernels: the count from the grid, as before; their SASS unchanged)
  const int m_blocks = Traits::kTileMajor ? (p.seqlen_q + kBlockM - 1) / kBlockM : int(gridDim.x);
  const bool tile_major =
      fp32wg_tile_major(Traits::kTileMajor, p.window_right, p.nheads, m_blocks);
  const fp32wg::GridTile cta = fp32wg::grid_tile(tile_major);
  const int m_block = m_blocks - 1 - cta.tile;  // (the longest causal rows first)
  const int head = cta.head;
  const int batch = cta.batch;
  const int head_k = head / (p.nheads / p.nheads_k);
  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  const int row0 = m_block * kBlockM;
  const int offset = seqlen_k - seqlen_q;
  const KeyBlocks blocks = visible_key_blocks<kBlockN>(p, row0, min(row0 + kBlockM, seqlen_q) - 1,
                                                       seqlen_k, offset);
  const int n_block_min = Traits::kLean ? 0 : blocks.min, n_block_max = blocks.max;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full(s), 128);
      mbar_init(bar_empty(s), 4 * Traits::kConsumers);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer: K and V^T of each key tile, split ----
    regs_decrease<Traits::kProducerRegs>();
    const float* gK = static_cast<const float*>(p.k) + batch * p.k_batch_stride +
                      head_k * p.k_head_stride;
    const float* gV = static_cast<const float*>(p.v) + batch * p.v_batch_stride +
                      head_k * p.v_head_stride;
    constexpr int kColThreads = 128 / kBlockN;  // V^T: threads per key
    const int v_key = tid % kBlockN, v_col = 4 * (tid / kBlockN);
    constexpr int kKRowStep = 128 / (kHeadDim / 4);  // K: rows per pass of the 128 threads
    const int k_row = tid / (kHeadDim / 4), k_col = 4 * (tid % (kHeadDim / 4));
    constexpr int kKPeriod = kKRowStep >= 8 ? 1 : 8 / kKRowStep;
    uint32_t k_off[kKPeriod], v_off[4];
#pragma unroll
    for (int i = 0; i < kKPeriod; ++i) k_off[i] = fp32wg::swz<kBlockN>(k_row + kKRowStep * i, k_col);
    static_assert(kKRowStep % 8 == 0 || 8 % kKRowStep == 0, "the K swizzle period");
    static_assert((4 * kColThreads) % 8 == 0, "V^T rows of one thread 8 apart");
#pragma unroll
    for (int e = 0; e < 4; ++e) v_off[e] = fp32wg::swz<kHeadDim>(v_col + e, fp32wg::key_pos(v_key));
    for (int n_block = n_block_max - 1, j = 0; n_block >= n_block_min; --n_block, ++j) {
      const int s = j % kStages;
      mbar_wait(bar_empty(s), ((j / kStages) & 1) ^ 1);
      const int n0 = n_block * kBlockN, rows = seqlen_k - n0;
      const float* gKt = gK + int64_t(n0) * p.k_row_stride;
      const float* gVt = gV + int64_t(n0) * p.v_row_stride;
      // Each thread's 8 float4 of K, then of V, in batches of kLoadDepth loads issued before
      // their stores (the stores' asm keeps the compiler from hoisting loads past them).
      // K: consecutive threads take a row's consecutive float4s (coalesced loads; each
      // quarter-warp's 16-byte stores hit the 8 units of one 128-byte row).
      // (thread tid: K rows k_row + kKRowStep i, columns k_col..k_col+3)
      constexpr int kKIters = kBlockN * kHeadDim / 4 / 128;
      static_assert(kKIters % kLoadDepth == 0, "whole batches");
      // (row pointers only: load4 adds the column, and tests it against the head dim)
      const float* gKrow = gKt + int64_t(k_row) * p.k_row_stride;
      const int64_t k_step = int64_t(kKRowStep) * p.k_row_stride;
#pragma unroll
      for (int b = 0; b < kKIters; b += kLoadDepth) {
        float4 x[kLoadDepth];
#pragma unroll
        for (int u = 0; u < kLoadDepth; ++u) {
          if constexpr (Traits::kLean) {
            x[u] = fp32wg::load4(gKrow + (b + u) * k_step + k_col, 0, kKRowStep * (b + u),
                                 rows - k_row, 0, p.headdim - k_col);
          } else {
            x[u] = fp32wg::load4(gKrow + (b + u) * k_step, 0, k_row + kKRowStep * (b + u), rows,
                                 k_col, p.headdim);
          }
        }
#pragma unroll
        for (int u = 0; u < kLoadDepth; ++u) {
          const fp32wg::Split4 sp = fp32wg::split4(x[u]);
          // (rows kKPeriod passes apart share the swizzle: kKPeriod offsets, the rest added)
          const int it = b + u;
          const uint32_t off = k_off[it % kKPeriod] + (it / kKPeriod) * kKPeriod * kKRowStep * 128;
          st_shared_v4(sKhi(s) + off, sp.hi.x, sp.hi.y, sp.hi.z, sp.hi.w);
          if constexpr (!kSingle) st_shared_v4(sKlo(s) + off, sp.lo.x, sp.lo.y, sp.lo.z, sp.lo.w);
        }
      }
      // V^T: a thread per key (a warp's 32 keys one 128-byte V^T row: 32 banks), its
      // float4s of columns v_col + 4 kColThreads i, each to 4 V^T rows.
      constexpr int kVIters = kHeadDim / (4 * kColThreads);
      static_assert(kVIters % kLoadDepth == 0, "whole batches");
      const float* gVrow = gVt + int64_t(v_key) * p.v_row_stride;
#pragma unroll
      for (int b = 0; b < kVIters; b += kLoadDepth) {
        float4 x[kLoadDepth];
#pragma unroll
        for (int u = 0; u < kLoadDepth; ++u) {
          if constexpr (Traits::kLean) {
            x[u] = fp32wg::load4(gVrow + v_col, 0, v_key, rows, 4 * kColThreads * (b + u),
                                 p.headdim - v_col);
          } else {
            x[u] = fp32wg::load4(gVrow, 0, v_key, rows, v_col + 4 * kColThreads * (b + u),
                                 p.headdim);
          }
        }
#pragma unroll
        for (int u = 0; u < kLoadDepth; ++u) {
          const fp32wg::Split4 sp = fp32wg::split4(x[u]);
          const float hi[4] = {sp.hi.x, sp.hi.y, sp.hi.z, sp.hi.w};
          const float lo[4] = {sp.lo.x, sp.lo.y, sp.lo.z, sp.lo.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // (V^T rows 8 apart share the swizzle: 4 offsets, the rest added)
            const uint32_t off = v_off[e] + 4 * kColThreads * (b + u) * 128;
            st_shared(sVhi(s) + off, hi[e]);
            if constexpr (!kSingle) st_shared(sVlo(s) + off, lo[e]);
          }
        }
      }
      fence_proxy_async();  // (the stores, then the wgmma of the async proxy)
      mbar_arrive(bar_full(s));
    }
  } else {
    // ---- consumers ----
    regs_increase<Traits::kConsumerRegs>();
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int q = lane % 4;
    const int wg_row0 = 64 * consumer;
    const int lane_row = row0 + wg_row0 + 16 * warp_in_wg + g;  // + 8 r: the lane's rows
    const float* gQ = static_cast<const float*>(p.q) + batch * p.q_batch_stride +
                      head * p.q_head_stride;

    // Q split once: Q hi (and, kQRegs, Q lo) in registers, the lane's A fragments (k8 step
    // kk: (g, q), (g+8, q), (g, q+4), (g+8, q+4) of its warp's 16 rows); !kQRegs: Q lo of the
    // warpgroup's 64 rows into sQlo. kSingle: Q hi of the warpgroup's rows into sQlo, none in
    // registers (wg_config.h fp32wg_smem_bytes says why).
    uint32_t q_hi[kKSteps][4];
    [[maybe_unused]] uint32_t q_lo[kQRegs ? kKSteps : 1][4];
#pragma unroll
    for (int kk = 0; kk < (kSingle ? 0 : kKSteps); ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = lane_row + 8 * (i & 1), col = 8 * kk + q + 4 * (i >> 1);
        const float x = row < seqlen_q && col < p.headdim
                            ? __ldg(gQ + int64_t(row) * p.q_row_stride + col)
                            : 0.f;
        const tf32::Split sp = tf32::split(x);
        q_hi[kk][i] = sp.hi;
        if constexpr (kQRegs && !kSingle) q_lo[kk][i] = sp.lo;
      }
    if constexpr (!kQRegs || kSingle) {
      const float* gQt = gQ + int64_t(row0 + wg_row0) * p.q_row_stride;
      if constexpr (kSingle && kHeadDim > 64) {
        const int q_rows = seqlen_q - row0 - wg_row0;
        constexpr int kQIters = 64 * kHeadDim / 4 / 128;
        auto q_at = [&](int it, int& r, int& c) {  // (the thread's float4 it: its place)
          const int i = tid % 128 + 128 * it;
          r = i / (kHeadDim / 4);
          c = 4 * (i % (kHeadDim / 4));
          return sQlo + fp32wg::swz<kBlockM>(wg_row0 + r, c);
        };
        // The rows raw by cp.async (zero-filled past the rows and the head dim) into the very
        // place their split values go, one wait, then each thread rounds its own float4s in
        // place: one global latency, where a load-split-store loop (the asm keeps each load
        // behind the previous store) waited on it once per float4, 16 times at d128. TF32
        // forward d128 +1-12 %, most at 1k (runs 3-4 of the twenty-sixth session).
#pragma unroll 1
        for (int it = 0; it < kQIters; ++it) {
          int r, c;
          const uint32_t dst = q_at(it, r, c);
          const bool ok = r < q_rows && c < p.headdim;
          ptx::cp_async_16(dst, ok ? gQt + int64_t(r) * p.q_row_stride + c : gQ, ok);
        }
        ptx::cp_async_commit();
        ptx::cp_async_wait<0>();
#pragma unroll 1
        for (int it = 0; it < kQIters; ++it) {
          int r, c;
          const uint32_t dst = q_at(it, r, c);
          const fp32wg::Split4 sp = fp32wg::split4(fp32wg::ld_shared_float4(dst));
          st_shared_v4(dst, sp.hi.x, sp.hi.y, sp.hi.z, sp.hi.w);
        }
      } else {
        // (The other instances keep the loop: the same prologue measured neutral in the
        // 3xTF32 d128 one (run 3; and ptxas then spilled 24 bytes in its producer), and the
        // single d64 one lost 5-11 % at every length in run 4, 8k too, though its key loops'
        // SASS is near-identical to this loop's build (with the split unrolled by 4 it had
        // gained 1-7 % in run 3, but spilled 8 bytes): benchmarks/NOTES.md.)
        for (int i = tid % 128; i < 64 * kHeadDim / 4; i += 128) {
          const int r = i / (kHeadDim / 4), c = 4 * (i % (kHeadDim / 4));
          const fp32wg::Split4 x = fp32wg::split4(
              fp32wg::load4(gQt, p.q_row_stride, r, seqlen_q - row0 - wg_row0, c, p.headdim));
          const uint32_t off = fp32wg::swz<kBlockM>(wg_row0 + r, c);
          if constexpr (kSingle) {
            st_shared_v4(sQlo + off, x.hi.x, x.hi.y, x.hi.z, x.hi.w);
          } else {
            st_shared_v4(sQlo + off, x.lo.x, x.lo.y, x.lo.z, x.lo.w);
          }
        }
      }
      fence_proxy_async();
      named_sync(1 + consumer, 128);
    }

    // The three products of S's k8 step kk into the fresh accumulator t (small terms first).
    auto s_step = [&](float (&t)[kBlockN / 2], int kk, int s) {
      const uint32_t kb = (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
      const uint64_t b_hi = desc_k_major(sKhi(s) + kb), b_lo = desc_k_major(sKlo(s) + kb);
      if constexpr (kQRegs) {
        WgmmaTf32<kBlockN>::rs(t, q_lo[kk], b_hi, 0);
      } else {
        const uint32_t qa = (kk / 4) * (kBlockM * 128) + wg_row0 * 128 + (kk % 4) * 32;
        WgmmaTf32<kBlockN>::ss(t, desc_k_major(sQlo + qa), b_hi, 0);
      }
      WgmmaTf32<kBlockN>::rs(t, q_hi[kk], b_lo, 1);
      WgmmaTf32<kBlockN>::rs(t, q_hi[kk], b_hi, 1);
    };

    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = p.softmax_scale * kLog2e;
    float acc_o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    const int wg_first = row0 + wg_row0;

    for (int n_block = n_block_max - 1, j = 0; n_block >= n_block_min; --n_block, ++j) {
      const int s = j % kStages;
      mbar_wait(bar_full(s), (j / kStages) & 1);

      // S = Q K^T in two levels: fresh accumulators t[kk % 2], FADD into acc_s (kSingle: one
      // chain into acc_s).
      float acc_s[kBlockN / 2];
      if constexpr (kSingle) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          const uint32_t kb = (kk / 4) * (kBlockN * 128) + (kk % 4) * 32;
          const uint32_t qa = (kk / 4) * (kBlockM * 128) + wg_row0 * 128 + (kk % 4) * 32;
          WgmmaTf32<kBlockN>::ss(acc_s, desc_k_major(sQlo + qa), desc_k_major(sKhi(s) + kb),
                                 kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc_s);
      } else {
        float t[2][kBlockN / 2];
        wgmma_fence();
        s_step(t[0], 0, s);
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          if (kk + 1 < kKSteps) {
            wgmma_fence();
            s_step(t[(kk + 1) % 2], kk + 1, s);
            wgmma_commit();
            wgmma_wait<1>();
          } else {
            wgmma_wait<0>();
          }
          fence_regs(t[kk % 2]);
#pragma unroll
          for (int i = 0; i < kBlockN / 2; ++i)
            acc_s[i] = kk == 0 ? t[kk % 2][i] : acc_s[i] + t[kk % 2][i];
        }
      }

      // Mask: keys past seqlen_k, and right of the window (causal: window_right 0).
      const int col0 = n_block * kBlockN;
      if (col0 + kBlockN > seqlen_k ||
          (p.window_right >= 0 && col0 + kBlockN - 1 > wg_first + offset + p.window_right)) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = lane_row + 8 * r;
          const int col_hi = p.window_right >= 0 ? min(seqlen_k - 1, row + offset + p.window_right)
                                                 : seqlen_k - 1;
#pragma unroll
          for (int nt = 0; nt < kPSteps; ++nt)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e)
              if (col0 + 8 * nt + 2 * q + (e & 1) > col_hi) acc_s[4 * nt + e] = -INFINITY;
        }
      }

      // Online softmax (base 2) per row r (g, g + 8), as fp32/fwd_kernel.cuh's plain instance.
      float correction[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m = row_max[r];
#pragma unroll
        for (int nt = 0; nt < kPSteps; ++nt)
          m = fmaxf(m, fmaxf(acc_s[4 * nt + 2 * r], acc_s[4 * nt + 2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
        // The correction from the difference of the raw maxima, so that an unchanged max gives
        // exp2(0) = 1 exactly. (row_max scale_log2 - max_scaled, contracted to an FFMA, is
        // the rounding error of m scale_log2, ~1e-7: a correction of 1 +- 1 ulp at every key
        // tile, a random walk of the sum that cancels in O / sum but not in the LSE: ~1.2e-5
        // at 4k keys, d128 (128 tiles), 15x PyTorch's; scripts/fp32wg_lse.py.)
        const float m0 = m == -INFINITY ? 0.f : m;
        const float max_scaled = m0 * scale_log2;
        correction[r] = ptx::exp2_approx((row_max[r] - m0) * scale_log2);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kPSteps; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            acc_s[4 * nt + e] = ptx::exp2_approx(fmaf(acc_s[4 * nt + e], scale_log2, -max_scaled));
            sum += acc_s[4 * nt + e];
          }
        row_max[r] = m;
        row_sum[r] = row_sum[r] * correction[r] + sum;
      }

      // P as A fragments (c0, c2, c1, c3 of each n8 tile: V^T's permuted keys), split.
      uint32_t p_hi[kPSteps][4];
      [[maybe_unused]] uint32_t p_lo[kSingle ? 1 : kPSteps][4];
#pragma unroll
      for (int nt = 0; nt < kPSteps; ++nt) {
        constexpr int kOrder[4] = {0, 2, 1, 3};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const tf32::Split sp = tf32::split(acc_s[4 * nt + kOrder[i]]);
          p_hi[nt][i] = sp.hi;
          if constexpr (!kSingle) p_lo[nt][i] = sp.lo;
        }
      }

      // O = O corr + P V, per kPVChain k8 steps into the fresh accumulator t_o, per kPVN
      // columns of O (columns [h kPVN, h kPVN + kPVN): V^T rows from h kPVN, 128 bytes each).
      // kSingle: O corr in its registers, then one chain over the tile's keys into O (N = d:
      // V^T's rows are consecutive 128-byte rows, so one descriptor spans all of them).
      if constexpr (kSingle) {
#pragma unroll
        for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] *= correction[(i % 4) / 2];
        fence_regs(acc_o);  // (the products before the fence)
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk) {
          const uint32_t vb = (kk / 4) * (kHeadDim * 128) + (kk % 4) * 32;
          WgmmaTf32<kHeadDim>::rs(acc_o, p_hi[kk], desc_k_major(sVhi(s) + vb), 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(acc_o);
      } else {
#pragma unroll
        for (int k0 = 0; k0 < kPSteps; k0 += kPVChain) {
#pragma unroll
          for (int h = 0; h < kHeadDim / kPVN; ++h) {
            float t_o[kPVN / 2];
            wgmma_fence();
#pragma unroll
            for (int i = 0; i < kPVChain; ++i) {
              const int kk = k0 + i;
              const uint32_t vb = (kk / 4) * (kHeadDim * 128) + h * kPVN * 128 + (kk % 4) * 32;
              const uint64_t b_hi = desc_k_major(sVhi(s) + vb), b_lo = desc_k_major(sVlo(s) + vb);
              WgmmaTf32<kPVN>::rs(t_o, p_lo[kk], b_hi, i > 0 ? 1 : 0);
              WgmmaTf32<kPVN>::rs(t_o, p_hi[kk], b_lo, 1);
              WgmmaTf32<kPVN>::rs(t_o, p_hi[kk], b_hi, 1);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs(t_o);
#pragma unroll
            for (int i = 0; i < kPVN / 2; ++i) {
              float& o = acc_o[h * (kPVN / 2) + i];
              o = k0 == 0 ? fmaf(o, correction[(i % 4) / 2], t_o[i]) : o + t_o[i];
            }
          }
        }
      }
      // This stage's K and V^T are read (every wgmma of the step completed).
      // (elect.sync picks the arriving lane: a lane index kept live across the loop spilled)
      __syncwarp();
      uint32_t elected;
      asm volatile("{\n.reg .pred e;\nelect.sync _|e, 0xffffffff;\nselp.u32 %0, 1, 0, e;\n}\n"
                   : "=r"(elected));
      if (elected) mbar_arrive(bar_empty(s));
    }

    // Epilogue: O and LSE from the accumulators. (The head from the grid again: kept live across
    // the key loop, the 3xTF32 d128 consumer spilled it.)
    const int head_o = !Traits::kTileMajor ? head
                                            : fp32wg::grid_tile<true>(fp32wg_tile_major(
                                                  true, p.window_right, p.nheads, m_blocks)).head;
    float* gO = static_cast<float*>(p.o) + batch * p.o_batch_stride + head_o * p.o_head_stride;
    float* gLse = p.lse + batch * p.lse_batch_stride + head_o * p.lse_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      const float inv = sum == 0.f ? 0.f : 1.f / sum;
      const int row = lane_row + 8 * r;
      if (row < seqlen_q) {
        float* o_row = gO + int64_t(row) * p.o_row_stride;
#pragma unroll
        for (int dt = 0; dt < kKSteps; ++dt) {
          const int col = 8 * dt + 2 * q;
          if (col < p.headdim) {
            *reinterpret_cast<float2*>(o_row + col) =
                make_float2(acc_o[4 * dt + 2 * r] * inv, acc_o[4 * dt + 2 * r + 1] * inv);
          }
        }
        if (q == 0) gLse[row] = sum == 0.f ? INFINITY : row_max[r] * p.softmax_scale + logf(sum);
      }
    }
  }
#endif
}

}  // namespace flashattn2
