// Split-KV combine: merges the num_splits partial results of the forward (FwdParams'
// o_accum / lse_accum, each split normalised by its own softmax sum) into o and lse:
//   lse = log sum_s exp(lse_s),   o = sum_s exp(lse_s - lse) o_s
// (the per-row math of lse_merge.cuh, which flashattn2.merge shares)
// A row that no split saw (every lse_s = -inf) gets o = 0, lse = +inf, as the forward.
// 128 threads combine 4 / W rows (W = combine_warps_per_row(num_splits): 1, 2 or 4 warps
// per row); grid ceil(batch * nheads * seqlen_q * W / 4). Warp j of a row takes splits j,
// j + W, ... (at most 8: one batch of loads in flight) and lane l columns 4 l + 128 i; the
// warps' sums meet in shared memory. Each warp issues the loads of its partial rows before
// it reads the LSEs (lane per split) for the weights, so the two L2 round trips overlap.
// (One warp per row walking all splits in batches of 8 took 4.2 us at b=1: 32 rows, 32
// splits, 8 CTAs.)
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "common/flash.h"
#include "common/lse_merge.cuh"
#include "common/launch.h"
#include "flash_api.h"
#include "common/ptx.cuh"
#include "common/seqlen.cuh"

namespace flashattn2 {

template <typename Element>
__global__ void __launch_bounds__(128) combine_kernel(const FwdParams p) {
  // Launched as a programmatic dependent of the split kernel on sm_90 (launch_combine): wait
  // for that grid's partial results.
  ptx::griddep_wait();
  constexpr int kUnroll = 8;          // splits per warp, loads in flight at once
  constexpr int kPasses = 256 / 128;  // 128 columns per pass (head dims up to 256)
  __shared__ float4 s_acc[4][kPasses][32];
  __shared__ float s_weight[4][kMaxSplits];
  const int warps_per_row = combine_warps_per_row(p.num_splits);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = warp / warps_per_row, part = warp % warps_per_row;  // row of the block
  // ((batch * nheads) + head) * seqlen_q + row; 32 bits (the host checks the row count:
  // 64-bit divisions cost this short kernel ~300 instructions before its first load).
  const int idx = int(blockIdx.x) * (4 / warps_per_row) + slot;
  const int row = idx % p.seqlen_q;
  const int head = idx / p.seqlen_q % p.nheads;
  const int batch = min(idx / p.seqlen_q / p.nheads, p.batch - 1);
  const SeqInfo seq(p, batch);
  // (Not a return: the block's barriers need every warp.)
  const bool valid = idx < p.batch * p.nheads * p.seqlen_q && row < seq.seqlen_q;

  const int64_t split_stride = int64_t(p.batch) * p.nheads * p.seqlen_q;  // rows per split
  const int64_t step = split_stride * p.headdim;                           // floats per split
  const float* const src = p.o_accum + int64_t(idx) * p.headdim + lane * 4;
  const int n_mine = valid ? (p.num_splits - part + warps_per_row - 1) / warps_per_row : 0;
  float4 x[kPasses][kUnroll];
  auto load = [&](int j0) {  // this warp's splits part + W (j0 + u); zeros past its last
#pragma unroll
    for (int i = 0; i < kPasses; ++i)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        x[i][u] = j0 + u < n_mine && 128 * i + 4 * lane < p.headdim
                      ? *reinterpret_cast<const float4*>(
                            src + (part + warps_per_row * (j0 + u)) * step + 128 * i)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  load(0);

  // Weights exp(lse_s - max): every warp of the row computes them all (the lanes take the
  // splits); its first warp keeps them for the others.
  float lse_max = -INFINITY, sum = 0.f;
  if (valid) {
    for (int s = lane; s < p.num_splits; s += 32) {
      lse_max = fmaxf(lse_max, p.lse_accum[s * split_stride + idx]);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffff, lse_max, o));
  if (valid) {
    for (int s = lane; s < p.num_splits; s += 32) {
      const float lse = p.lse_accum[s * split_stride + idx];
      const float w = lse_merge::weight(lse, lse_max);
      if (part == 0) s_weight[slot][s] = w;
      sum += w;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
  __syncthreads();  // s_weight

  float4 acc[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int j0 = 0; j0 < n_mine; j0 += kUnroll) {
    if (j0 > 0) load(j0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = j0 + u < n_mine ? s_weight[slot][part + warps_per_row * (j0 + u)] : 0.f;
#pragma unroll
      for (int i = 0; i < kPasses; ++i)
        acc[i] = make_float4(fmaf(w, x[i][u].x, acc[i].x), fmaf(w, x[i][u].y, acc[i].y),
                             fmaf(w, x[i][u].z, acc[i].z), fmaf(w, x[i][u].w, acc[i].w));
    }
  }
#pragma unroll
  for (int i = 0; i < kPasses; ++i) s_acc[warp][i][lane] = acc[i];
  __syncthreads();
  if (part > 0 || !valid) return;

  const float inv = lse_merge::inv_sum(sum);
  if (lane == 0) {
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + seq.q_row0 + row] =
        lse_merge::merged_lse(lse_max, sum, INFINITY);
  }
  Element* out = static_cast<Element*>(p.o) + batch * p.o_batch_stride +
                 head * p.o_head_stride + (seq.q_row0 + row) * p.o_row_stride;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int c = 128 * i + 4 * lane;
    if (c < p.headdim) {
      float4 a = s_acc[warp][i][lane];
      for (int w = 1; w < warps_per_row; ++w) {
        const float4 b = s_acc[warp + w][i][lane];
        a = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
      }
      *reinterpret_cast<uint2*>(out + c) = make_uint2(ptx::pack2<Element>(a.x * inv, a.y * inv),
                                                      ptx::pack2<Element>(a.z * inv, a.w * inv));
    }
  }
}

// Merges the num_splits partial results of a split-KV forward into o and lse. On sm_90 and
// newer as a programmatic dependent launch: the grid may start while the split kernel still
// runs (the decode kernel lets it at its start) and waits on the SMs (griddep_wait), so the
// gap between the two kernels shrinks to that wait.
template <typename Element>
void launch_combine(const FwdParams& params, cudaStream_t stream) {
  const int64_t rows = int64_t(params.batch) * params.nheads * params.seqlen_q;
  const int rows_per_block = 4 / combine_warps_per_row(params.num_splits);
  const unsigned blocks = unsigned((rows + rows_per_block - 1) / rows_per_block);
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  launch_kernel(combine_kernel<Element>, dim3(blocks), 128, 0, stream,
                compute_capability(device) >= 90, "combine_kernel launch", params);
}

}  // namespace flashattn2
