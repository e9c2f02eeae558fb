// The Hopper forward's types (fwd_kernel.cuh has the tiling block): the tile traits per head
// dim and step order, the kernel's arguments, the named barriers, the shared memory layout and
// its mbarriers, and one tile's work as the producer decodes it and publishes it to the
// consumers.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/flash.h"
#include "common/seqlen.cuh"
#include "sm90/fwd_config.h"
#include "sm90/mbarrier.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// kOrder_ (FA3's step order for d > 128; fwd_launch.cuh takes 3 for d256 dense full
// attention from 2k keys, FwdParams::sm90_fa3_order): bit 0 the consumers issue their MMAs
// without the ping-pong turn, bit 1 a step rescales O by the previous step's factor right after
// issuing its S, before its P V (instead of after its softmax).
template <int kHeadDim_, int kOrder_ = 0>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kTurns = !(kOrder_ & 1);
  static constexpr bool kRescaleFirst = (kOrder_ & 2) != 0;
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
  static constexpr int kQBufs = sm90_fwd_q_bufs(kHeadDim);  // the Q ring (fwd_config.h)
  static constexpr int kBarBytes = 8 * (9 + 4 * kStages);  // the mbarriers (FwdSmem)
  // The wgmma descriptors of a GEMM as one base descriptor per operand plus a constant
  // (desc_advance: one 32-bit add each, instead of masking and shifting every address):
  // H100 bf16, interleaved twice, d256 +1-3 % at 512-8k (geomean +2.3 %), d64 +-1 %, d128
  // -2 % at full 1k and +1 % at 8k (geomean -0.9 %), so d > 128 only (benchmarks/NOTES.md,
  // thirteenth session; d192 not measured, same structure as d256).
  static constexpr bool kDescAdvance = kHeadDim > 128;
  static constexpr int kSmemBytes = sm90_fwd_smem_bytes(kHeadDim);
  static_assert(kHeadDim % kChunkCols == 0 && kBlockM % 64 == 0 && kBlockN % 16 == 0, "tile");
  static_assert(kConsumers >= 2 && kConsumers <= 3, "ping-pong between 2 or 3 warpgroups");
  static_assert(kQBufs * kQBytes + 2 * kStages * kKVBytes + kBarBytes +
                        1024 <= kSmemBytes, "smem budget");
  static_assert(setmaxnreg_fits(kConsumers, kTile.producer_regs, kTile.consumer_regs),
                "register budget: setmaxnreg.inc would hang");
  // Staged bias: one 64 x 128 tile per consumer
  // warpgroup, 256-byte rows, after the barriers (+ 128 bytes to align it); where it fits
  // (d64, d128: 128-key steps).
  static constexpr int kBiasSmemBytes = kConsumers * 64 * 256;
  static constexpr bool kBiasSmemFits =
      kBlockN == 128 && kSmemBytes + kBiasSmemBytes + 128 <= kSm90SmemLimit;
  static constexpr int smem_bytes(bool bias_smem) {
    return kSmemBytes + (bias_smem ? kBiasSmemBytes + 128 : 0);
  }
};

// The kernel's arguments: TMA maps of q, k, v, o (tma_map.h), the forward params, and the
// tiles: m_blocks per (head, batch, split), their count, the counter of a dynamic walk
// (null: static), and a static walk's stream-K tail (fwd_config.h sm90_fwd_stream_k; units 0:
// none): its first tile, units, key blocks per tile, workspace and flags.
struct FwdArgs {
  CUtensorMap q, k, v, o;
  FwdParams p;
  int m_blocks;
  int tiles;
  int* tile_counter;
  int sk_first, sk_units, sk_blocks;
  float* sk_partial;
  int* sk_flags;
};

// Named barriers (0 is __syncthreads): the consumers' MMA turn (1 + c), each consumer's
// epilogue (1 + kMaxConsumers + c), its staged bias tile (1 + 2 kMaxConsumers + c), and
// kStageO's two signals before the consumers stage O in the last K / V stage (kBarStageO:
// warpgroup 1's last S is done; kBarStageO + 1: warpgroup 0's last P V is done), each one
// warpgroup's bar.arrive and the other's bar.sync at one instruction: bar.sync is
// barrier.sync.aligned, whose threads must all run the same instruction (one bar.sync per
// warpgroup at different places is what compute-sanitizer synccheck calls "divergent
// thread(s) in block").
constexpr int kMaxConsumers = 3;
constexpr int kBarTurn = 1;
constexpr int kBarEpilogue = 1 + kMaxConsumers;
constexpr int kBarBias = 1 + 2 * kMaxConsumers;
constexpr int kBarStageO = 1 + 3 * kMaxConsumers;  // and kBarStageO + 1 (<= 15)

// The shared memory (fwd_kernel.cuh's tiling block), from a 1024-aligned base: sQ (Q buffer
// b at q + b kQBytes), sK / sV (stage s at k / v + s kKVBytes), the mbarriers, the staged bias
// tiles (kBiasSmem, 128-aligned), then the two 32-byte slots of published tile work.
template <typename Traits, bool kBiasSmem>
struct FwdSmem {
  static constexpr int kStages = Traits::kStages;
  static constexpr int kBarBytes = Traits::kBarBytes;
  uint32_t q, k, v, bars, bias, pub;
  __device__ __forceinline__ explicit FwdSmem(uint32_t base)
      : q(base),
        k(q + Traits::kQBufs * Traits::kQBytes),
        v(k + kStages * Traits::kKVBytes),
        bars(v + kStages * Traits::kKVBytes),
        bias((bars + kBarBytes + 127) & ~127u),
        pub(bias + (kBiasSmem ? Traits::kBiasSmemBytes : 0)) {}
  // (The base is at most 1008 bytes past the 16-byte aligned dynamic shared memory.)
  static_assert(Traits::kQBufs * Traits::kQBytes + 2 * kStages * Traits::kKVBytes +
                        (kBarBytes + 127) / 128 * 128 + (kBiasSmem ? Traits::kBiasSmemBytes : 0) +
                        64 + 1008 <= Traits::smem_bytes(kBiasSmem), "published tile slots");

  // Q buffer b's barriers: b = 0 first, b = 1 after the tile slots.
  __device__ __forceinline__ uint32_t q_full(int b) const {
    return b ? bars + 8 * (7 + 4 * kStages) : bars;
  }
  __device__ __forceinline__ uint32_t q_empty(int b) const {
    return b ? bars + 8 * (8 + 4 * kStages) : bars + 8;
  }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 8 * (2 + s); }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return bars + 8 * (2 + kStages + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const {
    return bars + 8 * (2 + 2 * kStages + s);
  }
  __device__ __forceinline__ uint32_t v_empty(int s) const {
    return bars + 8 * (2 + 3 * kStages + s);
  }
  // The tile walk: the producer writes each tile's work to slot t % 2 (tile_full), the
  // consumers read it (tile_empty). The 8 bytes at bars + 8 (6 + 4 kStages), where the tile
  // index went before, hold the producer's stream-K cursor (its next unit and its end:
  // fwd_producer.cuh), off its 24 registers.
  __device__ __forceinline__ uint32_t tile_full(int t) const {
    return bars + 8 * (2 + 4 * kStages + (t & 1));
  }
  __device__ __forceinline__ uint32_t tile_empty(int t) const {
    return bars + 8 * (4 + 4 * kStages + (t & 1));
  }
  __device__ __forceinline__ uint32_t pub_slot(int t) const { return pub + 32 * (t & 1); }
  __device__ __forceinline__ uint32_t sk_cursor() const { return bars + 8 * (6 + 4 * kStages); }

  // The arrival counts: one TMA arrival (with its bytes) for a full barrier, one per consumer
  // warp for an empty one.
  __device__ __forceinline__ void init() const {
    constexpr int kConsumerWarps = 4 * Traits::kConsumers;
    for (int b = 0; b < Traits::kQBufs; ++b) {
      mbar_init(q_full(b), 1);
      mbar_init(q_empty(b), kConsumerWarps);
    }
    for (int t = 0; t < 2; ++t) {
      mbar_init(tile_full(t), 1);
      mbar_init(tile_empty(t), kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), kConsumerWarps);
      mbar_init(v_empty(s), kConsumerWarps);
    }
    mbar_fence_init();
  }
};

// One tile of the persistent loop: its coordinates, sequence and visible key blocks.
template <int kBlockM, int kBlockN>
struct FwdTileWork {
  int m_block, head, batch, split;
  SeqInfo seq;
  int n_block_min, n_block_max;

  // The producer's: decodes tile index `tile` and publishes the work in a tile slot (below),
  // each word as soon as it is known (the producer runs at 24 registers: holding all eight
  // for the end spilled).
  __device__ __forceinline__ FwdTileWork(const FwdArgs& a, int tile, uint32_t slot)
      : m_block(a.m_blocks - 1 - tile % a.m_blocks),
        head(tile / a.m_blocks % a.p.nheads),
        batch(tile / a.m_blocks / a.p.nheads / a.p.num_splits),
        split(tile / a.m_blocks / a.p.nheads % a.p.num_splits),
        seq(a.p, tile / a.m_blocks / a.p.nheads / a.p.num_splits) {
    store<0>(slot, m_block);
    store<1>(slot, head);
    store<2>(slot, batch | split << 16);
    store<4>(slot, seq.seqlen_q);
    store<5>(slot, seq.seqlen_k);
    store<6>(slot, int(seq.q_row0));
    key_blocks(a.p);
    store<3>(slot, n_block_min);
    store<7>(slot, n_block_max);
  }
  // Visible key blocks of the tile's rows (bottom-right aligned window, FwdParams); every
  // consumer walks all of them, so the MMA turns stay in step.
  __device__ __forceinline__ void key_blocks(const FwdParams& p) {
    const int offset = seq.seqlen_k - seq.seqlen_q;
    const int first = m_block * kBlockM;
    const int last = min(first + kBlockM, seq.seqlen_q) - 1;
    KeyBlocks blocks = visible_key_blocks<kBlockN>(p, first, last, seq.seqlen_k, offset);
    if (p.num_splits > 1) blocks.take_split(split, p.num_splits);
    n_block_min = blocks.min;
    n_block_max = blocks.max;
  }
  // Stream-K (the producer's): only units [k_lo, k_hi) of the tile's key blocks, in the walk's
  // order (unit 0 is the last block), republished with the piece's slot in the split word
  // (num_splits is 1): 0 for the whole tile, else the CTA boundary that splits it (the
  // consumers' `piece`, fwd_kernel.cuh).
  __device__ __forceinline__ void take_units(int k_lo, int k_hi, int blocks, uint32_t slot) {
    const int piece = k_lo > 0 ? int(blockIdx.x) : k_hi < blocks ? int(blockIdx.x) + 1 : 0;
    split = piece;
    n_block_min = n_block_max - k_hi;
    n_block_max -= k_lo;
    store<2>(slot, batch | piece << 16);
    store<3>(slot, n_block_min);
    store<7>(slot, n_block_max);
  }
  // Varlen: the grid covers the longest sequence; shorter ones skip their extra m blocks.
  __device__ __forceinline__ bool empty() const { return m_block * kBlockM >= seq.seqlen_q; }
  // The consumers read the work the producer decoded from the tile's 32-byte slot (two
  // LDS.128) instead of decoding the index again (three runtime divisions, the sequence and
  // key block arithmetic) between one tile's last P V and the next one's first S: H100 bf16,
  // +2-6 % at d64 s512-1k, +1.6-3.3 % at d128 s512 and causal 1k (benchmarks/NOTES.md,
  // twelfth session). Words:
  // m_block, head, batch | split << 16 (batch * num_splits <= 65535: flash_api.cpp; with one
  // split, the stream-K piece instead: take_units),
  // n_block_min, seqlen_q, seqlen_k, q_row0, n_block_max; m_block -1 ends the walk. The
  // consumers get no seq.k_row0 (0) and kv_batch (batch): the producer's loads use them.
  template <int kWord>
  __device__ __forceinline__ static void store(uint32_t slot, int value) {
    asm volatile("st.shared.b32 [%0 + %1], %2;\n" ::"r"(slot), "n"(4 * kWord), "r"(value)
                 : "memory");
  }
  __device__ __forceinline__ explicit FwdTileWork(uint32_t slot) {
    int batch_split, q_row0;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(m_block), "=r"(head), "=r"(batch_split), "=r"(n_block_min)
                 : "r"(slot) : "memory");
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4 + 16];\n"
                 : "=r"(seq.seqlen_q), "=r"(seq.seqlen_k), "=r"(q_row0), "=r"(n_block_max)
                 : "r"(slot) : "memory");
    batch = batch_split & 0xffff;
    split = unsigned(batch_split) >> 16;
    seq.q_row0 = q_row0;
    seq.k_row0 = 0;
    seq.kv_batch = batch;
  }
  __device__ __forceinline__ bool end() const { return m_block < 0; }
};

}  // namespace sm90
}  // namespace flashattn2
