// Decode forward: few query rows (seqlen_q * q_pack <= 16) against a long K/V range, at the
// memory floor (issue 20). Same math as fwd_kernel.cuh's KV variant (FlashAttention-2 online
// softmax), but the work split is over keys, not query rows.
//
// Tiling
//   grid   (num_splits, nheads / pack, batch); pack = FwdParams::q_pack. The CTA serves query
//          head group blockIdx.y (heads head0 .. head0 + pack - 1, one KV head) of one batch
//          entry: tile row m is query position m / pack of head head0 + m % pack, rows
//          >= seqlen_q * pack are zero padding (never stored). Split s takes its share of
//          the visible 16-key tiles, as the KV kernel's splits do (and writes the same
//          o_accum / lse_accum rows, so launch_combine merges them unchanged).
//   block  kNWarps = 4 warps (kDecodeWarps; or 2, kDecodeSmallWarps, for a grid of many CTAs),
//          all on the same 16 query rows; the CTA's key tiles are dealt round-robin to the
//          warps (warp w: tiles n_max - 1 - w - kNWarps j, j = 0, 1, ..),
//          each warp keeping its own online-softmax state (row max, row sum, acc_o [16 x d])
//          for the lane's rows g, g + 8 (g = lane / 4), merged by LSE in the epilogue.
//   smem   sQ [16 x d], then per warp a ring of kStages (d128: 3, d64: 4) stages of
//          (sK, sV) [16 x d], 2-byte elements, in tile.cuh's swizzled layout (conflict-free
//          ldmatrix and cp.async); decode_smem_bytes(): d128 100 KiB (2 CTAs per SM, so
//          8 warps x 2 tiles x 8 KiB = 128 KiB of K/V in flight per SM), d64 66 KiB
//          (3 CTAs, 144 KiB in flight).
//   regs   per thread: rQ [d/16][4] b32 (Q fragments, loaded once), acc_o [d/8][4] f32,
//          acc_s [2][4] f32; block-table entries of 32 steps' tiles, 2 a lane (and the next
//          32's). ptxas (sm_90a): d128 211-213 (kFullRows 223-225), d64 136-138 registers, no
//          spills (bound by shared memory, not registers).
//   copy   DecodeCopyRows: by default lane l copies rows l / 4 and l / 4 + 8 of a K or V tile
//          (16-byte chunks l % 4 + 4 m; the layout of load_tile_rows<16, d, 32>); kFullRows
//          (d128 where a CTA reads >= 512 keys, decode_full_rows): 16 lanes a 256-byte row,
//          rows l / 16 + 2 s for slots s < 8, so that a warp instruction reads whole rows. One
//          64-bit tile address per tile and tensor, then a 32-bit step per row slot
//          (copy_rows; a tile that crosses a page end or the keys' end selects per slot); each
//          cp.async hints L2 to fetch the row's whole 2d-byte segment (LDGSTS ... LTC256B at
//          d128).
//   step   (per warp, no CTA barrier in the loop)
//            __syncwarp (every lane is done with the stage tile j - 1 used) ; issue the
//            cp.async of tile j + kStages - 1 into it (its block-table entries shuffled from
//            the lane that read them up to 32 steps before) ; cp.async.wait_group (tile j
//            landed for this lane) ; __syncwarp (for all lanes): kStages - 1 tiles in flight
//            through the wait
//            S = Q K_j^T (16 x 16: d/16 k-steps x 2 HMMA, in 4 chains a column tile) ; mods ;
//            mask if the tile needs it
//            online softmax in base 2 against a lazy row max (moved, and acc_o rescaled, only
//            when a P would pass 2^8) ; acc_o += P V_j (d/8 HMMA)
//   epilogue  each warp publishes its rows' scaled max m_w and sum l_w (sM, sL) and, after a
//          barrier, acc_o * exp2(m_w - M) / L of its query rows (< seqlen_q * pack) to
//          sO [kNWarps][16][d + 8] f32 (reusing the rings;
//          M = max_w m_w, L = sum_w l_w exp2(m_w - M): lse_merge.cuh's math in base 2); the
//          threads then sum the kNWarps warps' rows 4 columns at a time and store O (or the
//          split's float32 partial) and LSE = M ln 2 + ln L (+inf / -inf for a row that saw
//          no key, as the KV kernel).
//   mods   kModLogits: softcap and ALiBi (q_pack = 1 with ALiBi) as fwd_kernel.cuh does.
//   limits decode_supports() (decode_config.h): kernel head dim 64 / 128 (real head dims
//          multiples of 8 below it are zero-padded on load), no varlen, dropout or bias;
//          16-byte aligned pointers and strides that are multiples of 8 elements.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/score_mod.cuh"
#include "common/seqlen.cuh"
#include "sm80/decode_config.h"
#include "sm80/tile.cuh"

namespace flashattn2 {

// The lanes of a warp's K / V tile copy: kLanesPerRow lanes a row (16-byte chunks lane %
// kLanesPerRow + kLanesPerRow m), so a warp instruction covers kRowsPerOp rows, and each lane
// has kSlots rows (slot s: row lane / kLanesPerRow + kRowsPerOp s; each with its page, picked
// from the tile's two block-table entries). Default 4 lanes a row (8 rows x 64 bytes an
// instruction, 2 slots); kFullRows: a whole row a lane group (d128: 2 rows x 256 bytes, 8
// slots), which streams faster but costs more address math (decode_full_rows).
template <int kRows, int kHeadDim, bool kFullRows>
struct DecodeCopyRows {
  static constexpr int kLanesPerRow = kFullRows ? kHeadDim / 8 : 4;
  static constexpr int kRowsPerOp = 32 / kLanesPerRow;
  static constexpr int kSlots = kRows / kRowsPerOp;
  static constexpr int kChunks = kHeadDim / 8 / kLanesPerRow;  // per lane and row
  static_assert(kLanesPerRow % 4 == 0 && 32 % kLanesPerRow == 0 && kRows % kRowsPerOp == 0,
                "copy layout");
  __device__ __forceinline__ static int row(int slot, int lane) {
    return lane / kLanesPerRow + kRowsPerOp * slot;
  }
  __device__ __forceinline__ static int chunk(int lane) { return lane % kLanesPerRow; }
};

template <int kHeadDim_, int kNWarps_ = kDecodeWarps>
struct DecodeTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kDecodeRows;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = 32 * kNWarps;
  static constexpr int kBlockN = kDecodeBlockN;
  static constexpr int kStages = decode_stages(kHeadDim);
  static constexpr int kSmemBytes = decode_smem_bytes(kHeadDim, kNWarps);
  static constexpr int kMinBlocks = decode_ctas_per_sm(kHeadDim, kNWarps);
  static constexpr int kORow = kHeadDim + 8;  // sO row stride in floats (2-way conflicts)
  static_assert(kHeadDim % 32 == 0 && kBlockN == 16, "tile shape");
  static_assert(4 * (kNWarps * kRows * kORow + 2 * kNWarps * kRows) <=
                    2 * kNWarps * kStages * 2 * kBlockN * kHeadDim,
                "the epilogue's sO, sM, sL must fit the K/V rings");
};

// kMods: kModNone or kModLogits (softcap / ALiBi); kFullRows: DecodeCopyRows' layout.
template <typename Traits, typename Element, int kMods, bool kFullRows>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocks)
    decode_kernel(const FwdParams p) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kRows = Traits::kRows;
  constexpr int kNWarps = Traits::kNWarps;
  constexpr int kNThreads = Traits::kNThreads;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kNTilesD = kHeadDim / 8;   // n8 column tiles of O
  constexpr int kKStepsD = kHeadDim / 16;  // k16 steps of Q K^T
  constexpr int kTile = kBlockN * kHeadDim;               // elements of one sK or sV
  constexpr uint32_t kStageBytes = 2 * kTile * 2;         // sK + sV
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int kQkChains = 4;  // Q K^T accumulator chains a column tile (step)
  constexpr float kRescaleSlack = 8.f;  // log2 of the largest P before row_max moves

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Element* const sQ = reinterpret_cast<Element*>(smem_raw);
  Element* const sKV = sQ + kRows * kHeadDim;
  // The split-KV combine after this grid (common/combine_kernel.cuh) may launch now: its
  // blocks wait for this grid's end on the SMs, so its launch latency is spent meanwhile.
  ptx::griddep_launch_dependents();

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int pack = p.q_pack;
  const int split = blockIdx.x;
  const int head0 = blockIdx.y * pack;
  const int batch = blockIdx.z;
  // q_pack is 1 or the group size (flash_api.cpp): a packed CTA serves its KV head's group;
  // unpacked, nheads = gridDim.y <= 65535 (small_div's range).
  const int head_k =
      pack > 1 ? int(blockIdx.y) : small_div(blockIdx.y, small_div(p.nheads, p.nheads_k));
  const SeqInfo seq(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k;
  const int rows_q = seqlen_q * pack;  // <= kRows (decode_supports)

  // Visible 16-key tiles of the CTA's rows (positions 0 .. seqlen_q - 1), bottom-right
  // aligned window, then this split's share (the KV kernel's formula in 16-key tiles).
  const int offset = seqlen_k - seqlen_q;
  KeyBlocks blocks = visible_key_blocks<kBlockN>(p, 0, seqlen_q - 1, seqlen_k, offset);
  blocks.min = min(blocks.min, blocks.max);
  if (p.num_splits > 1) blocks.take_split(split, p.num_splits);
  const int n_min = blocks.min, n_max = blocks.max;
  // This warp's tiles: n_max - 1 - warp - kNWarps * j for j < n_mine.
  const int n_mine = (n_max - n_min - warp + kNWarps - 1) / kNWarps;
  auto tile_of = [&](int j) { return n_max - 1 - warp - kNWarps * j; };

  const Element* gQ = static_cast<const Element*>(p.q) + batch * p.q_batch_stride +
                      head0 * p.q_head_stride + seq.q_row0 * p.q_row_stride;
  const KvRows<true> kv_rows(p, seq, batch);
  const Element* gK = kv_rows.base(static_cast<const Element*>(p.k) + head_k * p.k_head_stride,
                                   seq, p.k_batch_stride, p.k_row_stride);
  const Element* gV = kv_rows.base(static_cast<const Element*>(p.v) + head_k * p.v_head_stride,
                                   seq, p.v_batch_stride, p.v_row_stride);

  // The warp's K/V copies: 16 rows x d per tile in DecodeCopyRows' lane layout (default: lane l
  // copies rows l / 4 and l / 4 + 8, two row slots).
  using WarpRows = DecodeCopyRows<kBlockN, kHeadDim, kFullRows>;
  Element* const sRing = sKV + warp * kStages * 2 * kTile;
  // A 16-key tile's rows lie on at most 2 pages (page_size >= 16): the block-table entries of
  // its first and last visible rows (e[0], e[1]; dense: both stay 0).
  auto fetch_pages = [&](int j, int (&e)[2]) {
    if (j < n_mine && kv_rows.pages) {
      const int n0 = tile_of(j) * kBlockN;
      const int last = min(n0 + kBlockN - 1, seqlen_k - 1);
      e[0] = kv_rows.pages[(kv_rows.row0 + n0) >> p.page_size_log2];
      e[1] = kv_rows.pages[(kv_rows.row0 + last) >> p.page_size_log2];
    }
  };
  // The lane's slot-s row lies kRowsPerOp s rows below its slot-0 row: 32-bit element offsets
  // from the tile's row 0 (decode_supports keeps 16 rows of either stride below 2^31
  // elements). lane_off: the lane's slot-0 row and first chunk.
  const int lane_col = 8 * WarpRows::chunk(lane);
  const int k_lane_off = WarpRows::row(0, lane) * int(p.k_row_stride) + lane_col;
  const int v_lane_off = WarpRows::row(0, lane) * int(p.v_row_stride) + lane_col;
  const int k_slot_step = WarpRows::kRowsPerOp * int(p.k_row_stride);
  const int v_slot_step = WarpRows::kRowsPerOp * int(p.v_row_stride);
  const int page_mask = kv_rows.pages ? (1 << p.page_size_log2) - 1 : -1;
  const int last_page = max(p.num_pages - 1, 0);  // (dense: 0, and the entries stay 0)
  // Rows n0 .. n0 + 15 of K or V into sX, in the swizzled layout (lane l: the rows of its
  // slots, 16-byte chunks l % kL + kL m; zero fill past the keys and the head dim). The 64-bit
  // math runs once per tile and tensor: a0, the address of the tile's row 0 (on page e[0]).
  // A whole tile on one page (dense: always; paged: unless it crosses a page end) then costs
  // one 32-bit step a row slot; the last tile of a range, or one that crosses a page end
  // (left padding, a cache offset), also takes a1, where row 0 would lie were it on page
  // e[1], and a select per slot. Each copy hints L2 to fetch the row's whole d x 2-byte
  // segment (one DRAM access per head row rather than one per 64 bytes with the default
  // layout; the H100 lost 1-5 % without it, the H200 5-11 %).
  constexpr int kPrefetch = kHeadDim * 2 >= 256 ? 256 : 128;
  constexpr int kL = WarpRows::kLanesPerRow;
  auto copy_rows = [&](Element* sX, const Element* gX, int64_t batch_stride, int64_t row_stride,
                       int lane_off, int slot_step, int n0, const int (&e)[2]) {
    const int first = (kv_rows.row0 + n0) & page_mask;  // row 0's place in its page
    const Element* const a0 =
        gX + min(max(e[0], 0), last_page) * batch_stride + int64_t(first) * row_stride;
    const int split = page_mask - first + 1;  // rows below it lie on page e[0] (dense: 0)
    const int rows_left = seqlen_k - n0;
    const uint32_t sx = ptx::smem_addr(sX);
    // Slot `slot`'s chunks from src (nothing read, zeros written, where !row_ok).
    auto issue = [&](int slot, const Element* src, bool row_ok) {
      const uint32_t dst = sx + 2 * swizzle<kBlockN>(WarpRows::row(slot, lane), WarpRows::chunk(lane));
#pragma unroll
      for (int m = 0; m < WarpRows::kChunks; ++m)  // chunk kL m + lane % kL: segment kL m / 4
        ptx::cp_async_16_prefetch<kPrefetch>(dst + m * (kL / 4) * kBlockN * 64, src + 8 * kL * m,
                                             row_ok && lane_col + 8 * kL * m < p.headdim);
    };
    if (rows_left >= kBlockN && (split >= kBlockN || split <= 0)) {  // (warp-uniform)
      const Element* src = a0 + lane_off;
#pragma unroll
      for (int slot = 0; slot < WarpRows::kSlots; ++slot, src += slot_step) issue(slot, src, true);
    } else {
      const Element* const a1 = gX + min(max(e[1], 0), last_page) * batch_stride +
                                int64_t(first - page_mask - 1) * row_stride;
#pragma unroll
      for (int slot = 0; slot < WarpRows::kSlots; ++slot) {
        const int r = WarpRows::row(slot, lane);
        const bool row_ok = r < rows_left;
        // (a row past the keys copies nothing: its address stays inside the cache)
        issue(slot,
              row_ok ? (r < split || split <= 0 ? a0 : a1) + (lane_off + slot * slot_step)
                     : a0 + lane_col,
              row_ok);
      }
    }
  };
  // Tile j into `stage`, or nothing past the warp's last tile; load_kv then closes one
  // cp.async group either way (the waits count groups).
  auto copy_kv = [&](int j, int stage, const int (&e)[2]) {
    if (j < n_mine) {
      const int n0 = tile_of(j) * kBlockN;
      Element* const sK = sRing + stage * 2 * kTile;
      copy_rows(sK, gK, p.k_batch_stride, p.k_row_stride, k_lane_off, k_slot_step, n0, e);
      copy_rows(sK + kTile, gV, p.v_batch_stride, p.v_row_stride, v_lane_off, v_slot_step, n0, e);
    }
  };
  auto load_kv = [&](int j, int stage, const int (&e)[2]) {
    copy_kv(j, stage, e);
    ptx::cp_async_commit();
  };

  // Prologue: each warp's first kStages - 1 tiles, their pages read all at once first so that
  // the copies wait for one block-table round trip, then Q (all threads) in the first tile's
  // group: the K/V bytes, the kernel's critical path, are requested before Q's address math.
  {
    int pages[kStages - 1][2] = {};
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) fetch_pages(s, pages[s]);
    copy_kv(0, 0, pages[0]);
    load_tile_rows<kRows, kHeadDim, kNThreads>(
        sQ,
        [&](int r, int) {
          const int i = small_div(r, pack);
          return gQ + i * p.q_row_stride + (r - i * pack) * p.q_head_stride;
        },
        rows_q, p.headdim, tid);
    ptx::cp_async_commit();
#pragma unroll
    for (int s = 1; s < kStages - 1; ++s) load_kv(s, s, pages[s]);
  }
  // The entries of the tiles the loop's steps issue, 32 steps at a time: in batch i, lane l
  // holds those of tile 32 i + l + kStages - 1 (issued at step 32 i + l), and a step takes
  // them from that lane (two shuffles). Each lane's load is used 32 steps after it is issued
  // (batch i + 1 is read as batch i starts), so no step waits on the block table, whose lines
  // come from DRAM under the copies' load (16-key pages: b16 +11 % with the entries read one
  // step ahead, thirty-second session). pages_cur: batch i, pages_next: batch i + 1.
  int pages_cur[2] = {}, pages_next[2] = {};
  fetch_pages(lane + kStages - 1, pages_next);
  // Fragment coordinates: the lane holds rows g and g + 8, columns 2q, 2q + 1 of each n8 tile.
  const int g = lane / 4;
  const int q = lane % 4;
  int lane_pos[2];  // query position of the lane's rows
#pragma unroll
  for (int r = 0; r < 2; ++r) lane_pos[r] = (g + 8 * r) / pack;

  ScoreMod mod;
  float scale_log2 = p.softmax_scale * kLog2e;
  if constexpr (kMods != kModNone) {
    mod = ScoreMod(p, batch, head0);  // (ALiBi runs with pack = 1: head0 is the head)
    scale_log2 = mod.slope_log2 != 0.f ? 1.f : mod.mult();
  }

  // Q fragments once the first group (Q and tile 0) has landed, the oldest of kStages - 1.
  ptx::cp_async_wait<kStages - 2>();
  __syncthreads();
  uint32_t rQ[1][kKStepsD][4];
  {
    const LdsmTile<kRows> q_tile(ptx::smem_addr(sQ), 0, 0, lane, false);
#pragma unroll
    for (int kk = 0; kk < kKStepsD; ++kk) ptx::ldmatrix_x4(rQ[0][kk], q_tile(0, kk));
  }
  // K as the B operand from key-major rows, V (.trans) from key-major rows; per stage +=.
  const uint32_t ring_addr = ptx::smem_addr(sRing);
  const LdsmTile<kBlockN> k_tile(ring_addr, 0, 0, lane, true);
  const LdsmTile<kBlockN> v_tile(ring_addr + 2 * kTile, 0, 0, lane, false);

  float acc_o[1][kNTilesD][4];
#pragma unroll
  for (int dt = 0; dt < kNTilesD; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dt][e] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  // A row that has seen only masked scores keeps max -inf: 0 then, so -inf - -inf never
  // happens (its p and correction are exp2(-inf) = 0).
  auto scaled = [&](float m) { return m == -INFINITY ? 0.f : m * scale_log2; };

  auto step = [&](auto mask_tag, int n_block, int stage) {
    constexpr bool kMask = decltype(mask_tag)::value;
    const uint32_t stage_off = stage * kStageBytes;
    // S = Q K^T over the d / 16 k-steps in kQkChains independent accumulator chains per n8
    // tile (k-step kk into chain kk % kQkChains), summed after: a single chain is d / 16
    // dependent HMMAs deep, the step's longest latency with one warp per scheduler (one chain,
    // through warp_gemm_areg, measured 0.982-1.004 per config against this: NOTES, s37).
    float acc_s[1][2][4];
    {
      float part[kQkChains][2][4];
#pragma unroll
      for (int c = 0; c < kQkChains; ++c)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[c][nt][e] = 0.f;
      const LdsmTile<kBlockN> kt = k_tile.plus(stage_off);
#pragma unroll
      for (int kk = 0; kk < kKStepsD; ++kk) {
        uint32_t bf[4];
        ptx::ldmatrix_x4(bf, kt(0, kk));
        ptx::mma_16816<Element>(part[kk % kQkChains][0], rQ[0][kk], bf[0], bf[1]);
        ptx::mma_16816<Element>(part[kk % kQkChains][1], rQ[0][kk], bf[2], bf[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float sum = part[0][nt][e];
#pragma unroll
          for (int c = 1; c < kQkChains; ++c) sum += part[c][nt][e];
          acc_s[0][nt][e] = sum;
        }
    }

    const int col0 = n_block * kBlockN + 2 * q;  // column of element (nt, e): col0 + 8 nt + (e & 1)
    if constexpr (kMods != kModNone) {
      // S -> what the softmax scales (fwd_kernel.cuh): capped scores, and with ALiBi the
      // base-2 logits fmaf(capped, mult, bias(row + offset - col)).
      if (mod.softcap > 0.f) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = mod.capped(acc_s[0][nt][e]);
      }
      if (mod.slope_log2 != 0.f) {
        const float mult = mod.mult();
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc_s[0][nt][e] = fmaf(acc_s[0][nt][e], mult,
                                   mod.bias(float(lane_pos[e >> 1] + offset - (col0 + 8 * nt + (e & 1)))));
      }
    }
    if constexpr (kMask) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = lane_pos[r];
        const int col_hi = p.window_right >= 0 ? min(seqlen_k - 1, row + offset + p.window_right)
                                               : seqlen_k - 1;
        const int col_lo = p.window_left >= 0 ? row + offset - p.window_left : 0;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const int col = col0 + 8 * nt + (e & 1);
            if (col < col_lo || col > col_hi) acc_s[0][nt][e] = -INFINITY;
          }
      }
    }

    // Online softmax (base 2) per row, with a lazy reference max: the row's max over the quad
    // (m), but row_max, the max P and the sums are taken against, moves only when some row of
    // the warp would see a P above 2^kRescaleSlack (and at the first key), so most tiles skip
    // rescaling acc_o (d/2 FMUL a lane). P <= 2^kRescaleSlack keeps P, the row sums and acc_o
    // far from overflow, and the epilogue merges by the same row_max, so the result is exact.
    float m[2];
    bool grow = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = fmaxf(fmaxf(acc_s[0][0][2 * r], acc_s[0][0][2 * r + 1]),
                   fmaxf(acc_s[0][1][2 * r], acc_s[0][1][2 * r + 1]));
      m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffff, m[r], 1));
      m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffff, m[r], 2));
      // (-inf - -inf is NaN: false, a row that has seen only masked scores stays put; a first
      // finite max against -inf: +inf, true)
      grow |= (m[r] - row_max[r]) * scale_log2 > kRescaleSlack;
    }
    if (__any_sync(0xffffffff, grow)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], row_max[r]);
        const float correction = ptx::exp2_approx(row_max[r] * scale_log2 - scaled(m_new));
        row_max[r] = m_new;
        row_sum[r] *= correction;
#pragma unroll
        for (int dt = 0; dt < kNTilesD; ++dt) {
          acc_o[0][dt][2 * r] *= correction;
          acc_o[0][dt][2 * r + 1] *= correction;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float max_scaled = scaled(row_max[r]);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          acc_s[0][nt][e] = ptx::exp2_approx(fmaf(acc_s[0][nt][e], scale_log2, -max_scaled));
          sum += acc_s[0][nt][e];
        }
      row_sum[r] += sum;
    }

    // acc_o += P V: P from the S accumulators (n8 tiles 0, 1 = one k16 step).
    uint32_t pa[1][1][4];
    ptx::acc_to_a<Element>(pa[0][0], acc_s[0][0], acc_s[0][1]);
    warp_gemm_areg<Element, true, 1, kHeadDim / 16, 1>(acc_o, pa, v_tile.plus(stage_off));
  };

  for (int j = 0, stage = 0; j < n_mine; ++j) {
    const int next_stage = stage == 0 ? kStages - 1 : stage - 1;  // (stage + kStages - 1) % kStages
    if (j % 32 == 0) {
      pages_cur[0] = pages_next[0];
      pages_cur[1] = pages_next[1];
      fetch_pages(j + 32 + lane + kStages - 1, pages_next);
    }
    const int kv_page[2] = {__shfl_sync(0xffffffff, pages_cur[0], j % 32),
                            __shfl_sync(0xffffffff, pages_cur[1], j % 32)};
    // Every lane is done with the stage of tile j - 1: fill it with tile j + kStages - 1
    // before waiting for tile j, so kStages - 1 tiles stay in flight through the wait (the
    // H100 lost 0-2 % waiting first).
    __syncwarp();
    load_kv(j + kStages - 1, next_stage, kv_page);
    ptx::cp_async_wait<kStages - 1>();
    __syncwarp();  // tile j has landed for every lane
    const int n_block = tile_of(j);
    const int n0 = n_block * kBlockN;
    const bool need_mask = n0 + kBlockN > seqlen_k ||
                           (p.window_right >= 0 && n0 + kBlockN - 1 > offset + p.window_right) ||
                           (p.window_left >= 0 && n0 < seqlen_q - 1 + offset - p.window_left);
    if (need_mask) {
      step(std::true_type{}, n_block, stage);
    } else {
      step(std::false_type{}, n_block, stage);
    }
    stage = stage == kStages - 1 ? 0 : stage + 1;
  }

  // Epilogue: merge the warps' states by LSE through shared memory (the rings are free once
  // every warp is past its last tile and the trailing empty groups are drained).
  ptx::cp_async_wait<0>();
  __syncthreads();
  constexpr int kORow = Traits::kORow;
  float* const sO = reinterpret_cast<float*>(sKV);  // [kNWarps][kRows][kORow]
  float* const sM = sO + kNWarps * kRows * kORow;   // [kNWarps][kRows] scaled max, base 2
  float* const sL = sM + kNWarps * kRows;           // [kNWarps][kRows] row sums
  float m_own[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    m_own[r] = sum == 0.f ? -INFINITY : row_max[r] * scale_log2;
    if (q == 0) {
      sM[warp * kRows + g + 8 * r] = m_own[r];
      sL[warp * kRows + g + 8 * r] = sum;
    }
  }
  __syncthreads();
  // The merged max M and sum L of row `row` (L = 0: no warp saw a key).
  auto merged = [&](int row, float& m_all, float& l_all) {
    m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNWarps; ++w) m_all = fmaxf(m_all, sM[w * kRows + row]);
    l_all = 0.f;
#pragma unroll
    for (int w = 0; w < kNWarps; ++w) {
      const float m = sM[w * kRows + row];
      if (m != -INFINITY) l_all += sL[w * kRows + row] * exp2f(m - m_all);
    }
  };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (row >= rows_q) continue;  // (the O pass reads the query rows only)
    float m_all, l_all;
    merged(row, m_all, l_all);
    const float factor = m_own[r] == -INFINITY ? 0.f : exp2f(m_own[r] - m_all) / l_all;
    float* const dst = sO + (warp * kRows + row) * kORow + 2 * q;
#pragma unroll
    for (int dt = 0; dt < kNTilesD; ++dt) {
      *reinterpret_cast<float2*>(dst + 8 * dt) =
          make_float2(acc_o[0][dt][2 * r] * factor, acc_o[0][dt][2 * r + 1] * factor);
    }
  }
  __syncthreads();

  // O: the warps' rows summed, 4 columns per thread and pass; LSE by threads 0 .. 15.
  const bool splitkv = p.num_splits > 1;
  const int64_t bh0 = (int64_t(split) * p.batch + batch) * p.nheads + head0;  // split-KV rows
  constexpr int kQuads = kHeadDim / 4;
  static_assert(kRows * kQuads % kNThreads == 0, "the O pass splits evenly");
#pragma unroll
  for (int pass = 0; pass < kRows * kQuads / kNThreads; ++pass) {
    const int idx = pass * kNThreads + tid;
    const int row = idx / kQuads;
    const int col = (idx % kQuads) * 4;
    if (row >= rows_q || col >= p.headdim) continue;
    float4 a = *reinterpret_cast<const float4*>(sO + row * kORow + col);
#pragma unroll
    for (int w = 1; w < kNWarps; ++w) {
      const float4 b = *reinterpret_cast<const float4*>(sO + (w * kRows + row) * kORow + col);
      a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    const int i = row / pack, h = row - i * pack;  // position, head within the group
    if (splitkv) {
      *reinterpret_cast<float4*>(p.o_accum + ((bh0 + h) * p.seqlen_q + i) * p.headdim + col) = a;
    } else {
      Element* gO = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                    (head0 + h) * p.o_head_stride + (seq.q_row0 + i) * p.o_row_stride + col;
      *reinterpret_cast<uint2*>(gO) =
          make_uint2(ptx::pack2<Element>(a.x, a.y), ptx::pack2<Element>(a.z, a.w));
    }
  }
  if (tid < rows_q) {
    float m_all, l_all;
    merged(tid, m_all, l_all);
    const float lse = l_all == 0.f ? (splitkv ? -INFINITY : INFINITY)
                                   : m_all * 0.6931471805599453f + logf(l_all);
    const int i = tid / pack, h = tid - i * pack;
    if (splitkv) {
      p.lse_accum[(bh0 + h) * p.seqlen_q + i] = lse;
    } else {
      p.lse[batch * p.lse_batch_stride + (head0 + h) * p.lse_head_stride + seq.q_row0 + i] = lse;
    }
  }
}

}  // namespace flashattn2
