// Hopper forward (FlashAttention-3 design, Shah et al. 2024 §3): TMA loads, wgmma, warp
// specialisation, ping-pong between consumer warpgroups, a persistent tile loop.
//
// Tiling
//   grid   min(tiles, SMs) persistent CTAs; CTA i takes tile i first, then, for tiles of
//          equal work (dense, no window), i + grid, i + 2 grid, ...; for causal, windowed or
//          varlen tiles the next tile of a shared counter (FwdParams::tile_counter), so that
//          whichever CTA is free takes it. The producer publishes each index to the
//          consumers through shared memory (tile_full / tile_empty) already decoded
//          (FwdTileWork: coordinates, sequence, key blocks). A tile
//          is (m block, head, batch * num_splits + split), m blocks fastest and in reverse
//          order: the longest causal rows come first, and the CTAs running at once share
//          their heads' K and V in L2. Split-KV: split s of a tile's key blocks writes
//          float32 partial O and LSE for the combine kernel.
//   block  128 (1 + kConsumers) threads. Warpgroup 0 is the producer: it gives registers
//          away (setmaxnreg) and one thread issues every TMA load (sm90/fwd_producer.cuh).
//          Consumer warpgroup c (1 + c) owns query rows [64 c, 64 c + 64) of the tile; its
//          warp w rows 16 w..+15, so the S / O accumulators have the mma.sync C layout
//          (sm90/fwd_softmax.cuh).
//   smem   (FwdSmem, sm90/fwd_tile.cuh) sQ: a ring of two [kBlockM x d] buffers (d64, d128;
//          one where two do not fit), tile t's in buffer t % 2, which also stages its O (its Q
//          is dead after the tile's last S); kStages x sK, sV [kBlockN x d]; each as d / 64
//          chunks of 128-byte rows in TMA's 128-byte swizzle (sm90/wgmma.cuh); then the
//          mbarriers q_full, q_empty (per Q buffer), per stage k_full, k_empty, v_full,
//          v_empty, and tile_full / tile_empty; after them (and the staged bias) the two
//          32-byte slots of published tile work. K and V land on separate barriers, so
//          S = Q K^T starts before V is in. Budget: sm90/fwd_config.h.
//   regs   consumer: S [kBlockN / 2] f32, P [kBlockN / 16][4] b32, O [d / 2] f32.
//   step   (key blocks from the last visible one down to the first; j counts the steps of
//          all of the CTA's tiles, so stages and phases run on across tiles)
//            producer: wait k_empty, TMA K_j -> k_full; wait v_empty, TMA V_j -> v_full;
//                      per tile first: wait q_empty, TMA Q -> q_full
//            consumer: wait k_full[j]; turn (named barrier): S_j = Q K_j^T (SS wgmma);
//                      wait v_full[j-1]; O += P_{j-1} V_{j-1} (RS wgmma, P in registers);
//                      pass the turn; wait S_j -> release K_j; mods, mask, softmax of S_j
//                      (under the other warpgroups' MMAs); wait P V -> release V_{j-1};
//                      O *= correction; P_j = S_j as 16-bit A fragments. (FwdTraits kOrder_
//                      3, FA3's d > 128 order: no turn; O *= the last step's correction right
//                      after the S issue, before P V.)
//   epilogue  (sm90/fwd_epilogue.cuh) O / sum -> the consumer's rows of the tile's Q buffer
//          (stmatrix) -> TMA store (dense) or 16-byte stores (varlen: a box would cross into
//          the next sequence); LSE = max * scale + ln(sum), +inf for rows that see no key. The
//          buffer is released (q_empty) once the store has read it: with two, at the next
//          tile's start, so that the producer loads the next-but-one tile's Q a whole tile
//          ahead (the next one's is in by then); with one, at once (the next tile's Q then
//          waits for the epilogue).
//          kStageO (one Q buffer: d192, d256; a prototype, FwdParams::sm90_stage_o): a tile
//          with key steps (no split) stages warpgroup 0's O in the K buffer and warpgroup 1's
//          in the V buffer of its last stage instead, each held back from the producer until
//          its store read it, and releases Q after its last S, so that the next tile's Q
//          loads under this one's last P V and epilogue.
//   mods   kMods: softcap / ALiBi as the sm80 kMods instance (common/score_mod.cuh): S becomes
//          base-2 logits before the mask. Dropout runs on the sm80 kernels. kBias (with
//          kMods, FLASHATTN2_BIAS builds): an attention bias too, one load per score, or
//          (kBiasSmem) staged per key step in shared memory by cp.async.
//   limits kernel head dims 64, 128, 192, 256 (whole chunks); d <= kHeadDim (TMA zero-fills
//          the columns past d and clips them on store); 16-byte aligned pointers, strides
//          multiples of 8 elements (TMA needs 16 bytes), checked by the host API.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"
#include "sm90/fwd_config.h"
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_softmax.cuh"
#include "sm90/fwd_tile.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// kBiasSmem (with kBias): the bias tile of each key step is staged in shared
// memory by cp.async one step ahead, instead of one global load per score (fwd_launch.cuh
// picks it for 16-byte aligned biases with unit key stride). kStageO: O staged in the last
// K / V stage (the tiling block's epilogue). kNarrowStep (a prototype, plain attention,
// FwdParams::sm90_narrow_step): a warpgroup that sees only the first 32 or 64 keys of its
// first key block (the causal diagonal: warpgroup 0 of every d128 tile, every other one at
// d64, 4 of 5 at d256; a right window; a key tail) runs that step on those keys: S m64n32 /
// m64n64, the mask and softmax over their columns, P V of 2 / 4 k16 blocks. The step opens
// the tile, where nothing hides its S and softmax latency.
template <typename Traits, typename Element, bool kMods, bool kBias = false,
          bool kBiasSmem = false, bool kStageO = false, bool kNarrowStep = false>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel(const __grid_constant__ FwdArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kConsumers = Traits::kConsumers;
  constexpr int kChunks = Traits::kChunks;
  using Work = FwdTileWork<kBlockM, kBlockN>;
  const FwdParams& p = args.p;

  extern __shared__ unsigned char smem_raw[];
  constexpr int kQBufs = Traits::kQBufs;
  // (FwdSmem's base 1024-aligned: the 128-byte swizzle's period.)
  const FwdSmem<Traits, kBiasSmem> sm((ptx::smem_addr(smem_raw) + 1023) & ~1023u);
  static_assert(!kBiasSmem || (kBias && Traits::kBiasSmemFits), "staged bias");
  // kStageO: a warpgroup's O (64 rows, chunks of 64 x 128 bytes) fits in one K / V buffer.
  static_assert(!kStageO || (kQBufs == 1 && kConsumers == 2 &&
                             kChunks * 64 * kSwizzleBytes <= Traits::kKVBytes), "O in a stage");
  static_assert(!kNarrowStep || (kBlockN > 64 && !kMods && !kStageO), "narrow step");

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  if (tid == 0) sm.init();
  __syncthreads();

  if (warp < 4) {
    // ---- producer (fwd_producer.cuh) ----
    regs_decrease<Traits::kTile.producer_regs>();
    if (warp == 0 && lane == 0) produce_tiles<Traits>(args, sm);
  } else {
    // ---- consumers ----
    regs_increase<Traits::kTile.consumer_regs>();
    // (Broadcast from lane 0, so that ptxas sees it warp-uniform: the smem addresses and
    // step counts derived from it stay in uniform registers.)
    const int consumer = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
    const int warp_in_wg = warp % 4;
    const int g = lane / 4;
    const int q = lane % 4;
    const int wg_row0 = 64 * consumer;                   // first row of this warpgroup
    const int lane_row = wg_row0 + 16 * warp_in_wg + g;  // + 8 r: the lane's tile rows
    const bool store_thread = warp_in_wg == 0 && lane == 0;

    float acc_o[kHeadDim / 2];
    uint32_t rP[kBlockN / 16][4];

    // The MMA turn: consumer c issues its MMAs between named_sync(turn c) and
    // named_arrive(turn c + 1), so one warpgroup's softmax runs under another's MMAs. The
    // last consumer opens turn 0 once; consumer 0 closes it after its last turn.
    // (Traits::kTurns false: no turns; the turn calls below are empty.)
    auto turn_wait = [&] {
      if constexpr (Traits::kTurns) named_sync(kBarTurn + consumer, 256);
    };
    auto turn_pass = [&] {
      if constexpr (Traits::kTurns) named_arrive(kBarTurn + (consumer + 1) % kConsumers, 256);
    };
    if (Traits::kTurns && consumer == kConsumers - 1) named_arrive(kBarTurn, 256);
    auto release = [&](uint32_t bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };
    uint32_t sQt = sm.q;  // the current tile's Q buffer (then its O staging)
    bool q_pending = false;  // Q ring: the previous tile's buffer awaits its release
    // S = Q K^T of the stage's keys into acc: float[kBlockN / 2], or (kNarrowStep) of the
    // block's first kW keys into float[kW / 2] (its own array: S into a part of acc_s made
    // ptxas serialise the wgmmas, C7515).
    auto gemm_s = [&](auto& acc, int stage) {
      constexpr int kW = 2 * int(sizeof(acc) / sizeof(float));
      const uint32_t q_base = sQt + wg_row0 * kSwizzleBytes;
      const uint32_t k_base = sm.k + stage * Traits::kKVBytes;
      // (Traits::kDescAdvance: each k16 step's descriptors from these two.)
      [[maybe_unused]] uint64_t a0 = 0, b0 = 0;
      if constexpr (Traits::kDescAdvance) a0 = desc_k_major(q_base), b0 = desc_k_major(k_base);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const uint32_t col = (kk % 4) * 32;  // the k16 step's 32 bytes of the chunk row
        uint64_t a, b;
        if constexpr (Traits::kDescAdvance) {
          a = desc_advance(a0, (kk / 4) * Traits::kQChunkBytes + col);
          b = desc_advance(b0, (kk / 4) * Traits::kKVChunkBytes + col);
        } else {
          a = desc_k_major(q_base + (kk / 4) * Traits::kQChunkBytes + col);
          b = desc_k_major(k_base + (kk / 4) * Traits::kKVChunkBytes + col);
        }
        Wgmma<kW, Element>::template ss<0>(acc, a, b, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // O += P V over the stage's first kW keys (width: std::integral_constant<int, kW>; kBlockN,
    // or kNarrowStep's 32 / 64).
    auto gemm_o_w = [&](auto width, int stage) {
      constexpr int kW = decltype(width)::value;
      const uint32_t v_base = sm.v + stage * Traits::kKVBytes;
      [[maybe_unused]] uint64_t b0 = 0;
      if constexpr (Traits::kDescAdvance) b0 = desc_mn_major(v_base, Traits::kKVChunkBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kW / 16; ++kk) {
        uint64_t b;
        if constexpr (Traits::kDescAdvance)
          b = desc_advance(b0, kk * 16 * kSwizzleBytes);
        else
          b = desc_mn_major(v_base + kk * 16 * kSwizzleBytes, Traits::kKVChunkBytes);
        Wgmma<kHeadDim, Element>::template rs<1>(acc_o, rP[kk], b, 1);
      }
      wgmma_commit();
    };
    auto gemm_o = [&](int stage) { gemm_o_w(std::integral_constant<int, kBlockN>{}, stage); };

    int j = 0, t = 0;  // key steps and tiles of this CTA so far (as the producer counts)
    for (int walk = 0;; ++walk) {
      mbar_wait(sm.tile_full(walk), (walk >> 1) & 1);
      const Work w(sm.pub_slot(walk));
      release(sm.tile_empty(walk));
      if (w.end()) break;
      if (w.empty()) continue;
      // kStageO: this tile's O goes to its last stage (warpgroup 0: K, 1: V), whose release
      // by this warpgroup waits for the store; its Q is released after its last S. Before
      // its O stores each warpgroup waits for the other's reads of the buffer it writes:
      // warpgroup 1 arrives at kBarStageO after its last S, warpgroup 0 waits there in the
      // epilogue, then arrives at kBarStageO + 1, where warpgroup 1 waits (after its last
      // P V). In that order a warpgroup never arrives twice before the other's wait.
      // Stream-K (FwdArgs::sk_units): a piece of a tile split between two CTAs, at CTA
      // boundary `piece` (0: the whole tile; the epilogue merges the pieces).
      const int piece = p.num_splits == 1 ? w.split : 0;
      const bool hold = kStageO && p.num_splits == 1 && !piece && w.n_block_max > w.n_block_min;
      const int seqlen_q = w.seq.seqlen_q, seqlen_k = w.seq.seqlen_k;
      const int offset = seqlen_k - seqlen_q;
      const int row0_pos = w.m_block * kBlockM + lane_row;  // query position of row r = 0
      const int wg_first = w.m_block * kBlockM + wg_row0;
      const int wg_last = min(wg_first + 64, seqlen_q) - 1;
      // The tile's key blocks above this warpgroup's last row's (causal, a right window
      // bound; all of them for a warpgroup past seqlen_q) are passed with skip_step: no
      // MMAs, the turn and the stage releases of a step, so that the turns and the stages'
      // phases stay in step with the other warpgroups. (Blocks left of a warpgroup's window
      // run as masked steps: the loop bound stays the tile's, one register fewer.)
      int wg_hi = w.n_block_min;
      if (wg_first < seqlen_q)
        wg_hi = min(visible_key_blocks<kBlockN>(p, wg_first, wg_last, seqlen_k, offset).max,
                    w.n_block_max);
      // kNarrowStep: the keys of this warpgroup's first step, 32 or 64 where it sees none
      // past them in its first block (0: the whole block). 32 only with 80 / 112-key blocks
      // (d256 / d192: 2 of 5 / 7 causal diagonals); with 128 its code would serve tails and
      // windows only, the causal diagonal being at 64 or 128 keys.
      constexpr bool kNarrow32 = kBlockN < 128;
      int narrow = 0;
      if constexpr (kNarrowStep) {
        if (wg_hi > w.n_block_min) {
          const int col_hi = p.window_right >= 0
                                 ? min(seqlen_k - 1, wg_last + offset + p.window_right)
                                 : seqlen_k - 1;
          const int seen = col_hi - (wg_hi - 1) * kBlockN + 1;  // (from the block's first key)
          narrow = kNarrow32 && seen <= 32 ? 32 : seen <= 64 ? 64 : 0;
        }
      }
      FwdSoftmax<kBlockN, kMods, kBias> softmax(p, w.batch, w.head);
      softmax.reset();
#pragma unroll
      for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;

      // kBiasSmem: the warpgroup's 64 rows x 128 keys of the bias for key block n_block
      // into its tile of sBias, 8 16-byte cp.async per thread (consecutive threads take a
      // row's consecutive chunks), chunk c of row r at (c ^ r % 8) 16 bytes; rows past
      // seqlen_q and keys past seqlen_k are zero-filled (the global path's 0 there).
      const uint32_t sBias_wg = sm.bias + consumer * 64 * 256;
      auto bias_issue = [&](int n_block) {
        if constexpr (kBiasSmem) {
          const int tid_wg = tid % 128;
          const auto* plane = static_cast<const Element*>(softmax.mod.bias_plane);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int idx = tid_wg + 128 * i, row = idx / 16, chunk = idx % 16;
            const int query = wg_first + row, key = n_block * kBlockN + 8 * chunk;
            const int bytes = query < seqlen_q ? 2 * min(max(seqlen_k - key, 0), 8) : 0;
            const Element* src =
                bytes > 0 ? plane + int64_t(query) * softmax.mod.bias_row + key : plane;
            ptx::cp_async_16_bytes(sBias_wg + row * 256 + ((chunk ^ (row % 8)) * 16), src,
                                   bytes);
          }
          ptx::cp_async_commit();
        }
      };

      // -inf outside each row's visible keys in the step's columns from col0 (acc: S or, in
      // kNarrowStep's first step, its first columns).
      auto mask_step = [&](auto& acc, int col0) {
        int lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = row0_pos + 8 * r, base = col0 + 2 * q;
          hi[r] = (p.window_right >= 0 ? min(seqlen_k - 1, row + offset + p.window_right)
                                       : seqlen_k - 1) - base;
          lo[r] = (p.window_left >= 0 ? row + offset - p.window_left : 0) - base;
        }
        softmax.mask(acc, lo, hi);
      };
      // Mods, mask (only on blocks that need it) and online softmax of S (n_block).
      auto step_softmax = [&](float (&acc_s)[kBlockN / 2], int n_block, float (&correction)[2]) {
        const int col0 = n_block * kBlockN;
        if constexpr (kBiasSmem) {
          // This step's tile is in (every thread's copies, then the warpgroup's barrier);
          // after the reads, a second barrier frees the buffer for the next step's tile.
          ptx::cp_async_wait<0>();
          named_sync(kBarBias + consumer, 128);
          softmax.template apply_mods<Element, true>(
              acc_s, row0_pos + offset - col0 - 2 * q, row0_pos, col0 + 2 * q, seqlen_q,
              seqlen_k, sBias_wg + (16 * warp_in_wg + g) * 256 + 4 * q, uint32_t(g) << 4);
          named_sync(kBarBias + consumer, 128);
          if (n_block > w.n_block_min) bias_issue(n_block - 1);
        } else {
          softmax.template apply_mods<Element>(acc_s, row0_pos + offset - col0 - 2 * q, row0_pos,
                                               col0 + 2 * q, seqlen_q, seqlen_k);
        }
        const bool need_mask =
            col0 + kBlockN > seqlen_k ||
            (p.window_right >= 0 && col0 + kBlockN - 1 > wg_first + offset + p.window_right) ||
            (p.window_left >= 0 && col0 < wg_last + offset - p.window_left);
        if (need_mask) mask_step(acc_s, col0);
        softmax.online(acc_s, correction);
      };
      // kNarrowStep's first step: the mask and softmax of its columns (the block's others
      // are wholly masked; every such step needs the mask).
      // The narrow first step, from the MMA turn (taken) to P in registers; the block's
      // other columns are wholly masked, so every such step needs the mask.
      auto narrow_first = [&](auto width, int s, int n_block, float (&correction)[2]) {
        float acc_n[decltype(width)::value / 2];
        gemm_s(acc_n, s);
        turn_pass();
        wgmma_wait<0>();
        fence_regs(acc_n);
        release(sm.k_empty(s));  // (kStageO's hold never comes with kNarrowStep)
        mask_step(acc_n, n_block * kBlockN);
        softmax.online(acc_n, correction);
        FwdSoftmax<kBlockN, kMods, kBias>::template to_p<Element>(acc_n, rP);
      };
      auto rescale_o = [&](const float (&correction)[2]) {
#pragma unroll
        for (int dt = 0; dt < kHeadDim / 8; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_o[4 * dt + e] *= correction[e >> 1];
      };

      auto skip_step = [&](bool last) {
        const int s = j % kStages;
        const uint32_t phase = (j / kStages) & 1;
        mbar_wait(sm.k_full(s), phase);  // the stage holds this step's tiles: its release
        if (!(hold && last && consumer == 0)) release(sm.k_empty(s));  // counts toward this
        turn_wait();                                                     // step's phase
        turn_pass();
        mbar_wait(sm.v_full(s), phase);
        if (!(hold && last && consumer == 1)) release(sm.v_empty(s));
        ++j;
      };

      // Q ring: the previous tile's buffer is free once its O store has read it (each
      // warpgroup's store thread waits for its own store, then its warps release). Done
      // after this tile's first step, so that the wait is off the tile's start; the
      // producer needs the buffer only for the next tile's Q, near this one's end.
      const int qb = t % kQBufs;
      auto release_prev_q = [&] {
        if (kQBufs == 2 && q_pending) {
          if (store_thread) tma_store_wait_read();
          named_sync(kBarEpilogue + consumer, 128);
          release(sm.q_empty(qb ^ 1));
          q_pending = false;
        }
      };
      sQt = sm.q + qb * Traits::kQBytes;
      mbar_wait(sm.q_full(qb), (t++ / kQBufs) & 1);
      int n_block = w.n_block_max - 1;
      for (; n_block >= max(wg_hi, w.n_block_min); --n_block) skip_step(n_block == w.n_block_min);
      if (kBiasSmem && n_block >= w.n_block_min) bias_issue(n_block);
      if (n_block >= w.n_block_min) {
        float acc_s[kBlockN / 2];
        float correction[2];
        int s = j % kStages;
        mbar_wait(sm.k_full(s), (j / kStages) & 1);
        turn_wait();
        if (kNarrowStep && kNarrow32 && narrow == 32) {
          narrow_first(std::integral_constant<int, 32>{}, s, n_block, correction);
        } else if (kNarrowStep && narrow == 64) {
          narrow_first(std::integral_constant<int, 64>{}, s, n_block, correction);
        } else {
          gemm_s(acc_s, s);
          turn_pass();
          wgmma_wait<0>();
          fence_regs(acc_s);
          if (!(hold && consumer == 0 && n_block == w.n_block_min)) release(sm.k_empty(s));
          if (hold && n_block == w.n_block_min) release(sm.q_empty(0));  // (its last S is done)
          step_softmax(acc_s, n_block, correction);
          FwdSoftmax<kBlockN, kMods, kBias>::template to_p<Element>(acc_s, rP);
        }
        release_prev_q();
        for (--n_block; n_block >= w.n_block_min; --n_block) {
          const int s_prev = s;
          const uint32_t phase_prev = (j / kStages) & 1;
          s = ++j % kStages;
          mbar_wait(sm.k_full(s), (j / kStages) & 1);
          turn_wait();
          gemm_s(acc_s, s);
          // (Traits::kRescaleFirst: O, complete since the last step's wait, by the last
          // step's factor, under this S; then P V adds P_{j-1} V_{j-1} at the same scale.)
          if constexpr (Traits::kRescaleFirst) rescale_o(correction);
          mbar_wait(sm.v_full(s_prev), phase_prev);
          if (kNarrowStep && kNarrow32 && narrow == 32)
            gemm_o_w(std::integral_constant<int, 32>{}, s_prev);
          else if (kNarrowStep && narrow == 64)
            gemm_o_w(std::integral_constant<int, 64>{}, s_prev);
          else
            gemm_o(s_prev);
          narrow = 0;
          turn_pass();
          wgmma_wait<1>();
          fence_regs(acc_s);
          if (!(hold && consumer == 0 && n_block == w.n_block_min)) release(sm.k_empty(s));
          if (hold && n_block == w.n_block_min) release(sm.q_empty(0));
          step_softmax(acc_s, n_block, correction);
          wgmma_wait<0>();
          fence_regs(acc_o);
          release(sm.v_empty(s_prev));
          if constexpr (!Traits::kRescaleFirst) rescale_o(correction);
          FwdSoftmax<kBlockN, kMods, kBias>::template to_p<Element>(acc_s, rP);
        }
        if (hold && consumer == 1) named_arrive(kBarStageO, 256);  // (its last S is done)
        if constexpr (Traits::kRescaleFirst) rescale_o(correction);  // (by the last factor)
        mbar_wait(sm.v_full(s), (j / kStages) & 1);
        if (kNarrowStep && kNarrow32 && narrow == 32)
          gemm_o_w(std::integral_constant<int, 32>{}, s);
        else if (kNarrowStep && narrow == 64)
          gemm_o_w(std::integral_constant<int, 64>{}, s);
        else
          gemm_o(s);
        wgmma_wait<0>();
        fence_regs(acc_o);
        if (!(hold && consumer == 1)) release(sm.v_empty(s));
        ++j;
      } else {
        release_prev_q();
        if (hold) {
          release(sm.q_empty(0));
          if (consumer == 1) named_arrive(kBarStageO, 256);
        }
      }

      // ---- epilogue (fwd_epilogue.cuh) ----
      tile_epilogue<Traits, Element, kMods, kBias>(args, sm, w, softmax, acc_o, release,
                                                   q_pending, piece, hold, consumer, tid, lane,
                                                   warp_in_wg, wg_row0, row0_pos, wg_first, qb,
                                                   sQt, j, store_thread);
    }
    if (Traits::kTurns && consumer == 0) turn_wait();  // the turn the last consumer opened
    if (store_thread) tma_store_wait();
  }
#endif
}

}  // namespace sm90
}  // namespace flashattn2
