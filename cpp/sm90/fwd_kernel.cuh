// Hopper forward (FlashAttention-3 design, Shah et al. 2024 §3): TMA loads, wgmma, warp
// specialisation, ping-pong between consumer warpgroups, softmax overlapped with the MMAs.
//
// Tiling
//   grid   (ceil(seqlen_q / kBlockM), nheads, batch * num_splits); m blocks in reverse
//          order, so the longest causal rows start first. Split-KV: split s of a CTA's key
//          tiles writes float32 partial O and LSE for the combine kernel.
//   block  128 (1 + kConsumers) threads. Warpgroup 0 is the producer: it gives registers
//          away (setmaxnreg) and one thread issues every TMA load. Consumer warpgroup c
//          (1 + c) owns query rows [64 c, 64 c + 64) of the tile; its warp w rows 16 w..+15,
//          so the S / O accumulators have the mma.sync C layout (sm90/wgmma_ops.cuh) and the
//          softmax reduces inside a quad, as in the sm80 kernel.
//   smem   sQ [kBlockM x d], kStages x sK, sV [kBlockN x d], each as d / 64 chunks of
//          128-byte rows in TMA's 128-byte swizzle (sm90/wgmma.cuh); then the mbarriers:
//          q_full, and per stage k_full, k_empty, v_full, v_empty. K and V land on separate
//          barriers, so S = Q K^T starts before V is in. The epilogue stages O in sQ (each
//          consumer its own 64 rows, which only it ever read). Budget: sm90/fwd_config.h.
//   regs   consumer: S [kBlockN / 2] f32, P [kBlockN / 16][4] b32, O [d / 2] f32.
//   step   (K/V tiles from the last visible one down to the first; j counts the steps)
//            producer: wait k_empty, TMA K_j -> k_full; wait v_empty, TMA V_j -> v_full
//            consumer: wait k_full[j]; turn (named barrier): S_j = Q K_j^T (SS wgmma);
//                      wait v_full[j-1]; O += P_{j-1} V_{j-1} (RS wgmma, P in registers);
//                      pass the turn; wait S_j -> release K_j; mask, softmax of S_j (runs
//                      under the other warpgroup's MMAs and this one's P V); wait P V ->
//                      release V_{j-1}; O *= correction; P_j = S_j as 16-bit A fragments.
//   epilogue  row sums over the quad; O / sum -> sQ rows of the consumer -> TMA store (dense)
//          or 16-byte stores (varlen: a box would cross into the next sequence); LSE =
//          max * scale + ln(sum), +inf for rows that see no key.
//   mods   kMods: softcap / ALiBi as the sm80 kMods instance (common/score_mod.cuh): S becomes
//          base-2 logits before the mask. Dropout runs on the sm80 kernels.
//   limits kernel head dims 64, 128, 192, 256 (whole chunks); d <= kHeadDim (TMA zero-fills
//          the columns past d and clips them on store); 16-byte aligned pointers, strides
//          multiples of 8 elements (TMA needs 16 bytes), checked by the host API.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/score_mod.cuh"
#include "common/seqlen.cuh"
#include "sm90/fwd_config.h"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

template <int kHeadDim_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr Sm90FwdTile kTile = sm90_fwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumers = kBlockM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * kSwizzleBytes;
  static constexpr int kKVChunkBytes = kBlockN * kSwizzleBytes;
  static constexpr int kQBytes = kChunks * kQChunkBytes;
  static constexpr int kKVBytes = kChunks * kKVChunkBytes;
  static constexpr int kSmemBytes = sm90_fwd_smem_bytes(kHeadDim);
  static_assert(kHeadDim % kChunkCols == 0 && kBlockM % 64 == 0 && kBlockN % 16 == 0, "tile");
  static_assert(kConsumers >= 2 && kConsumers <= 3, "ping-pong between 2 or 3 warpgroups");
  static_assert(kQBytes + 2 * kStages * kKVBytes + 8 * (1 + 4 * kStages) + 1024 <= kSmemBytes,
                "smem budget");
};

// The kernel's arguments: TMA maps of q, k, v, o (tma_map.h) and the forward params.
struct FwdArgs {
  CUtensorMap q, k, v, o;
  FwdParams p;
};

// Named barriers (0 is __syncthreads): the consumers' MMA turn (1 + c) and each consumer's
// epilogue (1 + kMaxConsumers + c).
constexpr int kMaxConsumers = 3;
constexpr int kBarTurn = 1;
constexpr int kBarEpilogue = 1 + kMaxConsumers;

template <typename Traits, typename Element, bool kMods>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ FwdArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kConsumers = Traits::kConsumers;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kNTilesN = kBlockN / 8;  // n8 column tiles of S
  const FwdParams& p = args.p;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  const uint32_t sQ = smem;
  const uint32_t sK = sQ + Traits::kQBytes;                  // stage s at s * kKVBytes
  const uint32_t sV = sK + kStages * Traits::kKVBytes;
  const uint32_t bars = sV + kStages * Traits::kKVBytes;
  const uint32_t bar_q = bars;
  auto bar_k_full = [&](int s) { return bars + 8 * (1 + s); };
  auto bar_k_empty = [&](int s) { return bars + 8 * (1 + kStages + s); };
  auto bar_v_full = [&](int s) { return bars + 8 * (1 + 2 * kStages + s); };
  auto bar_v_empty = [&](int s) { return bars + 8 * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int split = blockIdx.z % p.num_splits;
  const int batch = blockIdx.z / p.num_splits;
  const SeqInfo seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  if (m_block * kBlockM >= seqlen_q) return;  // varlen: the grid covers the longest sequence

  // Visible key tiles of the CTA's rows (bottom-right aligned window, FwdParams); every
  // consumer walks all of them, so the MMA turns stay in step.
  const int offset = seqlen_k - seqlen_q;
  const int cta_first = m_block * kBlockM;
  const int cta_last = min(cta_first + kBlockM, seqlen_q) - 1;
  int n_block_max = (seqlen_k + kBlockN - 1) / kBlockN;
  if (p.window_right >= 0) {
    const int col_hi = cta_last + offset + p.window_right;
    n_block_max = col_hi < 0 ? 0 : min(n_block_max, col_hi / kBlockN + 1);
  }
  int n_block_min = 0;
  if (p.window_left >= 0) {
    const int col_lo = cta_first + offset - p.window_left;
    n_block_min = col_lo <= 0 ? 0 : col_lo / kBlockN;
  }
  if (p.num_splits > 1) {  // this split's share of the visible tiles
    const int per_split = (n_block_max - n_block_min + p.num_splits - 1) / p.num_splits;
    n_block_min = min(n_block_max, n_block_min + split * per_split);
    n_block_max = min(n_block_max, n_block_min + per_split);
  }

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_k_full(s), 1);
      mbar_init(bar_v_full(s), 1);
      mbar_init(bar_k_empty(s), 4 * kConsumers);  // one arrival per consumer warp
      mbar_init(bar_v_empty(s), 4 * kConsumers);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer ----
    regs_decrease<Traits::kTile.producer_regs>();
    if (warp == 0 && lane == 0) {
      tma_prefetch(&args.q);
      tma_prefetch(&args.k);
      tma_prefetch(&args.v);
      // Dense tensors are 4-D (d, rows, heads, batch); varlen ones have one batch entry
      // and the sequence's rows start at its offset (SeqInfo).
      const int q_batch = p.cu_seqlens_q ? 0 : batch;
      const int k_batch = p.cu_seqlens_k ? 0 : seq.kv_batch;
      const int head_k = head / (p.nheads / p.nheads_k);
      mbar_arrive_expect_tx(bar_q, Traits::kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load(sQ + c * Traits::kQChunkBytes, &args.q, c * kChunkCols,
                 int(seq.q_row0) + cta_first, head, q_batch, bar_q);
      for (int n_block = n_block_max - 1, j = 0; n_block >= n_block_min; --n_block, ++j) {
        const int s = j % kStages;
        const uint32_t phase = (j / kStages) & 1;
        const int row = int(seq.k_row0) + n_block * kBlockN;
        mbar_wait(bar_k_empty(s), phase ^ 1);
        mbar_arrive_expect_tx(bar_k_full(s), Traits::kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load(sK + s * Traits::kKVBytes + c * Traits::kKVChunkBytes, &args.k, c * kChunkCols,
                   row, head_k, k_batch, bar_k_full(s));
        mbar_wait(bar_v_empty(s), phase ^ 1);
        mbar_arrive_expect_tx(bar_v_full(s), Traits::kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load(sV + s * Traits::kKVBytes + c * Traits::kKVChunkBytes, &args.v, c * kChunkCols,
                   row, head_k, k_batch, bar_v_full(s));
      }
    }
  } else {
    // ---- consumers ----
    regs_increase<Traits::kTile.consumer_regs>();
    const int consumer = warp / 4 - 1;
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int q = lane % 4;
    const int wg_row0 = 64 * consumer;                      // first row of this warpgroup
    const int lane_row = wg_row0 + 16 * warp_in_wg + g;     // + 8 r: the lane's tile rows
    const int row0_pos = cta_first + lane_row;              // query position of row r = 0
    const int wg_first = cta_first + wg_row0;
    const int wg_last = min(wg_first + 64, seqlen_q) - 1;

    // Softmax scale in base 2 (common/score_mod.cuh): with an ALiBi bias S becomes base-2
    // logits (scale 1); otherwise S holds the (capped) scores and mult() is the scale.
    constexpr float kLog2e = 1.4426950408889634f;
    ScoreMod mod;
    float scale_log2 = p.softmax_scale * kLog2e, lse_scale = p.softmax_scale;
    if constexpr (kMods) {
      mod = ScoreMod(p, batch, head);
      scale_log2 = mod.slope_log2 != 0.f ? 1.f : mod.mult();
      lse_scale = scale_log2 * 0.6931471805599453f;
    }

    float acc_o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    uint32_t rP[kBlockN / 16][4];

    // The MMA turn: consumer c issues its MMAs between named_sync(turn c) and
    // named_arrive(turn c + 1), so one warpgroup's softmax runs under another's MMAs. The
    // last consumer opens turn 0 once; consumer 0 closes it after its last turn.
    auto turn_wait = [&] { named_sync(kBarTurn + consumer, 256); };
    auto turn_pass = [&] { named_arrive(kBarTurn + (consumer + 1) % kConsumers, 256); };
    if (consumer == kConsumers - 1) named_arrive(kBarTurn, 256);

    auto release = [&](uint32_t bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };
    auto gemm_s = [&](float (&acc_s)[kBlockN / 2], int stage) {
      const uint32_t q_base = sQ + wg_row0 * kSwizzleBytes;
      const uint32_t k_base = sK + stage * Traits::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;  // the k16 step's 32 bytes of the chunk row
        const uint64_t a = desc_k_major(q_base + (kk / 4) * Traits::kQChunkBytes + col);
        const uint64_t b = desc_k_major(k_base + (kk / 4) * Traits::kKVChunkBytes + col);
        Wgmma<kBlockN, Element>::template ss<0>(acc_s, a, b, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto gemm_o = [&](int stage) {
      const uint32_t v_base = sV + stage * Traits::kKVBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t b = desc_mn_major(v_base + kk * 16 * kSwizzleBytes, Traits::kKVChunkBytes);
        Wgmma<kHeadDim, Element>::template rs<1>(acc_o, rP[kk], b, 1);
      }
      wgmma_commit();
    };

    // Mask, score mods and online softmax of S (n_block); returns O's correction per row.
    auto softmax = [&](float (&acc_s)[kBlockN / 2], int n_block, float (&correction)[2]) {
      const int col0 = n_block * kBlockN;
      if constexpr (kMods) {
        if (mod.softcap > 0.f) {
#pragma unroll
          for (int i = 0; i < kBlockN / 2; ++i) acc_s[i] = mod.capped(acc_s[i]);
        }
        if (mod.slope_log2 != 0.f) {
          const float mult = mod.mult();
          // dist = row + offset - col = dist0 + 8 r - 8 nt - (e & 1)
          const float dist0 = float(row0_pos + offset - col0 - 2 * q);
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc_s[4 * nt + e] = fmaf(acc_s[4 * nt + e], mult,
                                       mod.bias(dist0 + float(8 * (e >> 1) - 8 * nt - (e & 1))));
        }
      }
      const bool need_mask =
          col0 + kBlockN > seqlen_k ||
          (p.window_right >= 0 && col0 + kBlockN - 1 > wg_first + offset + p.window_right) ||
          (p.window_left >= 0 && col0 < wg_last + offset - p.window_left);
      if (need_mask) {
        // Visible columns [lo, hi] of each of the lane's rows, relative to its first column
        // (col0 + 2 q), so each test compares with a compile-time offset (no per-column
        // registers live across the loop).
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0_pos + 8 * r;
          const int base = col0 + 2 * q;
          const int hi = (p.window_right >= 0 ? min(seqlen_k - 1, row + offset + p.window_right)
                                              : seqlen_k - 1) - base;
          const int lo = (p.window_left >= 0 ? row + offset - p.window_left : 0) - base;
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const int col = 8 * nt + (e & 1);
              if (col < lo || col > hi) acc_s[4 * nt + e] = -INFINITY;
            }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Row max: a pairwise tree over the lane's column pairs (any count), then the quad.
        float part[kNTilesN];
#pragma unroll
        for (int nt = 0; nt < kNTilesN; ++nt)
          part[nt] = fmaxf(acc_s[4 * nt + 2 * r], acc_s[4 * nt + 2 * r + 1]);
#pragma unroll
        for (int stride = 1; stride < kNTilesN; stride *= 2)
#pragma unroll
          for (int i = 0; i + stride < kNTilesN; i += 2 * stride)
            part[i] = fmaxf(part[i], part[i + stride]);
        float m = fmaxf(row_max[r], part[0]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
        // A row that has seen only masked scores keeps max -inf: use 0 so that -inf - -inf
        // never happens (its p and correction are then exp2(-inf) = 0).
        const float max_scaled = m == -INFINITY ? 0.f : m * scale_log2;
        correction[r] = ptx::exp2_approx(row_max[r] * scale_log2 - max_scaled);
        row_max[r] = m;
        float sum[kNTilesN];
#pragma unroll
        for (int nt = 0; nt < kNTilesN; ++nt) {
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e)
            acc_s[4 * nt + e] = ptx::exp2_approx(fmaf(acc_s[4 * nt + e], scale_log2, -max_scaled));
          sum[nt] = acc_s[4 * nt + 2 * r] + acc_s[4 * nt + 2 * r + 1];
        }
#pragma unroll
        for (int stride = 1; stride < kNTilesN; stride *= 2)
#pragma unroll
          for (int i = 0; i + stride < kNTilesN; i += 2 * stride) sum[i] += sum[i + stride];
        row_sum[r] = row_sum[r] * correction[r] + sum[0];
      }
    };
    // P as the A fragments of the P V wgmma (C layout of n8 tiles 2kk, 2kk + 1).
    auto to_p = [&](const float (&acc_s)[kBlockN / 2]) {
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const float* lo = acc_s + 8 * kk;
        rP[kk][0] = ptx::pack2<Element>(lo[0], lo[1]);
        rP[kk][1] = ptx::pack2<Element>(lo[2], lo[3]);
        rP[kk][2] = ptx::pack2<Element>(lo[4], lo[5]);
        rP[kk][3] = ptx::pack2<Element>(lo[6], lo[7]);
      }
    };
    auto rescale_o = [&](const float (&correction)[2]) {
#pragma unroll
      for (int dt = 0; dt < kHeadDim / 8; ++dt) {
        acc_o[4 * dt + 0] *= correction[0];
        acc_o[4 * dt + 1] *= correction[0];
        acc_o[4 * dt + 2] *= correction[1];
        acc_o[4 * dt + 3] *= correction[1];
      }
    };

    mbar_wait(bar_q, 0);
    int n_block = n_block_max - 1;
    int j = 0;
    if (n_block >= n_block_min) {
      float acc_s[kBlockN / 2];
      float correction[2];
      mbar_wait(bar_k_full(0), 0);
      turn_wait();
      gemm_s(acc_s, 0);
      turn_pass();
      wgmma_wait<0>();
      fence_regs(acc_s);
      release(bar_k_empty(0));
      softmax(acc_s, n_block, correction);
      to_p(acc_s);
      for (--n_block, ++j; n_block >= n_block_min; --n_block, ++j) {
        const int s = j % kStages, s_prev = (j - 1) % kStages;
        mbar_wait(bar_k_full(s), (j / kStages) & 1);
        turn_wait();
        gemm_s(acc_s, s);
        mbar_wait(bar_v_full(s_prev), ((j - 1) / kStages) & 1);
        gemm_o(s_prev);
        turn_pass();
        wgmma_wait<1>();
        fence_regs(acc_s);
        release(bar_k_empty(s));
        softmax(acc_s, n_block, correction);
        wgmma_wait<0>();
        fence_regs(acc_o);
        release(bar_v_empty(s_prev));
        rescale_o(correction);
        to_p(acc_s);
      }
      const int s_last = (j - 1) % kStages;
      mbar_wait(bar_v_full(s_last), ((j - 1) / kStages) & 1);
      gemm_o(s_last);
      wgmma_wait<0>();
      fence_regs(acc_o);
      release(bar_v_empty(s_last));
    }
    if (consumer == 0) turn_wait();  // the turn the last consumer opened at the start

    // ---- epilogue ----
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      inv[r] = sum == 0.f ? 0.f : 1.f / sum;
      // A row that saw no key: +inf, or -inf for a split (the combine's "no key").
      lse[r] = sum == 0.f ? (p.num_splits > 1 ? -INFINITY : INFINITY)
                          : row_max[r] * lse_scale + logf(sum);
    }
    if (p.num_splits > 1) {
      // Split-KV: this split's O (normalised by its own sum) and LSE, float32, straight
      // from the accumulators into o_accum / lse_accum [split, batch, head, row].
      const int64_t row_base = ((int64_t(split) * p.batch + batch) * p.nheads + head) * p.seqlen_q;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int pos = row0_pos + 8 * r;
        if (pos < seqlen_q) {
          float* gO = p.o_accum + (row_base + pos) * p.headdim;
#pragma unroll
          for (int dt = 0; dt < kHeadDim / 8; ++dt) {
            const int col = 8 * dt + 2 * q;
            if (col < p.headdim) {
              *reinterpret_cast<float2*>(gO + col) =
                  make_float2(acc_o[4 * dt + 2 * r] * inv[r], acc_o[4 * dt + 2 * r + 1] * inv[r]);
            }
          }
          if (q == 0) p.lse_accum[row_base + pos] = lse[r];
        }
      }
      return;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int pos = row0_pos + 8 * r;
      if (q == 0 && pos < seqlen_q) {
        p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_row0 + pos] = lse[r];
      }
    }
    // O / sum into this warpgroup's rows of sQ (the layout TMA reads; 4-byte stores hit 32
    // distinct banks: the 8 rows of a quad column differ in the swizzled unit).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = lane_row + 8 * r;
#pragma unroll
      for (int dt = 0; dt < kHeadDim / 8; ++dt) {
        const uint32_t addr = sQ + (dt / 8) * Traits::kQChunkBytes + row * kSwizzleBytes +
                              (((dt % 8) ^ (row % 8)) * 16) + 4 * q;
        const uint32_t v = ptx::pack2<Element>(acc_o[4 * dt + 2 * r] * inv[r],
                                               acc_o[4 * dt + 2 * r + 1] * inv[r]);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
      }
    }
    fence_proxy_async();
    named_sync(kBarEpilogue + consumer, 128);
    if (!p.cu_seqlens_q) {
      if (warp_in_wg == 0 && lane == 0) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_store(&args.o, sQ + c * Traits::kQChunkBytes + wg_row0 * kSwizzleBytes,
                    c * kChunkCols, wg_first, head, batch);
        tma_store_commit();
        tma_store_wait();
      }
    } else {
      // Varlen: the sequence's rows only, 16 bytes a thread, columns below headdim.
      constexpr int kUnits = kHeadDim / 8;  // 16-byte units per row
      Element* gO = static_cast<Element*>(p.o) + head * p.o_head_stride +
                    (seq.q_row0 + wg_first) * p.o_row_stride;
      const int rows = min(64, seqlen_q - wg_first);
      for (int idx = tid % 128; idx < 64 * kUnits; idx += 128) {
        const int row = idx / kUnits, unit = idx % kUnits;
        if (row < rows && unit * 8 < p.headdim) {
          const int trow = wg_row0 + row;
          const uint32_t addr = sQ + (unit / 8) * Traits::kQChunkBytes + trow * kSwizzleBytes +
                                (((unit % 8) ^ (trow % 8)) * 16);
          uint4 v;
          asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                       : "r"(addr));
          *reinterpret_cast<uint4*>(gO + int64_t(row) * p.o_row_stride + unit * 8) = v;
        }
      }
    }
  }
#endif
}

}  // namespace sm90
}  // namespace flashattn2
