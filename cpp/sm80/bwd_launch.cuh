// Launcher of the backward kernels for one (dtype, head dim); instantiated by the generated
// units bwd_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_BWD.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "sm80/bwd_kernel.cuh"
#include "sm80/bwd_prepost.cuh"
#include "common/launch.h"

namespace flashattn2 {

template <typename Element, int kHeadDim>
void run_bwd_preprocess(const BwdParams& params, cudaStream_t stream) {
  const dim3 rows_grid((params.seqlen_q + 63) / 64, params.nheads, params.batch);
  if (params.dq_first_store_rows)  // (the Hopper backward's first visitors store)
    bwd_preprocess_kernel<Element, kHeadDim, false><<<rows_grid, 128, 0, stream>>>(params);
  else
    bwd_preprocess_kernel<Element, kHeadDim><<<rows_grid, 128, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_preprocess_kernel launch");
}

template <typename Element, int kHeadDim>
void run_bwd_convert_dq(const BwdParams& params, bool pdl, cudaStream_t stream) {
  const dim3 rows_grid((params.seqlen_q + 63) / 64, params.nheads, params.batch);
  if (params.convert_lean || params.dq_first_store_rows)
    launch_kernel(bwd_convert_dq_lean_kernel<Element, kHeadDim>, rows_grid, 128, 0, stream, pdl,
                  "bwd_convert_dq_lean_kernel launch", params);
  else
    launch_kernel(bwd_convert_dq_kernel<Element>, rows_grid, 128, 0, stream, pdl,
                  "bwd_convert_dq_kernel launch", params);
}

template <typename Element, int kHeadDim>
void run_bwd(const BwdParams& params, int smem_per_block, cudaStream_t stream) {
  run_bwd_preprocess<Element, kHeadDim>(params, stream);
  auto launch = [&](auto traits, auto mods, auto bias, auto staged) {
    using Traits = decltype(traits);
    constexpr bool kStaged = decltype(staged)::value;
    constexpr auto kernel = bwd_kernel<Traits, Element, decltype(mods)::value,
                                       decltype(bias)::value, kStaged>;
    constexpr int kSmem =
        Traits::kSmemBytes + (kStaged ? bwd_bias_smem_bytes(kHeadDim, Traits::kSmallSmem) : 0);
    raise_smem_limit<kernel>(kSmem, "cudaFuncSetAttribute(bwd_kernel, smem)");
    const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.nheads_k,
                    params.batch);
    kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  };
  // Score modifiers in their own instance, as in run_fwd; the small-smem tile where the
  // full one does not fit the GPU's blocks (bwd_config.h; the host checked that one fits).
  // A bias with 16-byte aligned rows is staged in shared memory where the full tile has room
  // for it (bwd_bias_smem_bytes; BwdParams::bias_staged lets the caller turn it off).
  auto launch_mods = [&](auto traits) {
    using Traits = decltype(traits);
    if (has_bias(params)) {  // (FLASHATTN2_BIAS builds only)
#if FLASHATTN2_BIAS
      if constexpr (!Traits::kSmallSmem) {
        if (params.bias_staged && bias_rows_16b(params) &&
            smem_per_block >= Traits::kSmemBytes + bwd_bias_smem_bytes(kHeadDim)) {
          launch(traits, std::true_type{}, std::true_type{}, std::true_type{});
          return;
        }
      }
#endif
      if constexpr (FLASHATTN2_BIAS) {
        launch(traits, std::true_type{}, std::true_type{}, std::false_type{});
      }
    } else if (has_score_mods(params)) {
      launch(traits, std::true_type{}, std::false_type{}, std::false_type{});
    } else {
      launch(traits, std::false_type{}, std::false_type{}, std::false_type{});
    }
  };
  if constexpr (bwd_smem_bytes(kHeadDim, true) < bwd_smem_bytes(kHeadDim, false)) {
    if (smem_per_block < bwd_smem_bytes(kHeadDim, false)) {
      launch_mods(BwdTraits<kHeadDim, true>{});
    } else {
      launch_mods(BwdTraits<kHeadDim, false>{});
    }
  } else {
    launch_mods(BwdTraits<kHeadDim, false>{});
  }
  check_cuda(cudaGetLastError(), "bwd_kernel launch");
  run_bwd_convert_dq<Element, kHeadDim>(params, false, stream);
}

}  // namespace flashattn2

// run_bwd_preprocess / run_bwd_convert_dq are instantiated here for the Hopper backward too
// (sm90/bwd_launch.cuh only declares them), so that their kernels exist in one unit, built
// for every arch: a kernel template instantiated in units of different archs may bind to
// the copy without code for the running GPU.
#define FLASHATTN2_INSTANTIATE_BWD(Element, kHeadDim)                                     \
  template void flashattn2::run_bwd<Element, kHeadDim>(const flashattn2::BwdParams&, int,  \
                                                        cudaStream_t);                     \
  template void flashattn2::run_bwd_preprocess<Element, kHeadDim>(                         \
      const flashattn2::BwdParams&, cudaStream_t);                                         \
  template void flashattn2::run_bwd_convert_dq<Element, kHeadDim>(                         \
      const flashattn2::BwdParams&, bool, cudaStream_t);
