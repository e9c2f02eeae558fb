// The Hopper float32 backward for kernel head dim 128 (FLASHATTN2_EXPERIMENTAL=fp32wg builds,
// BwdParams::fp32wg_bwd128): preprocess and dQ convert of bwd_prepost.cu around
// wg_bwd128_kernel.cuh's main kernel.
#include <cuda_runtime.h>

#include "common/launch.h"
#include "fp32/launch.h"
#include "fp32/wg_bwd128_kernel.cuh"

namespace flashattn2 {

template <int kHeadDim>
void run_bwd_fp32wg128(const BwdParams& params, cudaStream_t stream) {
  using Traits = Fp32WgBwd128Traits<kHeadDim>;
  run_bwd_fp32_preprocess(params, stream);
  const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.nheads_k,
                  params.batch);
  constexpr auto kernel = bwd_fp32wg128_kernel<Traits>;
  raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(bwd_fp32wg128_kernel, smem)");
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "bwd_fp32wg128_kernel launch");
  run_bwd_fp32_convert(params, stream);
}

template void run_bwd_fp32wg128<128>(const BwdParams&, cudaStream_t);

}  // namespace flashattn2
