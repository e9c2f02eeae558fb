// The float32 backward's preprocess and dQ convert kernels (one unit for every head dim;
// FLASHATTN2_EXPERIMENTAL=fp32 builds), around the main kernel of bwd_kernel.cuh.
#include <cuda_runtime.h>

#include "common/launch.h"
#include "fp32/bwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn2 {
namespace {

// dsum = rowsum(dO o O) and a zeroed dq_accum row; one warp per (batch, head, row).
__global__ void __launch_bounds__(128) bwd_fp32_preprocess_kernel(const BwdParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * 4 + threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  if (row >= p.seqlen_q) return;
  const float* o = static_cast<const float*>(p.o) + batch * p.o_batch_stride +
                   head * p.o_head_stride + int64_t(row) * p.o_row_stride;
  const float* dout = static_cast<const float*>(p.dout) + batch * p.do_batch_stride +
                      head * p.do_head_stride + int64_t(row) * p.do_row_stride;
  const int64_t ws = fp32_ws_row(p, batch, head, row);
  float* dq_accum = p.dq_accum + ws * p.headdim;
  float sum = 0.f;
  for (int c = lane; c < p.headdim; c += 32) {
    sum = fmaf(o[c], dout[c], sum);
    dq_accum[c] = 0.f;
  }
#pragma unroll
  for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(0xffffffff, sum, width);
  if (lane == 0) p.dsum[ws] = sum;
}

// dq = dq_accum * softmax_scale; one thread per element.
__global__ void __launch_bounds__(256) bwd_fp32_convert_kernel(const BwdParams p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_head = int64_t(p.seqlen_q) * p.headdim;
  if (i >= int64_t(p.batch) * p.nheads * per_head) return;
  const int64_t bh = i / per_head;
  const int row = int((i % per_head) / p.headdim), c = int(i % p.headdim);
  const int batch = int(bh / p.nheads), head = int(bh % p.nheads);
  static_cast<float*>(p.dq)[batch * p.dq_batch_stride + head * p.dq_head_stride +
                            int64_t(row) * p.dq_row_stride + c] = p.dq_accum[i] * p.softmax_scale;
}

}  // namespace

void run_bwd_fp32_preprocess(const BwdParams& params, cudaStream_t stream) {
  bwd_fp32_preprocess_kernel<<<dim3((params.seqlen_q + 3) / 4, params.nheads, params.batch), 128,
                               0, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32_preprocess_kernel launch");
}

void run_bwd_fp32_convert(const BwdParams& params, cudaStream_t stream) {
  const int64_t elements = int64_t(params.batch) * params.nheads * params.seqlen_q * params.headdim;
  bwd_fp32_convert_kernel<<<unsigned((elements + 255) / 256), 256, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32_convert_kernel launch");
}

}  // namespace flashattn2
