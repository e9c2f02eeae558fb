// The Hopper backward's fused dQ convert (kDqFuse instances of sm90/bwd_kernel.cuh; a
// prototype, off by default: BwdParams::dq_fuse, FLASHATTN2_SM90_DQ_FUSE; design and the
// visitor-count argument: /work/helpers/dqfuse.md, moved into benchmarks/NOTES.md by the
// lead). Producer warp 2 (dq_order_warp) adds 1 to a query tile's counter once its reduces
// of the tile are complete and passes the old value to warp 3 (dq_fuse_warp), which converts
// the tile (dq_convert_tile) when the CTA was its last visitor (dq_visitors).
#pragma once
#include <cstdint>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/ptx.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"

namespace flashattn2 {
namespace sm90 {

// kDqFuse: the visitors of query tile m_block (of any head: the same key blocks visit every
// head of a GQA group): the key blocks n whose BwdRange holds it, counted by the warp 32
// blocks at a time from the very ranges the CTAs walk (so the count is exact under every
// mask, window, sq != sk and varlen length; /work/helpers/dqfuse.md).
template <typename Traits, bool kVarlen>
__device__ __forceinline__ int dq_visitors(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                           int m_block, int lane) {
  const int n_blocks = (seq.seqlen_k() + Traits::kBlockN - 1) / Traits::kBlockN;
  int count = 0;
  for (int n = lane; n - lane < n_blocks; n += 32) {
    const BwdRange r(p, seq, n * Traits::kBlockN, Traits::kBlockM, 1, false, n);
    count += __popc(__ballot_sync(
        0xffffffffu, n < n_blocks && m_block >= r.m_block_min && m_block < r.m_block_max));
  }
  return count;
}

// kDqFuse, the whole of producer warp 3, once the CTA is the last visitor of query tile
// m_block of `head` (every visitor's reduces complete and acquired): dq of the tile =
// accumulator (`acc`: the head's first workspace row) * softmax_scale in the input dtype,
// what the convert kernel (sm80/bwd_kernel.cuh) computes for one chain, bit for bit. The
// tile's accumulator rows (contiguous: 16-row blocks of ws_dq_index) come into sConv by bulk
// copies of kConvBytes (a piece of kConvRows rows), then each lane turns one 16-byte dq
// chunk (a row's 8 columns: four float2 of the accumulator order) at a time into a 16-byte
// store in the user's strides.
template <typename Traits, typename Element, bool kVarlen>
__device__ __forceinline__ void dq_convert_tile(const BwdParams& p, const BwdSeq<kVarlen>& seq,
                                                int head, int m_block, const float* acc,
                                                uint32_t sConv, uint32_t bar, uint32_t& phase,
                                                int lane) {
  constexpr int kRowChunks = Traits::kHeadDim / 8;  // 16-byte dq chunks of a row (at most)
  constexpr int kConvRows = Traits::kConvRows;
  const int m0 = m_block * Traits::kBlockM;
  const int rows = min(Traits::kBlockM, seq.seqlen_q() - m0);
  Element* const dq = static_cast<Element*>(p.dq) + seq.batch * p.dq_batch_stride +
                      head * p.dq_head_stride + (int64_t(seq.q_row0()) + m0) * p.dq_row_stride;
#pragma unroll 1
  for (int r0 = 0; r0 < rows; r0 += kConvRows) {
    if (lane == 0) {
      // The accumulator's reads (async proxy) after the counter's acquire; the last piece's
      // (or tile's) reads of sConv (generic, done: their values are stored) before the copy
      // overwrites it.
      if (r0 == 0) fence_proxy_async_global();
      fence_proxy_async();
      const uint32_t bytes = min(kConvRows, (rows - r0 + 15) & ~15) * p.headdim * 4;
      mbar_arrive_expect_tx(bar, bytes);
      bulk_load(sConv, acc + int64_t(m0 + r0) * p.headdim, bytes, bar);
    }
    mbar_wait(bar, phase);
    phase ^= 1;
#pragma unroll 1
    for (int i = lane; i < kConvRows * kRowChunks; i += 32) {
      const int row = i / kRowChunks, c = i % kRowChunks;
      if (row < rows - r0 && 8 * c < p.headdim) {
        // (row, 8 c + 2 k + e) at ws_dq_index: 16-row block, 8-column tile c, lane slot
        // 4 (row % 8) + k, rows row % 8 + 8 ((row / 8) % 2) at + 2
        const uint32_t a = sConv + 4 * ((row / 16) * 16 * p.headdim + 128 * c + 16 * (row % 8) +
                                        2 * ((row / 8) % 2));
        const float s = p.softmax_scale;
        float2 x = ld_shared_float2(a);
        const uint32_t v0 = ptx::pack2<Element>(x.x * s, x.y * s);
        x = ld_shared_float2(a + 16);
        const uint32_t v1 = ptx::pack2<Element>(x.x * s, x.y * s);
        x = ld_shared_float2(a + 32);
        const uint32_t v2 = ptx::pack2<Element>(x.x * s, x.y * s);
        x = ld_shared_float2(a + 48);
        // (st.global.v4 spelled out: the plain uint4 store came out as 4 STG.E at 24 registers)
        const uint32_t v3 = ptx::pack2<Element>(x.x * s, x.y * s);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(
                         dq + int64_t(r0 + row) * p.dq_row_stride + 8 * c),
                     "r"(v0), "r"(v1), "r"(v2), "r"(v3)
                     : "memory");
      }
    }
    __syncwarp();
  }
}

// kDqFuse, producer warp 3 (idle otherwise), in a CTA with steps: per step, warp 2's message
// (its old value of the query tile's counter; the tile, its head and whether the step is the
// CTA's last: kBarConvFull), the slot handed back (kBarConvEmpty), the tile's visitor count,
// and if the CTA was its last visitor, the tile's conversion: warp 2's acquire reaches this
// warp through the named barrier (the pattern of one thread acquiring a flag, then a CTA
// barrier before the others read; an own ld.acquire here cost a global round trip per
// converted tile). The loop ends on the message, not on a step count, so that no value of the
// prologue stays live in it (with the count, ptxas spilled the CTA's steps at the 24
// registers of this warpgroup, and reloaded it in the consumers' loop as well).
// Dense only (with the varlen instance's sequence in the loop, ptxas spilled 92-160 bytes in
// every warp's loop, the consumers' included).
template <typename Traits, typename Element>
__device__ __forceinline__ void dq_fuse_warp(const BwdParams& p, uint32_t sConv,
                                             uint32_t bar_conv, uint32_t sMsg, int lane) {
  const BwdSeq<false> seq(p, int(blockIdx.z));
  uint32_t phase = 0;
  bool more = true;
  while (more) {
    named_sync(kBarConvFull, 64);
    const uint2 msg = ld_shared_v2(sMsg);
    more = !(msg.y >> 31);
    if (more) named_arrive(kBarConvEmpty, 64);
    const int m_block = msg.y & 0xffff, head = (msg.y >> 16) & 0x7fff;
    if (int(msg.x) == dq_visitors<Traits>(p, seq, m_block, lane) - 1) {
      // (one dQ chain: chain 0's accumulator)
      dq_convert_tile<Traits, Element>(p, seq, head, m_block,
                                       dq_chain(p, 0) + seq.ws_row0(head) * p.headdim, sConv,
                                       bar_conv, phase, lane);
    }
  }
}

}  // namespace sm90
}  // namespace flashattn2
