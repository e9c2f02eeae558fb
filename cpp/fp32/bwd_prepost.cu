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
// row), and with deterministic the dQ order counter of each 64-row group. A row's float4s are
// read by pre_lanes(headdim) consecutive lanes (a power of two, up to 32: d64 16, d128 32, one
// float4 each up to d128), 128 / lanes rows a pass, kPrePasses passes a CTA, every pass's loads
// issued before the reductions and the zeroes (a warp a row left half the lanes idle at d64 and
// one row's loads in flight per warp). Varlen: the rows of the sequence (SeqInfo), the grid
// covering the longest.
constexpr int kPrePasses = 4;
__host__ __device__ constexpr int pre_lanes(int headdim) {
  int lanes = 1;
  while (lanes < 32 && 4 * lanes < headdim) lanes *= 2;
  return lanes;
}

__global__ void __launch_bounds__(128) bwd_fp32_preprocess_kernel(const BwdParams p) {
  const int lanes = pre_lanes(p.headdim), rows_per_pass = 128 / lanes;
  const int sub = threadIdx.x % lanes, r = threadIdx.x / lanes, chunks = p.headdim / 4;
  const int head = blockIdx.y, batch = blockIdx.z;
  const SeqInfo seq(p, batch);
  const int row0 = blockIdx.x * kPrePasses * rows_per_pass;
  if (row0 >= seq.seqlen_q) return;
  const float* const o = static_cast<const float*>(p.o) + batch * p.o_batch_stride +
                         head * p.o_head_stride;
  const float* const dout = static_cast<const float*>(p.dout) + batch * p.do_batch_stride +
                            head * p.do_head_stride;
  // Every pass's first float4 of O and dO at once (an invalid row or chunk reads the CTA's
  // first row and adds nothing), the rest of a row past 32 float4s (d > 128) after them, then
  // the zeroes.
  float acc[kPrePasses];
  float4 a[kPrePasses], b[kPrePasses];
#pragma unroll
  for (int pass = 0; pass < kPrePasses; ++pass) {
    const int row = row0 + pass * rows_per_pass + r;
    const bool valid = row < seq.seqlen_q && sub < chunks;
    const int64_t grow = seq.q_row0 + (valid ? row : row0);
    const int c = valid ? 4 * sub : 0;
    a[pass] = __ldg(reinterpret_cast<const float4*>(o + grow * p.o_row_stride + c));
    b[pass] = __ldg(reinterpret_cast<const float4*>(dout + grow * p.do_row_stride + c));
  }
#pragma unroll
  for (int pass = 0; pass < kPrePasses; ++pass) {
    const int row = row0 + pass * rows_per_pass + r;
    const bool valid = row < seq.seqlen_q && sub < chunks;
    const float dot = fmaf(a[pass].x, b[pass].x, fmaf(a[pass].y, b[pass].y,
                           fmaf(a[pass].z, b[pass].z, a[pass].w * b[pass].w)));
    acc[pass] = valid ? dot : 0.f;
    if (row >= seq.seqlen_q) continue;
    const int64_t grow = seq.q_row0 + row;
    for (int c = 4 * (sub + lanes); c < 4 * chunks; c += 4 * lanes) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(o + grow * p.o_row_stride + c));
      const float4 y = __ldg(reinterpret_cast<const float4*>(dout + grow * p.do_row_stride + c));
      acc[pass] = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, acc[pass]))));
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPrePasses; ++pass) {
    const int row = row0 + pass * rows_per_pass + r;
    if (row >= seq.seqlen_q) continue;
    const int64_t grow = seq.q_row0 + row;
    float* const zero = p.fp32_dq_direct
                            ? static_cast<float*>(p.dq) + batch * p.dq_batch_stride +
                                  head * p.dq_head_stride + grow * p.dq_row_stride
                            : p.dq_accum + (fp32_ws_row0(p, seq, batch, head) + row) * p.headdim;
    for (int c = 4 * sub; c < 4 * chunks; c += 4 * lanes) {
      *reinterpret_cast<float4*>(zero + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPrePasses; ++pass) {
    for (int offset = lanes / 2; offset > 0; offset /= 2) {
      acc[pass] += __shfl_xor_sync(0xffffffff, acc[pass], offset);
    }
    const int row = row0 + pass * rows_per_pass + r;
    if (sub != 0 || row >= seq.seqlen_q) continue;
    p.dsum[fp32_ws_row0(p, seq, batch, head) + row] = acc[pass];
    if (p.deterministic && row % kFp32DqGroupRows == 0) {
      dq_counters(p)[ws_tile0(p, seq, batch, head, kFp32DqGroupRows) + row / kFp32DqGroupRows] = 0;
    }
  }
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
  const int rows = kPrePasses * 128 / pre_lanes(params.headdim);
  const dim3 grid(unsigned((params.seqlen_q + rows - 1) / rows), params.nheads, params.batch);
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
