// The mma.sync backward's two small kernels around bwd_kernel (sm80/bwd_kernel.cuh has the
// main kernel's tiling block), also run by the Hopper backward (sm90/bwd_launch.cuh):
// 1. bwd_preprocess_kernel: dsum = rowsum(dO * O) in f32, and zero the f32 dQ accumulator.
// 3. bwd_convert_dq_kernel: dQ = accumulator (chains summed in order) * scale, cast, store
//    (back from the accumulator order through shared memory); bwd_convert_dq_lean_kernel:
//    the same bits with every load of a tile in flight at once (BwdParams::convert_lean).
#pragma once
#include <cuda_runtime.h>

#include "common/dq_order.cuh"
#include "common/flash.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"

namespace flashattn2 {

// dsum[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d]; zero dq_accum[b, h, i, :] (with the
// padding of the last 16-row block) and the counter of each 64-row query tile, in every chain.
// grid (ceil(seqlen_q / 64), nheads, batch), 128 threads. A row's 16-byte chunks are read by
// kLanes consecutive lanes (one chunk each up to d128), so a pass covers 128 / kLanes rows and
// the unrolled passes keep all of the tile's loads in flight (one row per warp, as before, left
// 24 of 32 lanes idle at d64 and ran 26 us behind FA2's kernel at b s h d = 16k x 2048).
// kZero false (BwdParams::dq_first_store_rows): dsum and the counters only.
template <typename Element, int kHeadDim, bool kZero = true>
__global__ void __launch_bounds__(128) bwd_preprocess_kernel(const BwdParams p) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of a row of the kernel's head dim
  constexpr int kLanes =
      kChunks > 16 ? 32 : kChunks > 8 ? 16 : kChunks > 4 ? 8 : kChunks > 2 ? 4 : 2;
  constexpr int kRowsPerPass = 128 / kLanes;
  // The Hopper backward's kernel (launched as a programmatic dependent, BwdParams::pdl) may
  // start its prologue now: it waits (griddep_wait) before it reads dsum or dq_accum.
  ptx::griddep_launch_dependents();
  const int sub = threadIdx.x % kLanes, r = threadIdx.x / kLanes;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  if (int(blockIdx.x) * 64 >= seq.seqlen_q) return;
  const int64_t ws0 = ws_row0(p, seq, batch, head);
  if (threadIdx.x < p.dq_chains) {
    dq_counters(p)[threadIdx.x * ws_tiles(p, 64) + ws_tile0(p, seq, batch, head, 64) + blockIdx.x] = 0;
  }
  const Element* const o = static_cast<const Element*>(p.o) + batch * p.o_batch_stride +
                           head * p.o_head_stride;
  const Element* const dout = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride +
                              head * p.do_head_stride;
  // All passes' loads first, unconditional (an invalid row or chunk reads the tile's first
  // one and adds nothing), so that they are all in flight at once; then the reductions and
  // the dsum stores.
  constexpr int kPasses = 64 / kRowsPerPass;
  float acc[kPasses];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = blockIdx.x * 64 + pass * kRowsPerPass + r;
    acc[pass] = 0.f;
#pragma unroll
    for (int k = 0; k < (kChunks + kLanes - 1) / kLanes; ++k) {
      const int c = sub + k * kLanes;
      const bool valid = row < seq.seqlen_q && c < kChunks && c * 8 < p.headdim;
      const int64_t grow = seq.q_row0 + (valid ? row : blockIdx.x * 64);
      const int col = valid ? c * 8 : 0;
      const uint4 a = *reinterpret_cast<const uint4*>(o + grow * p.o_row_stride + col);
      const uint4 b = *reinterpret_cast<const uint4*>(dout + grow * p.do_row_stride + col);
      const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 x = ptx::unpack2<Element>(av[i]), y = ptx::unpack2<Element>(bv[i]);
        dot = fmaf(x.x, y.x, fmaf(x.y, y.y, dot));
      }
      acc[pass] += valid ? dot : 0.f;
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) {
      acc[pass] += __shfl_xor_sync(0xffffffff, acc[pass], offset);
    }
    const int row = blockIdx.x * 64 + pass * kRowsPerPass + r;
    if (sub == 0 && row < seq.seqlen_q) p.dsum[ws0 + row] = acc[pass];
  }
  // Zero the tile's dq_accum rows in every chain: whole 16-row blocks (ws_dq_index), which
  // are contiguous; the rows past seqlen_q of the last block are the sequence's padding.
  if constexpr (!kZero) return;
  const int rows = min(64, (seq.seqlen_q - int(blockIdx.x) * 64 + 15) / 16 * 16);
  for (int chain = 0; chain < p.dq_chains; ++chain) {
    float4* dq =
        reinterpret_cast<float4*>(dq_chain(p, chain) + (ws0 + blockIdx.x * 64) * p.headdim);
    for (int i = threadIdx.x; i < rows * p.headdim / 4; i += 128) {
      dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// dq = (sum of the dq_chains accumulators, in chain order) * softmax_scale in the output
// dtype. grid as the preprocess kernel.
template <typename Element>
__global__ void __launch_bounds__(128) bwd_convert_dq_kernel(const BwdParams p) {
  // Launched as a programmatic dependent of the Hopper backward's kernel (BwdParams::pdl):
  // wait for that grid's end (which implies the preprocess's: every block of it waited for
  // that one). Every thread, first: a no-op where the launch was a plain one.
  ptx::griddep_wait();
  // The tile's 64 rows in chunks of 64 columns: the 16 x 8 accumulator-order blocks
  // (ws_dq_index) are read with 16-byte loads, summed over the chains, and transposed
  // through shared memory, so that the stores are 16-byte row segments again.
  __shared__ float tile[64][64 + 8];  // + 8: a half-warp's float2 writes hit distinct banks
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  const int64_t ws0 = ws_row0(p, seq, batch, head);
  const int m0 = blockIdx.x * 64, rows = min(64, seq.seqlen_q - m0);
  const float s = p.softmax_scale;
  for (int c0 = 0; c0 < p.headdim; c0 += 64) {
    const int cols = min(64, p.headdim - c0);
    // Lane slot l of block (rb, cb): rows g, g + 8 x columns 2 q, 2 q + 1 (g = l / 4, q = l % 4).
    for (int idx = threadIdx.x; idx < 4 * (cols / 8) * 32; idx += 128) {
      const int l = idx % 32, cb = idx / 32 % (cols / 8), rb = idx / 32 / (cols / 8);
      const int row = rb * 16 + l / 4, col = cb * 8 + 2 * (l % 4);
      if (rb * 16 >= rows) break;
      const int64_t offset = ws_dq_index(ws0 + m0 + row, c0 + col, p.headdim);
      float4 a = *reinterpret_cast<const float4*>(p.dq_accum + offset);
      for (int chain = 1; chain < p.dq_chains; ++chain) {
        const float4 a1 = *reinterpret_cast<const float4*>(dq_chain(p, chain) + offset);
        a = make_float4(a.x + a1.x, a.y + a1.y, a.z + a1.z, a.w + a1.w);
      }
      *reinterpret_cast<float2*>(&tile[row][col]) = make_float2(a.x, a.y);
      *reinterpret_cast<float2*>(&tile[row + 8][col]) = make_float2(a.z, a.w);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * (cols / 8); idx += 128) {
      const int row = idx / (cols / 8), c = idx % (cols / 8) * 8;
      const float4 a = *reinterpret_cast<const float4*>(&tile[row][c]);
      const float4 b = *reinterpret_cast<const float4*>(&tile[row][c + 4]);
      const uint4 out = {ptx::pack2<Element>(a.x * s, a.y * s),
                         ptx::pack2<Element>(a.z * s, a.w * s),
                         ptx::pack2<Element>(b.x * s, b.y * s),
                         ptx::pack2<Element>(b.z * s, b.w * s)};
      *reinterpret_cast<uint4*>(static_cast<Element*>(p.dq) + batch * p.dq_batch_stride +
                                (seq.q_row0 + m0 + row) * p.dq_row_stride +
                                head * p.dq_head_stride + c0 + c) = out;
    }
    __syncthreads();
  }
}

// The same result as bwd_convert_dq_kernel, bit for bit (BwdParams::convert_lean, for A/B;
// always with dq_first_store_rows, whose unvisited tiles it reads as 0). That kernel's loop
// issues one 16-byte load per thread, waits for it and stores it in shared memory before the
// next (runtime trip count and an early exit), so its 128 threads keep 2 KiB in flight, and
// it measured 102-120 us for 201 MB (d128, 16k tokens x hidden 2048, H100), 1.7-2.0 TB/s.
// Here warp w owns the tile's 16-row block w (in accumulator order 16 x kCols contiguous
// floats): all its loads of a pass and chain (kCols / 8 per lane) are issued before any is
// used, the chains added in order; the scaled values go to shared memory as the output
// dtype's pairs (a 4-word row pad: the 8 rows x 4 words of a store hit 32 banks) and come
// back as 16-byte row segments. d128: one pass, 64 registers of loads, 17 KiB.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(128) bwd_convert_dq_lean_kernel(const BwdParams p) {
  ptx::griddep_wait();  // as bwd_convert_dq_kernel's
  // columns per pass: all of them up to 128; d192 in two passes of 96, d256 of 128
  constexpr int kCols = kHeadDim <= 128 ? kHeadDim : kHeadDim % 128 == 0 ? 128 : kHeadDim / 2;
  constexpr int kBlocks = kCols / 8;                      // n8 blocks of a row block per pass
  constexpr int kStride = kCols / 2 + 4;                  // 32-bit words per shared row
  static_assert(kHeadDim % kCols == 0 && (kStride * 4) % 16 == 0, "convert tile");
  __shared__ alignas(16) uint32_t tile[64 * kStride];  // (16-byte row segments read back)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  const int m0 = blockIdx.x * 64, rows = min(64, seq.seqlen_q - m0);
  if (rows <= 0) return;  // (varlen: past this sequence; uniform in the block)
  const int64_t block0 = ws_row0(p, seq, batch, head) + m0 + 16 * warp;  // a multiple of 16
  const bool live = 16 * warp < rows;
  const float s = p.softmax_scale;
  // dq_first_store_rows (dq_accum not zeroed): the tile's counter in chain 0 (the main
  // kernel's tiles of that many rows; d64's 128-row tiles use the first slots), non-zero
  // where a visitor stored (and then added) the chain's dQ; a chain without reads as 0.
  const int* const counter =
      p.dq_first_store_rows
          ? dq_counters(p) + ws_tile0(p, seq, batch, head, 64) + m0 / p.dq_first_store_rows
          : nullptr;
  Element* const dq = static_cast<Element*>(p.dq) + batch * p.dq_batch_stride +
                      (seq.q_row0 + m0) * p.dq_row_stride + head * p.dq_head_stride;
#pragma unroll 1
  for (int c0 = 0; c0 < kHeadDim; c0 += kCols) {
    // Chain c's blocks of the pass, all loads issued before any is used.
    auto load = [&](int chain, float4 (&b)[kBlocks]) {
      const float* const src = dq_chain(p, chain) + block0 * p.headdim + 16 * c0 + 4 * lane;
#pragma unroll
      for (int cb = 0; cb < kBlocks; ++cb) {
        b[cb] = live && c0 + 8 * cb < p.headdim ? *reinterpret_cast<const float4*>(src + 128 * cb)
                                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      // (issued with the loads, not before them; an unvisited tile's floats are garbage)
      if (counter && counter[chain * ws_tiles(p, 64)] == 0) {
#pragma unroll
        for (int cb = 0; cb < kBlocks; ++cb) b[cb] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    };
    float4 a[kBlocks];
    load(0, a);
#pragma unroll 1
    for (int chain = 1; chain < p.dq_chains; ++chain) {  // added in chain order, as there
      float4 b[kBlocks];
      load(chain, b);
#pragma unroll
      for (int cb = 0; cb < kBlocks; ++cb) {
        a[cb] = make_float4(a[cb].x + b[cb].x, a[cb].y + b[cb].y, a[cb].z + b[cb].z,
                            a[cb].w + b[cb].w);
      }
    }
    // Lane 4 g + q holds rows g, g + 8 x columns 2 q, 2 q + 1 of each block.
    const int r = 16 * warp + lane / 4, q = lane % 4;
#pragma unroll
    for (int cb = 0; cb < kBlocks; ++cb) {
      tile[r * kStride + 4 * cb + q] = ptx::pack2<Element>(a[cb].x * s, a[cb].y * s);
      tile[(r + 8) * kStride + 4 * cb + q] = ptx::pack2<Element>(a[cb].z * s, a[cb].w * s);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 64 * kBlocks / 128; ++i) {
      const int idx = threadIdx.x + 128 * i, row = idx / kBlocks, seg = idx % kBlocks;
      if (row < rows && c0 + 8 * seg < p.headdim) {
        *reinterpret_cast<uint4*>(dq + row * p.dq_row_stride + c0 + 8 * seg) =
            *reinterpret_cast<const uint4*>(&tile[row * kStride + 4 * seg]);
      }
    }
    if (c0 + kCols < kHeadDim) __syncthreads();  // (d256: the next pass rewrites the tile)
  }
}

}  // namespace flashattn2
