// Host-safe parameter block shared by the binding, the dispatcher and the kernels.
// No torch, no CUDA types: plain pointers, sizes and strides (in elements).
#pragma once
#include <cstdint>

namespace flashattn2 {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

struct FwdParams {
  const void* q;  // (batch, seqlen_q, nheads,   headdim)
  const void* k;  // (batch, seqlen_k, nheads_k, headdim)
  const void* v;  // (batch, seqlen_k, nheads_k, headdim)
  void* o;        // (batch, seqlen_q, nheads,   headdim), same dtype as q
  float* lse;     // (batch, nheads, seqlen_q) float32, row stride 1

  // Strides in elements; the head-dim stride is 1 for every tensor.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_k;
  int headdim;  // the real head dim (multiple of 8, <= 256); kernels pad to their tile

  float softmax_scale;  // multiplies q.k before softmax
  // Key j is visible to query i iff
  //   j <= i + seqlen_k - seqlen_q + window_right   (window_right >= 0)
  //   j >= i + seqlen_k - seqlen_q - window_left    (window_left  >= 0)
  // A negative bound is unbounded. causal == (window_left < 0, window_right == 0).
  int window_left, window_right;

  DType dtype;

  // Score modifiers (score_mod.cuh), appended last; all zero / null = plain attention.
  float softcap;               // > 0: logit = softcap * tanh(softmax_scale * q.k / softcap)
  const float* alibi_slopes;   // null, or float32 slopes: bias -slope |i + sk - sq - j|
  int64_t alibi_batch_stride;  // slope of (batch, head) at batch * stride + head (0: shared)
  const int64_t* rng_state;    // dropout (seed, offset) on the device
  uint32_t dropout_threshold;  // drop iff the element's Philox word < this; 0: no dropout
  float dropout_scale;         // 1 / (1 - dropout_p)
};

// Backward (FA2 Algorithm 2). Same shapes and masking as FwdParams; all strides in elements
// with a unit head-dim stride. dk/dv are summed over each GQA group by the kernel.
struct BwdParams {
  const void* q;     // (batch, seqlen_q, nheads,   headdim)
  const void* k;     // (batch, seqlen_k, nheads_k, headdim)
  const void* v;     // (batch, seqlen_k, nheads_k, headdim)
  const void* o;     // (batch, seqlen_q, nheads,   headdim)
  const void* dout;  // (batch, seqlen_q, nheads,   headdim)
  const float* lse;  // (batch, nheads, seqlen_q), row stride 1
  void* dq;          // (batch, seqlen_q, nheads, headdim)
  void* dk;          // (batch, seqlen_k, nheads_k, headdim)
  void* dv;          // (batch, seqlen_k, nheads_k, headdim)
  float* dq_accum;   // workspace, bwd_workspace_floats(...).first floats
  float* dsum;       // workspace, bwd_workspace_floats(...).second floats: rowsum(dO * O),
                     // then one int counter per (batch, head, 64-row query tile)

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim;
  float softmax_scale;
  int window_left, window_right;
  DType dtype;
  // Bitwise-reproducible dq: the CTAs that add into one query tile's dQ do so in a fixed
  // order (a counter per tile), instead of racing.
  bool deterministic;

  // Score modifiers as in FwdParams; all zero / null = plain attention.
  float softcap;               // > 0: logit = softcap * tanh(softmax_scale * q.k / softcap)
  const float* alibi_slopes;   // null, or float32 slopes: bias -slope |i + sk - sq - j|
  int64_t alibi_batch_stride;  // slope of (batch, head) at batch * stride + head (0: shared)
  const int64_t* rng_state;    // dropout (seed, offset) on the device
  uint32_t dropout_threshold;  // drop iff the element's Philox word < this; 0: no dropout
  float dropout_scale;         // 1 / (1 - dropout_p)
};

// The dropout keep mask as a tensor (tests, return_attn_probs): mask[b, h, i, j] = 1 where
// the forward keeps element (b, h, i, j), else 0; contiguous uint8 (batch, nheads, sq, sk).
struct DropoutMaskParams {
  uint8_t* mask;
  const int64_t* rng_state;
  int batch, nheads, seqlen_q, seqlen_k;
  uint32_t dropout_threshold;
};

// True when any score modifier is on (the kernels then run their kMods instance).
template <typename Params>
bool has_score_mods(const Params& p) {
  return p.softcap > 0.f || p.alibi_slopes != nullptr || p.dropout_threshold != 0;
}

// Dropout threshold of a probability p in [0, 1): an element is dropped iff its 32-bit
// Philox word is below floor(p * 2^32) (p * 2^32 is exact in double).
inline uint32_t dropout_threshold_of(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

}  // namespace flashattn2
