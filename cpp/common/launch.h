// Host-side declarations shared by the dispatcher and the launchers (plain C++ + CUDA runtime).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/flash.h"

namespace flashattn2 {

constexpr int kMaxDevices = 64;

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flashattn2: ") + what + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}

// The split-KV combine (common/combine_kernel.cuh), instantiated in common/combine.cu only:
// that unit is built for every arch. A kernel template instantiated in units of different
// archs (the sm90 units are sm_90a only) shares one host stub, which may bind to the copy
// without code for the running GPU.
template <typename Element>
void launch_combine(const FwdParams& params, cudaStream_t stream);

// Compute capability (major * 10 + minor) of `device` (in [0, kMaxDevices)), cached: a
// driver call costs about a microsecond, too much for every decode step.
inline int compute_capability(int device) {
  static std::atomic<int> ccs[kMaxDevices] = {};
  int cc = ccs[device].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "cudaDeviceGetAttribute");
    cc = major * 10 + minor;
    ccs[device].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

// Raises kKernel's dynamic shared-memory limit to `bytes` (needed above 48 KiB) where it is
// lower on this device: the attribute is per device, and setting it on every launch costs a
// driver call. (A kernel launched with more than one size, as the decode kernel, raises it
// again when a size exceeds the largest so far; under a lock, so the limit only grows.) The
// current device must be in [0, kMaxDevices) (the host API checks it).
template <auto kKernel>
void raise_smem_limit(int bytes, const char* name) {
  static std::atomic<int> limit[kMaxDevices] = {};
  static std::mutex mutex;
  if (bytes <= 48 * 1024) return;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (bytes > limit[device].load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex);
    if (bytes > limit[device].load(std::memory_order_relaxed)) {
      check_cuda(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                 name);
      limit[device].store(bytes, std::memory_order_release);
    }
  }
}

// Launches kernel(args...) on `stream`; with `pdl`, as a programmatic dependent of the kernel
// before it in the stream (cudaLaunchAttributeProgrammaticStreamSerialization, sm_90 and
// newer: the caller checks): it may start once every block of that kernel has called
// griddep_launch_dependents or exited, and must griddep_wait (common/ptx.cuh) before it
// touches that kernel's results, in every block (so that its own end implies that kernel's).
// Stream capture turns the attribute into a programmatic edge of the graph.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, int smem,
                   cudaStream_t stream, bool pdl, const char* what, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), what);
}

// Defined in fwd_launch.cuh / bwd_launch.cuh, instantiated per (dtype, head dim) in
// generated units.
template <typename Element, int kHeadDim>
void run_fwd(const FwdParams& params, cudaStream_t stream);
// Defined in sm80/decode_launch.cuh, instantiated for the head dims of
// FLASHATTN2_DECODE_HEAD_DIMS (built_config.h): the decode kernel (+ combine), launched with
// CTAs of `warps` warps and smem_bytes of dynamic shared memory (flash_api_splits.cpp
// decode_launch).
template <typename Element, int kHeadDim>
void run_decode(const FwdParams& params, int warps, int smem_bytes, cudaStream_t stream);
// Defined in sm90/fwd_launch.cuh (units built for sm_90a only): the Hopper forward, on a
// persistent grid of at most num_sms CTAs; false if TMA cannot describe the tensors (the
// caller then runs run_fwd).
template <typename Element, int kHeadDim>
bool run_fwd_sm90(const FwdParams& params, int num_sms, cudaStream_t stream);
// Defined in sm90/bwd_launch.cuh (units built for sm_90a only): the Hopper backward (first
// version, sm90/bwd_config.h); false if TMA cannot describe the tensors (the caller then
// runs run_bwd).
template <typename Element, int kHeadDim>
bool run_bwd_sm90(const BwdParams& params, cudaStream_t stream);
// Defined in sm80/bwd_launch.cuh and instantiated in its units only (every arch): the
// backward's preprocess (dsum, zeroed dq_accum) and dQ convert, shared by both backwards.
template <typename Element, int kHeadDim>
void run_bwd_preprocess(const BwdParams& params, cudaStream_t stream);
// pdl: the convert as a programmatic dependent of the kernel before it (launch_kernel; the
// Hopper backward with BwdParams::pdl); it waits for that kernel's end on the SMs.
template <typename Element, int kHeadDim>
void run_bwd_convert_dq(const BwdParams& params, bool pdl, cudaStream_t stream);
// run_bwd picks the backward tile that fits smem_per_block (bwd_config.h).
template <typename Element, int kHeadDim>
void run_bwd(const BwdParams& params, int smem_per_block, cudaStream_t stream);
// kvcache.cu
void run_append_kv_any(const AppendKvParams& params, cudaStream_t stream);
// rotary.cu
void run_rotary_any(const RotaryParams& params, cudaStream_t stream);
// Defined in dropout_mask.cu.
void run_dropout_mask(const DropoutMaskParams& params, cudaStream_t stream);
// Defined in merge.cu.
void run_merge(const MergeParams& params, cudaStream_t stream);

}  // namespace flashattn2
