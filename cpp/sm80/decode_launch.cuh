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

// Whether kKernel can run with clusters of `n` CTAs (n <= kDecodeMaxCluster; n > 8 needs the
// non-portable size allowed) of `threads` threads and `smem` bytes on the current device: at
// least one such cluster fits (cudaOccupancyMaxActiveClusters), cached per device and n.
template <auto kKernel>
bool decode_cluster_fits(int n, int threads, int smem) {
  static std::atomic<int> state[kMaxDevices][kDecodeMaxCluster + 1] = {};  // 0 unknown, 1 / 2
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  int s = state[device][n].load(std::memory_order_acquire);
  if (s == 0) {
    if (n > 8) {
      check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                 "cudaFuncSetAttribute(decode_kernel, non-portable cluster size)");
    }
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = n;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(n);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = smem;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config);
    if (err != cudaSuccess) (void)cudaGetLastError();  // (a refusal is an answer: no)
    s = err == cudaSuccess && clusters > 0 ? 1 : 2;
    state[device][n].store(s, std::memory_order_release);
  }
  return s == 1;
}

// The decode kernel, then for num_splits > 1 the split-KV combine kernel, which merges the
// partial results (the KV kernel's o_accum / lse_accum layout). With params.decode_cluster on
// an sm_90 GPU, 2 <= num_splits <= kDecodeMaxCluster and such clusters launchable, the
// num_splits CTAs of each (batch, group) run as one cluster instead and merge in the kernel
// (no combine launch; true returned). The caller checked decode_supports().
template <typename Element, int kHeadDim>
bool run_decode(const FwdParams& params, cudaStream_t stream) {
  using Traits = DecodeTraits<kHeadDim>;
  const dim3 grid(params.num_splits, params.nheads / params.q_pack, params.batch);
  const bool want_cluster = params.decode_cluster && params.num_splits > 1 &&
                            params.num_splits <= kDecodeMaxCluster;
  int device = 0;
  if (want_cluster) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  bool clustered = false;
  auto launch = [&](auto mods) {
    constexpr int kMods = decltype(mods)::value;
    constexpr auto kernel = decode_kernel<Traits, Element, kMods, false>;
    constexpr auto cluster_kernel = decode_kernel<Traits, Element, kMods, true>;
    if (want_cluster && compute_capability(device) >= 90) {
      raise_smem_limit<cluster_kernel>(Traits::kSmemBytes,
                                       "cudaFuncSetAttribute(decode_kernel cluster, smem)");
      if (decode_cluster_fits<cluster_kernel>(params.num_splits, Traits::kNThreads,
                                              Traits::kSmemBytes)) {
        cudaLaunchAttribute attribute;
        attribute.id = cudaLaunchAttributeClusterDimension;
        attribute.val.clusterDim.x = params.num_splits;
        attribute.val.clusterDim.y = 1;
        attribute.val.clusterDim.z = 1;
        cudaLaunchConfig_t config = {};
        config.gridDim = grid;
        config.blockDim = dim3(Traits::kNThreads);
        config.dynamicSmemBytes = Traits::kSmemBytes;
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
        check_cuda(cudaLaunchKernelEx(&config, cluster_kernel, params), "decode_kernel cluster launch");
        clustered = true;
        return;
      }
    }
    raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(decode_kernel, smem)");
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  };
  if (has_score_mods(params)) {  // softcap / ALiBi (decode_supports excludes dropout, bias)
    launch(std::integral_constant<int, kModLogits>{});
  } else {
    launch(std::integral_constant<int, kModNone>{});
  }
  check_cuda(cudaGetLastError(), "decode_kernel launch");
  if (params.num_splits > 1 && !clustered) launch_combine<Element>(params, stream);
  return clustered;
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_DECODE(Element, kHeadDim) \
  template bool flashattn2::run_decode<Element, kHeadDim>(const flashattn2::FwdParams&, cudaStream_t);
