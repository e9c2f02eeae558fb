// Host-side declarations of the float32 kernels' launchers (FLASHATTN2_FP32 builds).
#pragma once
#include <cuda_runtime.h>

#include "common/flash.h"
#include "fp32/wg_config.h"

namespace flashattn2 {

// fwd_launch.cuh / bwd_launch.cuh, instantiated in fwd_fp32_hdim<D>.cu / bwd_fp32_hdim<D>.cu
// for the head dims of fwd_config.h (kFp32HeadDims).
template <int kHeadDim>
void run_fwd_fp32(const FwdParams& params, cudaStream_t stream);
template <int kHeadDim>
void run_bwd_fp32(const BwdParams& params, cudaStream_t stream);
// The grid of a float32 wgmma kernel (tile_major: wg_config.h's fp32wg_tile_major; the kernels
// read it back with fp32wg::grid_tile).
inline dim3 fp32wg_grid(bool tile_major, int heads, int tiles, int batch) {
  return tile_major ? dim3(heads, tiles, batch) : dim3(tiles, heads, batch);
}

// wg_launch.cuh (FLASHATTN2_FP32WG builds, sm_90a), instantiated in fwd_fp32wg_hdim<D>.cu for
// kernel head dims 64 and 128 (wg_config.h).
// kSingle: the single-TF32 instance (FwdParams::fp32_tf32), in fwd_fp32wg_tf32_hdim<D>.cu.
template <int kHeadDim, bool kSingle>
void run_fwd_fp32wg(const FwdParams& params, cudaStream_t stream);
// bwd_fp32wg_hdim64.cu (FLASHATTN2_FP32WG builds, sm_90a): the Hopper float32 backward
// (wg_bwd_kernel.cuh) for the kernel head dims of wg_bwd_config.h, preprocess included (dQ
// added into dq itself: BwdParams::fp32_dq_direct, no convert).
// kSingle: the single-TF32 instances (BwdParams::fp32_tf32), in bwd_fp32wg_tf32_hdim<D>.cu.
template <int kHeadDim, bool kSingle>
void run_bwd_fp32wg(const BwdParams& params, cudaStream_t stream);
// bwd_fp32wg_hdim128.cu (FLASHATTN2_FP32WG builds, sm_90a): the d128 one
// (wg_bwd128_kernel.cuh, BwdParams::fp32wg_bwd128), preprocess included, no convert.
template <int kHeadDim, bool kSingle>
void run_bwd_fp32wg128(const BwdParams& params, cudaStream_t stream);
// bwd_prepost.cu: dsum and a zeroed dq_accum (fp32_dq_direct: dq); dq from dq_accum.
void run_bwd_fp32_preprocess(const BwdParams& params, cudaStream_t stream);
void run_bwd_fp32_convert(const BwdParams& params, cudaStream_t stream);

}  // namespace flashattn2
