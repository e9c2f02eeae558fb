// Launcher of the decode kernel (decode_kernel.cuh) for one (dtype, head dim); instantiated by
// the generated units decode_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_DECODE (builds
// with FLASHATTN2_EXPERIMENTAL containing decode only).
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "common/launch.h"
#include "sm80/decode_kernel.cuh"

namespace flashattn2 {

// The decode kernel (whole-row copies where decode_full_rows says so), then for num_splits > 1
// the split-KV combine kernel, which merges the partial results (the KV kernel's o_accum /
// lse_accum layout). The caller checked decode_supports(). `warps`: kDecodeWarps or
// kDecodeSmallWarps; smem_bytes >= decode_smem_bytes(kHeadDim, warps) (more limits the CTAs an
// SM holds; flash_api_splits.cpp decode_launch picks both).
template <typename Element, int kHeadDim>
void run_decode(const FwdParams& params, int warps, int smem_bytes, cudaStream_t stream) {
  const dim3 grid(params.num_splits, params.nheads / params.q_pack, params.batch);
  auto launch = [&](auto mods, auto full_rows, auto n_warps) {
    using Traits = DecodeTraits<kHeadDim, decltype(n_warps)::value>;
    constexpr auto kernel =
        decode_kernel<Traits, Element, decltype(mods)::value, decltype(full_rows)::value>;
    raise_smem_limit<kernel>(smem_bytes, "cudaFuncSetAttribute(decode_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, smem_bytes, stream>>>(params);
  };
  auto launch_warps = [&](auto mods, auto full_rows) {
    if (warps == kDecodeSmallWarps) {
      launch(mods, full_rows, std::integral_constant<int, kDecodeSmallWarps>{});
    } else {
      launch(mods, full_rows, std::integral_constant<int, kDecodeWarps>{});
    }
  };
  auto launch_rows = [&](auto mods) {
    if constexpr (decode_full_rows_head_dim(kHeadDim)) {  // (else no whole-row instance)
      if (decode_full_rows(kHeadDim, params.seqlen_k, params.num_splits)) {
        launch_warps(mods, std::true_type{});
        return;
      }
    }
    launch_warps(mods, std::false_type{});
  };
  if (has_score_mods(params)) {  // softcap / ALiBi (decode_supports excludes dropout, bias)
    launch_rows(std::integral_constant<int, kModLogits>{});
  } else {
    launch_rows(std::integral_constant<int, kModNone>{});
  }
  check_cuda(cudaGetLastError(), "decode_kernel launch");
  if (params.num_splits > 1) launch_combine<Element>(params, stream);
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_DECODE(Element, kHeadDim) \
  template void flashattn2::run_decode<Element, kHeadDim>(const flashattn2::FwdParams&, int, int, \
                                                          cudaStream_t);
