// Launcher of the decode kernel (decode_kernel.cuh) for one (dtype, head dim); instantiated by
// the generated units decode_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_DECODE (builds
// with FLASHATTN2_EXPERIMENTAL containing decode only).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "common/launch.h"
#include "sm80/decode_kernel.cuh"

namespace flashattn2 {

// A tag for one launch's split counters (FwdParams::split_tag): 56 bits, never 0, from a
// per-process count through a bijective 64-bit mix (splitmix64's finaliser), so that no small
// integer a reused buffer may hold (positions, token ids) matches it.
inline unsigned long long next_split_tag() {
  static std::atomic<unsigned long long> count{0};
  unsigned long long x = count.fetch_add(1, std::memory_order_relaxed) + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (x >> 8) | (1ull << 55);
}

// The decode kernel, then for num_splits > 1 the merge of the partial results (the KV
// kernel's o_accum / lse_accum layout): inside the kernel, by the last CTA of each group,
// where params.split_counters is given and decode_fused_merge() holds, else the split-KV
// combine kernel. The caller checked decode_supports(). Returns whether the kernel merged.
template <typename Element, int kHeadDim>
bool run_decode(const FwdParams& params, cudaStream_t stream) {
  using Traits = DecodeTraits<kHeadDim>;
  FwdParams p = params;
  const bool fused = p.split_counters != nullptr &&
                     decode_fused_merge(p.seqlen_q * p.q_pack, p.num_splits, kHeadDim);
  if (fused) {
    p.split_tag = next_split_tag();
  } else {
    p.split_counters = nullptr;
  }
  const dim3 grid(p.num_splits, p.nheads / p.q_pack, p.batch);
  auto launch = [&](auto mods) {
    constexpr auto kernel = decode_kernel<Traits, Element, decltype(mods)::value>;
    raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(decode_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p);
  };
  if (has_score_mods(p)) {  // softcap / ALiBi (decode_supports excludes dropout, bias)
    launch(std::integral_constant<int, kModLogits>{});
  } else {
    launch(std::integral_constant<int, kModNone>{});
  }
  check_cuda(cudaGetLastError(), "decode_kernel launch");
  if (p.num_splits > 1 && !fused) launch_combine<Element>(p, stream);
  return fused;
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_DECODE(Element, kHeadDim) \
  template bool flashattn2::run_decode<Element, kHeadDim>(const flashattn2::FwdParams&, cudaStream_t);
