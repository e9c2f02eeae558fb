// The dropout keep mask as a uint8 tensor (tests and return_attn_probs), from the Philox
// function of score_mod.cuh that the attention kernels use. Not per (dtype, head dim), so it
// is the one hand-written .cu file of the kernel library.
#include <cuda_runtime.h>

#include "common/launch.h"
#include "common/score_mod.cuh"

namespace flashattn2 {
namespace {

// mask[b, h, i, j] = 1 if kept (DropoutMaskParams, flash.h). One thread per 2x2 Philox
// group; grid (ceil(group columns / 128), ceil(seqlen_q / 16) * 8, batch * nheads), 128
// threads.
__global__ void __launch_bounds__(128) dropout_mask_kernel(const DropoutMaskParams p) {
  const int bh = blockIdx.z;
  ScoreMod mod;
  mod.init_dropout(p.rng_state, p.dropout_threshold, bh);
  const int group_col = blockIdx.x * 128 + threadIdx.x;
  const int group_row = blockIdx.y;
  const int i = (group_row / 8) * 16 + group_row % 8;
  const int j = (group_col / 8) * 16 + group_col % 8;
  if (i >= p.seqlen_q || j >= p.seqlen_k) return;
  const uint4 w = mod.dropout_words(i, j);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  uint8_t* out = p.mask + int64_t(bh) * p.seqlen_q * p.seqlen_k;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int row = i + 8 * (k >> 1), col = j + 8 * (k & 1);
    if (row < p.seqlen_q && col < p.seqlen_k) {
      out[int64_t(row) * p.seqlen_k + col] = words[k] >= mod.threshold ? 1 : 0;
    }
  }
}

}  // namespace

void run_dropout_mask(const DropoutMaskParams& params, cudaStream_t stream) {
  const int group_cols = (params.seqlen_k + 15) / 16 * 8;
  const dim3 grid((group_cols + 127) / 128, (params.seqlen_q + 15) / 16 * 8,
                  params.batch * params.nheads);
  dropout_mask_kernel<<<grid, 128, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "dropout_mask_kernel launch");
}

}  // namespace flashattn2
