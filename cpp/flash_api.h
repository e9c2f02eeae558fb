// Host API of the kernel library (plain C++; compiled into the static library
// `flashattn2_kernels`). The pybind11 binding is the only caller.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/flash.h"

namespace flashattn2 {

// Runs the forward pass on `stream` (a cudaStream_t passed as void*) with `device`
// made current for the launch. Throws std::invalid_argument for arguments the kernels
// do not support and std::runtime_error for CUDA errors or a GPU this build has no
// code for (the message names the archs it was built for). Returns the generation of the
// kernel that ran: 90 (the Hopper kernels of cpp/sm90, used on sm_90 GPUs for what they
// support unless allow_sm90 is false) or 80 (the mma.sync kernels of cpp/sm80), or
// kFwdKernelDecode = 81: the decode kernel of cpp/sm80/decode_kernel.cuh, which builds with
// FLASHATTN2_EXPERIMENTAL=decode run for the forwards it supports (decode_config.h
// decode_supports: at most 16 packed query rows) unless allow_decode is false.
constexpr int kFwdKernelDecode = 81;
// kFwdKernelFp32Wg = 91: the Hopper float32 forward (cpp/fp32/wg_kernel.cuh), which builds
// with FLASHATTN2_EXPERIMENTAL=fp32wg run on sm_90 GPUs for the float32 forwards it supports
// (fp32wg_supports in flash_api.cpp) unless allow_sm90 is false; other float32 forwards run
// the mma.sync float32 kernels (80). kFwdKernelFp32WgTf32 = 93: the same kernel's
// single-TF32 instance, run instead when FwdParams::fp32_tf32 is set.
constexpr int kFwdKernelFp32Wg = 91;
constexpr int kFwdKernelFp32WgTf32 = 93;
int mha_fwd(const FwdParams& params, int device, void* stream, bool allow_sm90 = true,
            bool allow_decode = true);

// Backward pass: dq, dk, dv from dout and the forward's out and lse. Uses the two float32
// workspaces of BwdParams (sizes from bwd_workspace_floats; no need to zero them).
// Throws like mha_fwd; head dims above the largest backward kernel, or whose kernel needs
// more shared memory than the GPU gives a block (bwd_smem_per_block), are invalid_argument.
// smem_limit > 0 caps the shared memory per block the kernels may use below the GPU's (a
// test hook: it selects the tiles of a 99 KiB sm_86 / sm_89 block on any GPU).
// allow_sm90: on an sm_90 GPU, run the Hopper backward (cpp/sm90) for what it supports
// (sm90/bwd_config.h). Returns the generation of the backward kernel that ran: 90 or 80, or
// kBwdKernelFp32Wg = 91: the Hopper float32 backward (cpp/fp32/wg_bwd_kernel.cuh), which
// builds with FLASHATTN2_EXPERIMENTAL=fp32wg run on sm_90 GPUs for the float32 backwards it
// supports when BwdParams::fp32wg_bwd and allow_sm90 are set; other float32 backwards run
// the mma.sync float32 kernels (80). kBwdKernelFp32Wg128 = 92: the d128 one
// (cpp/fp32/wg_bwd128_kernel.cuh), when BwdParams::fp32wg_bwd128 and allow_sm90 are set.
// 93 / 94: their single-TF32 instances, run instead when BwdParams::fp32_tf32 is set.
constexpr int kBwdKernelFp32Wg = 91;
constexpr int kBwdKernelFp32Wg128 = 92;
constexpr int kBwdKernelFp32WgTf32 = 93;
constexpr int kBwdKernelFp32Wg128Tf32 = 94;
// float32 only: BwdParams::dq_accum may be null (0), as the Hopper float32 backwards add dQ
// into dq itself (fp32_dq_direct); where the kernel that takes the call needs the workspace,
// nothing runs and mha_bwd returns kBwdNeedsDqAccum: call again with it.
constexpr int kBwdNeedsDqAccum = -1;
int mha_bwd(const BwdParams& params, int device, void* stream, int smem_limit = 0,
            bool allow_sm90 = true);

// KV-cache append (+ rotary) before a KV-cache forward; throws like mha_fwd.
void mha_append_kv(const AppendKvParams& params, int device, void* stream);

// Rotary embedding of params.x into params.out (in place when they are equal): fp16 / bf16 /
// fp32 x, any of those for cos / sin. Throws like mha_fwd.
void rotary(const RotaryParams& params, int device, void* stream);

// Writes the dropout keep mask of params.rng_state / dropout_threshold (what the kernels of
// this rng_state keep) as uint8 0/1 into params.mask. Throws like mha_fwd.
void dropout_mask(const DropoutMaskParams& params, int device, void* stream);

// flashattn2.merge: (out, lse) from two results over disjoint key sets (MergeParams).
// Throws like mha_fwd (invalid_argument for sizes, dtype codes or null pointers).
void mha_merge(const MergeParams& params, int device, void* stream);

// (dq_accum, dsum) workspace sizes in floats for a backward of these sizes; total_q >= 0
// for varlen (cu_seqlens_q; seqlen_q is then the maximum), -1 for the dense layout;
// dq_chains as BwdParams::dq_chains (1 to kBwdMaxDqChains).
std::pair<int64_t, int64_t> bwd_workspace_floats(int batch, int nheads, int seqlen_q,
                                                 int headdim, int total_q = -1,
                                                 int dq_chains = 1);

// The dQ accumulator chains (BwdParams::dq_chains) a backward of these arguments should
// use on a GPU of num_sms SMs, on either backward: more than one only for deterministic runs
// without a right window bound, from 1024 keys in the ascending order and from 8192 in the
// rotated walk of full attention (common/dq_order.cuh).
int bwd_dq_chains(int seqlen_q, int seqlen_k, int headdim, bool deterministic, int window_left,
                  int window_right, int num_sms);

// Most splits FwdParams::num_splits may take.
constexpr int kMaxSplits = 128;

// Split-KV combine (combine_kernel.cuh): warps per output row, so that each warp reads at
// most 8 splits' partial rows (one batch of loads in flight) -- 1, 2 or 4; a 128-thread
// block combines 4 / that many rows.
constexpr int combine_warps_per_row(int num_splits) {
  return num_splits > 16 ? 4 : num_splits > 8 ? 2 : 1;
}

// The split-KV count that fills `device` for a forward of these sizes (1 = no split): the
// fewest splits whose CTAs fill the SMs' resident slots in whole waves within 85 % of the
// best; 1 when the unsplit grid already fills 80 % of them. nheads and seqlen_q are the
// heads and rows the KV kernel tiles: with GQA packing (FwdParams::q_pack = g), nheads / g
// and seqlen_q * g. sm90: the tile of the Hopper forward instead (sm90_fwd_applies; it
// packs no heads). decode: the decode kernel's count instead where mha_fwd would run it
// (built, the GPU's shared memory, seqlen_q rows <= 16; the caller knows the call is one
// decode_supports takes), by bytes per SM (flash_api_splits.cpp decode_num_splits).
int num_splits_heuristic(int batch, int nheads, int seqlen_q, int seqlen_k, int headdim,
                         int device, bool sm90 = false, bool decode = false);

// Whether mha_fwd runs the Hopper kernels (cpp/sm90) for a forward of this head dim and
// seqlen_q on `device` (when allow_sm90), given whether it has dropout and a KV-cache layout
// (seqused_k, left padding, cache batch index, pages or appended keys).
bool sm90_fwd_applies(int device, int headdim, int seqlen_q, bool dropout, bool kv_cache_layout);

// The float32 workspace (in floats) of a Hopper forward's stream-K tail (sm90/fwd_config.h
// sm90_fwd_stream_k): dense attention, no window, one split, on `device`; 0 where it takes
// none. Passed as FwdParams::o_accum (num_splits 1) with tile_counter (kSm90FwdCounterInts
// zeroed int32), the launch splits its last tiles' key blocks between CTAs.
int64_t sm90_fwd_stream_k_floats(int device, int batch, int nheads, int seqlen_q, int seqlen_k,
                                 int headdim);

// Largest head dim the backward supports in this build (0 if none).
int bwd_max_head_dim();

// Dynamic shared memory per block, in bytes, of the backward kernel that runs head dim
// `headdim` (0 if this build has none). Head dims above 128 need more than the 99 KiB a
// block may use on sm_86 / sm_89; mha_bwd refuses them there.
int bwd_smem_per_block(int headdim);

// The most dynamic shared memory a block may use on `device` (opt-in limit), in bytes;
// cached per device.
int max_smem_per_block(int device);

// Smallest compiled kernel head dim >= headdim, or -1 if none (kernel head dim 16 only while
// set_native_d16 is on, the default).
int kernel_head_dim(int headdim);
// Whether head dims 1-16 may run the kernel of head dim 16 where built (FLASHATTN2_HEAD_DIMS
// with 16); false sends them to the next larger kernel, as builds without it (an A/B switch,
// process-wide; python/flashattn2/_ext.py FLASHATTN2_NATIVE_D16).
void set_native_d16(bool enabled);

std::vector<int> built_head_dims();  // e.g. {32, 64, 96, 128, 192, 256}
std::vector<int> built_sm90_head_dims();  // the Hopper forward's, e.g. {64, 128, 192, 256}
std::vector<int> built_sm90_bwd_head_dims();  // the Hopper backward's: {128}, {64, 128} or {}
// FLASHATTN2_SM90_BWD_EXPERIMENTAL as built, comma-separated (default "d64,window,varlen,mods,dq_bulk").
std::string built_sm90_bwd_experimental();
// Kernel head dims of the float32 (3xTF32) kernels: {32, 64, 128} in builds with
// FLASHATTN2_EXPERIMENTAL=fp32, else {}. A float32 head dim d runs the smallest one >= d.
std::vector<int> built_fp32_head_dims();
std::vector<int> built_archs();      // SASS archs, e.g. {80, 90}
std::vector<int> built_ptx_archs();  // PTX archs, e.g. {90}
int cuda_runtime_version();          // CUDART_VERSION the library was built with, e.g. 13000
std::string version();               // package version, e.g. "0.1.0"

// Empty if `device` can run this build's kernels; otherwise a human-readable reason
// ("this build has code for sm_80, sm_90 and PTX compute_90; GPU 0 is sm_75").
std::string device_unsupported_reason(int device);

}  // namespace flashattn2
