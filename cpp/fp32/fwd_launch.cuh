// Launcher of the float32 forward (fwd_kernel.cuh) for one head dim; instantiated by the units
// fwd_fp32_hdim<D>.cu.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "common/launch.h"
#include "fp32/fwd_kernel.cuh"
#include "fp32/launch.h"

namespace flashattn2 {

template <int kHeadDim>
void run_fwd_fp32(const FwdParams& params, cudaStream_t stream) {
  using Traits = Fp32FwdTraits<kHeadDim>;
  // (varlen: seqlen_q is the longest sequence's length)
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch);
  auto launch = [&](auto general) {
    constexpr auto kernel = fwd_fp32_kernel<Traits, decltype(general)::value>;
    raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(fwd_fp32_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  };
  // Varlen and softcap / ALiBi in their own instance (fwd_kernel.cuh kGeneral).
  if (params.cu_seqlens_q || params.softcap > 0.f || params.alibi_slopes) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  check_cuda(cudaGetLastError(), "fwd_fp32_kernel launch");
}

}  // namespace flashattn2
