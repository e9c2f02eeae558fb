// Launchers of the Hopper float32 backwards: the preprocess of bwd_prepost.cu before
// wg_bwd_kernel.cuh's main kernel (kernel head dim 64) or wg_bwd128_kernel.cuh's (128);
// instantiated by the units bwd_fp32wg_hdim<D>.cu (3xTF32) and bwd_fp32wg_tf32_hdim<D>.cu
// (kSingle: one tf32 product, BwdParams::fp32_tf32) (sm_90a, FLASHATTN2_EXPERIMENTAL=fp32wg
// builds).
#pragma once
#include <cuda_runtime.h>

#include "common/launch.h"
#include "fp32/launch.h"
#include "fp32/wg_bwd128_kernel.cuh"
#include "fp32/wg_bwd_kernel.cuh"

namespace flashattn2 {

// Preprocess (dsum, dq zeroed), kKernel over key blocks of Traits::kBlockN, nheads_k, batch
// (fp32wg_grid) adding dQ * scale into dq (fp32_dq_direct: no dq_accum, no convert kernel).
template <typename Traits, auto kKernel>
void run_bwd_fp32wg_main(const BwdParams& direct_off, cudaStream_t stream) {
  BwdParams params = direct_off;
  params.fp32_dq_direct = true;
  run_bwd_fp32_preprocess(params, stream);
  const int n_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const dim3 grid = fp32wg_grid(
      fp32wg_tile_major(Traits::kTileMajor, params.window_right, params.nheads_k, n_blocks),
      params.nheads_k, n_blocks, params.batch);
  raise_smem_limit<kKernel>(Traits::kSmemBytes, "cudaFuncSetAttribute(fp32wg backward, smem)");
  kKernel<<<grid, Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fp32wg backward launch");
}

template <int kHeadDim, bool kSingle>
void run_bwd_fp32wg(const BwdParams& params, cudaStream_t stream) {
  using Traits = Fp32WgBwdTraits<kHeadDim, kSingle>;
  run_bwd_fp32wg_main<Traits, bwd_fp32wg_kernel<Traits>>(params, stream);
}

template <int kHeadDim, bool kSingle>
void run_bwd_fp32wg128(const BwdParams& params, cudaStream_t stream) {
  using Traits = Fp32WgBwd128Traits<kHeadDim, kSingle>;
  run_bwd_fp32wg_main<Traits, bwd_fp32wg128_kernel<Traits>>(params, stream);
}

}  // namespace flashattn2
