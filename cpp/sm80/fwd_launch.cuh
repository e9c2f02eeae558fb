// Launcher of the forward kernels for one (dtype, head dim); instantiated by the generated
// units fwd_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_FWD.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "sm80/fwd_kernel.cuh"
#include "common/launch.h"

namespace flashattn2 {

template <typename Traits, typename Element>
void launch_fwd(const FwdParams& params, cudaStream_t stream) {
  const int splits = Traits::kKv ? params.num_splits : 1;
  const int pack = Traits::kKv ? params.q_pack : 1;  // GQA packing: FwdParams::q_pack
  const dim3 grid((params.seqlen_q * pack + Traits::kBlockM - 1) / Traits::kBlockM,
                  params.nheads / pack, params.batch * splits);
  auto launch = [&](auto mods) {
    constexpr auto kernel = fwd_kernel<Traits, Element, decltype(mods)::value>;
    raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(fwd_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  };
  // Score modifiers run in their own instances so that plain attention keeps its registers
  // (benchmarks/NOTES.md, "Attention variants"); dropout only in the plain-tile kernel.
  using Mods = std::integral_constant<int, kModLogits>;
  if (!has_score_mods(params)) {
    launch(std::integral_constant<int, kModNone>{});
  } else if (has_bias(params)) {  // (mha_fwd refuses a bias with splits or pages)
    if constexpr (FLASHATTN2_BIAS && !Traits::kKv) {
      if (params.dropout_threshold == 0) {
        launch(std::integral_constant<int, kModBias>{});
      } else {
        launch(std::integral_constant<int, kModBiasDropout>{});
      }
    }
  } else if (params.dropout_threshold == 0) {
    constexpr bool kSoftcapInstance = fwd_softcap_instance(Traits::kHeadDim, Traits::kKv);
    constexpr bool kBoundedInstance = fwd_softcap_bounded(
        Traits::kHeadDim, std::is_same_v<Element, __nv_bfloat16>, Traits::kKv);
    constexpr float kLog2e = 1.4426950408889634f;
    if (kSoftcapInstance && params.softcap > 0.f && params.alibi_slopes == nullptr) {
      if constexpr (kSoftcapInstance) {
        if (kBoundedInstance && params.softcap * kLog2e <= kSoftcapBoundedLog2) {
          constexpr int kMods = kBoundedInstance ? kModSoftcapBounded : kModSoftcap;
          launch(std::integral_constant<int, kMods>{});
        } else {
          launch(std::integral_constant<int, kModSoftcap>{});
        }
      }
    } else {
      launch(Mods{});
    }
  } else if constexpr (!Traits::kKv) {  // (mha_fwd refuses dropout with splits or pages)
    launch(std::integral_constant<int, kModDropout>{});
  }
  check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

// The KV-cache variant runs paged K/V, split-KV, and any problem of at most 64 query rows
// (decoding), where its 64-row tile wastes less than the 128-row one; not dropout, not an
// attention bias (mha_fwd refuses one with pages or splits).
inline bool use_kv_kernel(const FwdParams& params) {
  return !has_bias(params) &&
         (params.block_table != nullptr || params.num_splits > 1 ||
          (params.seqlen_q <= 64 && params.dropout_threshold == 0));
}

template <typename Element, int kHeadDim>
void run_fwd(const FwdParams& params, cudaStream_t stream) {
  if (!use_kv_kernel(params)) {
    launch_fwd<FwdTraits<kHeadDim, false>, Element>(params, stream);
    return;
  }
  launch_fwd<FwdTraits<kHeadDim, true>, Element>(params, stream);
  if (params.num_splits > 1) launch_combine<Element>(params, stream);
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_FWD(Element, kHeadDim) \
  template void flashattn2::run_fwd<Element, kHeadDim>(const flashattn2::FwdParams&, cudaStream_t);
