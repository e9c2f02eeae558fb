// Sequence geometry of the float32 kernels: the dense instance's at compile time, the varlen
// one's from SeqInfo (common/seqlen.cuh), so that the dense instances, at the 255-register
// limit, keep the code they had without varlen (no row offsets live across the mainloop).
#pragma once
#include <cstdint>
#include <type_traits>

#include "common/flash.h"
#include "common/seqlen.cuh"

namespace flashattn2 {

template <bool kVarlen>
struct Fp32Seq;

// Dense: every batch entry has p.seqlen_q / p.seqlen_k rows at row 0 of its batch stride.
template <>
struct Fp32Seq<false> {
  int seqlen_q, seqlen_k;
  static constexpr int64_t q_row0 = 0, k_row0 = 0;
  template <typename Params>
  __device__ __forceinline__ Fp32Seq(const Params& p, int) : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}
};

// Varlen (cu_seqlens_q / cu_seqlens_k; the host refuses a KV-cache layout for float32).
template <>
struct Fp32Seq<true> : SeqInfo {
  template <typename Params>
  __device__ __forceinline__ Fp32Seq(const Params& p, int batch) : SeqInfo(p, batch) {}
};

// Row 0 of (batch, head) in the backward workspace (dsum, and dq_accum row-major: row *
// headdim + column): varlen, seqlen.cuh's layout (ws_row0); dense, the (batch, head) planes
// one after another, unpadded (the float32 dq_accum has no 16-row blocks to align, and the
// padded index cost the d128 instance 4 spill bytes), within ws_rows either way. Seq:
// Fp32Seq<false> (dense at compile time), else SeqInfo / Fp32Seq<true> (either, at run time).
template <typename Seq>
__device__ __forceinline__ int64_t fp32_ws_row0(const BwdParams& p, const Seq& seq, int batch,
                                                int head) {
  const int64_t dense = (int64_t(batch) * p.nheads + head) * p.seqlen_q;
  if constexpr (std::is_same_v<Seq, Fp32Seq<false>>) {
    return dense;
  } else {
    return p.cu_seqlens_q ? ws_row0(p, seq, batch, head) : dense;
  }
}

}  // namespace flashattn2
