// The decode kernel's tile (sm80/decode_kernel.cuh) and when it runs: host-safe, read by the
// launcher, the kernel and the host API (flash_api*.cpp), so they can never disagree.
// Built only with FLASHATTN2_EXPERIMENTAL containing decode (FLASHATTN2_DECODE).
#pragma once
#include <cstdint>

#include "common/flash.h"

namespace flashattn2 {

// One m16 row tile per CTA (the packed query rows of a GQA group: seqlen_q * q_pack <= 16),
// kDecodeWarps warps that split the keys, each walking its own kDecodeBlockN-key tiles
// through its own kStages-deep cp.async ring. A grid that the SMs would hold only in more
// than one wave of such CTAs, but in one of kDecodeSmallWarps-warp CTAs (twice as many fit an
// SM, with the same bytes in flight), runs those (flash_api_splits.cpp decode_launch).
constexpr int kDecodeRows = 16;
constexpr int kDecodeWarps = 4;
constexpr int kDecodeSmallWarps = 2;
constexpr int kDecodeBlockN = 16;
// A split gets at least one key tile per warp.
constexpr int kDecodeMinTilesPerSplit = kDecodeWarps;

constexpr bool decode_head_dim(int kernel_head_dim) {
  return kernel_head_dim == 64 || kernel_head_dim == 128;
}

// Ring depth per warp: d128 3 stages (8 KiB each: 16 keys of K and V), so that 2 CTAs fit an
// SM; d64 4 stages (4 KiB each), 3 CTAs per SM. Either way 96-144 KiB of K/V per SM in flight.
constexpr int decode_stages(int head_dim) { return head_dim <= 64 ? 4 : 3; }

// sQ [16 x d] + `warps` rings of kStages x (K, V) [16 x d], 2-byte elements (4 warps: d128
// 100 KiB, d64 66 KiB; 2 warps: 52 / 34 KiB). The epilogue reuses the rings (decode_kernel.cuh).
constexpr int decode_smem_bytes(int head_dim, int warps = kDecodeWarps) {
  return 2 * head_dim * (kDecodeRows + warps * decode_stages(head_dim) * 2 * kDecodeBlockN);
}

// The copy's lane layout (decode_kernel.cuh, DecodeCopyRows): whole rows per warp instruction
// (d128: 2 rows x 256 bytes, 16 lanes a row) where a CTA streams many keys, the default 8 rows x
// 64 bytes (4 lanes a row) where it reads few. On an H200 (thirty-first session, d128, GQA
// 32 / 8): whole rows read at 97-100 % of the read floor from 1k keys a CTA (b16 8k 125.2 us
// against 148.9, cuDNN 123.2) but cost b1 1k / 8k and b4 1k 7-10 % (16-256 keys a CTA: 8 row
// addresses a lane, not 2, in a CTA that is mostly prologue). d64 keeps the default: whole
// 128-byte rows (8 lanes a row) ran at 0.96-0.99x its speed over b 1 / 16 / 64 x 1k-32k, but
// 1.02x at b64 8k; geomean 0.97-1.00 per (layout, batch) (thirty-second session, H200).
constexpr int kDecodeFullRowsMinKeys = 512;
constexpr bool decode_full_rows_head_dim(int head_dim) { return head_dim == 128; }
constexpr bool decode_full_rows(int head_dim, int seqlen_k, int num_splits) {
  return decode_full_rows_head_dim(head_dim) &&
         seqlen_k >= kDecodeFullRowsMinKeys * (num_splits > 1 ? num_splits : 1);
}

// CTAs per SM from shared memory on sm_90 (228 KiB per SM, 1 KiB reserved per CTA): 2 at
// d128, 3 at d64 (2-warp CTAs: 4 / 6); the kernel's __launch_bounds__ minimum. (The host
// heuristics take the GPU's own shared memory: an A100's 164 KiB hold 1 / 2.)
constexpr int decode_ctas_per_sm(int head_dim, int warps = kDecodeWarps) {
  return (228 * 1024) / (decode_smem_bytes(head_dim, warps) + 1024);
}

// The kernel's copies address a tile's rows by 32-bit element offsets from its row 0 (up to
// 16 rows of the row stride, plus the row's columns).
constexpr bool decode_row_offsets_fit(int64_t row_stride) {
  return row_stride >= 0 && row_stride <= (int64_t(1) << 31) / (kDecodeBlockN + 1);
}

// The calls the decode kernel computes exactly as the KV kernel would (anything else runs
// the KV kernel): fp16 / bf16 (checked by mha_fwd), kernel head dim 64 or 128, the packed
// query rows fit one m16 tile, dense or KV-cache layouts (seqused_k, left padding, cache
// batch index, pages, appended keys) but not varlen, no dropout, no attention bias. Causal,
// windows, softcap, ALiBi (q_pack = 1 then, as the host requires), GQA / MQA and split-KV
// are supported. The caller adds the build, the runtime switch and the shared memory.
inline bool decode_supports(const FwdParams& p, int kernel_head_dim) {
  return decode_head_dim(kernel_head_dim) &&
         int64_t(p.seqlen_q) * p.q_pack <= kDecodeRows && p.cu_seqlens_q == nullptr &&
         p.cu_seqlens_k == nullptr && p.dropout_threshold == 0 && !has_bias(p) &&
         decode_row_offsets_fit(p.k_row_stride) && decode_row_offsets_fit(p.v_row_stride);
}

}  // namespace flashattn2
