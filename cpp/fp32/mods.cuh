// Score modifiers of the float32 kernels (their kGeneral instances): softcap and ALiBi, as
// common/score_mod.cuh defines them,
//   logit = softcap * tanh(softmax_scale * s / softcap)   (softcap > 0), else softmax_scale * s
//   logit -= slope * |i + seqlen_k - seqlen_q - j|        (ALiBi; slope of (batch, head))
// but computed in natural units with tanhf (CUDA: 2 ulp) where ScoreMod works in base-2 units
// with tanh.approx (relative error 2^-11): good below bf16's rounding, 2^13 times float32's.
// In natural units the large logits of ALiBi are formed with one rounding (an FFMA, as
// PyTorch's scores + bias), and the softmax subtracts the row max before scaling by log2(e)
// (fwd_kernel.cuh / bwd_kernel.cuh), so a logit of -2000 costs no more than PyTorch's
// float32 does. Dropout and an attention bias are not taken (mha_fwd / mha_bwd refuse them).
#pragma once
#include <cmath>

namespace flashattn2 {

struct Fp32Mods {
  float cap_scale;  // softmax_scale / softcap (softcap on)
  float slope;      // ALiBi slope, 0: off
  bool on;          // softcap or ALiBi: the kernel's scores are logits (natural units)

  Fp32Mods() = default;

  template <typename Params>
  __device__ __forceinline__ Fp32Mods(const Params& p, int batch, int head)
      : cap_scale(p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f),
        slope(p.alibi_slopes ? p.alibi_slopes[batch * p.alibi_batch_stride + head] : 0.f),
        on(p.softcap > 0.f || slope != 0.f) {}

  // Natural units per unit of the scores the softmax sees: 1 with a modifier (logits), else
  // softmax_scale (the raw q.k, scaled in the softmax's exponent).
  template <typename Params>
  __device__ __forceinline__ float unit(const Params& p) const {
    return on ? 1.f : p.softmax_scale;
  }

  // The logit of score s = q.k at distance dist = i + seqlen_k - seqlen_q - j; *dlogit = d logit
  // / d(softmax_scale s) (1 - tanh^2 with softcap, else 1): the backward's factor on dS.
  template <typename Params>
  __device__ __forceinline__ float logit(const Params& p, float s, float dist, float* dlogit) const {
    float x, d = 1.f;
    if (p.softcap > 0.f) {
      const float t = tanhf(s * cap_scale);
      x = p.softcap * t;
      d = fmaf(-t, t, 1.f);
    } else {
      x = s * p.softmax_scale;
    }
    *dlogit = d;
    return slope != 0.f ? fmaf(-slope, fabsf(dist), x) : x;
  }
};

}  // namespace flashattn2
