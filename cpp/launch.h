// Host-side declarations shared by the dispatcher and the launchers (plain C++ + CUDA runtime).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "flash.h"

namespace flashattn2 {

constexpr int kMaxDevices = 64;

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flashattn2: ") + what + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// Defined in fwd_launch.cuh / bwd_launch.cuh, instantiated per (dtype, head dim) in
// generated units.
template <typename Element, int kHeadDim>
void run_fwd(const FwdParams& params, cudaStream_t stream);
template <typename Element, int kHeadDim>
void run_bwd(const BwdParams& params, cudaStream_t stream);

}  // namespace flashattn2
