// Hopper forward tiles: one constexpr function read by the launcher (host) and the kernel
// (device), and the host's test of which forwards the sm90 kernel serves.
#pragma once

#include "common/flash.h"

namespace flashattn2 {

struct Sm90FwdTile {
  int block_m;        // query rows per CTA = 64 per consumer warpgroup
  int block_n;        // keys per mainloop step (the N of S = Q K^T)
  int stages;         // shared-memory stages of K and of V
  int consumer_regs;  // setmaxnreg of a consumer warpgroup
  int producer_regs;  // setmaxnreg of the producer warpgroup
};

// Budgets: shared memory 2 d (block_m (Q, and O where it fits) + 2 stages block_n) bytes
// <= 227 KiB less the barriers;
// registers 128 producer_regs + 128 (block_m / 64) consumer_regs <= 64 Ki. A consumer thread
// holds S (block_n / 2 f32), P (block_n / 4 b32) and O (d / 2 f32). setmaxnreg only moves
// registers within what the launch gave the CTA: 8 * floor(64 Ki / threads / 8) per thread
// (168 at 384 threads, 128 at 512), so producer_regs + consumers x consumer_regs must fit in
// (1 + consumers) x that, or the consumers' setmaxnreg.inc waits forever (a producer at 32
// with two consumers at 240 hung: 32 + 480 > 3 x 168). At 24 the producer's tile walk
// spills one word (an STL / LDL per tile, in the producer only).
//   d64   3 consumer warpgroups, 192 x 128: 112 KiB; S 64 + P 32 + O 32 of 160 registers.
//   d128  2 warpgroups, 128 x 128: 192 KiB; S 64 + P 32 + O 64 of 240.
//   d192  128 x 112: 216 KiB (O in sQ); S 56 + P 28 + O 96 of 240.
//   d256  128 x 80: 224 KiB (O in sQ); S 40 + P 20 + O 128 of 240.
// FLASHATTN2_SM90_TILE_{M,N,STAGES} (as -D flags in CUDAFLAGS) force one tile for every
// head dim: scripts/tile_sweep.sh (KIND=sm90) uses them.
constexpr Sm90FwdTile sm90_fwd_tile(int head_dim) {
#ifdef FLASHATTN2_SM90_TILE_M
  return Sm90FwdTile{FLASHATTN2_SM90_TILE_M, FLASHATTN2_SM90_TILE_N, FLASHATTN2_SM90_TILE_STAGES,
                     FLASHATTN2_SM90_TILE_M == 192 ? 160 : 240, 24};
#endif
  return head_dim <= 64    ? Sm90FwdTile{192, 128, 2, 160, 24}
         : head_dim <= 128 ? Sm90FwdTile{128, 128, 2, 240, 24}
         : head_dim <= 192 ? Sm90FwdTile{128, 112, 2, 240, 24}
                           : Sm90FwdTile{128, 80, 2, 240, 24};
}

// Kernel head dims of the sm90 forward: multiples of 64 (whole 128-byte swizzle chunks).
constexpr bool sm90_fwd_head_dim(int kernel_head_dim) {
  return kernel_head_dim == 64 || kernel_head_dim == 128 || kernel_head_dim == 192 ||
         kernel_head_dim == 256;
}

// Shared memory: Q in a ring of two buffers where they fit, else one (q_bufs); each tile's O
// is staged in its own Q buffer (its Q is dead after the tile's last S), so with two the next
// tile's Q loads a whole tile ahead (fwd_kernel.cuh); 2 x stages (K, V) tiles; then
// 8 + 4 x stages 8-byte mbarriers (and 8 unused bytes), two 32-byte slots of published tile
// work after them, 128-byte aligned (kSm90FwdPublishBytes), plus up to 1 KiB to align the
// dynamic shared memory to the 128-byte swizzle's 1024-byte period.
constexpr int kSm90SmemLimit = 227 * 1024;
constexpr int kSm90FwdPublishBytes = 2 * 32 + 128;
constexpr int sm90_fwd_smem_bytes(int head_dim, int q_bufs) {
  return 2 * head_dim *
             (q_bufs * sm90_fwd_tile(head_dim).block_m +
              2 * sm90_fwd_tile(head_dim).stages * sm90_fwd_tile(head_dim).block_n) +
         8 * (9 + 4 * sm90_fwd_tile(head_dim).stages) + 1024 + kSm90FwdPublishBytes;
}
constexpr int sm90_fwd_q_bufs(int head_dim) {
  return sm90_fwd_smem_bytes(head_dim, 2) <= kSm90SmemLimit ? 2 : 1;
}
constexpr int sm90_fwd_smem_bytes(int head_dim) {
  return sm90_fwd_smem_bytes(head_dim, sm90_fwd_q_bufs(head_dim));
}

// Causal, windowed and varlen tiles differ in work: the persistent grid takes them from a
// shared counter (FwdParams::tile_counter, the caller's) at every length and head dim, each
// CTA claiming its next tile once the current one's loads are issued (sm90/fwd_producer.cuh).
// H100 bf16 causal 512-16k, three rounds, geomean against one CTA per tile with a counter up
// to 2k keys at d <= 128 only (the rule before): d64 1.016, d128 1.024, d256 1.018; counter
// against one CTA per tile, d256: 1.01-1.05 at every length (benchmarks/NOTES.md, fifteenth
// session). With the claim at the tile's start instead, the counter had lost 5-15 % on long
// causal tiles (d128 s16k 570 vs 624 TFLOP/s). d192 is not measured (d256's structure).

// Stream-K for tiles of equal work (dense attention without a window, one split): with a
// static stride the last wave keeps only tiles % grid of the grid's CTAs busy (2048 d128 tiles
// on 132 SMs: 15.5 waves of work in the time of 16; H100 bf16 d128 full 512, 2112 tiles = 16
// whole waves measured 1.8 % more TFLOP/s than 2048, cuDNN's unchanged). So the last
// grid + tiles % grid tiles are cut into their key blocks (units) and shared out evenly: CTA c
// takes units [c U / grid, (c + 1) U / grid) of the U from tile `first` on, at least a whole
// tile's worth each, so a tile is split between at most two CTAs, at boundary c (its slot,
// 1..grid - 1). Its two pieces meet in a float32 workspace (fwd_epilogue.cuh): the first to
// finish leaves its O accumulators and softmax state there, the second merges them and
// stores the tile. `units` 0: the static stride throughout.
// Each piece costs what a tile start and end cost (the first S and softmax with nothing under
// them, the last P V, the epilogue) plus the hand-over (a ticket, 64-128 KiB written or read
// per warpgroup), and a CTA of the region runs 2-3 pieces where it ran 1-2 tiles, so the tail
// pays only with long tiles and cheap tile starts. H100, bf16 / fp16, full attention, stream-K
// over the static stride, best of two rounds (benchmarks/NOTES.md, sixteenth session): d64
// 512-1k +-1 %, 2k-16k +0.3 to +3.1 %; d128 512 -2 to -3 %, 1k -1 to 0 %, 2k-16k -0.3 to
// +2.2 %; d256 (one Q buffer: a piece loses the staged O, its next Q waits for its epilogue)
// 512 -11 %, 1k -6 %, 2k-4k -3 %, 8k-16k 0 to +1.4 %. So kernel head dims up to 128, from 16
// key blocks (2048 keys).
struct Sm90StreamK {
  int first;  // the region's first tile (the tiles before it take the static stride)
  int units;  // its key blocks: (tiles - first) x key blocks per tile
};
constexpr int kSm90StreamKMaxGrid = 1024;  // slots of the flags (kSm90FwdCounterInts)
constexpr Sm90StreamK sm90_fwd_stream_k(int kernel_head_dim, int64_t tiles, int grid,
                                        int key_blocks) {
  if (kernel_head_dim > 128 || key_blocks < 16 || tiles <= grid || tiles % grid == 0 ||
      grid > kSm90StreamKMaxGrid)
    return {0, 0};
  const int64_t first = (tiles / grid - 1) * grid;
  const int64_t units = (tiles - first) * key_blocks;
  return units * grid < (int64_t(1) << 31) ? Sm90StreamK{int(first), int(units)}
                                           : Sm90StreamK{0, 0};
}
// The workspace: per slot and consumer warpgroup, 128 threads x (d / 8 + 1) float4 (O's
// accumulators, then row max and sum); and the int32 the host keeps per stream (the tile
// counter, then one flag per slot and consumer warpgroup, zero between launches).
constexpr int64_t sm90_fwd_stream_k_workspace(int kernel_head_dim, int grid) {
  return int64_t(grid) * (sm90_fwd_tile(kernel_head_dim).block_m / 64) * 128 * 4 *
         (kernel_head_dim / 8 + 1);
}
constexpr int kSm90FwdCounterInts = 1 + 3 * kSm90StreamKMaxGrid;

// FA3's step order for d > 128 (fwd_kernel.cuh FwdTraits kOrder_ 3: the consumers issue their
// MMAs without the ping-pong turn, and a step rescales O right after issuing its S, before its
// P V), taken for plain dense full attention in one split (fwd_launch.cuh) at kernel head dim
// 256 from 2048 keys. H100 bf16, time vs the default order: s512 1.017x (slower), 2k 0.999x,
// 8k 0.947x, 16k 0.939x. d192: not measured, so it keeps the default order.
constexpr bool sm90_fwd_fa3_order(int kernel_head_dim, int seqlen_k) {
  return kernel_head_dim == 256 && seqlen_k >= 2048;
}

// The forwards the sm90 kernel serves, on an sm_90 GPU with its head dim built: dense or
// varlen attention of more than 64 query rows (causal, window, GQA, softcap, ALiBi, strided
// inputs, split-KV). Decoding-sized forwards, KV-cache layouts (seqused_k, left padding,
// cache batch index, pages, appended keys) and dropout run the mma.sync kernels. (GQA
// packing, FwdParams::q_pack, is the KV kernel's: the sm90 kernel ignores it.)
constexpr bool sm90_fwd_supports(int seqlen_q, bool dropout, bool kv_cache_layout) {
  return seqlen_q > 64 && !dropout && !kv_cache_layout;
}
inline bool sm90_fwd_supports(const FwdParams& p) {
  const bool kv_cache = p.block_table != nullptr || p.seqused_k != nullptr ||
                        p.leftpad_k != nullptr || p.kv_batch_idx != nullptr || p.seqlen_k_new != 0;
  return sm90_fwd_supports(p.seqlen_q, p.dropout_threshold != 0, kv_cache);
}

}  // namespace flashattn2
