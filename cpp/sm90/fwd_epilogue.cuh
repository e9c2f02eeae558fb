// The Hopper forward's consumer epilogue (fwd_kernel.cuh's tiling block), run by each
// consumer warpgroup at the end of a tile: the stream-K hand-over through the workspace, then
// split-KV's float32 partial O and LSE, or the LSE and O / sum through the staging buffer
// (stmatrix) to a TMA store (dense) or 16-byte stores (varlen), and the buffer's release.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "sm90/fwd_softmax.cuh"
#include "sm90/fwd_tile.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flashattn2 {
namespace sm90 {

// The epilogue of tile w for this thread of consumer warpgroup `consumer`, after its last key
// step (acc_o, softmax: the tile's O accumulators and row state; j: the key steps so far). The
// kernel's variables come as they are there: piece, hold (kStageO), qb / sQt (the tile's Q
// buffer), release (the warp's arrival on an mbarrier). A tile done here (stream-K's first
// piece, split-KV) releases its Q buffer itself; with two Q buffers the dense / varlen store
// leaves q_pending set (released at the next tile's start).
template <typename Traits, typename Element, bool kMods, bool kBias, bool kBiasSmem,
          typename Release>
__device__ __forceinline__ void tile_epilogue(
    const FwdArgs& args, const FwdSmem<Traits, kBiasSmem>& sm,
    const FwdTileWork<Traits::kBlockM, Traits::kBlockN>& w,
    FwdSoftmax<Traits::kBlockN, kMods, kBias>& softmax, float (&acc_o)[Traits::kHeadDim / 2],
    const Release& release, bool& q_pending, int piece, bool hold, int consumer, int tid,
    int lane, int warp_in_wg, int wg_row0, int row0_pos, int wg_first, int qb, uint32_t sQt,
    int j, bool store_thread) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kStages = Traits::kStages;
  constexpr int kConsumers = Traits::kConsumers;
  constexpr int kChunks = Traits::kChunks;
  constexpr int kQBufs = Traits::kQBufs;
  const FwdParams& p = args.p;
  const int q = lane % 4;
  const int seqlen_q = w.seq.seqlen_q;

  // Stream-K: the first of a split tile's two pieces (per warpgroup, by a ticket) leaves
  // its O accumulators and softmax state in the tile's slot of the workspace and is done;
  // the second waits until they are in (they are: the first took its ticket after its
  // last step), folds them into its own and stores the tile. Neither ever waits for a
  // CTA that has not run: the waiter holds the second ticket. The flag goes back to 0.
  constexpr int kVecs = kHeadDim / 8;  // (stream-K: float4 of O per thread, then the state)
  const int tid_wg = tid % 128;
  int* const flag = args.sk_flags + piece * kMaxConsumers + consumer;
  float4* const part = reinterpret_cast<float4*>(args.sk_partial) +
                       (int64_t(piece) * kConsumers + consumer) * 128 * (kVecs + 1) + tid_wg;
  bool leave = false;  // (the first piece: its state goes to the workspace, below)
  if (piece) {
    int ticket = 0;
    if (tid_wg == 0) ticket = atomicAdd(flag, 1);
    // (Broadcast from lane 0 so that ptxas sees `leave` warp-uniform: a branch it must
    // treat as divergent moved the loop's uniform registers into ordinary ones, which
    // spilled at d64 / d256.)
    leave = __shfl_sync(0xffffffffu, int(!named_sync_or(kBarEpilogue + consumer, 128,
                                                         ticket != 0)), 0) != 0;
    if (!leave) {
      if (tid_wg == 0) {
        while (!(ptx::ld_acquire(flag) & 4)) __nanosleep(32);
        *flag = 0;  // (both tickets and the release are in)
      }
      named_sync(kBarEpilogue + consumer, 128);
      const float4 state = __ldcg(part + 128 * kVecs);
      const bool tail = int(blockIdx.x) == piece;  // (the head piece is CTA piece - 1's)
      float scale_a[2], scale_b[2];
      softmax.merge({state.x, state.y}, {state.z, state.w}, tail, scale_a, scale_b);
#pragma unroll
      for (int i = 0; i < kVecs; ++i) {
        const float4 o = __ldcg(part + 128 * i);
        const float other[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc_o[4 * i + e] = FwdSoftmax<kBlockN, kMods, kBias>::combine(
              acc_o[4 * i + e], scale_a[e >> 1], other[e], scale_b[e >> 1], tail);
      }
    }
  }
  float inv[2], lse[2];
  softmax.finish(inv, lse, p.num_splits > 1 ? -INFINITY : INFINITY);
  if (leave) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
      part[128 * i] = make_float4(acc_o[4 * i], acc_o[4 * i + 1], acc_o[4 * i + 2],
                                  acc_o[4 * i + 3]);
    part[128 * kVecs] = make_float4(softmax.row_max[0], softmax.row_max[1],
                                    softmax.row_sum[0], softmax.row_sum[1]);
    __threadfence();
    named_sync(kBarEpilogue + consumer, 128);
    if (tid_wg == 0) ptx::red_release_add(flag, 4);
    release(sm.q_empty(qb));  // (O not staged)
    return;
  }
  if (p.num_splits > 1) {
    // Split-KV: this split's O (normalised by its own sum) and LSE, float32, straight
    // from the accumulators into o_accum / lse_accum [split, batch, head, row].
    const int64_t row_base =
        ((int64_t(w.split) * p.batch + w.batch) * p.nheads + w.head) * p.seqlen_q;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int pos = row0_pos + 8 * r;
      if (pos < seqlen_q) {
        float* gO = p.o_accum + (row_base + pos) * p.headdim;
#pragma unroll
        for (int dt = 0; dt < kHeadDim / 8; ++dt) {
          const int col = 8 * dt + 2 * q;
          if (col < p.headdim) {
            *reinterpret_cast<float2*>(gO + col) = make_float2(
                acc_o[4 * dt + 2 * r] * inv[r], acc_o[4 * dt + 2 * r + 1] * inv[r]);
          }
        }
        if (q == 0) p.lse_accum[row_base + pos] = lse[r];
      }
    }
    release(sm.q_empty(qb));  // (O not staged)
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pos = row0_pos + 8 * r;
    if (q == 0 && pos < seqlen_q) {
      p.lse[w.batch * p.lse_batch_stride + w.head * p.lse_head_stride + w.seq.q_row0 + pos] =
          lse[r];
    }
  }
  // O / sum into this warpgroup's rows of its Q buffer (its Q reads are done: the
  // warpgroup's last wgmma completed), in the layout TMA reads, by stmatrix
  // (wgmma.cuh stmatrix_acc_rows). kStageO (hold): into the last stage's K / V buffer as
  // 64-row chunks (o_base is offset so that tile row wg_row0 lands on its first row).
  const int s_last = (j + kStages - 1) % kStages;  // (hold: the tile has steps)
  const uint32_t o_base =
      hold ? (consumer == 0 ? sm.k : sm.v) + s_last * Traits::kKVBytes - wg_row0 * kSwizzleBytes
           : sQt;
  const uint32_t o_chunk = hold ? 64 * kSwizzleBytes : Traits::kQChunkBytes;
  // (Warpgroup 0's K buffer: warpgroup 1's S reads are done at kBarStageO; warpgroup 1's
  // V buffer: kBarStageO + 1 waits for all 256 threads, each past its last P V wait.)
  if (hold) {
    if (consumer == 0) {
      named_sync(kBarStageO, 256);
      named_arrive(kBarStageO + 1, 256);
    } else {
      named_sync(kBarStageO + 1, 256);
    }
  }
  stmatrix_acc_rows<Element, kHeadDim>(o_base + (wg_row0 + 16 * warp_in_wg) * kSwizzleBytes,
                                        o_chunk, lane, acc_o, inv);
  fence_proxy_async();
  named_sync(kBarEpilogue + consumer, 128);
  if (!p.cu_seqlens_q) {
    if (store_thread) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_store(&args.o, o_base + c * o_chunk + wg_row0 * kSwizzleBytes,
                  c * kChunkCols, wg_first, w.head, w.batch);
      tma_store_commit();
    }
  } else {
    // Varlen: the sequence's rows only, 16 bytes a thread, columns below headdim.
    constexpr int kUnits = kHeadDim / 8;  // 16-byte units per row
    Element* gO = static_cast<Element*>(p.o) + w.head * p.o_head_stride +
                  (w.seq.q_row0 + wg_first) * p.o_row_stride;
    const int rows = min(64, seqlen_q - wg_first);
    for (int idx = tid % 128; idx < 64 * kUnits; idx += 128) {
      const int row = idx / kUnits, unit = idx % kUnits;
      if (row < rows && unit * 8 < p.headdim) {
        const int trow = wg_row0 + row;
        const uint32_t addr = o_base + (unit / 8) * o_chunk + trow * kSwizzleBytes +
                              (((unit % 8) ^ (trow % 8)) * 16);
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(addr));
        *reinterpret_cast<uint4*>(gO + int64_t(row) * p.o_row_stride + unit * 8) = v;
      }
    }
  }
  if constexpr (kQBufs == 2) {
    q_pending = true;  // released at the next tile's start
  } else {
    // One Q buffer: release it (kStageO, hold: this warpgroup's stage buffer) once the
    // store (varlen: every thread's loads) read it.
    if (store_thread) tma_store_wait_read();
    named_sync(kBarEpilogue + consumer, 128);
    release(hold ? (consumer == 0 ? sm.k_empty(s_last) : sm.v_empty(s_last)) : sm.q_empty(0));
  }
}

}  // namespace sm90
}  // namespace flashattn2
