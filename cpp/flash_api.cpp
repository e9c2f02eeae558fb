// Host API: argument checks, arch check and dispatch from runtime values (dtype, head dim)
// to the compiled template instances; the backward is in flash_api_bwd.cpp, the split-KV
// heuristics in flash_api_splits.cpp, what they share in flash_api_internal.h.
#include "flash_api.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <stdexcept>
#include <string>

#include "built_config.h"
#include "flash_api_internal.h"
#include "sm80/decode_config.h"
#include "sm80/fwd_config.h"
#include "sm90/fwd_config.h"
#include "common/launch.h"
#include "fp32/fwd_config.h"
#include "fp32/launch.h"
#include "fp32/wg_config.h"

namespace flashattn2 {
namespace {

std::string join_archs(const std::vector<int>& archs, const char* prefix) {
  std::string out;
  for (size_t i = 0; i < archs.size(); ++i) {
    out += (i ? ", " : "") + std::string(prefix) + std::to_string(archs[i]);
  }
  return out;
}

std::string built_archs_text() {
  std::string text = join_archs(SassArchs::vec(), "sm_");
  const std::string ptx = join_archs(PtxArchs::vec(), "compute_");
  if (!ptx.empty()) text += (text.empty() ? "PTX " : " and PTX ") + ptx;
  return text;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

std::atomic<bool> g_native_d16{true};  // set_native_d16

void set_native_d16(bool enabled) { g_native_d16.store(enabled, std::memory_order_relaxed); }

int kernel_head_dim(int headdim) {
  const bool d16 = g_native_d16.load(std::memory_order_relaxed);
  for (int d : HeadDims::vec()) {
    if (d >= headdim && (d != 16 || d16)) return d;
  }
  return -1;
}

std::vector<int> built_head_dims() { return HeadDims::vec(); }
std::vector<int> built_sm90_head_dims() { return Sm90HeadDims::vec(); }
std::vector<int> built_sm90_bwd_head_dims() { return Sm90BwdHeadDims::vec(); }
std::string built_sm90_bwd_experimental() { return FLASHATTN2_SM90_BWD_EXPERIMENTAL; }
std::vector<int> built_fp32_head_dims() {
  return FLASHATTN2_FP32 ? std::vector<int>(std::begin(kFp32HeadDims), std::end(kFp32HeadDims))
                         : std::vector<int>{};
}
std::vector<int> built_archs() { return SassArchs::vec(); }
std::vector<int> built_ptx_archs() { return PtxArchs::vec(); }
int cuda_runtime_version() { return CUDART_VERSION; }
std::string version() { return FLASHATTN2_VERSION; }

std::string device_unsupported_reason(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(err);
  if (device < 0 || device >= count || device >= kMaxDevices) {
    return "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " visible)";
  }
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute");
  const int cc = major * 10 + minor;
  // SASS for sm_XY runs on sm_XZ with Z >= Y; PTX for compute_XY is JIT-compiled for any
  // sm >= XY.
  for (int arch : SassArchs::vec()) {
    if (arch / 10 == major && arch <= cc) return "";
  }
  for (int arch : PtxArchs::vec()) {
    if (arch <= cc) return "";
  }
  return "this flashattn2 build has code for " + built_archs_text() + "; GPU " +
         std::to_string(device) + " is sm_" + std::to_string(cc) +
         (cc < 80 ? " (FlashAttention needs Ampere, sm_80, or newer)" : "");
}

namespace {

// Checks shared by the forward and the backward, then window normalisation: a bound that
// can never bind is unbounded (this also keeps row + offset + window inside int).
template <typename Params>
Params checked(const Params& params, std::initializer_list<const void*> pointers,
               std::initializer_list<int64_t> strides) {
  Params p = params;
  require(p.batch > 0 && p.seqlen_q > 0 && p.seqlen_k > 0 && p.nheads > 0 && p.nheads_k > 0,
          "batch, seqlens and head counts must be positive");
  require(p.nheads % p.nheads_k == 0,
          "Number of heads in key/value must divide number of heads in query");
  require(p.headdim > 0 && p.headdim % 8 == 0,
          "the kernel head dim must be a positive multiple of 8, got " + std::to_string(p.headdim));
  require(p.batch <= 65535 && p.nheads <= 65535, "batch and nheads must be at most 65535");
  const bool fp32 = p.dtype == DType::kFloat32;
  require(p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16 || fp32,
          "FlashAttention only supports fp16, bf16 and float32 data type");
  require(p.softmax_scale > 0.f && p.softmax_scale < INFINITY,
          "softmax_scale must be positive and finite");
  for (const void* ptr : pointers) {
    require(ptr != nullptr, "null pointer");
    require(aligned16(ptr), "tensors and workspaces must be 16-byte aligned");
  }
  for (int64_t stride : strides) {  // (16 bytes)
    require(stride % (fp32 ? 4 : 8) == 0,
            fp32 ? "batch, row and head strides must be multiples of 4 elements (float32)"
                 : "batch, row and head strides must be multiples of 8 elements");
  }
  // Sequence layout (SeqLayout): int32 vectors, 4-byte aligned.
  for (const int* vec : {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.leftpad_k,
                         p.kv_batch_idx, p.block_table}) {
    require(reinterpret_cast<uintptr_t>(vec) % 4 == 0, "int32 index tensors must be 4-byte aligned");
  }
  require(!(p.cu_seqlens_k && p.seqused_k), "cu_seqlens_k and seqused_k are exclusive");
  require(p.total_q >= 0 && p.total_k >= 0 && p.seqlen_k_new >= 0, "negative varlen totals");
  if (p.block_table) {
    require(p.page_size_log2 >= 4 && p.page_size_log2 <= 20,
            "page_size must be a power of two in [16, 2^20]");
    require(!p.cu_seqlens_k && !p.kv_batch_idx,
            "a paged KV cache takes neither cu_seqlens_k nor cache_batch_idx");
    require(p.block_table_batch_stride >= 0, "block_table batch stride must be >= 0");
  }
  // A bound that can never bind is unbounded (seqlen_q / seqlen_k are the maxima when the
  // layout makes them per batch entry).
  require(p.softcap >= 0.f && p.softcap < INFINITY, "softcap must be >= 0 and finite");
  require(p.alibi_slopes == nullptr || reinterpret_cast<uintptr_t>(p.alibi_slopes) % 4 == 0,
          "alibi_slopes must be 4-byte aligned float32");
  require(p.alibi_batch_stride >= 0, "alibi_slopes batch stride must be >= 0");
  if (p.dropout_threshold) {
    require(p.rng_state != nullptr && reinterpret_cast<uintptr_t>(p.rng_state) % 8 == 0,
            "dropout needs an 8-byte aligned int64 rng_state (seed, offset)");
    require(p.dropout_scale > 0.f && p.dropout_scale < INFINITY,
            "dropout_scale must be positive and finite");
    require(!p.block_table, "dropout does not run with paged K/V (block_table)");
  }
  if (p.window_right >= p.seqlen_q) p.window_right = -1;
  if (p.window_left >= p.seqlen_k) p.window_left = -1;
  return p;
}

}  // namespace

// The forward's and the backward's tensors: every pointer and stride they read or write.
FwdParams checked(const FwdParams& p) {
  return checked(p, {p.q, p.k, p.v, p.o, p.lse},
                 {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride,
                  p.k_row_stride, p.k_head_stride, p.v_batch_stride, p.v_row_stride,
                  p.v_head_stride, p.o_batch_stride, p.o_row_stride, p.o_head_stride});
}
BwdParams checked(const BwdParams& p) {
  // (float32 may pass a null dq_accum: mha_bwd_fp32 asks for it where a kernel needs it)
  const void* dq_accum = p.dtype == DType::kFloat32 && !p.dq_accum ? p.dsum : p.dq_accum;
  return checked(p,
                 {p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, dq_accum, p.dsum},
                 {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride,
                  p.k_row_stride, p.k_head_stride, p.v_batch_stride, p.v_row_stride,
                  p.v_head_stride, p.o_batch_stride, p.o_row_stride, p.o_head_stride,
                  p.do_batch_stride, p.do_row_stride, p.do_head_stride, p.dq_batch_stride,
                  p.dq_row_stride, p.dq_head_stride, p.dk_batch_stride, p.dk_row_stride,
                  p.dk_head_stride, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride});
}

// Throws if this build has no code for `device` (checked once per device).
void require_supported_device(int device) {
  static std::array<int, kMaxDevices> checked{};  // 0 unknown, 1 supported
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  require(device >= 0 && device < kMaxDevices, "bad device index " + std::to_string(device));
  if (!checked[device]) {
    const std::string why = device_unsupported_reason(device);
    if (!why.empty()) throw std::runtime_error("flashattn2: " + why);
    checked[device] = 1;
  }
}

int sm_count(int device) {
  static std::array<std::atomic<int>, kMaxDevices> counts{};
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

bool sm90_fwd_applies(int device, int headdim, int seqlen_q, bool dropout, bool kv_cache_layout) {
  require(device >= 0 && device < kMaxDevices, "bad device index " + std::to_string(device));
  const int kd = kernel_head_dim(headdim);
  return kd > 0 && Sm90HeadDims::dispatch(kd, [](auto) {}) && compute_capability(device) == 90 &&
         sm90_fwd_supports(seqlen_q, dropout, kv_cache_layout);
}

int64_t sm90_fwd_stream_k_floats(int device, int batch, int nheads, int seqlen_q, int seqlen_k,
                                 int headdim) {
  if (!sm90_fwd_applies(device, headdim, seqlen_q, false, false)) return 0;
  const int kd = kernel_head_dim(headdim);
  const Sm90FwdTile tile = sm90_fwd_tile(kd);
  const int64_t tiles = int64_t((seqlen_q + tile.block_m - 1) / tile.block_m) * nheads * batch;
  const int grid = sm_count(device);
  const int key_blocks = (seqlen_k + tile.block_n - 1) / tile.block_n;
  return sm90_fwd_stream_k(kd, tiles, grid, key_blocks).units ? sm90_fwd_stream_k_workspace(kd, grid)
                                                          : 0;
}

namespace {

#if FLASHATTN2_FP32WG
// Whether the Hopper float32 forward (fp32/wg_kernel.cuh) takes `p` (checked, float32): built
// (FLASHATTN2_FP32WG), allowed, an sm_90 GPU with the shared memory, kernel head dim 64 or
// 128, dense, full or a right window only (causal), no softcap / ALiBi (require_fp32_supported
// has refused dropout, a bias and KV caches already; split-KV is refused for float32).
bool fp32wg_supports(const FwdParams& p, int kd, int device, bool allow) {
  return FLASHATTN2_FP32WG && allow && fp32wg_head_dim(kd) && !p.cu_seqlens_q &&
         !p.cu_seqlens_k && p.window_left < 0 && p.softcap <= 0.f && !p.alibi_slopes &&
         compute_capability(device) == 90 &&
         fp32wg_smem_bytes(kd, p.fp32_tf32) <= max_smem_per_block(device);
}
#endif

int mha_fwd_fp32(const FwdParams& params, int device, void* stream, bool allow_sm90) {
  require_fp32_supported(params);
  require(params.num_splits == 1, "float32 runs no split-KV (num_splits must be 1)");
  const FwdParams p = checked(params);
  DeviceGuard guard(device);
  require_supported_device(device);
  const int kd = fp32_kernel_head_dim(p.headdim);
  const int smem = fp32_fwd_smem_bytes(kd);
  require(smem <= max_smem_per_block(device),
          "the float32 forward for head dim " + std::to_string(p.headdim) + " needs " +
              std::to_string(smem) + " bytes of shared memory per block; GPU " +
              std::to_string(device) + " allows " + std::to_string(max_smem_per_block(device)));
  auto s = static_cast<cudaStream_t>(stream);
#if FLASHATTN2_FP32WG
  if (fp32wg_supports(p, kd, device, allow_sm90)) {
    const bool single = p.fp32_tf32;
    if (kd == 64) {
      single ? run_fwd_fp32wg<64, true>(p, s) : run_fwd_fp32wg<64, false>(p, s);
    } else {
      single ? run_fwd_fp32wg<128, true>(p, s) : run_fwd_fp32wg<128, false>(p, s);
    }
    return single ? kFwdKernelFp32WgTf32 : kFwdKernelFp32Wg;
  }
#else
  (void)allow_sm90;
#endif
#if FLASHATTN2_FP32
  switch (kd) {
    case 32: run_fwd_fp32<32>(p, s); break;
    case 64: run_fwd_fp32<64>(p, s); break;
    default: run_fwd_fp32<128>(p, s); break;
  }
#else
  (void)s;
#endif
  return 80;
}

}  // namespace

namespace {

// Whether mha_fwd runs the decode kernel (sm80/decode_kernel.cuh) for `p` (checked, kernel
// head dim kd): built (FLASHATTN2_DECODE, this head dim), allowed (the runtime switch), a
// call it supports (decode_config.h decode_supports) and a GPU that gives a block its shared
// memory (not sm_86 / sm_89 at d128). Everything else runs the kernels it ran before.
bool decode_applies(const FwdParams& p, int kd, int device, bool allow_decode) {
  return allow_decode && DecodeHeadDims::dispatch(kd, [](auto) {}) && decode_supports(p, kd) &&
         max_smem_per_block(device) >= decode_smem_bytes(kd);
}

}  // namespace

int mha_fwd(const FwdParams& params, int device, void* stream, bool allow_sm90,
            bool allow_decode) {
  require(params.num_splits >= 1 && params.num_splits <= kMaxSplits,
          "num_splits must be in [1, " + std::to_string(kMaxSplits) + "], got " +
              std::to_string(params.num_splits));
  require(int64_t(params.batch) * params.num_splits <= 65535, "batch * num_splits must be at most 65535");
  require(!has_bias(params) || (params.num_splits == 1 && !params.cu_seqlens_q &&
                                !params.cu_seqlens_k && !params.seqused_k && !params.leftpad_k &&
                                !params.kv_batch_idx && !params.block_table &&
                                params.seqlen_k_new == 0),
          "an attention bias runs dense attention only: no varlen, KV cache or split-KV");
  require(params.num_splits == 1 || params.dropout_threshold == 0,
          "dropout runs with num_splits = 1");
  if (params.num_splits > 1) {
    require(params.o_accum && params.lse_accum && aligned16(params.o_accum) && aligned16(params.lse_accum),
            "split-KV needs 16-byte aligned o_accum and lse_accum workspaces");
    require(int64_t(params.batch) * params.nheads * params.seqlen_q <= (int64_t(1) << 30),
            "split-KV needs batch * nheads * seqlen_q <= 2^30 (the combine kernel's row index)");
  }
  if (params.q_pack != 1) {
    require(params.nheads_k > 0 && params.nheads % params.nheads_k == 0 &&
                params.q_pack == params.nheads / params.nheads_k,
            "q_pack must be 1 or nheads / nheads_k, got " + std::to_string(params.q_pack));
    require(!params.alibi_slopes && params.dropout_threshold == 0,
            "q_pack > 1 cannot be used with ALiBi or dropout (their values depend on the head)");
    require(int64_t(params.seqlen_q) * params.q_pack <= (int64_t(1) << 30),
            "seqlen_q * q_pack must be at most 2^30");
  }
  if (params.dtype == DType::kFloat32) return mha_fwd_fp32(params, device, stream, allow_sm90);
  const FwdParams p = checked(params);
  const int kd = kernel_head_dim(p.headdim);
  require(kd > 0, "head dim " + std::to_string(p.headdim) +
                      " is larger than every head dim this build has (" +
                      join_archs(HeadDims::vec(), "") + ")");
  DeviceGuard guard(device);
  require_supported_device(device);
  auto s = static_cast<cudaStream_t>(stream);
  if (decode_applies(p, kd, device, allow_decode)) {
    const DecodeLaunch how =
        decode_launch(int64_t(p.num_splits) * (p.nheads / p.q_pack) * p.batch, kd, device);
    DecodeHeadDims::dispatch(kd, [&](auto head_dim) {
      dispatch_dtype(p.dtype, [&](auto element) {
        run_decode<decltype(element), decltype(head_dim)::value>(p, how.warps, how.smem_bytes, s);
      });
    });
    return kFwdKernelDecode;
  }
  // The Hopper kernels take what they support on an sm_90 GPU (sm90/fwd_config.h); the
  // mma.sync kernels everything else, and whatever TMA cannot describe.
  const int kd_sm90 = Sm90HeadDims::dispatch(kd, [](auto) {}) ? kd : 0;
  if (allow_sm90 && kd_sm90 && compute_capability(device) == 90 && sm90_fwd_supports(p)) {
    bool ran = false;
    Sm90HeadDims::dispatch(kd, [&](auto head_dim) {
      dispatch_dtype(p.dtype, [&](auto element) {
        ran = run_fwd_sm90<decltype(element), decltype(head_dim)::value>(p, sm_count(device), s);
      });
    });
    if (ran) return 90;
  }
  const bool found = HeadDims::dispatch(kd, [&](auto head_dim) {
    dispatch_dtype(p.dtype, [&](auto element) {
      run_fwd<decltype(element), decltype(head_dim)::value>(p, s);
    });
  });
  if (!found) throw std::logic_error("flashattn2: no kernel for head dim " + std::to_string(kd));
  return 80;
}

void mha_append_kv(const AppendKvParams& params, int device, void* stream) {
  const AppendKvParams& p = params;
  require(p.batch > 0 && p.seqlen_new >= 0 && p.nheads_k > 0 && p.cache_capacity >= 0,
          "bad append sizes");
  require(p.headdim > 0 && p.headdim % 8 == 0 && p.headdim <= 256,
          "the KV-cache head dim must be a multiple of 8, at most 256");
  const bool fp32 = p.dtype == DType::kFloat32;
  require(p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16 || fp32,
          "FlashAttention only supports fp16, bf16 and float32 data type");
  require(p.cache_seqlens != nullptr, "cache_seqlens is required");
  require(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.headdim,
          "rotary_dim must be even and at most the head dim");
  if (p.rotary_dim) {
    require(p.rotary_cos && p.rotary_sin && p.q && p.q_out && p.seqlen_ro > 0,
            "rotary needs cos, sin, q and q_out");
  }
  if (p.block_table) {
    require(p.page_size_log2 >= 4 && p.page_size_log2 <= 20, "bad page size");
    require(!p.kv_batch_idx, "a paged KV cache takes no cache_batch_idx");
  }
  for (const void* ptr : {p.k_cache, p.v_cache}) require(aligned16(ptr), "cache must be 16-byte aligned");
  if (p.seqlen_new > 0) {
    for (const void* ptr : {p.k_new, p.v_new}) require(aligned16(ptr), "k/v must be 16-byte aligned");
  }
  for (int64_t stride : {p.knew_batch_stride, p.knew_row_stride, p.knew_head_stride,
                         p.vnew_batch_stride, p.vnew_row_stride, p.vnew_head_stride,
                         p.kc_batch_stride, p.kc_row_stride, p.kc_head_stride,
                         p.vc_batch_stride, p.vc_row_stride, p.vc_head_stride,
                         p.q_batch_stride, p.q_row_stride, p.q_head_stride}) {
    require(stride % 8 == 0, "batch, row and head strides must be multiples of 8 elements");
  }
  DeviceGuard guard(device);
  require_supported_device(device);
  run_append_kv_any(p, static_cast<cudaStream_t>(stream));
}

void rotary(const RotaryParams& params, int device, void* stream) {
  const RotaryParams& p = params;
  require(p.x && p.out, "x and out are required");
  require(p.nheads >= 0 && p.seqlen >= 0 && p.headdim > 0, "bad rotary sizes");
  require(p.cu_seqlens ? p.batch >= 1 : p.batch >= 0,
          "batch must be >= 0 (>= 1 with cu_seqlens)");
  require(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= p.headdim,
          "rotary_dim must be even and at most the head dim");
  require(p.seqlen_ro >= 0 && (p.rotary_dim == 0 || p.seqlen_ro == 0 || (p.cos && p.sin)),
          "rotary needs cos and sin");
  for (DType t : {p.dtype, p.cs_dtype}) {
    require(t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32,
            "the rotary kernel takes float16, bfloat16 or float32");
  }
  if (p.out == p.x) {
    require(p.out_batch_stride == p.x_batch_stride && p.out_row_stride == p.x_row_stride &&
                p.out_head_stride == p.x_head_stride,
            "in place (out == x) needs equal strides");
  }
  const int64_t tokens = p.cu_seqlens ? int64_t(p.seqlen) : int64_t(p.batch) * p.seqlen;
  require(tokens * p.nheads * p.headdim / 256 < (int64_t(1) << 31), "tensor too large");
  DeviceGuard guard(device);
  require_supported_device(device);
  run_rotary_any(p, static_cast<cudaStream_t>(stream));
}

void dropout_mask(const DropoutMaskParams& params, int device, void* stream) {
  const DropoutMaskParams& p = params;
  require(p.batch > 0 && p.nheads > 0 && p.seqlen_q > 0 && p.seqlen_k > 0,
          "batch, nheads and seqlens must be positive");
  require(int64_t(p.batch) * p.nheads <= 65535, "dropout_mask: batch * nheads must be <= 65535");
  require(p.seqlen_q <= 131072, "dropout_mask: seqlen_q must be <= 131072");
  require(p.mask != nullptr, "null pointer");
  require(p.dropout_threshold == 0 ||
              (p.rng_state != nullptr && reinterpret_cast<uintptr_t>(p.rng_state) % 8 == 0),
          "dropout needs an 8-byte aligned int64 rng_state (seed, offset)");
  DeviceGuard guard(device);
  require_supported_device(device);
  run_dropout_mask(p, static_cast<cudaStream_t>(stream));
}

void mha_merge(const MergeParams& params, int device, void* stream) {
  const MergeParams& p = params;
  require(p.batch > 0 && p.seqlen > 0 && p.nheads > 0 && p.headdim > 0,
          "merge: batch, seqlen, nheads and headdim must be positive");
  require(p.out_a && p.out_b && p.out && p.lse_a && p.lse_b && p.lse, "merge: null pointer");
  for (int t = 0; t < 3; ++t) {
    require(p.dtype[t] >= 0 && p.dtype[t] <= 2,
            "merge: dtype codes must be 0 (float16), 1 (bfloat16) or 2 (float32)");
  }
  DeviceGuard guard(device);
  require_supported_device(device);
  run_merge(p, static_cast<cudaStream_t>(stream));
}

int max_smem_per_block(int device) {
  require(device >= 0 && device < kMaxDevices, "bad device index " + std::to_string(device));
  static std::array<std::atomic<int>, kMaxDevices> bytes{};
  int n = bytes[device].load(std::memory_order_relaxed);
  if (n == 0) {
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute(maxSharedMemoryPerBlockOptin)");
    bytes[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace flashattn2
