// Launcher of the float32 backward (bwd_kernel.cuh) for one head dim: preprocess, main,
// convert (bwd_prepost.cu); instantiated by the units bwd_fp32_hdim<D>.cu.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "common/launch.h"
#include "fp32/bwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn2 {

template <int kHeadDim>
void run_bwd_fp32(const BwdParams& params, cudaStream_t stream) {
  using Traits = Fp32BwdTraits<kHeadDim>;
  run_bwd_fp32_preprocess(params, stream);
  constexpr int kSmemBytes = 4 * Traits::kSmemFloats;
  // (varlen: seqlen_k is the longest sequence's length)
  const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.nheads_k,
                  params.batch);
  auto launch = [&](auto general) {
    constexpr auto kernel = bwd_fp32_kernel<Traits, decltype(general)::value>;
    raise_smem_limit<kernel>(kSmemBytes, "cudaFuncSetAttribute(bwd_fp32_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  };
  // Varlen, the deterministic dQ order and softcap / ALiBi in their own instance
  // (bwd_kernel.cuh kGeneral).
  if (params.cu_seqlens_q || params.deterministic || params.softcap > 0.f ||
      params.alibi_slopes) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  check_cuda(cudaGetLastError(), "bwd_fp32_kernel launch");
  run_bwd_fp32_convert(params, stream);
}

}  // namespace flashattn2
