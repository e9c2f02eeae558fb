// Internals the host API's .cpp files share (flash_api.cpp; the backward,
// flash_api_bwd.cpp; the split-KV heuristics, flash_api_splits.cpp): the built head-dim and
// arch lists, the device guard, argument checks and dtype dispatch. Not part of the API
// (flash_api.h is); plain C++17, never included by a .cu.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "built_config.h"
#include "common/flash.h"
#include "common/launch.h"
#include "fp32/fwd_config.h"

namespace flashattn2 {

template <int... Ds>
struct IntList {
  static std::vector<int> vec() { return {Ds...}; }
  // Calls f(std::integral_constant<int, D>{}) for the D equal to `value`; false if none.
  template <typename F>
  static bool dispatch(int value, F&& f) {
    return ((value == Ds ? (f(std::integral_constant<int, Ds>{}), true) : false) || ...);
  }
};

using HeadDims = IntList<FLASHATTN2_HEAD_DIMS>;
using BwdHeadDims = IntList<FLASHATTN2_BWD_HEAD_DIMS>;
using Sm90HeadDims = IntList<FLASHATTN2_SM90_HEAD_DIMS>;
using Sm90BwdHeadDims = IntList<FLASHATTN2_SM90_BWD_HEAD_DIMS>;
using DecodeHeadDims = IntList<FLASHATTN2_DECODE_HEAD_DIMS>;
using SassArchs = IntList<FLASHATTN2_SASS_ARCHS>;
using PtxArchs = IntList<FLASHATTN2_PTX_ARCHS>;

// Restores the caller's current device when it goes out of scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("flashattn2: " + message);
}

// Defined in flash_api.cpp (one instance each: the switch and the per-device caches).
extern std::atomic<bool> g_native_d16;  // set_native_d16
// The forward's and the backward's argument checks and window normalisation (flash_api.cpp
// checked).
FwdParams checked(const FwdParams& p);
BwdParams checked(const BwdParams& p);
// Throws if this build has no code for `device` (checked once per device).
void require_supported_device(int device);
// SMs of `device` (cached).
int sm_count(int device);
// How the decode kernel runs a grid of `ctas` CTAs at kernel head dim kd: warps a CTA and
// dynamic shared memory (flash_api_splits.cpp).
struct DecodeLaunch {
  int warps;
  int smem_bytes;
};
DecodeLaunch decode_launch(int64_t ctas, int kd, int device);

template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  if (dtype == DType::kFloat16) {
    f(__half{});
  } else {
    f(__nv_bfloat16{});
  }
}

// The float32 forward / backward (cpp/fp32, FLASHATTN2_EXPERIMENTAL=fp32 builds): dense or
// varlen (cu_seqlens_q and cu_seqlens_k) attention with causal / window, GQA, ragged tails,
// softcap and ALiBi; nothing else.
template <typename Params>
void require_fp32_supported(const Params& p) {
  require(FLASHATTN2_FP32,
          "float32 inputs need a build with fp32 in FLASHATTN2_EXPERIMENTAL (the default)");
  require(fp32_kernel_head_dim(p.headdim) > 0,
          "float32 supports head dims up to 128, got " + std::to_string(p.headdim));
  require(!p.seqused_k && !p.leftpad_k && !p.kv_batch_idx && !p.block_table &&
              p.seqlen_k_new == 0,
          "float32 runs dense or varlen attention only: no KV cache");
  require(!p.cu_seqlens_q == !p.cu_seqlens_k,
          "float32 varlen takes both cu_seqlens_q and cu_seqlens_k");
  require(p.dropout_threshold == 0 && !has_bias(p),
          "float32 supports no dropout or attention bias");
}

}  // namespace flashattn2
