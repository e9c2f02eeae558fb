// Score modifiers shared by the forward and the backward: softcap, ALiBi and dropout.
//
// One definition of each, so the backward recomputes exactly the forward's values:
//   softcap   logit = softcap * tanh(softmax_scale * s / softcap)   (s = q.k), else
//             logit = softmax_scale * s (flash-attn v2).
//   ALiBi     logit -= slope * |i + seqlen_k - seqlen_q - j|, after the softcap; slope per
//             (batch, head) from a float32 (nheads,) or (batch, nheads) tensor.
//   dropout   element (batch, head, i, j) is dropped iff its Philox4x32-10 word is below
//             dropout_threshold (= p * 2^32): a pure function of (seed, offset, batch, head,
//             i, j), so the forward (rows of S per lane) and the backward (rows of S^T per
//             lane) regenerate the same mask although their fragment layouts differ.
// The kernels take these only in their kMods instance (a template flag), so plain attention
// runs the code it ran before; inside the kMods instance each modifier is a runtime branch.
//
// Philox layout. One Philox call gives four 32-bit words for the 2x2 group of elements
//   {i, i + 8} x {j, j + 8}   with i % 16 < 8 and j % 16 < 8,
// the largest group that one lane holds in both the forward's m16n8 C fragments (rows g,
// g + 8; columns 2q, 2q+1 of each n8 tile) and the backward's transposed ones. The call is
//   key     = (seed lo, seed hi)
//   counter = (group column, group row, batch * nheads + head + offset lo, offset hi)
//   group row = (i / 16) * 8 + i % 8, group column = (j / 16) * 8 + j % 8
// and word .x is (i, j), .y (i, j + 8), .z (i + 8, j), .w (i + 8, j + 8).
// python/flashattn2/_reference.py holds a torch twin of this (dropout_keep_mask) for tests.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "common/ptx.cuh"

namespace flashattn2 {

// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11): 10 rounds of
//   (x0, x1, x2, x3) -> (hi(M1 x2) ^ x1 ^ k0, lo(M1 x2), hi(M0 x0) ^ x3 ^ k1, lo(M0 x0))
// with the key bumped by the Weyl constants (W0, W1) between rounds.
__host__ __device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * ctr.x;
    const uint64_t p1 = uint64_t(kM1) * ctr.z;
    ctr = make_uint4(uint32_t(p1 >> 32) ^ ctr.y ^ key.x, uint32_t(p1),
                     uint32_t(p0 >> 32) ^ ctr.w ^ key.y, uint32_t(p0));
    key.x += kW0;
    key.y += kW1;
  }
  return ctr;
}

// The modifiers of one (batch, head), read once per CTA (forward) or per query head
// (backward). Params is FwdParams or BwdParams (same field names).
//
// The kernels work with logits in base-2 units, x = log2(e) * logit, so the softmax is
// exp2(x - max) with no further scale (the forward without ALiBi keeps capped(s) instead and
// folds mult() into the softmax scale). Per score, the forward spends (beyond plain attention):
//   softcap   FMUL, tanh.approx (one MUFU); + FMUL with ALiBi
//   ALiBi     FADD, FFMA                               (dist from a per-tile base plus a
//                                                      compile-time constant, exact)
// tanh.approx.f32 has a maximum relative error of 2^-10.99 (PTX ISA), i.e. about
// softcap * 5e-4 on a logit near the cap: below the bf16 rounding of the scores that the
// reference computes in the same dtype (tests/test_variants.py checks the 2x rule).
struct ScoreMod {
  float scale_log2;  // softmax_scale * log2(e): the logit of a score without softcap
  float softcap;     // 0: off
  float cap_scale;   // softmax_scale / softcap
  float cap_log2;    // softcap * log2(e)
  float slope_log2;  // ALiBi slope * log2(e), 0: off
  uint2 key;         // Philox key (seed)
  uint32_t ctr_z;    // batch * nheads + head + offset lo
  uint32_t ctr_w;    // offset hi
  uint32_t threshold;  // 0: no dropout

  ScoreMod() = default;

  template <typename Params>
  __device__ __forceinline__ ScoreMod(const Params& p, int batch, int head) {
    constexpr float kLog2e = 1.4426950408889634f;
    scale_log2 = p.softmax_scale * kLog2e;
    softcap = p.softcap;
    cap_scale = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
    cap_log2 = p.softcap * kLog2e;
    const float slope = p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_batch_stride + head] : 0.f;
    slope_log2 = slope * kLog2e;
    init_dropout(p.rng_state, p.dropout_threshold, batch * p.nheads + head);
  }

  // Dropout state of (batch * nheads + head) = bh; rng_state is read only when threshold > 0.
  __device__ __forceinline__ void init_dropout(const int64_t* rng_state, uint32_t thresh,
                                               int bh) {
    threshold = thresh;
    uint64_t seed = 0, offset = 0;
    if (threshold) {
      seed = static_cast<uint64_t>(rng_state[0]);
      offset = static_cast<uint64_t>(rng_state[1]);
    }
    key = make_uint2(uint32_t(seed), uint32_t(seed >> 32));
    ctr_z = uint32_t(bh) + uint32_t(offset);
    ctr_w = uint32_t(offset >> 32);
  }

  // The logit in two steps, x = fmaf(capped(s), mult(), bias(dist)) in base 2:
  //   capped(s) = tanh(s * softmax_scale / softcap) with softcap (then d logit / d(scale s)
  //               = 1 - t^2), else s; tanh(-inf) = -1, so masks go after the modifiers;
  //   mult()    = softcap * log2(e), else softmax_scale * log2(e);
  //   bias(d)   = -slope * log2(e) * |d|, d = i + seqlen_k - seqlen_q - j (0 without ALiBi).
  __device__ __forceinline__ float capped(float s) const {
    return ptx::tanh_approx(s * cap_scale);
  }
  __device__ __forceinline__ float mult() const { return softcap > 0.f ? cap_log2 : scale_log2; }
  __device__ __forceinline__ float bias(float dist) const { return -slope_log2 * fabsf(dist); }
  // All of it for one score (the backward's form; the forward runs each step as its own
  // pass over the tile so that the uniform branches stay outside the loops).
  __device__ __forceinline__ float logit2(float s, float dist, float* dlogit) const {
    float t = s, d = 1.f;
    if (softcap > 0.f) {
      t = capped(s);
      d = fmaf(-t, t, 1.f);
    }
    *dlogit = d;
    return fmaf(t, mult(), slope_log2 != 0.f ? bias(dist) : 0.f);
  }

#if FLASHATTN2_BIAS
  // Attention bias (BiasLayout) of this (batch, head): its (seqlen_q, seqlen_k) plane, and
  // the plane of dbias (the backward's, when asked for). Set by init_bias, which only the
  // kernels' bias instances call (the others keep the registers they had without it).
  const void* bias_plane;  // elements of the attention's own dtype (BiasLayout)
  int64_t bias_row, bias_col;
  char* dbias_plane;       // elements of BiasLayout::dbias_dtype
  int64_t dbias_row;

  template <typename Params>
  __device__ __forceinline__ void init_bias(const Params& p, int batch, int head) {
    bias_row = p.bias_row_stride;
    bias_col = p.bias_col_stride;
    const int64_t at = batch * p.bias_batch_stride + head * p.bias_head_stride;
    bias_plane = p.attn_bias ? static_cast<const char*>(p.attn_bias) + at * 2 : nullptr;
    dbias_plane = nullptr;
    if constexpr (std::is_same_v<Params, BwdParams>) {
      const int64_t dat = batch * p.dbias_batch_stride + head * p.dbias_head_stride;
      dbias_plane = p.dbias ? static_cast<char*>(p.dbias) + dat * dbias_bytes(p) : nullptr;
      dbias_row = p.dbias_row_stride;
    }
  }
  __device__ __forceinline__ bool has_bias() const { return bias_plane != nullptr; }
  __device__ __forceinline__ bool has_dbias() const { return dbias_plane != nullptr; }
  __device__ __forceinline__ int64_t dbias_row_stride() const { return dbias_row; }
  template <typename Params>
  static __device__ __forceinline__ int dbias_bytes(const Params& p) {
    return p.dbias_dtype == static_cast<int>(DType::kFloat32) ? 4 : 2;
  }
  // Bias of query i, key j (natural units); the caller checks i < seqlen_q, j < seqlen_k.
  template <typename Element>
  __device__ __forceinline__ float bias_at(int i, int j) const {
    const Element b = static_cast<const Element*>(bias_plane)[i * bias_row + j * bias_col];
    if constexpr (std::is_same_v<Element, __half>) {
      return __half2float(b);
    } else {
      return __bfloat162float(b);
    }
  }
  // The backward's d loss / d logit into dbias (has_dbias()). The lane holds queries i, i + 1
  // of key j, the lane 4 apart (xor) the same queries of key j ^ 1: one shuffle gives each
  // lane two adjacent keys of one query, so that one store (or atomic) writes both. Lanes of
  // even j take (i, j), (i, j + 1), lanes of odd j (i + 1, j - 1), (i + 1, j): `at` is the
  // address of that pair (dbias_pair), `valid` whether its row is < seqlen_q and its first
  // key < seqlen_k (with an odd seqlen_k the last pair's second key is the row's padding:
  // BwdParams). Every lane of the warp calls it (the shuffle), with warp-uniform p.
  template <typename Params>
  __device__ __forceinline__ char* dbias_pair(const Params& p, int i, int j) const {
    const bool odd = j & 1;
    return dbias_plane + ((i + odd) * dbias_row + j - odd) * dbias_bytes(p);
  }
  template <typename Params>
  __device__ __forceinline__ void store_dbias2(const Params& p, char* at, bool odd, bool valid,
                                               float ds0, float ds1) const {
    const float got = __shfl_xor_sync(0xffffffffu, odd ? ds0 : ds1, 4);
    const float lo = odd ? got : ds0, hi = odd ? ds1 : got;
    if (!valid) return;
    if (p.dbias_dtype == static_cast<int>(DType::kFloat32)) {
      float* const d = reinterpret_cast<float*>(at);
      if (p.dbias_add) {
        ptx::red_add_v2(d, lo, hi);
      } else {
        *reinterpret_cast<float2*>(d) = make_float2(lo, hi);
      }
    } else {
      *reinterpret_cast<uint32_t*>(at) = p.dbias_dtype == static_cast<int>(DType::kBFloat16)
                                             ? ptx::pack2<__nv_bfloat16>(lo, hi)
                                             : ptx::pack2<__half>(lo, hi);
    }
  }
#else
  template <typename Params>
  __device__ __forceinline__ void init_bias(const Params&, int, int) {}
  static constexpr bool has_bias() { return false; }
  static constexpr bool has_dbias() { return false; }
  template <typename Element>
  __device__ __forceinline__ float bias_at(int, int) const { return 0.f; }
  template <typename Params>
  static __device__ __forceinline__ int dbias_bytes(const Params&) { return 0; }
  __device__ __forceinline__ int64_t dbias_row_stride() const { return 0; }
  template <typename Params>
  __device__ __forceinline__ char* dbias_pair(const Params&, int, int) const { return nullptr; }
  template <typename Params>
  __device__ __forceinline__ void store_dbias2(const Params&, char*, bool, bool, float,
                                               float) const {}
#endif

  // The four Philox words of the group {i, i + 8} x {j, j + 8} (i % 16 < 8, j % 16 < 8).
  __device__ __forceinline__ uint4 dropout_words(int i, int j) const {
    const uint32_t row = uint32_t(i >> 4) * 8u + uint32_t(i & 7);
    const uint32_t col = uint32_t(j >> 4) * 8u + uint32_t(j & 7);
    return philox4x32_10(make_uint4(col, row, ctr_z, ctr_w), key);
  }
};

}  // namespace flashattn2
