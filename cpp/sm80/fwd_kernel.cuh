// FlashAttention-2 forward (Dao 2023, Algorithm 1 with the split-Q work partition of §3.3).
//
// Tiling
//   grid   (ceil(seqlen_q / kBlockM), nheads, batch); m blocks are taken in reverse order so
//          the longest causal rows start first. KV variant: (ceil(seqlen_q * pack / kBlockM),
//          nheads / pack, batch * num_splits); with GQA packing (pack = nheads / nheads_k) tile
//          row m is query position m / pack of query head blockIdx.y * pack + m % pack, so a
//          CTA serves a whole group and reads each K/V tile once for it. Masks, LSE and O use
//          (head, position); each thread divides by pack once per row, in the prologue.
//   block  kNWarps warps; warp w owns query rows [16w, 16w + 16) of the tile and all kBlockN
//          columns of the current K/V tile, so row max / row sum are reduced inside a quad
//          (4 lanes) and warps never exchange softmax state.
//   smem   sQ [kBlockM x d] + 2 stages x (sK, sV) [kBlockN x d], 2-byte elements. Each tile
//          is stored as d/32 column segments of [rows x 32] elements (64-byte rows); the
//          16-byte chunk c of row r sits at chunk c ^ ((r / 2) % 4), so the 8 row addresses
//          of every ldmatrix and each 8-lane phase of a cp.async hit 8 distinct 16-byte bank
//          groups (conflict free); d16 tiles take one segment each and use its first 16
//          columns (smem_cols). Budget: fwd_smem_bytes() <= 96 KiB (fwd_config.h).
//   regs   per thread: acc_o [d/8][4] f32, acc_s [kBlockN/8][4] f32, P [kBlockN/16][4] b32,
//          Q [d/16][4] b32 when kQInRegs (d <= 128); 1 CTA of 256 threads per SM.
//   step   (K/V tiles visited from the last visible one down to the first)
//            wait for tile n (cp.async group) ; __syncthreads
//            issue cp.async of tile n-1 into the other stage (overlaps all math below);
//            paged: then read the block-table entries of this thread's rows of tile n-2
//            (one per row slot, used for K and V), landing during this step's math
//            S = Q K_n^T (mma.m16n8k16, K via ldmatrix) ; mask only if the tile needs it
//            online softmax in base 2 (one FFMA + ex2 per score) ; rescale acc_o (d > 64:
//            only when a row max grew by more than 2^8; bounded softcap: never)
//            acc_o += P V_n (P straight from the S accumulators, V via ldmatrix.trans)
//   epilogue  quad-reduce row sums, O = acc_o / sum, staged through sQ (own rows), written
//          with 16-byte stores; LSE = max * scale + ln(sum), +inf for rows that see no key.
//   mods   kMods instance only (softcap / ALiBi / dropout, score_mod.cuh): before the mask,
//          S becomes the base-2 logits (the softmax then uses scale 1); after the row
//          sums (LSE stays that of the undropped softmax), dropped P elements are zeroed;
//          the epilogue multiplies O by 1 / (1 - p). Dropout has its own instance (kMods).
//          An attention bias (FLASHATTN2_BIAS builds, flash.h BiasLayout) is one more pass
//          over S after the ALiBi one: x = fmaf(bias, log2 e, x), one load per score.
//   limits d multiple of 8, <= kHeadDim (16 or a multiple of 32); 16-byte aligned pointers
//          and strides a multiple of 8 elements (checked by the host API); ragged seqlen_q /
//          seqlen_k tails are zero-filled on load and masked.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/flash.h"
#include "sm80/fwd_config.h"
#include "common/ptx.cuh"
#include "common/score_mod.cuh"
#include "common/seqlen.cuh"
#include "sm80/tile.cuh"

namespace flashattn2 {

// kKv_: the KV-cache / decoding variant (fwd_config.h tile; paged K/V and split-KV).
template <int kHeadDim_, bool kKv_ = false>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kKv = kKv_;
  static constexpr FwdTile kTile = fwd_tile(kHeadDim, kKv);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kNWarps = kTile.n_warps;
  static constexpr int kMTiles = kTile.m_tiles;
  static constexpr bool kQInRegs = kTile.q_in_regs;
  static constexpr int kMinBlocks = kTile.min_blocks;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = fwd_smem_bytes(kHeadDim, kKv);
  static constexpr int kSmemCols = smem_cols(kHeadDim);  // elements per tile row in smem
  static constexpr bool kStage1InQ = fwd_stage1_in_q(kHeadDim, kKv);
  static_assert(kBlockM == 16 * kMTiles * kNWarps, "each warp owns 16 * kMTiles query rows");
  static_assert((kHeadDim % 32 == 0 || kHeadDim == 16) && kBlockN % 16 == 0, "tile shape");
};

// kMods (FwdMods): kModNone plain attention; kModLogits softcap / ALiBi; kModDropout those
// and dropout (its own instance: the Philox state spills the d128 tile's registers);
// kModBias / kModBiasDropout: kModLogits / kModDropout with an attention bias;
// kModSoftcap softcap alone (fwd_config.h fwd_softcap_instance), kModSoftcapBounded the same
// without a running max (fwd_softcap_bounded).
// Dropout and bias instances keep at most 2 CTAs per SM (fwd_config.h fwd_tile: d16 asks 3 for
// the others; the Philox state and bias addressing spilled 16-256 bytes at 168 registers).
template <typename Traits, int kMods>
constexpr int fwd_min_blocks() {
  constexpr bool kHeavy = kMods == kModDropout || kMods >= kModBias;
  return kHeavy && Traits::kMinBlocks > 2 ? 2 : Traits::kMinBlocks;
}

template <typename Traits, typename Element, int kMods>
__global__ void __launch_bounds__(Traits::kNThreads, (fwd_min_blocks<Traits, kMods>()))
    fwd_kernel(const FwdParams p) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kMTiles = Traits::kMTiles;  // m16 tiles per warp
  constexpr int kNTilesN = kBlockN / 8;     // n8 column tiles of S
  constexpr int kNTilesD = kHeadDim / 8;    // n8 column tiles of O
  constexpr int kKStepsD = kHeadDim / 16;   // k16 steps of Q K^T
  constexpr int kKStepsN = kBlockN / 16;    // k16 steps of P V

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* sQ = reinterpret_cast<Element*>(smem_raw);
  constexpr int kKVTile = kBlockN * Traits::kSmemCols;
  // Stage s holds K at sKVs and V at sKVs + kKVTile; stage 1 may live inside sQ.
  // (Selected with ?: rather than an array: a run-time index would put it in local memory.)
  Element* const sKV0 = sQ + kBlockM * Traits::kSmemCols;
  Element* const sKV1 = Traits::kStage1InQ ? sQ : sKV0 + 2 * kKVTile;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int m_block = gridDim.x - 1 - blockIdx.x;
  constexpr bool kKv = Traits::kKv;  // paged K/V, split-KV, GQA packing live only here
  // GQA packing (FwdParams::q_pack): tile row m is query position m / pack of query head
  // head0 + m % pack. pack = 1 (always in the plain kernel): row m is position m of head0.
  const int pack = kKv ? p.q_pack : 1;
  const int head0 = blockIdx.y * pack;
  const int split = kKv ? blockIdx.z % p.num_splits : 0;
  const int batch = kKv ? blockIdx.z / p.num_splits : blockIdx.z;
  const int head_k = head0 / (p.nheads / p.nheads_k);
  const int row0 = m_block * kBlockM;  // first (packed) row of the tile
  const SeqInfo seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int rows_q = seqlen_q * pack;
  if (row0 >= rows_q) return;  // varlen: the grid covers the longest sequence

  const Element* gQ = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                      head0 * p.q_head_stride + (seq.q_row0 + (kKv ? 0 : row0)) * p.q_row_stride;
  const KvRows<kKv> kv_rows(p, seq, batch);
  const Element* gK = kv_rows.base(static_cast<const Element*>(p.k) + head_k * p.k_head_stride,
                                   seq, p.k_batch_stride, p.k_row_stride);
  const Element* gV = kv_rows.base(static_cast<const Element*>(p.v) + head_k * p.v_head_stride,
                                   seq, p.v_batch_stride, p.v_row_stride);

  // Visible key range of this tile (bottom-right aligned window; see FwdParams), from the
  // first and last query positions of its rows.
  const int offset = seqlen_k - seqlen_q;
  const int i_first = row0 / pack;
  const int i_last = (min(row0 + kBlockM, rows_q) - 1) / pack;
  KeyBlocks blocks = visible_key_blocks<kBlockN>(p, i_first, i_last, seqlen_k, offset);
  if (kKv && p.num_splits > 1) blocks.take_split(split, p.num_splits);
  const int n_block_min = blocks.min, n_block_max = blocks.max;

  // Paged K/V: the pages of this thread's rows of the next K/V tile to load, read from the
  // block table one tile ahead (so the cp.async addresses do not wait on it), for K and V.
  using KvTileRows = TileThreadRows<kBlockN, kNThreads, copy_lanes(kHeadDim)>;
  int kv_page[KvTileRows::kSlots] = {};
  auto fetch_pages = [&](int n_block) {
    if constexpr (kKv) {
      kv_rows.template fetch_pages<KvTileRows>(p, n_block * kBlockN, seqlen_k, tid, kv_page);
    }
  };
  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    const int rows = seqlen_k - n0;
    Element* const sK = stage ? sKV1 : sKV0;
    if constexpr (!kKv) {  // dense rows: the one-base copy (tile.cuh load_tile)
      load_tile<kBlockN, kHeadDim, kNThreads>(sK, gK + int64_t(n0) * p.k_row_stride,
                                              p.k_row_stride, rows, p.headdim, tid);
      load_tile<kBlockN, kHeadDim, kNThreads>(sK + kKVTile, gV + int64_t(n0) * p.v_row_stride,
                                              p.v_row_stride, rows, p.headdim, tid);
      return;
    }
    load_tile_rows<kBlockN, kHeadDim, kNThreads>(
        sK,
        [&](int r, int slot) {
          return kv_rows(p, gK, p.k_batch_stride, p.k_row_stride, n0 + r, kv_page[slot]);
        },
        rows, p.headdim, tid);
    load_tile_rows<kBlockN, kHeadDim, kNThreads>(
        sK + kKVTile,
        [&](int r, int slot) {
          return kv_rows(p, gV, p.v_batch_stride, p.v_row_stride, n0 + r, kv_page[slot]);
        },
        rows, p.headdim, tid);
  };

  // Prologue: Q and the first K/V tile in one cp.async group.
  if (n_block_max > n_block_min) fetch_pages(n_block_max - 1);
  if constexpr (kKv) {
    load_tile_rows<kBlockM, kHeadDim, kNThreads>(
        sQ,
        [&](int r, int) {
          const int m = row0 + r;
          const int i = m / pack;
          return gQ + i * p.q_row_stride + (m - i * pack) * p.q_head_stride;
        },
        rows_q - row0, p.headdim, tid);
  } else {
    // (Not load_tile: its one-base copy, made for the backward's per-step copies, costs the
    // d128 forward 148 B of spills through the register allocation of this one-off copy.)
    load_tile_rows<kBlockM, kHeadDim, kNThreads>(
        sQ, [&](int r, int) { return gQ + r * p.q_row_stride; }, seqlen_q - row0, p.headdim, tid);
  }
  if (n_block_max > n_block_min) {
    load_kv(n_block_max - 1, 0);
    if (n_block_max - 1 > n_block_min) fetch_pages(n_block_max - 2);
  }
  ptx::cp_async_commit();

  // Fragment coordinates: in m16 tile mt, the lane owns rows g and g + 8, columns 2q, 2q+1.
  const int g = lane / 4;
  const int q = lane % 4;
  const int warp_row0 = warp * 16 * kMTiles;
  // ldmatrix addresses (see ptx.cuh). A operand (Q) and V (.trans): lane gives row
  // lane % 16 and chunk lane / 16 of a 16x16 block; K: row 8 * (lane / 16) + lane % 8 and
  // chunk (lane / 8) % 2. Block (row r0, chunk 2k) then sits at
  //   base[k % 2] + (k / 2) * segment + r0 * 64 bytes,
  // with r0 a multiple of 8 (so the swizzle of the lane's row does not change) and
  // base[j] the lane's own offset for chunk parity j: two registers per operand.
  const uint32_t sQ_addr = ptx::smem_addr(sQ);
  const uint32_t stage0_addr = ptx::smem_addr(sKV0);
  const uint32_t stage1_addr = ptx::smem_addr(sKV1);
  uint32_t q_base[2], k_base[2], v_base[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    q_base[j] = sQ_addr + 2 * swizzle<kBlockM>(warp_row0 + (lane & 15), 2 * j + (lane >> 4));
    k_base[j] = 2 * swizzle<kBlockN>(((lane >> 4) << 3) + (lane & 7), 2 * j + ((lane >> 3) & 1));
    v_base[j] = 2 * swizzle<kBlockN>(lane & 15, 2 * j + (lane >> 4)) + 2 * kKVTile;
  }
  constexpr uint32_t kQSegBytes = kBlockM * 32 * 2;   // one 32-column segment of sQ
  constexpr uint32_t kKVSegBytes = kBlockN * 32 * 2;  // one 32-column segment of sK / sV
  constexpr uint32_t kRow16Bytes = 16 * 32 * 2;       // 16 rows of a segment
  auto q_addr = [&](int mt, int kk) {
    return q_base[kk % 2] + (kk / 2) * kQSegBytes + mt * kRow16Bytes;
  };

  // With score mods, S holds the base-2 logits x = fmaf(capped(s), mult, bias) (ScoreMod)
  // where there is an ALiBi bias: softmax scale 1 and LSE = max * ln(2) + ln(sum). Without
  // one, S holds capped(s) and mult is the softmax scale (exp2(mult (t - max)), the row max
  // of t): one FMUL per score less (a softcap costs FMUL + tanh per score then).
  constexpr bool kBounded = kMods == kModSoftcapBounded;
  constexpr bool kSoftcapOnly = kMods == kModSoftcap || kBounded;
  constexpr float kLog2e = 1.4426950408889634f;
  // The instances that take an attention bias (FLASHATTN2_BIAS builds; BiasLayout).
  constexpr bool kBias = kMods == kModBias || kMods == kModBiasDropout;
  ScoreMod mod;  // (ALiBi and dropout run with pack = 1: head0 is the head)
  if constexpr (kMods) mod = ScoreMod(p, batch, head0);
  if constexpr (kBias) mod.init_bias(p, batch, head0);
  float scale_log2 = p.softmax_scale * kLog2e, lse_scale = p.softmax_scale;
  if constexpr (kMods) {
    scale_log2 = !kSoftcapOnly && (mod.slope_log2 != 0.f || (kBias && mod.has_bias()))
                     ? 1.f : mod.mult();
    lse_scale = scale_log2 * 0.6931471805599453f;
  }
  constexpr bool kDropout = kMods == kModDropout || kMods == kModBiasDropout;
  // Query position of the lane's row r of m16 tile mt. Packed: one division per row and CTA,
  // kept in registers; plain: the row itself, recomputed where used.
  int lane_pos_kv[kKv ? kMTiles : 1][2];
  if constexpr (kKv) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        lane_pos_kv[mt][r] = (row0 + warp_row0 + 16 * mt + g + 8 * r) / pack;
  }
  auto lane_pos = [&](int mt, int r) {
    if constexpr (kKv) return lane_pos_kv[mt][r];
    return row0 + warp_row0 + 16 * mt + g + 8 * r;
  };
  constexpr bool kLazy = fwd_lazy_rescale(kHeadDim);
  float acc_o[kMTiles][kNTilesD][4];
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < kNTilesD; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][i][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[mt][r] = kBounded ? 0.f : -INFINITY;
      row_sum[mt][r] = 0.f;
    }
  }
  uint32_t rQ[Traits::kQInRegs ? kMTiles : 1][Traits::kQInRegs ? kKStepsD : 1][4];

  // One mainloop step on the K/V tile in `stage`; kMask applies the per-element mask.
  auto step = [&](auto mask_tag, int n_block, int stage) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const uint32_t stage_addr = stage ? stage1_addr : stage0_addr;

    // S = Q K^T; each K fragment feeds the kMTiles m16 tiles of the warp.
    float acc_s[kMTiles][kNTilesN][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int i = 0; i < kNTilesN; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][i][e] = 0.f;
    // The A fragments of k16 step kk for the kMTiles m16 tiles, and one k16 step of column
    // tiles 2nn, 2nn+1 with them.
    auto q_frags = [&](int kk, uint32_t (&a)[kMTiles][4]) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (Traits::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = rQ[mt][kk][e];
        } else {
          ptx::ldmatrix_x4(a[mt], q_addr(mt, kk));
        }
      }
    };
    auto qk = [&](int kk, int nn, const uint32_t (&a)[kMTiles][4]) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, stage_addr + k_base[kk % 2] + (kk / 2) * kKVSegBytes + nn * kRow16Bytes);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_16816<Element>(acc_s[mt][2 * nn], a[mt], b[0], b[1]);
        ptx::mma_16816<Element>(acc_s[mt][2 * nn + 1], a[mt], b[2], b[3]);
      }
    };
    if constexpr (kSoftcapOnly) {
      // Column tiles outermost (Q in registers, so no fragment is loaded twice): S tiles
      // 2nn, 2nn+1 are final after iteration nn, so their tanh overlaps the later MMAs.
      static_assert(Traits::kQInRegs, "kModSoftcap(Bounded) reads Q fragments from registers");
#pragma unroll
      for (int nn = 0; nn < kNTilesN / 2; ++nn)
#pragma unroll
        for (int kk = 0; kk < kKStepsD; ++kk) {
          uint32_t a[kMTiles][4];
          q_frags(kk, a);
          qk(kk, nn, a);
        }
    } else {
#pragma unroll
      for (int kk = 0; kk < kKStepsD; ++kk) {
        uint32_t a[kMTiles][4];
        q_frags(kk, a);
#pragma unroll
        for (int nn = 0; nn < kNTilesN / 2; ++nn) qk(kk, nn, a);
      }
    }

    if constexpr (kMods) {
      // S -> base-2 logits (ScoreMod::logit2 as passes over the tile, so that the uniform
      // branches stay outside the loops); before the mask, which then sets -inf. The tanh
      // argument is the f32 score times softmax_scale / softcap, as the backward recomputes
      // it (a Q pre-scaled and rounded to the input type saved one FMUL per score, but gave
      // other capped scores than the backward's: dK lost precision, benchmarks/NOTES.md).
      if (kSoftcapOnly || mod.softcap > 0.f) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = mod.capped(acc_s[mt][nt][e]);
      }
      if (!kSoftcapOnly && mod.slope_log2 != 0.f) {
        const float mult = mod.mult();
        // dist = row + offset - col = dist0 + 16 mt + 8 r - 8 nt - (e & 1).
        const float dist0 = float(row0 + warp_row0 + g + offset - n_block * kBlockN - 2 * q);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              acc_s[mt][nt][e] = fmaf(acc_s[mt][nt][e], mult,
                                      mod.bias(dist0 + float(16 * mt + 8 * (e >> 1) - 8 * nt - (e & 1))));
      }  // (else: mult is scale_log2)
      if constexpr (kBias) {
        if (mod.has_bias()) {
          // + bias (BiasLayout), after S became logits (above with ALiBi, here without),
          // in the order of the backward's recomputation: fmaf(bias, log2 e, logit).
          const float mult = mod.slope_log2 != 0.f ? 1.f : mod.mult();
          const int col0 = n_block * kBlockN + 2 * q;
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int i = lane_pos(mt, e >> 1), j = col0 + 8 * nt + (e & 1);
                const float b =
                    i < seqlen_q && j < seqlen_k ? mod.template bias_at<Element>(i, j) : 0.f;
                acc_s[mt][nt][e] = fmaf(b, kLog2e, acc_s[mt][nt][e] * mult);
              }
        }
      }
    }

    if constexpr (kMask) {
      // Visible columns of each of the lane's rows (bounds computed here, on the few
      // masked tiles, rather than kept live in registers across the mainloop).
      const int col0 = n_block * kBlockN + 2 * q;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = lane_pos(mt, r);
          const int col_hi = p.window_right >= 0
                                 ? min(seqlen_k - 1, row + offset + p.window_right)
                                 : seqlen_k - 1;
          const int col_lo = p.window_left >= 0 ? row + offset - p.window_left : 0;
#pragma unroll
          for (int nt = 0; nt < kNTilesN; ++nt)
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const int col = col0 + nt * 8 + (e & 1);
              if (col < col_lo || col > col_hi) acc_s[mt][nt][e] = -INFINITY;
            }
        }
    }

    // Online softmax (base 2), per row: the max over the quad; O and the sum rescaled to it;
    // p and the row sum (per thread until the epilogue). Max and sum are trees over the
    // lane's kNTilesN column pairs, not serial chains: with 2 warps per scheduler a chain of
    // dependent FMNMX / FADD is a visible stall. Two forms skip work (fwd_config.h):
    //   kLazy     a row keeps its max unless the tile's exceeds it by more than
    //             kLazyRescaleLog2 (so p <= 2^8): O is rescaled only when a row of the warp
    //             moved, rarely after the first tiles (a warp vote between max and exps);
    //   kBounded  no max: the reference stays 0 and p = exp2(scale_log2 t), |t| <= 1.
    auto tile_max = [&](int mt, int r) {
      float part[kNTilesN];
#pragma unroll
      for (int nt = 0; nt < kNTilesN; ++nt)
        part[nt] = fmaxf(acc_s[mt][nt][2 * r], acc_s[mt][nt][2 * r + 1]);
#pragma unroll
      for (int width = kNTilesN / 2; width > 0; width /= 2)
#pragma unroll
        for (int i = 0; i < width; ++i) part[i] = fmaxf(part[i], part[i + width]);
      float m = fmaxf(row_max[mt][r], part[0]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
      return fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
    };
    // O rescaled to a new row max m, whose scaled value is max_scaled; returns the correction.
    auto rescale = [&](int mt, int r, float m, float max_scaled) {
      const float correction = ptx::exp2_approx(row_max[mt][r] * scale_log2 - max_scaled);
      row_max[mt][r] = m;
#pragma unroll
      for (int dt = 0; dt < kNTilesD; ++dt) {
        acc_o[mt][dt][2 * r] *= correction;
        acc_o[mt][dt][2 * r + 1] *= correction;
      }
      return correction;
    };
    // A row that has seen only masked scores keeps max -inf: use 0 so -inf - -inf never
    // happens (its p and correction are then exp2(-inf) = 0).
    auto scaled = [&](float m) { return m == -INFINITY ? 0.f : m * scale_log2; };
    // p in place; returns the lane's part of the row sum.
    auto exps = [&](int mt, int r, float max_scaled) {
      float part[kNTilesN];
#pragma unroll
      for (int nt = 0; nt < kNTilesN; ++nt) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e)
          acc_s[mt][nt][e] = ptx::exp2_approx(fmaf(acc_s[mt][nt][e], scale_log2, -max_scaled));
        part[nt] = acc_s[mt][nt][2 * r] + acc_s[mt][nt][2 * r + 1];
      }
#pragma unroll
      for (int width = kNTilesN / 2; width > 0; width /= 2)
#pragma unroll
        for (int i = 0; i < width; ++i) part[i] += part[i + width];
      return part[0];
    };
    if constexpr (kLazy) {
      float mx[kMTiles][2];
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[mt][r] = tile_max(mt, r);
          // (-inf - -inf is NaN: a row with only masked scores so far does not ask.)
          grow |= (mx[mt][r] - row_max[mt][r]) * scale_log2 > kLazyRescaleLog2;
        }
      if (__any_sync(0xffffffff, grow)) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            row_sum[mt][r] *= rescale(mt, r, mx[mt][r], scaled(mx[mt][r]));
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kBounded) {
          row_sum[mt][r] += exps(mt, r, 0.f);
        } else if constexpr (kLazy) {
          row_sum[mt][r] += exps(mt, r, scaled(row_max[mt][r]));
        } else {
          const float m = tile_max(mt, r), max_scaled = scaled(m);
          const float correction = rescale(mt, r, m, max_scaled);
          row_sum[mt][r] = row_sum[mt][r] * correction + exps(mt, r, max_scaled);
        }
      }

    if constexpr (kDropout) {
      if (mod.threshold) {
        // Dropout on P (after the row sums): Philox group {R, R+8} x {C, C+8} is
        // acc_s[mt][2nn][e01] (.x), [2nn+1][e01] (.y), [2nn][e01+2] (.z), [2nn+1][e01+2] (.w).
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nn = 0; nn < kNTilesN / 2; ++nn)
#pragma unroll
            for (int e01 = 0; e01 < 2; ++e01) {
              const uint4 w = mod.dropout_words(row0 + warp_row0 + 16 * mt + g,
                                                n_block * kBlockN + 16 * nn + 2 * q + e01);
              float* lo = acc_s[mt][2 * nn];
              float* hi = acc_s[mt][2 * nn + 1];
              if (w.x < mod.threshold) lo[e01] = 0.f;
              if (w.y < mod.threshold) hi[e01] = 0.f;
              if (w.z < mod.threshold) lo[e01 + 2] = 0.f;
              if (w.w < mod.threshold) hi[e01 + 2] = 0.f;
            }
      }
    }

    // acc_o += P V, P converted in registers to A fragments (C layout of n8 tiles 2k, 2k+1);
    // each V fragment feeds the kMTiles m16 tiles of the warp.
#pragma unroll
    for (int kk = 0; kk < kKStepsN; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ptx::acc_to_a<Element>(pa[mt], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
#pragma unroll
      for (int dd = 0; dd < kKStepsD; ++dd) {
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, stage_addr + v_base[dd % 2] + (dd / 2) * kKVSegBytes + kk * kRow16Bytes);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ptx::mma_16816<Element>(acc_o[mt][2 * dd], pa[mt], b[0], b[1]);
          ptx::mma_16816<Element>(acc_o[mt][2 * dd + 1], pa[mt], b[2], b[3]);
        }
      }
    }
  };

  for (int n_block = n_block_max - 1, stage = 0; n_block >= n_block_min; --n_block, stage ^= 1) {
    // Tile n_block has landed in `stage`, and every warp is done with the other stage.
    ptx::cp_async_wait<0>();
    __syncthreads();
    if constexpr (Traits::kQInRegs) {
      if (n_block == n_block_max - 1) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < kKStepsD; ++kk) ptx::ldmatrix_x4(rQ[mt][kk], q_addr(mt, kk));
        // Stage 1 overwrites sQ: every warp must hold its Q fragments first (once per CTA).
        if constexpr (Traits::kStage1InQ) __syncthreads();
      }
    }
    if (n_block > n_block_min) {
      load_kv(n_block - 1, stage ^ 1);
      if (n_block - 1 > n_block_min) fetch_pages(n_block - 2);  // lands during this step
    }
    ptx::cp_async_commit();
    const int col0 = n_block * kBlockN;
    const bool need_mask = col0 + kBlockN > seqlen_k ||
                           (p.window_right >= 0 && col0 + kBlockN - 1 > i_first + offset + p.window_right) ||
                           (p.window_left >= 0 && col0 < i_last + offset - p.window_left);
    if (need_mask) {
      step(std::true_type{}, n_block, stage);
    } else {
      step(std::false_type{}, n_block, stage);
    }
  }

  // Epilogue. Q may still be in flight when no K/V tile was visible: drain before reusing sQ.
  ptx::cp_async_wait<0>();
  __syncthreads();
  const SeqInfo seq_out(p, batch);  // re-read, not kept live across the mainloop
  const int row0_out = kKv ? (gridDim.x - 1 - blockIdx.x) * kBlockM : row0;  // (the same)
  // Row sums reduced over the quad, and the factor of O: 1 / sum (times 1 / (1 - p) with
  // dropout); sum == 0: the row saw no key (O = 0). NaN inputs propagate to O and LSE.
  float inv[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = row_sum[mt][r];
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      row_sum[mt][r] = sum;
      inv[mt][r] = sum == 0.f ? 0.f : (kDropout ? p.dropout_scale : 1.f) / sum;
    }
  if (kKv && p.num_splits > 1) {
    // Split-KV: this split's O (normalised by its own sum) and LSE, float32, straight from
    // the accumulators, at (query head, position) of each row; a split that saw no key
    // writes O = 0, LSE = -inf.
    const int64_t bh0 = (int64_t(split) * p.batch + batch) * p.nheads + head0;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = row_sum[mt][r];
        const int row = row0_out + warp_row0 + 16 * mt + g + 8 * r;
        if (row < seq_out.seqlen_q * pack) {
          const int i = lane_pos(mt, r);
          const int64_t q_idx = (bh0 + (row - i * pack)) * p.seqlen_q + i;
          float* gO = p.o_accum + q_idx * p.headdim;
#pragma unroll
          for (int dt = 0; dt < kNTilesD; ++dt) {
            const int col = dt * 8 + 2 * q;
            if (col < p.headdim) {
              *reinterpret_cast<float2*>(gO + col) =
                  make_float2(acc_o[mt][dt][0 + 2 * r] * inv[mt][r], acc_o[mt][dt][1 + 2 * r] * inv[mt][r]);
            }
          }
          if (q == 0) {
            p.lse_accum[q_idx] = sum == 0.f ? -INFINITY : row_max[mt][r] * lse_scale + logf(sum);
          }
        }
      }
    return;
  }
  float* gLse = p.lse + batch * p.lse_batch_stride + head0 * p.lse_head_stride + seq_out.q_row0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = row_sum[mt][r];  // 0: LSE = +inf
      const int row_local = warp_row0 + 16 * mt + g + 8 * r;
#pragma unroll
      for (int dt = 0; dt < kNTilesD; ++dt) {
        *reinterpret_cast<uint32_t*>(sQ + swizzle<kBlockM>(row_local, dt) + 2 * q) =
            ptx::pack2<Element>(acc_o[mt][dt][2 * r] * inv[mt][r], acc_o[mt][dt][2 * r + 1] * inv[mt][r]);
      }
      const int row = row0_out + row_local;
      if (q == 0 && row < seq_out.seqlen_q * pack) {
        const int i = lane_pos(mt, r);
        gLse[(row - i * pack) * p.lse_head_stride + i] =
            sum == 0.f ? INFINITY : row_max[mt][r] * lse_scale + logf(sum);
      }
    }
  __syncthreads();
  Element* gO = static_cast<Element*>(p.o) + batch * p.o_batch_stride + head0 * p.o_head_stride +
                (seq_out.q_row0 + (kKv ? 0 : row0)) * p.o_row_stride;
  if constexpr (kKv) {
    store_tile_rows<kBlockM, kHeadDim, kNThreads>(
        [&](int r) {
          const int m = row0_out + r;
          const int i = m / pack;
          return gO + i * p.o_row_stride + (m - i * pack) * p.o_head_stride;
        },
        sQ, seq_out.seqlen_q * pack - row0_out, p.headdim, tid);
  } else {
    store_tile<kBlockM, kHeadDim, kNThreads>(gO, sQ, p.o_row_stride, seq_out.seqlen_q - row0,
                                             p.headdim, tid);
  }
}

}  // namespace flashattn2
