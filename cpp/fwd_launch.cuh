// Launcher of the forward kernel for one (dtype, head dim); instantiated by the generated
// units fwd_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_FWD.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "fwd_kernel.cuh"
#include "launch.h"

namespace flashattn2 {

template <typename Element, int kHeadDim>
void run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = FwdTraits<kHeadDim>;
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch);
  auto launch = [&](auto mods) {
    constexpr auto kernel = fwd_kernel<Traits, Element, decltype(mods)::value>;
    raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(fwd_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  };
  // Score modifiers run in their own instance so that plain attention keeps its registers
  // (benchmarks/NOTES.md, "Attention variants").
  if (has_score_mods(params)) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_FWD(Element, kHeadDim) \
  template void flashattn2::run_fwd<Element, kHeadDim>(const flashattn2::FwdParams&, cudaStream_t);
