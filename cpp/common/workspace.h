// Backward workspace sizes shared by the host (bwd_workspace_floats) and every generation's
// kernels (seqlen.cuh ws_*): the f32 dQ accumulator rows and the deterministic-order chains.
#pragma once
#include <cstdint>

namespace flashattn2 {

// Backward workspace rows per chain (seqlen.cuh ws_rows): every sequence's rows start at a
// multiple of 16 (dense: round16(seqlen_q) per (batch, head); varlen, total_q >= 0: at most
// 15 rows of padding before each sequence, so round16(total_q + 16 batch) per head).
constexpr int64_t round16(int64_t x) { return (x + 15) & ~int64_t(15); }
constexpr int64_t bwd_ws_rows(int batch, int nheads, int seqlen_q, int total_q) {
  return total_q >= 0 ? int64_t(nheads) * round16(int64_t(total_q) + 16 * int64_t(batch))
                      : int64_t(batch) * nheads * round16(seqlen_q);
}

// Deterministic mode orders the dQ adds of the K/V tiles that visit a query tile
// (dq_order.cuh). The tiles can be dealt round-robin to up to this many chains (a power of
// two, as is the count used: bwd_dq_chains), each adding into its own f32 dQ accumulator
// in its own order (summed in a fixed order at the end), so that a tile waits only for its
// chain's previous visitor: the ascending order's stagger shrinks by that factor and the
// rotated walk gains chains - 1 steps of slack, for as many times the accumulator memory.
constexpr int kBwdMaxDqChains = 4;

}  // namespace flashattn2
