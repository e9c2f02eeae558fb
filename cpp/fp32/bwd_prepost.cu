// The float32 backward's preprocess and dQ convert kernels (one unit for every head dim;
// FLASHATTN2_EXPERIMENTAL=fp32 builds), around the main kernel of bwd_kernel.cuh.
#include <cuda_runtime.h>

#include "common/launch.h"
#include "common/dq_order.cuh"
#include "common/seqlen.cuh"
#include "fp32/bwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn2 {
namespace {

// dsum = rowsum(dO o O), a zeroed dq_accum row (fp32/seq.cuh's layout; fp32_dq_direct: the dq
// row), and with deterministic the dQ order counter of each 64-row group; one warp per (batch,
// head, row). Varlen: the rows of the sequence (SeqInfo), the grid covering the longest.
__global__ void __launch_bounds__(128) bwd_fp32_preprocess_kernel(const BwdParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 4 + threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  if (row >= seq.seqlen_q) return;
  const int64_t ws = fp32_ws_row0(p, seq, batch, head) + row;
  if (p.deterministic && lane == 0 && row % kFp32DqGroupRows == 0) {
    dq_counters(p)[ws_tile0(p, seq, batch, head, kFp32DqGroupRows) + row / kFp32DqGroupRows] = 0;
  }
  const int64_t grow = seq.q_row0 + row;
  const float* o = static_cast<const float*>(p.o) + batch * p.o_batch_stride +
                   head * p.o_head_stride + grow * p.o_row_stride;
  const float* dout = static_cast<const float*>(p.dout) + batch * p.do_batch_stride +
                      head * p.do_head_stride + grow * p.do_row_stride;
  float* dq_accum = p.fp32_dq_direct
                        ? static_cast<float*>(p.dq) + batch * p.dq_batch_stride +
                              head * p.dq_head_stride + grow * p.dq_row_stride
                        : p.dq_accum + ws * p.headdim;
  float sum = 0.f;
  for (int c = lane; c < p.headdim; c += 32) {
    sum = fmaf(o[c], dout[c], sum);
    dq_accum[c] = 0.f;
  }
#pragma unroll
  for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(0xffffffff, sum, width);
  if (lane == 0) p.dsum[ws] = sum;
}

// dq = dq_accum * softmax_scale; one thread per element of (batch, head)'s rows.
__global__ void __launch_bounds__(256) bwd_fp32_convert_kernel(const BwdParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  const int row = int(i / p.headdim), c = int(i % p.headdim);
  if (row >= seq.seqlen_q) return;
  const float x = p.dq_accum[(fp32_ws_row0(p, seq, batch, head) + row) * p.headdim + c];
  static_cast<float*>(p.dq)[batch * p.dq_batch_stride + head * p.dq_head_stride +
                            (seq.q_row0 + row) * p.dq_row_stride + c] = x * p.softmax_scale;
}

}  // namespace

void run_bwd_fp32_preprocess(const BwdParams& params, cudaStream_t stream) {
  // (varlen: seqlen_q is the longest sequence's length)
  const dim3 grid(unsigned((params.seqlen_q + 3) / 4), params.nheads, params.batch);
  bwd_fp32_preprocess_kernel<<<grid, 128, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32_preprocess_kernel launch");
}

void run_bwd_fp32_convert(const BwdParams& params, cudaStream_t stream) {
  const int64_t elements = int64_t(params.seqlen_q) * params.headdim;
  const dim3 grid(unsigned((elements + 255) / 256), params.nheads, params.batch);
  bwd_fp32_convert_kernel<<<grid, 256, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32_convert_kernel launch");
}

}  // namespace flashattn2
