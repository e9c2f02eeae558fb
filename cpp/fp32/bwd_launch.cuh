// Launcher of the float32 backward (bwd_kernel.cuh) for one head dim: preprocess, main,
// convert (bwd_prepost.cu); instantiated by the units bwd_fp32_hdim<D>.cu.
#pragma once
#include <cuda_runtime.h>

#include "common/launch.h"
#include "fp32/bwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn2 {

template <int kHeadDim>
void run_bwd_fp32(const BwdParams& params, cudaStream_t stream) {
  using Traits = Fp32BwdTraits<kHeadDim>;
  run_bwd_fp32_preprocess(params, stream);
  constexpr auto kernel = bwd_fp32_kernel<Traits>;
  constexpr int kSmemBytes = 4 * Traits::kSmemFloats;
  raise_smem_limit<kernel>(kSmemBytes, "cudaFuncSetAttribute(bwd_fp32_kernel, smem)");
  const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.nheads_k,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32_kernel launch");
  run_bwd_fp32_convert(params, stream);
}

}  // namespace flashattn2
