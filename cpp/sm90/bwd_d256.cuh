// Hopper backward for kernel head dim 256 (issue 18; the `d256` item of
// FLASHATTN2_SM90_BWD_EXPERIMENTAL, on by default). Design and budgets: design/bwd256.md;
// measurements: benchmarks/NOTES.md "Eighth session: the d256 Hopper backward".
//
// d256 cannot keep bwd_kernel.cuh's layout (a warpgroup holding dK + dV of its 64 keys over all
// 256 columns needs 256 f32 per thread), so the two consumer warpgroups split the COLUMNS:
//   grid   (ceil(seqlen_k / 64), nheads_k, batch): one CTA per 64-key block of a KV head.
//   block  384 threads: producer warpgroup as bwd_kernel.cuh's, the same code
//          (sm90/bwd_producer.cuh: K, V once; Q, dO, LSE, dsum of each 64-row query step into
//          stage t % 2); consumer warpgroup c (c = 0, 1) owns
//          dK[:, 128 c..+128] and dV[:, 128 c..+128] of all 64 keys (64 + 64 f32 per thread).
//   smem   sK, sV [64 x 256]; per stage sQ, sdO [64 x 256], LSE, dsum; sP^T and sdS^T
//          [64 keys x 64 queries] (one 128-byte swizzled chunk each) x 2 buffers (by stage);
//          mbarriers: 226.1 KiB of 227 (sm90_bwd_d256_smem_bytes).
//   step   (t, query block m of head h; stage s)
//            S^T_c = K Q_c^T, dP^T_c = V dO_c^T: the warpgroup's query half c (queries
//              32 c..+32; SS m64 n32, k 256)
//            mask, P^T_c = exp2(S^T scale log2e - LSE log2e) -> A fragments and sP[s] quarter c
//            dS^T_c = P^T_c o (dP^T_c - dsum) -> A fragments and sdS[s] quarter c
//            named barrier of both consumers (sP[s], sdS[s] complete)
//            dV_c += P^T dO[:, 128 c..], dK_c += dS^T Q[:, 128 c..] (m64 n128 over the 64
//              queries: the own half's two k16 steps from registers (RS), the partner's from
//              sP / sdS (SS, K-major))
//            dQ[:, 128 c + 64 j..+64] = dS K[:, ...] for j = 0, 1 (SS m64 n64, A = sdS read
//              M-major, as bwd_kernel.cuh's dQ), staged (below) for producer warp 2's bulk
//              reduce-adds into dq_accum
//          sP / sdS are double-buffered by stage: the reuse argument of bwd_kernel.cuh (one
//          named barrier per step) holds unchanged.
//   dQ     staged (kStaged: dq_bulk + dq_warp builds; else each slice goes out by
//          red.global.add.v4 from the consumers and the stage is released once dV / dK are
//          done). Once dV / dK are done, the warpgroup's own column chunks 2 c, 2 c + 1 of
//          sQ[s] and sdO[s] are read by nobody any more (both warpgroups' S^T / dP^T ended
//          before the named barrier; the partner's dV / dK read its own chunks), so they
//          stage its dQ (16 KiB a slice). The consumers arrive on the stage's empty barrier
//          after staging, and warp 2 (bwd_producer.cuh dq_order_warp) once its bulk reduces
//          have read the stage (one more arrival), so the stage goes back to the producer
//          only then. Measured against red.global.add (eighteenth session): +3 to +11 %
//          (bf16, 1k-8k); the L2 was the busy unit (ncu). The same staging with the
//          consumers issuing the reduces ran at 0.92x (branch bwd256-bulk, 38ac281).
//   determ deterministic=True: warp 2 adds a query tile's dQ in the fixed order of
//          common/dq_order.cuh (DqOrder<64, 64>: the counters' 64-row tiles; chains
//          p.dq_chains).
// Limits (sm90_bwd_supports at 256): dense, full / causal / window, no softcap / ALiBi / bias,
// no dropout: everything else runs the mma.sync backward.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/launch.h"
#include "common/ptx.cuh"
#include "common/workspace.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_consumer.cuh"
#include "sm90/bwd_producer.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/tma_map.h"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

struct BwdTraitsD256 {
  static constexpr int kHeadDim = 256;
  static constexpr Sm90BwdTile kTile = sm90_bwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;  // 64 query rows per step
  static constexpr int kBlockN = kTile.block_n;  // 64 keys per CTA
  static constexpr int kStages = kTile.stages;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kChunks = kHeadDim / kChunkCols;     // 4 column chunks
  static constexpr int kWgCols = kHeadDim / kConsumers;     // dK / dV columns per warpgroup
  static constexpr int kWgQueries = kBlockM / kConsumers;   // S^T / dP^T queries per warpgroup
  static constexpr int kQChunkBytes = kBlockM * kSwizzleBytes;
  static constexpr int kKChunkBytes = kBlockN * kSwizzleBytes;
  static constexpr int kQBytes = kChunks * kQChunkBytes;    // one of sQ, sdO per stage
  static constexpr int kKBytes = kChunks * kKChunkBytes;    // one of sK, sV
  static constexpr int kPBytes = kBlockN * kSwizzleBytes;   // one sP^T / sdS^T buffer
  static constexpr int kRowBytes = kBlockM * 4;             // one of LSE, dsum per stage
  static constexpr int kBars = 1 + 4 * kStages;
  static constexpr int kSmemBytes = sm90_bwd_d256_smem_bytes();
  static_assert(kBlockM == 64 && kBlockN == 64 && kStages == 2 && kWgCols == 2 * kChunkCols &&
                    kWgQueries == 32,
                "the tile of this kernel (bwd256.md)");
  static_assert(kPBytes == kBlockM * kBlockN * 2, "sP^T / sdS^T: one chunk of 64 queries");
  static_assert(2 * kKBytes + kStages * (2 * kQBytes + 2 * kRowBytes) + 2 * kStages * kPBytes +
                        8 * kBars + 1024 <= kSmemBytes &&
                    kSmemBytes <= 227 * 1024,
                "smem budget");
  static_assert(setmaxnreg_fits(kConsumers, kTile.producer_regs, kTile.consumer_regs),
                "register budget: setmaxnreg.inc would hang");
};

// kStaged: the dQ staged in the stage's dead chunks and added by warp 2 (dq_order_warp, also
// deterministic mode's order) instead of by the consumers' red.global.add.
template <typename Element, bool kStaged>
__global__ void __launch_bounds__(BwdTraitsD256::kThreads, 1)
    bwd_kernel_d256(const __grid_constant__ BwdArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = BwdTraitsD256;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  const BwdParams& p = args.p;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  // The stages (sm90/bwd_producer.cuh); this kernel's own between sdO and the LSE rows: sP^T,
  // sdS^T.
  const BwdStages<Traits> st(smem, 2 * kStages * Traits::kPBytes);
  const uint32_t sK = st.k, sV = st.v;
  const uint32_t sQ = st.q, sdO = st.dout;                // stage s: + s kQBytes
  const uint32_t sP = st.own;                             // buffer s: + s kPBytes
  const uint32_t sdS = sP + kStages * Traits::kPBytes;    // buffer s: + s kPBytes

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int head_k = blockIdx.y, batch = blockIdx.z;
  const int group = p.nheads / p.nheads_k;
  const BwdSeq<false> seq(p, batch);
  // Deterministic: the dQ order's K/V tile (launched last first when descending)
  // and rotated walk.
  const DqOrder<kBlockM, kBlockN> order(p, seq.seqlen_q(), seq.seqlen_k(),
                                        (seq.seqlen_q() + kBlockM - 1) / kBlockM, true);
  const int n_block = kStaged ? order.n_block() : int(blockIdx.x);
  const int n0 = n_block * kBlockN;
  const BwdRange range(p, seq, n0, kBlockM, group,
                       kStaged && p.deterministic && order.rotate, n_block, kBlockN);
  // Programmatic dependent launch (BwdParams::pdl, bwd_launch.cuh): the dQ convert may be
  // scheduled now (it waits for this grid's end); this grid itself may have started before
  // the preprocess ended, so warp 1 waits for it (griddep_wait) before its first dsum load.
  ptx::griddep_launch_dependents();
  if (tid == 0) {
    st.init(128 * Traits::kConsumers + (kStaged ? 1 : 0));  // staged: + warp 2
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer (sm90/bwd_producer.cuh) ----
    regs_decrease<Traits::kTile.producer_regs>();
    if (warp == 0 && lane == 0 && range.steps > 0) {
      load_tiles(args, seq, range, st, n0, head_k, group);
    } else if (warp == 1) {
      load_rows(p, seq, range, st, batch, head_k * group, lane);
    } else if (kStaged && warp == 2) {
      // The consumers' staged 16 x 64 blocks (warp 4 c + w, slice j: column chunk 2 c + j of
      // rows 16 w..+16, staged at 4096 j of its 8 KiB, chunk 2 c + w % 2 of sQ[s] (w < 2) or
      // sdO[s]); a warp's two slices are adjacent in dq_accum too, so one 8 KiB op adds both
      // where the head dim has no padding (else columns past it are skipped); then stage s
      // goes back.
      auto issue = [&](float* dq_tile, int rows, int t) {
        const uint32_t stage = (t % kStages) * Traits::kQBytes;
#pragma unroll
        for (int i = 0; i < 4 * Traits::kConsumers; ++i) {
          const int c = i / 4, w = i % 4;
          const uint32_t src = (w < 2 ? sQ : sdO) + stage + (2 * c + w % 2) * Traits::kQChunkBytes;
          if (p.headdim == Traits::kHeadDim) {  // both slices, adjacent in both: one op
            if (16 * w < rows)
              bulk_reduce_add_f32(dq_tile + 16 * w * p.headdim + 16 * 64 * 2 * c, src, 8192);
            continue;
          }
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int tiles = min(8, (p.headdim - 64 * (2 * c + j)) / 8);
            if (16 * w < rows && tiles > 0)
              bulk_reduce_add_f32(dq_tile + 16 * w * p.headdim + 16 * 64 * (2 * c + j),
                                  src + 4096 * j, tiles * 128 * 4);
          }
        }
      };
      ptx::griddep_wait();  // PDL: before its first counter load (zeroed by the preprocess)
      dq_order_warp<kBlockM, kBlockN, false>(p, seq, head_k * group, n_block, range, lane, issue,
                                             [&](int t) { mbar_arrive(st.empty(t % kStages)); });
    }
  } else {
    // ---- consumers ----
    regs_increase<Traits::kTile.consumer_regs>();
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int q = lane % 4;
    const int lane_key = 16 * warp_in_wg + g;  // + 8 r: the lane's key rows of the block
    const int wq0 = Traits::kWgQueries * consumer;  // the warpgroup's first query of a step
    const int offset = seq.seqlen_k() - seq.seqlen_q();
    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = p.softmax_scale * kLog2e;

    float acc_dk[Traits::kWgCols / 2], acc_dv[Traits::kWgCols / 2];
#pragma unroll
    for (int i = 0; i < Traits::kWgCols / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;

    // acc (64 keys x the warpgroup's 32 queries) = sA (64 keys x 256) times the stage's
    // rows wq0..+32 of sB, transposed.
    auto gemm_t = [&](float (&acc)[Traits::kWgQueries / 2], uint32_t a_base, uint32_t b_base) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Traits::kHeadDim / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;
        const uint64_t a = desc_k_major(a_base + (kk / 4) * Traits::kKChunkBytes + col);
        const uint64_t b = desc_k_major(b_base + (kk / 4) * Traits::kQChunkBytes +
                                        wq0 * kSwizzleBytes + col);
        Wgmma<Traits::kWgQueries, Element>::template ss<0>(acc, a, b, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // acc (64 keys x the warpgroup's 128 columns) += A (64 keys x 64 queries) times the
    // stage's sB columns 128 c.. (MN-major), in two parts: the own query half's k16 steps from
    // registers (RS), issued as soon as the fragments exist, and the partner's from sA (SS,
    // K-major) once the named barrier says the partner stored them. The instruction sequence
    // is the same in both warpgroups.
    auto kv_cols = [&](uint32_t b_base) { return b_base + 2 * consumer * Traits::kQChunkBytes; };
    auto gemm_kv_own = [&](float (&acc)[Traits::kWgCols / 2], const uint32_t (&a)[2][4],
                           uint32_t b_base) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int kk = 2 * consumer + i;
        const uint64_t b =
            desc_mn_major(kv_cols(b_base) + kk * 16 * kSwizzleBytes, Traits::kQChunkBytes);
        Wgmma<Traits::kWgCols, Element>::template rs<1>(acc, a[i], b, 1);
      }
    };
    auto gemm_kv_partner = [&](float (&acc)[Traits::kWgCols / 2], uint32_t a_smem,
                               uint32_t b_base) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int kk = 2 * (1 - consumer) + i;
        const uint64_t a_desc = desc_k_major(a_smem + kk * 32);
        const uint64_t b =
            desc_mn_major(kv_cols(b_base) + kk * 16 * kSwizzleBytes, Traits::kQChunkBytes);
        Wgmma<Traits::kWgCols, Element>::template ss<1>(acc, a_desc, b, 1);
      }
    };
    // dQ slice j (64 queries x columns 128 c + 64 j..+64) = dS K over the block's 64 keys.
    auto gemm_dq = [&](float (&acc)[32], uint32_t sdS_t, int j) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint64_t a = desc_mn_major(sdS_t + kk * 16 * kSwizzleBytes, Traits::kPBytes);
        const uint64_t b = desc_mn_major(sK + (2 * consumer + j) * Traits::kKChunkBytes +
                                         kk * 16 * kSwizzleBytes, Traits::kKChunkBytes);
        Wgmma<64, Element>::template ss<1, 1>(acc, a, b, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };

    if (range.steps > 0) mbar_wait(st.kv_full(), 0);
    int head = head_k * group, m_block = range.m_start;
    for (int t = 0; t < range.steps; ++t) {
      const int s = t % kStages;
      const uint32_t phase = (t / kStages) & 1;
      const int m0 = m_block * kBlockM;
      const int mq0 = m0 + wq0;  // the warpgroup's first query row
      float acc_s[Traits::kWgQueries / 2], acc_dp[Traits::kWgQueries / 2];
      uint32_t rP[2][4], rdS[2][4];

      mbar_wait(st.q_full(s), phase);
      gemm_t(acc_s, sK, sQ + s * Traits::kQBytes);
      mbar_wait(st.do_full(s), phase);
      gemm_t(acc_dp, sV, sdO + s * Traits::kQBytes);
      mbar_wait(st.lse_full(s), phase);
      wgmma_wait<1>();
      fence_regs(acc_s);

      // Mask (bwd_kernel.cuh's; bwd_consumer.cuh): all 64 keys, the warpgroup's 32 queries.
      const bool need_mask =
          n0 + kBlockN > seq.seqlen_k() ||
          (p.window_right >= 0 && n0 + kBlockN - 1 > mq0 + offset + p.window_right) ||
          (p.window_left >= 0 && n0 < mq0 + Traits::kWgQueries - 1 + offset - p.window_left);
      if (need_mask) mask_tile<Traits::kWgQueries>(acc_s, p, seq, n0 + lane_key, mq0, q, offset);
      // P^T (rows r: key lane_key + 8 r) into the A fragments of the warpgroup's k16 steps
      // and into sP[s]: query unit 4 c + nt of the key's 128-byte row, swizzled.
      const uint32_t sP_t = sP + s * Traits::kPBytes;
      const uint32_t sdS_t = sdS + s * Traits::kPBytes;
      auto unit_addr = [&](uint32_t base, int nt, int r) {
        const int row = lane_key + 8 * r;
        return base + row * kSwizzleBytes + (((wq0 / 8 + nt) ^ (row % 8)) * 16) + 4 * q;
      };
#pragma unroll
      for (int nt = 0; nt < Traits::kWgQueries / 8; ++nt) {
        const float2 lse = ld_shared_float2(st.lse(s) + 4 * (wq0 + 8 * nt + 2 * q));
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc_s[4 * nt + e] = ptx::exp2_approx(
              fmaf(acc_s[4 * nt + e], scale_log2, -(e & 1 ? lse.y : lse.x) * kLog2e));
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t v = ptx::pack2<Element>(acc_s[4 * nt + 2 * r], acc_s[4 * nt + 2 * r + 1]);
          rP[nt / 2][(nt & 1) * 2 + r] = v;
          st_shared(unit_addr(sP_t, nt, r), v);
        }
      }
      // dV_c += P^T dO over the own query half, while dS^T is computed.
      wgmma_fence();
      gemm_kv_own(acc_dv, rP, sdO + s * Traits::kQBytes);
      wgmma_commit();
      wgmma_wait<1>();  // dP^T (the own dV half may still run)
      fence_regs(acc_dp);
#pragma unroll
      for (int nt = 0; nt < Traits::kWgQueries / 8; ++nt) {
        const float2 dsum = ld_shared_float2(st.dsum(s) + 4 * (wq0 + 8 * nt + 2 * q));
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc_dp[4 * nt + e] =
              acc_s[4 * nt + e] * (acc_dp[4 * nt + e] - (e & 1 ? dsum.y : dsum.x));
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t v =
              ptx::pack2<Element>(acc_dp[4 * nt + 2 * r], acc_dp[4 * nt + 2 * r + 1]);
          rdS[nt / 2][(nt & 1) * 2 + r] = v;
          st_shared(unit_addr(sdS_t, nt, r), v);
        }
      }
      wgmma_fence();
      gemm_kv_own(acc_dk, rdS, sQ + s * Traits::kQBytes);
      wgmma_commit();
      fence_proxy_async();
      named_sync(kBarDS, 256);  // both warpgroups' quarters of sP[s], sdS[s] are stored

      gemm_kv_partner(acc_dv, sP_t, sdO + s * Traits::kQBytes);
      gemm_kv_partner(acc_dk, sdS_t, sQ + s * Traits::kQBytes);
      wgmma_commit();
      float acc_dq0[32], acc_dq1[32];
      gemm_dq(acc_dq0, sdS_t, 0);
      // dV and dK done: sQ, sdO, LSE, dsum of stage s are read (dQ reads sK and sdS only);
      // Staged: released after staging dQ into the stage (below).
      wgmma_wait<1>();
      fence_regs(acc_dk);
      fence_regs(acc_dv);
      fence_regs(rP);
      fence_regs(rdS);
      if constexpr (!kStaged) mbar_arrive(st.empty(s));
      gemm_dq(acc_dq1, sdS_t, 1);

      // dq_accum (ws_dq_index, as bwd_kernel.cuh's non-bulk path): the warp's 16 rows x 64
      // columns of slice j are 8 n8 tiles of 128 floats at column chunk 2 c + j.
      const int dq_row = m0 + 16 * warp_in_wg;
      float* const dq = p.dq_accum + (seq.ws_row0(head) + dq_row) * p.headdim + 4 * lane;
      auto add_dq = [&](const float (&acc)[32], int j) {
        const int chunk = 2 * consumer + j;
        if (dq_row < seq.seqlen_q()) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            if (64 * chunk + 8 * nt < p.headdim)
              ptx::red_add_v4(dq + 16 * 64 * chunk + 128 * nt, acc[4 * nt], acc[4 * nt + 1],
                              acc[4 * nt + 2], acc[4 * nt + 3]);
        }
      };
      // Slice j of the warp staged (in accumulator order, each store the warp's 512
      // contiguous bytes) at 4096 j of its 8 KiB: chunk 2 c + w % 2 of sQ[s] (warps 0, 1) or
      // sdO[s] (2, 3), dead since dV / dK (the header); warp 2 adds them.
      const uint32_t sdq = (warp_in_wg < 2 ? sQ : sdO) + s * Traits::kQBytes +
                           (2 * consumer + warp_in_wg % 2) * Traits::kQChunkBytes;
      auto stage_dq = [&](const float (&acc)[32], int j) {
        if (dq_row < seq.seqlen_q()) {
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            st_shared_v4(sdq + 4 * (1024 * j + 128 * nt + 4 * lane), acc[4 * nt],
                         acc[4 * nt + 1], acc[4 * nt + 2], acc[4 * nt + 3]);
        }
      };
      wgmma_wait<1>();
      fence_regs(acc_dq0);
      if constexpr (kStaged) stage_dq(acc_dq0, 0);
      else add_dq(acc_dq0, 0);
      wgmma_wait<0>();
      fence_regs(acc_dq1);
      if constexpr (kStaged) {
        stage_dq(acc_dq1, 1);
        fence_proxy_async();  // the generic-proxy stores, before warp 2's async-proxy reads
        // This thread's reads of the stage (LSE, dsum) and staging stores are done; the stage
        // goes back once warp 2 arrives too, after its reduces read the staging.
        mbar_arrive(st.empty(s));
        // Warp 2 has taken step t - 1's staging (so that the arrivals below are step t's).
        if (t > 0) named_sync(kBarDqEmpty, 256 + 32);
        named_arrive(kBarDqFull, 256 + 32);
      } else {
        add_dq(acc_dq1, 1);
      }
      range.next(head, m_block);
    }

    // ---- epilogue: dK * scale, dV in the input dtype, columns 128 c.., staged in the warp's
    // 16 rows of this warpgroup's chunks of sV (the partner's dP^T read them before the last
    // step's kBarDS, which this warpgroup passed) ----
    store_dk_dv<Element, Traits::kWgCols>(
        p, seq, batch, head_k, n0 + 16 * warp_in_wg, Traits::kWgCols * consumer,
        sV + 2 * consumer * Traits::kKChunkBytes + 16 * warp_in_wg * kSwizzleBytes,
        Traits::kKChunkBytes, lane, acc_dk, acc_dv);
  }
#endif
}

template <typename Element, bool kStaged>
void launch_bwd_d256(const BwdArgs& args, cudaStream_t stream) {
  using Traits = BwdTraitsD256;
  constexpr auto kernel = bwd_kernel_d256<Element, kStaged>;
  raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(sm90 bwd_kernel_d256, smem)");
  const BwdParams& p = args.p;
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.nheads_k, p.batch);
  launch_kernel(kernel, grid, Traits::kThreads, Traits::kSmemBytes, stream, p.pdl,
                "sm90 bwd_kernel_d256 launch", args);
}

// Host: TMA maps (64-row boxes for all four), preprocess, the kernel, dQ convert (the last two
// programmatic dependents with BwdParams::pdl, as in bwd_launch.cuh).
template <typename Element>
bool run_bwd_sm90_d256(const BwdParams& p, cudaStream_t stream) {
  using Traits = BwdTraitsD256;
  BwdArgs args;
  args.p = p;
  const auto [rows_q, rows_k, batch_q, batch_k] = map_rows(p);
  const bool mapped =
      make_tma_map(&args.q, p.q, p.dtype, p.headdim, rows_q, p.nheads, batch_q, p.q_row_stride,
                   p.q_head_stride, p.q_batch_stride, Traits::kBlockM) &&
      make_tma_map(&args.dout, p.dout, p.dtype, p.headdim, rows_q, p.nheads, batch_q,
                   p.do_row_stride, p.do_head_stride, p.do_batch_stride, Traits::kBlockM) &&
      make_tma_map(&args.k, p.k, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k, p.k_row_stride,
                   p.k_head_stride, p.k_batch_stride, Traits::kBlockN) &&
      make_tma_map(&args.v, p.v, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k, p.v_row_stride,
                   p.v_head_stride, p.v_batch_stride, Traits::kBlockN);
  if (!mapped) return false;
  run_bwd_preprocess<Element, Traits::kHeadDim>(p, stream);
  // The dQ staged for warp 2 where built (dq_bulk + dq_warp; deterministic mode needs it:
  // sm90_bwd_d256_supports), by red.global.add otherwise.
  launch_bwd_d256<Element, FLASHATTN2_SM90_BWD_DQ_BULK && FLASHATTN2_SM90_BWD_DQ_WARP>(args,
                                                                                    stream);
  run_bwd_convert_dq<Element, Traits::kHeadDim>(p, p.pdl, stream);
  return true;
}

}  // namespace sm90
}  // namespace flashattn2
