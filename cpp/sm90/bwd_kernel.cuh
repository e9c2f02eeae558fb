// Hopper backward, first version (issue 18; GPU-validated 2026-11-25, benchmarks/NOTES.md "Hopper
// backward"). The mainloop of the FA2 backward (sm80/bwd_kernel.cuh) on wgmma and TMA; the
// preprocess (dsum = rowsum(dO o O), zeroing dq_accum) and the dQ convert kernel are the
// sm80 ones, unchanged, and dQ goes into the same f32 accumulator layout (ws_dq_index).
// This file: the kernel (bwd_kernel) and its tiling. Its parts in headers of their own: the
// producer warps (stages, TMA loads, LSE / dsum, the dQ order: sm90/bwd_producer.cuh, shared
// with the d256 kernel), the mask and the dK / dV stores (sm90/bwd_consumer.cuh, shared too);
// the step's dQ (the dQ GEMM, the deterministic turn, the adds into dq_accum, warp 2's reduces
// of the staging: sm90/bwd_dq.cuh); tile constants and the walk: bwd_traits.cuh.
//
// Tiling
//   grid   (ceil(seqlen_k / 128), nheads_k, batch): one CTA per 128-key block of a KV head;
//          it walks every query block (kBlockM rows: d128 64, d64 128; sm90_bwd_tile) that
//          sees the keys, for each query head of the GQA group (head-major), and keeps dK / dV
//          in f32 registers over all of them.
//   block  384 threads. Warpgroup 0 is the producer (setmaxnreg down): thread 0 loads K, V
//          once (TMA, kv_full) and Q, dO of each step into stage t % 2 (q_full, do_full);
//          warp 1 copies the step's LSE (+inf past seqlen_q: P = 0 there) and dsum into the
//          stage (lse_full, 32 arrivals). Consumer warpgroup c (1 + c) owns keys
//          [64 c, 64 c + 64) of the block; its warp w keys 16 w..+15, so the S^T / dP^T / dK /
//          dV accumulators have the mma.sync C layout (fwd_softmax.cuh).
//   smem   sK, sV [128 x d]; per stage sQ, sdO [kBlockM x d] (TMA's 128-byte swizzle,
//          wgmma.cuh) and LSE, dsum [kBlockM] f32; sdS 2 x [128 keys x kBlockM queries] (dS^T
//          in chunks of 64 queries, the same swizzle); dq_bulk staging; mbarriers; the
//          deterministic dQ-order counter's address (8 bytes). Budget:
//          sm90/bwd_config.h.
//   step   (t, query block m of head h; stage s = t % 2)
//            S^T = K_c Q^T (SS, m64 n kBlockM), dP^T = V_c dO^T (SS)
//            mask (key tail, causal), P^T = exp2(S^T scale log2e - LSE log2e) -> A fragments
//            dV += P^T dO (RS, n = d, K = kBlockM queries, dO MN-major)
//            dS^T = P^T o (dP^T - dsum) -> A fragments and sdS[s] (4-byte stores)
//            dK += dS^T Q (RS)
//            named barrier of both consumers (sdS[s] complete)
//            dQ tile of warpgroup c (m64 n64 over the block's 128 keys; SS, A = sdS read
//            M-major, K MN-major): d128 dQ[:, 64 c..+64] = dS K[:, 64 c..+64]; d64
//            dQ[64 c..+64, :] = dS[64 c..+64, :] K: no dQ element from two warpgroups
//            wait all; release stage s; dQ into dq_accum (dq_bulk: staged, bulk reduce-adds
//            by each warp or, kDqWarp, by warp 2, one per tile where it can; else
//            red.add.v4; bwd_dq.cuh)
//          d128 (kRotate, not kBias): the dQ GEMM and its adds move to the top of step t + 1:
//          wait all and release stage s after the barrier; then issue the dQ GEMM, step
//          t + 1's S^T, wait for the dQ and add it while S^T runs.
//          d64 issues dV in the dS^T pass (P^T packed there; kMods: its logits too, after
//          dP^T), so that S^T, dP^T (64 f32 each at n128) and in-flight P^T fragments are not
//          live together with dK / dV (kDvAfterDs: registers): dV and dK of the first 64
//          queries once their fragments are packed (they run during the second half of the
//          pass; not with varlen + mods: registers), the rest after it.
//          sdS is double-buffered: a warpgroup writes sdS[s] of step t + 2 only after
//          passing step t + 1's barrier, i.e. after the other one finished step t's dQ (with
//          kRotate too: step t's dQ GEMM is waited for at the top of step t + 1, before its
//          barrier).
//   determ deterministic=True (dq_bulk builds): the dQ reduces of a query tile in the fixed
//          order of common/dq_order.cuh (descending: key blocks launched last first; the
//          rotated walk; or ascending), each key block n into dQ chain n % dq_chains (its
//          own accumulator and counters), one counter per query tile and chain: after
//          issuing dV (d64: before the dS^T pass), each warp's lane 0 waits for its
//          previous reduce to complete and adds 1 to that tile's counter (release); thread
//          128, while its dQ GEMM runs, waits for this tile's turn (8 adds per earlier
//          visitor of its chain); a second named barrier passes it on. dq_warp builds
//          (kDqWarp instances, no mods / bias): producer warp 2 does the waits, the reduces
//          and 1 add per visitor (dq_order_warp); the consumers only stage dQ.
//   epilogue  dK * scale and dV converted to the input dtype, each warp's 16 key rows staged
//          by stmatrix in its own rows of sV, then 16-byte stores (bwd_consumer.cuh store_dk_dv).
//   dbias  kDbias instances (BwdParams::sm90_dbias): dS into dbias as the mma.sync backward
//          writes it; in q's dtype through the warpgroup's staged bias tile (stmatrix .trans
//          of the dK GEMM's A fragments, then 16-byte stores while that GEMM runs), float32
//          from the dS^T pass (a key pair per store or red.add); each (b, h, i, j) of a
//          visited step is the CTA's alone.
// Limits: kernel head dims 64 and 128 (d 33-64, 97-128), dense or varlen (BwdSeq), full,
// causal or sliding-window attention, softcap / ALiBi (kMods), an attention bias (kBias; at
// d64 with one sdS buffer) and, without softcap, its gradient (kDbias), deterministic mode
// (dq_bulk builds); no dropout (sm90_bwd_supports).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/score_mod.cuh"
#include "common/seqlen.cuh"
#include "common/workspace.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_consumer.cuh"
#include "sm90/bwd_dq.cuh"
#include "sm90/bwd_producer.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// kVarlen: packed sequences (BwdSeq<true>); kMods: softcap and ALiBi (common/score_mod.cuh).
// Instances of their own, so that plain calls run none of their code (with kMods in the one
// d128 kernel, 24 B of spills and the logit pass cost every call ~10 %, H100 2026-11-25).
// kBias (with kMods, dense, FLASHATTN2_BIAS builds): an attention bias without its gradient,
// 16-byte aligned rows of unit key stride (bias_rows_16b), staged per step in shared memory.
// kDqWarp (dq_warp builds, calls without mods or a bias): producer warp 2 runs the dQ order
// (dq_order_warp); the other instances have none of its code (their SASS is a build's
// without the item), so that a dq_warp build can run both paths (BwdParams::dq_warp, A/B).
// kFirstStore (with kDqWarp; BwdParams::dq_first_store_rows): warp 2 stores the dQ of a tile's
// first visitor instead of adding it (dq_order_warp), dq_accum not zeroed.
// kDbias (with kBias; BwdParams::dbias, no softcap: sm90_bwd_takes_bias): the bias's gradient,
// dS = P o (dP - dsum) (d loss / d logit), into dbias as the mma.sync backward writes it.
// kDbiasElement (dbias in Element, 16-byte aligned rows): the packed dS^T fragments (rdS, the
// dK GEMM's) transposed by stmatrix into the warpgroup's staged bias tile, whose reads are
// done by then, and back by 16-byte loads and stores (stage_dbias / store_dbias_tile) while
// the dK GEMM runs. Float32 (kDbiasF32: stores; kDbiasF32Add: red.add.v2, broadcast batch /
// heads) from the dS^T pass's float registers, a key pair per store (store_dbias_pair: one
// shuffle, one 8-byte store or red). An instance per target (with the target a runtime
// branch, each pair store cost ~33 SASS instructions: d128 loop 1313 -> 1838).
template <typename Traits, typename Element, bool kVarlen, bool kMods, bool kBias = false,
          bool kDqWarp = false, bool kFirstStore = false, int kDbias = kDbiasNone>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  // d64 (128-row steps): the dV GEMM is issued in the dS^T pass, with P^T packed there, so
  // that S^T (64 f32), dP^T (64) and the in-flight P^T fragments (32) are never live
  // together with dK / dV (64): that order (d128's) needs ~256 of the 240 registers (ptxas
  // serialised the wgmma and spilled). kDvSplit: half of dV and dK issued mid-pass (the
  // plain instance spilled 16 B with both GEMMs after the pass; varlen + mods 32 B with the
  // split, 0 without).
  constexpr bool kDvAfterDs = Traits::kBlockM > 64;
  constexpr bool kDvSplit = kDvAfterDs && !(kVarlen && kMods);
  // sdS buffers: 2, indexed by the stage; 1 in d64's kBias instance (smem), whose reuse then
  // waits for the other warpgroup's dQ GEMM of the step before (kBarDsFree).
  constexpr int kDsBuffers = Traits::ds_buffers(kBias);
  const BwdParams& p = args.p;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem = (ptx::smem_addr(smem_raw) + 1023) & ~1023u;
  // The stages (sm90/bwd_producer.cuh); this kernel's own between sdO and the LSE rows: sdS,
  // then dq_bulk's staging (each consumer warp's 4 KiB slot: bwd_dq.cuh dq_slot).
  const BwdStages<Traits> st(smem, kDsBuffers * Traits::kDSBytes + Traits::kDqStageBytes);
  const uint32_t sK = st.k, sV = st.v;
  const uint32_t sQ = st.q, sdO = st.dout;  // stage s: + s kQBytes
  const uint32_t sdS = st.own;              // buffer b: + b kDSBytes
  [[maybe_unused]] const uint32_t sDq = sdS + kDsBuffers * Traits::kDSBytes;
  // Deterministic: the dQ-order counter of the step's query tile (thread 128 writes it).
  const uint32_t sDqCounter = st.end();
  [[maybe_unused]] const uint32_t sBias = (sDqCounter + 8 + 127) & ~127u;  // kBias

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int head_k = blockIdx.y, batch = blockIdx.z;
  const int group = p.nheads / p.nheads_k;
  const BwdSeq<kVarlen> seq(p, batch);
  // The walk (common/dq_order.cuh): full attention rotates in both modes (K/V tile n starts
  // at query tile n), so that a head's CTAs, which run in step, visit different query tiles
  // at each step. Walking in step from tile 0 (the non-deterministic walk until now), each
  // step's dQ went to one query tile from all of them: with the first store (kFirstStore)
  // all but one waited for that store to complete before their reduces (ncu, d128 2k full:
  // half of warp 2's stall samples in the ticket / flag handshake, 11 % of all at the
  // consumers' kBarDqEmpty wait). Interleaved A/B (bf16 bwd): d128 full +2.6 % geomean
  // (512-1k +4-5 %, 2k +0.5 %), d64 full +1.0 %.
  const DqOrder<kBlockM, kBlockN> order(p, seq.seqlen_q(), seq.seqlen_k(),
                                        (seq.seqlen_q() + kBlockM - 1) / kBlockM, true);
  const int n_block = order.n_block();
  // kDqWarp: warp 2 runs the dQ order (below), the consumers only stage.
  static_assert(!kDqWarp || (Traits::kDqWarpBuilt && !kMods), "dq_warp instance");
  static_assert(!kFirstStore || kDqWarp, "first-store instance");
  static_assert(kDbias == kDbiasNone || (kBias && !kVarlen && !kDqWarp), "dbias instance");
  constexpr bool dq_warp = kDqWarp;
  const int n0 = n_block * kBlockN;
  const BwdRange range(p, seq, n0, kBlockM, group, order.rotate, n_block);
  // Programmatic dependent launch (BwdParams::pdl, bwd_launch.cuh): the dQ convert may be
  // scheduled now (it waits for this grid's end); this grid itself may have started before
  // the preprocess ended, so warp 1 waits for it (griddep_wait) before its first dsum load.
  ptx::griddep_launch_dependents();
  if (tid == 0) {
    // One empty arrival per consumer thread: each releases its own reads of the LSE / dsum
    // that warp 1 overwrites next (an arrive releases only the arriving thread's accesses;
    // compute-sanitizer's racecheck flagged the one-lane-per-warp form).
    st.init(128 * Traits::kConsumers);
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer ----
    regs_decrease<Traits::kTile.producer_regs>();
    if (warp == 0 && lane == 0 && range.steps > 0) {
      load_tiles(args, seq, range, st, n0, head_k, group);
    } else if (warp == 1) {
      load_rows(p, seq, range, st, batch, head_k * group, lane);
    } else if (warp == 2 && dq_warp) {
      ptx::griddep_wait();  // PDL: before its first counter load and reduce (zeroed by the
                            // preprocess)
      // The consumer warps' staged dQ, one bulk reduce per tile or per block (bwd_dq.cuh).
      auto issue = [&](float* dq_tile, int rows, int, bool store = false) {
        dq_reduce_staged<Traits, kFirstStore>(p, sDq, dq_tile, rows, store);
      };
      dq_order_warp<kBlockM, kBlockN, kVarlen, kFirstStore>(p, seq, head_k * group, n_block,
                                                            range, lane, issue, [](int) {});
    }
  } else {
    // ---- consumers ----
    regs_increase<Traits::kTile.consumer_regs>();
    // (Broadcast from lane 0, so that ptxas sees it warp-uniform: addresses derived from it
    // go to uniform registers; d128 loop 1119 -> 992 SASS instructions.)
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int q = lane % 4;
    const int key0 = 64 * consumer;                  // the warpgroup's first key of the block
    const int lane_key = key0 + 16 * warp_in_wg + g;  // + 8 r: the lane's key rows
    const int offset = seq.seqlen_k() - seq.seqlen_q();
    constexpr float kLog2e = 1.4426950408889634f;
    const float scale_log2 = p.softmax_scale * kLog2e;
    // Float32 dbias: the lane's key pair (ScoreMod::dbias_pair): lanes of even g store keys
    // g, g + 1 (+ 8 r) of query 2 q (+ 8 nt) of the step, lanes of odd g keys g - 1, g of
    // query 2 q + 1; a pair is written where its query is < seqlen_q and its first key <
    // seqlen_k (an odd seqlen_k: the second one of the last pair is the row's padding,
    // written with its dS, 0).
    [[maybe_unused]] const bool odd = g & 1;
    [[maybe_unused]] const int pair_key = n0 + lane_key - odd;

    float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;

    // acc (64 keys x kBlockM queries) = rows key0.. of sA times the stage's rows of sB^T.
    auto gemm_t = [&](float (&acc)[kBlockM / 2], uint32_t a_base, uint32_t b_base) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;  // the k16 step's 32 bytes of the chunk row
        const uint64_t a = desc_k_major(a_base + (kk / 4) * Traits::kKChunkBytes +
                                        key0 * kSwizzleBytes + col);
        const uint64_t b = desc_k_major(b_base + (kk / 4) * Traits::kQChunkBytes + col);
        Wgmma<kBlockM, Element>::template ss<0>(acc, a, b, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // acc (64 keys x d) += A (64 keys x kBlockM queries, registers) times the stage's sB
    // (MN-major); k16 steps kk_begin..kk_end - 1 of the queries.
    auto gemm_kv = [&](float (&acc)[kHeadDim / 2], const uint32_t (&a)[kBlockM / 16][4],
                       uint32_t b_base, int kk_begin = 0, int kk_end = Traits::kBlockM / 16) {
      wgmma_fence();
#pragma unroll
      for (int kk = kk_begin; kk < kk_end; ++kk) {
        const uint64_t b = desc_mn_major(b_base + kk * 16 * kSwizzleBytes, Traits::kQChunkBytes);
        Wgmma<kHeadDim, Element>::template rs<1>(acc, a[kk], b, 1);
      }
      wgmma_commit();
    };

    // kBias: the warpgroup's 64 keys x kBlockM queries of the bias of step (head, m_block) into
    // its tile of sBias, kBlockM / 16 16-byte cp.async per thread (consecutive threads take a
    // query row's consecutive 8-key chunks; a thread's rows 16 apart), chunk c of row r at
    // (c ^ r % 8) 16 bytes so that the fragment reads hit distinct banks; rows past seqlen_q,
    // keys past seqlen_k zero-filled. Issued after the previous step's sdS barrier (every read
    // of the tile is done by then), waited for before this step's logits.
    [[maybe_unused]] const uint32_t sBias_wg = sBias + consumer * Traits::kBiasWgBytes;
    auto bias_issue = [&](int head, int m_block) {
      if constexpr (kBias) {
#if FLASHATTN2_BIAS
        const auto* plane = static_cast<const Element*>(p.attn_bias) +
                            batch * p.bias_batch_stride + head * p.bias_head_stride;
        // One source pointer and shared address stepped by 16 rows (per-copy addresses
        // hoisted out of the loop spilled: d64 144 B, d128 76 B; threadIdx read again rather
        // than tid kept live: d64 20 B instead of 36, d128 0).
        const int row0 = (threadIdx.x % 128) / 8, chunk = threadIdx.x % 8;
        const int key = n0 + key0 + 8 * chunk;
        const int key_bytes = 2 * min(max(seq.seqlen_k() - key, 0), 8);
        const int query0 = m_block * kBlockM + row0;
        const Element* src = plane + int64_t(query0) * p.bias_row_stride + key;
        const uint32_t dst = sBias_wg + row0 * 128 + ((chunk ^ (row0 % 8)) * 16);
#pragma unroll
        for (int i = 0; i < kBlockM / 16; ++i) {
          const int bytes = query0 + 16 * i < seq.seqlen_q() ? key_bytes : 0;
          ptx::cp_async_16_bytes(dst + i * 16 * 128,
                                 bytes > 0 ? src + int64_t(16 * i) * p.bias_row_stride : plane,
                                 bytes);
        }
        ptx::cp_async_commit();
#endif
      }
    };

    // The warpgroup's dQ tile of step t (bwd_dq.cuh): query rows dq_q0..+64, columns
    // 64 dq_chunk..+64, from sdS[t % 2]; deterministic: thread 128 waits for the tile's turn
    // while the GEMM runs (dq_issue), the reduce waits for every thread's (dq_finish).
    const int dq_chunk = Traits::kDqSplitsRows ? 0 : consumer;
    const int dq_q0 = Traits::kDqSplitsRows ? 64 * consumer : 0;
    auto dq_issue = [&](float (&acc_dq)[32], int t_dq, int head_dq, int m_block_dq) {
      const uint32_t sdS_dq = sdS + (kDsBuffers == 2 ? (t_dq + kStages) % kStages : 0) *
                                        Traits::kDSBytes;
      dq_gemm<Traits, Element>(acc_dq, sdS_dq, sK, dq_q0, dq_chunk);
      if (p.deterministic && !dq_warp && tid == 128 && t_dq >= 0)
        dq_wait_turn<Traits>(p, seq, sDqCounter, head_dq, n_block, m_block_dq);
    };
    auto dq_finish = [&](float (&acc_dq)[32], int t_dq, int head_dq, int m_block_dq) {
      if constexpr (kDsBuffers == 1) {
        if (t_dq + 1 < range.steps) named_arrive(kBarDsFree + consumer, 256);
      }
      if (p.deterministic && !dq_warp) named_sync(kBarDqTurn, 256);
      dq_accumulate<Traits, kDqWarp>(p, seq, acc_dq, sDq, m_block_dq * kBlockM, dq_q0, dq_chunk,
                                     consumer, warp_in_wg, lane, head_dq, n_block, t_dq);
    };
    // kRotate: step t - 1's dQ GEMM is issued at the top of step t, just before step t's S^T
    // GEMM, and its staging runs while S^T does, so that the tensor pipe has work there (ncu,
    // d128 8k: the wait for the dQ GEMM and its staging were 17 % of the consumers' stall
    // samples, in both warpgroups at once, as the sdS barrier keeps them in step). Each step
    // ends with every GEMM waited for, so no wgmma is in flight across the loop's back edge
    // (an S^T prefetched there, ptxas serialised every wgmma: C7514 / C7515), and every
    // GEMM is issued unconditionally (under a branch: C7518): step 0 issues a dQ GEMM on the
    // idle sdS buffer whose result is dropped (1 / (5 steps) of the CTA's tensor work), and
    // the last step's dQ follows the loop. Registers while dQ is staged: dK, dV, dQ and the
    // in-flight S^T (192 f32). d128 only (nineteenth session, interleaved A/B against the old
    // order, bf16 512-16k: d128 backward +1.0 % geomean, -1.8 % to +6.4 %, the gains from 2k
    // on; d64, whose steps are twice as long, -1.0 %, -4 % to +2.6 %, and a spilled value),
    // and not with kBias (its tile copies follow the old order).
    constexpr bool kRotate = !kBias && !kDvAfterDs;
    float acc_dq[32];
    int dq_head = 0, dq_m_block = 0;  // step t - 1's (kRotate)

    if (range.steps > 0) mbar_wait(st.kv_full(), 0);
    int head = head_k * group, m_block = range.m_start;
    if (kBias && range.steps > 0) bias_issue(head, m_block);
    for (int t = 0; t < range.steps; ++t) {
      const int s = t % kStages;
      const uint32_t phase = (t / kStages) & 1;
      const int m0 = m_block * kBlockM;
      float acc_s[kBlockM / 2], acc_dp[kBlockM / 2];
      uint32_t rP[kBlockM / 16][4], rdS[kBlockM / 16][4];

      if constexpr (kRotate) dq_issue(acc_dq, t - 1, dq_head, dq_m_block);
      mbar_wait(st.q_full(s), phase);
      gemm_t(acc_s, sK, sQ + s * Traits::kQBytes);
      if constexpr (kRotate) {
        wgmma_wait<1>();  // step t - 1's dQ (S^T runs on)
        fence_regs(acc_dq);
        if (t > 0) dq_finish(acc_dq, t - 1, dq_head, dq_m_block);
      }
      mbar_wait(st.do_full(s), phase);
      gemm_t(acc_dp, sV, sdO + s * Traits::kQBytes);
      mbar_wait(st.lse_full(s), phase);
      // The P pass's and the dS pass's first LSE / dsum loads go before the waits for S^T
      // and dP^T, the others a tile ahead inside the passes, so that no 8-byte load's latency
      // is waited for in the step (the loads are volatile: they stay where they are written).
      [[maybe_unused]] float2 lse_next;
      if constexpr (!kMods) lse_next = ld_shared_float2(st.lse(s) + 4 * (2 * q));
      wgmma_wait<1>();
      fence_regs(acc_s);

      // Mask (bwd_consumer.cuh): keys past seqlen_k, and the window (causal: window_right 0,
      // bottom-right aligned) where the warpgroup's keys cross it.
      const int k_first = n0 + key0;
      const bool need_mask =
          k_first + 64 > seq.seqlen_k() ||
          (p.window_right >= 0 && k_first + 63 > m0 + offset + p.window_right) ||
          (p.window_left >= 0 && k_first < m0 + kBlockM - 1 + offset - p.window_left);
      if (need_mask) mask_tile<kBlockM>(acc_s, p, seq, n0 + lane_key, m0, q, offset);
      // kMods: P^T and d logit / d(scale s) (dl: 1 - t^2 with softcap, else 1) of n8 tile nt
      // from its scores: softcap and ALiBi through ScoreMod, the forward's logits, with the
      // masked scores (-inf above) kept at -inf (tanh(-inf) is finite); kBias adds the staged
      // bias. ALiBi distance query + sk - sq - key of element (nt, e): dist0 + 8 nt + (e & 1) -
      // 8 r. kBias: element (nt, e) is query row 8 nt + 2 q + (e & 1), key 16 w + g + 8 (e >> 1)
      // of the tile: chunk 2 w + (e >> 1) of the row, swizzled, 2-byte lane g of it.
      [[maybe_unused]] ScoreMod mod;
      [[maybe_unused]] float dist0 = 0.f;
      if constexpr (kMods) {
        mod = ScoreMod(p, batch, head);
        dist0 = float(m0 + 2 * q + offset - n0 - lane_key);
      }
      // Float32 dbias: the lane's pair of n8 tile 0, r = 0 (tile nt: 8 nt rows on; r: 8 keys
      // on), and its row's distance to seqlen_q (its row of tile nt exists iff 8 nt <
      // rows_left).
      [[maybe_unused]] char* dbias_lane = nullptr;
      [[maybe_unused]] int64_t dbias_rows8 = 0;
      [[maybe_unused]] int dbias_bytes = 0, rows_left = 0;
#if FLASHATTN2_BIAS
      if constexpr (kDbias == kDbiasF32 || kDbias == kDbiasF32Add) {
        dbias_bytes = 4;
        dbias_rows8 = 8 * p.dbias_row_stride * dbias_bytes;
        rows_left = seq.seqlen_q() - (m0 + 2 * q + odd);
        dbias_lane = static_cast<char*>(p.dbias) +
                     (batch * p.dbias_batch_stride + head * p.dbias_head_stride +
                      int64_t(m0 + 2 * q + odd) * p.dbias_row_stride + pair_key) * dbias_bytes;
      }
#endif
      [[maybe_unused]] auto mod_tile = [&](int nt, float (&pv)[4], float (&dl)[4]) {
        [[maybe_unused]] const uint32_t sbias_lane = sBias_wg + (2 * q) * 128 + 2 * g;
        const float2 lse = ld_shared_float2(st.lse(s) + 4 * (8 * nt + 2 * q));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float score = acc_s[4 * nt + e];
          float x = mod.logit2(score, dist0 + float(8 * nt + (e & 1) - 8 * (e >> 1)), &dl[e]);
          if constexpr (kBias) {
            // fmaf(bias, log2 e, logit), as the forward and the mma.sync backward
            const uint32_t chunk = (2 * warp_in_wg + (e >> 1)) ^ (2 * q + (e & 1));
            const float b = ptx::unpack2<Element>(
                ld_shared_u16(sbias_lane + (8 * nt + (e & 1)) * 128 + chunk * 16)).x;
            x = fmaf(b, kLog2e, x);
          }
          pv[e] = ptx::exp2_approx((score == -INFINITY ? -INFINITY : x) -
                                   (e & 1 ? lse.y : lse.x) * kLog2e);
        }
      };
      // P^T of n8 tile nt (rows r = 0, 1: pv[2 r], pv[2 r + 1]) into the A fragments of the k16
      // step nt / 2 over the queries.
      auto pack_p = [&](int nt, const float (&pv)[4]) {
        rP[nt / 2][(nt & 1) * 2] = ptx::pack2<Element>(pv[0], pv[1]);
        rP[nt / 2][(nt & 1) * 2 + 1] = ptx::pack2<Element>(pv[2], pv[3]);
      };
      if constexpr (kMods && !kDvAfterDs) {
        // One pass per n8 tile: P^T packed into the dV GEMM's A fragments, then
        // acc_s = P^T o dl, which the dS^T pass below multiplies, so that the derivative
        // needs no registers of its own.
        if constexpr (kBias) {
          ptx::cp_async_wait<0>();
          named_sync(kBarBias + consumer, 128);  // the warpgroup's tile has landed
        }
#pragma unroll
        for (int nt = 0; nt < kBlockM / 8; ++nt) {
          float pv[4], dl[4];
          mod_tile(nt, pv, dl);
          pack_p(nt, pv);
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[4 * nt + e] = pv[e] * dl[e];
        }
      } else if constexpr (!kMods) {
        // P^T in place (LSE of the lane's two query columns per n8 tile: one 8-byte load).
#pragma unroll
        for (int nt = 0; nt < kBlockM / 8; ++nt) {
          const float2 lse = lse_next;
          if (nt + 1 < kBlockM / 8) lse_next = ld_shared_float2(st.lse(s) + 4 * (8 * (nt + 1) + 2 * q));
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_s[4 * nt + e] = ptx::exp2_approx(
                fmaf(acc_s[4 * nt + e], scale_log2, -(e & 1 ? lse.y : lse.x) * kLog2e));
        }
        // P^T as A fragments (n8 tiles 2 kk, 2 kk + 1: the k16 step kk over the queries);
        // kDvAfterDs: in the dS^T pass.
        if constexpr (!kDvAfterDs) {
#pragma unroll
          for (int kk = 0; kk < kBlockM / 16; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              rP[kk][i] = ptx::pack2<Element>(acc_s[8 * kk + 2 * i], acc_s[8 * kk + 2 * i + 1]);
        }
      }
      if constexpr (!kDvAfterDs) gemm_kv(acc_dv, rP, sdO + s * Traits::kQBytes);
      // Deterministic: this warp's reduce of the previous step (issued before this step's
      // softmax) is complete by now; its lane 0 releases it, one of the 4 kConsumers adds
      // a visitor makes to the query tile's counter (thread 128 left its address in
      // sDqCounter; rewritten only after this step's sdS barrier). (Released at the dQ point
      // instead, the next visitor waited for it there in step: 1.84x the default time at
      // 16k.)
      if (p.deterministic && !dq_warp && t > 0 && lane == 0) dq_release(sDqCounter);
      float2 dsum_next = ld_shared_float2(st.dsum(s) + 4 * (2 * q));
      wgmma_wait<kDvAfterDs ? 0 : 1>();  // dP^T (d128: the dV GEMM may still run)
      fence_regs(acc_dp);

      // dS^T = P^T o (dP^T - dsum) as A fragments and into sdS[s] (key rows x query columns,
      // n8 tile nt in query chunk nt / 8, swizzled: the 4-byte stores of a warp hit 32
      // distinct banks). kDvAfterDs: P^T (kMods: its logits too, after dP^T: in one pass the
      // tile's S^T and dP^T die together) into the dV GEMM's A fragments here.
      const uint32_t sdS_t = sdS + (kDsBuffers == 2 ? s : 0) * Traits::kDSBytes;
      if constexpr (kBias && kDvAfterDs) {
        ptx::cp_async_wait<0>();
        named_sync(kBarBias + consumer, 128);  // the warpgroup's tile has landed
      }
      if constexpr (kDsBuffers == 1) {
        if (t > 0) named_sync(kBarDsFree + 1 - consumer, 256);  // the other's dQ read sdS
      }
#pragma unroll
      for (int nt = 0; nt < kBlockM / 8; ++nt) {
        const float2 dsum = dsum_next;
        if (nt + 1 < kBlockM / 8) dsum_next = ld_shared_float2(st.dsum(s) + 4 * (8 * (nt + 1) + 2 * q));
        if constexpr (kDvAfterDs) {
          float ps[4];  // P^T (o dl with kMods)
          if constexpr (kMods) {
            float dl[4];
            mod_tile(nt, ps, dl);
            pack_p(nt, ps);
#pragma unroll
            for (int e = 0; e < 4; ++e) ps[e] *= dl[e];
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) ps[e] = acc_s[4 * nt + e];
            pack_p(nt, ps);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_dp[4 * nt + e] = ps[e] * (acc_dp[4 * nt + e] - (e & 1 ? dsum.y : dsum.x));
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_dp[4 * nt + e] =
                acc_s[4 * nt + e] * (acc_dp[4 * nt + e] - (e & 1 ? dsum.y : dsum.x));
        }
#if FLASHATTN2_BIAS
        if constexpr (kDbias == kDbiasF32 || kDbias == kDbiasF32Add) {  // dS of keys lane_key
#pragma unroll  // + 8 r, queries 8 nt + 2 q + e (no softcap: dl = 1)
          for (int r = 0; r < 2; ++r)
            store_dbias_pair<kDbias>(
                dbias_lane + nt * dbias_rows8 + 8 * r * dbias_bytes, odd,
                8 * nt < rows_left && pair_key + 8 * r < seq.seqlen_k(), acc_dp[4 * nt + 2 * r],
                acc_dp[4 * nt + 2 * r + 1]);
        }
#endif
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t v =
              ptx::pack2<Element>(acc_dp[4 * nt + 2 * r], acc_dp[4 * nt + 2 * r + 1]);
          rdS[nt / 2][(nt & 1) * 2 + r] = v;
          const int row = lane_key + 8 * r;
          const uint32_t addr = sdS_t + (nt / 8) * Traits::kDSChunkBytes + row * kSwizzleBytes +
                                (((nt % 8) ^ (row % 8)) * 16) + 4 * q;
          st_shared(addr, v);
        }
        // kDvSplit: the dV and dK GEMMs of the first 64 queries as soon as their fragments
        // are packed, so that they run during the second half of the pass (kDbiasElement:
        // their dS^T staged first; the bias reads of those rows are done).
        if (kDvSplit && nt == kBlockM / 16 - 1) {
#if FLASHATTN2_BIAS
          if constexpr (kDbias == kDbiasElement)
            stage_dbias<kBlockM>(sBias_wg, rdS, warp_in_wg, lane, 0, kBlockM / 32);
#endif
          gemm_kv(acc_dv, rP, sdO + s * Traits::kQBytes, 0, kBlockM / 32);
          gemm_kv(acc_dk, rdS, sQ + s * Traits::kQBytes, 0, kBlockM / 32);
        }
      }
#if FLASHATTN2_BIAS
      if constexpr (kDbias == kDbiasElement)
        stage_dbias<kBlockM>(sBias_wg, rdS, warp_in_wg, lane, kDvSplit ? kBlockM / 32 : 0,
                             kBlockM / 16);
#endif
      if constexpr (kDvAfterDs) {
        gemm_kv(acc_dv, rP, sdO + s * Traits::kQBytes, kDvSplit ? kBlockM / 32 : 0, kBlockM / 16);
        gemm_kv(acc_dk, rdS, sQ + s * Traits::kQBytes, kDvSplit ? kBlockM / 32 : 0, kBlockM / 16);
      } else {
        gemm_kv(acc_dk, rdS, sQ + s * Traits::kQBytes);
      }
#if FLASHATTN2_BIAS
      if constexpr (kDbias == kDbiasElement) {  // (before the barrier: the next bias copies)
        Element* const dst = static_cast<Element*>(p.dbias) + batch * p.dbias_batch_stride +
                             head * p.dbias_head_stride + int64_t(m0) * p.dbias_row_stride +
                             n0 + key0;
        store_dbias_tile<Element, kBlockM>(sBias_wg, dst, p.dbias_row_stride,
                                           seq.seqlen_q() - m0, seq.seqlen_k() - n0 - key0,
                                           warp_in_wg, lane);
      }
#endif
      fence_proxy_async();
      named_sync(kBarDS, 256);  // both warpgroups' dS^T rows are in sdS[s]
      if constexpr (kBias) {
        if (t + 1 < range.steps) {  // the next step's bias tile (this one's reads are done)
          int next_head = head, next_m_block = m_block;
          range.next(next_head, next_m_block);
          bias_issue(next_head, next_m_block);
        }
      }

      if constexpr (kRotate) {
        // dV and dK done: sQ, sdO, LSE, dsum of stage s are read; the stage goes back.
        wgmma_wait<0>();
        fence_regs(acc_dk);
        fence_regs(acc_dv);
        mbar_arrive(st.empty(s));
        dq_head = head;
        dq_m_block = m_block;
      } else {
        dq_issue(acc_dq, t, head, m_block);
        // dV and dK done (all but the dQ group): sQ, sdO, LSE, dsum of stage s are read, so
        // the stage goes back to the producer while the dQ GEMM still runs.
        wgmma_wait<1>();
        fence_regs(acc_dk);
        fence_regs(acc_dv);
        mbar_arrive(st.empty(s));
        wgmma_wait<0>();
        fence_regs(acc_dq);
        dq_finish(acc_dq, t, head, m_block);
      }
      range.next(head, m_block);
    }
    if constexpr (kRotate) {  // the last step's dQ (none without steps: dropped)
      dq_issue(acc_dq, range.steps - 1, dq_head, dq_m_block);
      wgmma_wait<0>();
      fence_regs(acc_dq);
      if (range.steps > 0) dq_finish(acc_dq, range.steps - 1, dq_head, dq_m_block);
    }

    // dq_bulk: the reduces complete (their shared memory is read) before the CTA exits;
    // deterministic: then the last step's query tile is released.
    if (Traits::kDqBulk && lane == 0) {
      if (p.deterministic && !dq_warp && range.steps > 0) dq_release(sDqCounter);
      else tma_store_wait();
    }

    // ---- epilogue: dK * scale, dV in the input dtype, staged in the warp's own 16 rows of sV
    // (the warpgroup's V rows: only its own dP^T GEMMs read them, all complete) ----
    store_dk_dv<Element, kHeadDim>(p, seq, batch, head_k, n0 + key0 + 16 * warp_in_wg, 0,
                                   sV + (key0 + 16 * warp_in_wg) * kSwizzleBytes,
                                   Traits::kKChunkBytes, lane, acc_dk, acc_dv);
  }
#endif
}

}  // namespace sm90
}  // namespace flashattn2
