// Launcher of the Hopper float32 forward (wg_kernel.cuh) for one head dim; instantiated by the
// units fwd_fp32wg_hdim<D>.cu (3xTF32) and fwd_fp32wg_tf32_hdim<D>.cu (kSingle: one tf32
// product, FwdParams::fp32_tf32) (sm_90a, FLASHATTN2_EXPERIMENTAL=fp32wg builds).
#pragma once
#include <cuda_runtime.h>

#include "common/launch.h"
#include "fp32/launch.h"
#include "fp32/wg_kernel.cuh"

namespace flashattn2 {

template <int kHeadDim, bool kSingle>
void run_fwd_fp32wg(const FwdParams& params, cudaStream_t stream) {
  using Traits = Fp32WgTraits<kHeadDim, kSingle>;
  const int m_blocks = (params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const dim3 grid = fp32wg_grid(
      fp32wg_tile_major(Traits::kTileMajor, params.window_right, params.nheads, m_blocks),
      params.nheads, m_blocks, params.batch);
  constexpr auto kernel = fwd_fp32wg_kernel<Traits>;
  raise_smem_limit<kernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(fwd_fp32wg_kernel, smem)");
  kernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fwd_fp32wg_kernel launch");
}

}  // namespace flashattn2
