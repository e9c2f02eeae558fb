// Launcher of the forward kernel for one (dtype, head dim); instantiated by the generated
// units fwd_<dtype>_hdim<D>.cu through FLASHATTN2_INSTANTIATE_FWD.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "fwd_kernel.cuh"
#include "launch.h"

namespace flashattn2 {

template <typename Element, int kHeadDim>
void run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = FwdTraits<kHeadDim>;
  auto kernel = fwd_kernel<Traits, Element>;
  constexpr int kSmem = Traits::kSmemBytes;
  // Raising the dynamic shared-memory limit is per device; do it once for each.
  // (mha_fwd has checked 0 <= device < kMaxDevices; a racing second set is harmless.)
  static std::atomic<bool> smem_set[kMaxDevices] = {};
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (kSmem > 48 * 1024 && !smem_set[device].load(std::memory_order_acquire)) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute(fwd_kernel, smem)");
    smem_set[device].store(true, std::memory_order_release);
  }
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_FWD(Element, kHeadDim) \
  template void flashattn2::run_fwd<Element, kHeadDim>(const flashattn2::FwdParams&, cudaStream_t);
