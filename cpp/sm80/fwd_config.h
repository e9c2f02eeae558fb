// Forward tile sizes: one constexpr function read by the launcher (host) and the kernel
// (device), so the two can never disagree.
#pragma once

namespace flashattn2 {

struct FwdTile {
  int block_m;     // query rows per CTA = 16 * m_tiles * n_warps
  int block_n;     // key/value rows per mainloop step
  int n_warps;
  int m_tiles;     // m16 MMA tiles per warp: each K/V fragment read from shared memory
                   // feeds m_tiles MMAs, so 2 halves the K/V shared-memory traffic of 1
  bool q_in_regs;  // Q fragments loaded to registers once (else re-read from shared memory)
  int min_blocks;  // CTAs per SM the register allocation must allow (__launch_bounds__)
};

// Columns a tile row of head dim d takes in shared memory (sm80/tile.cuh): d, or for d16 the
// one 32-column segment of the layout, of which the kernels use the first 16 columns.
constexpr int smem_cols(int head_dim) { return head_dim < 32 ? 32 : head_dim; }

// Every config fits 96 KiB of shared memory (Q + 2 stages of K and V), so it runs on
// sm_86/sm_89 (99 KiB per block) as well as sm_80/sm_90. Measurements behind each choice:
// benchmarks/NOTES.md. FLASHATTN2_FWD_TILE_{M,N,WARPS,MTILES,QREGS,MINB} (all six, as -D
// flags in CUDAFLAGS) force one tile for every head dim: scripts/tile_sweep.sh uses them.
//
// kv: the tile of the KV-cache / decoding kernel (paged K/V, split-KV, few query rows):
// 64 query rows, one m16 tile per warp, so a decoding step (a handful of query rows, or the
// query heads of a GQA group) spends half the tensor work of the 128-row tile per K/V byte.
constexpr FwdTile fwd_tile(int head_dim, bool kv = false) {
  if (kv) {
    return head_dim <= 64    ? FwdTile{64, 64, 4, 1, true, 3}
           : head_dim <= 128 ? FwdTile{64, 64, 4, 1, true, 2}
                             : FwdTile{64, 32, 4, 1, false, 2};
  }
#ifdef FLASHATTN2_FWD_TILE_M
  return FwdTile{FLASHATTN2_FWD_TILE_M,      FLASHATTN2_FWD_TILE_N,     FLASHATTN2_FWD_TILE_WARPS,
                 FLASHATTN2_FWD_TILE_MTILES, FLASHATTN2_FWD_TILE_QREGS, FLASHATTN2_FWD_TILE_MINB};
#endif
  return head_dim <= 16    ? FwdTile{128, 64, 4, 2, true, 3}
         : head_dim <= 64  ? FwdTile{128, 64, 4, 2, true, 2}
         : head_dim <= 128 ? FwdTile{128, 64, 4, 2, false, 2}
         : head_dim <= 192 ? FwdTile{128, 64, 8, 1, true, 1}
                           : FwdTile{128, 32, 8, 1, true, 1};
}

// Softcap alone gets its own forward instance (kModSoftcap) on the d <= 64 plain tile: there
// it costs a tanh (MUFU) per score besides the ex2 (64 tanh + 68 ex2 per warp and K/V tile
// against 128 HMMA at d64), and with the softcap known at compile time no branch splits the
// step: the S MMAs run column tiles outermost, so the tanh of finished S tiles overlaps the
// MMAs of the next ones. (Step specialisations inside the kModLogits instance cost ALiBi
// 4-6 %.) Measured: benchmarks/NOTES.md.
constexpr bool fwd_softcap_instance(int head_dim, bool kv = false) { return !kv && head_dim <= 64; }

// In bf16, softcap alone also has an instance without a running max (kModSoftcapBounded): a
// softcap bounds every base-2 logit by c = softcap * log2(e), so with the reference max fixed
// at 0, p = 2^x lies in [2^-c, 2^c] and the row max, its quad shuffles and every rescale of
// O go away. Used while c <= kSoftcapBoundedLog2 = 80 (softcap <= 55.4; Gemma 2 uses 50): p,
// the row sums and O (|v| * seqlen_k < 2^48) stay normal, finite floats, and p is a normal
// bf16. fp16 P (normal in [2^-14, 2^15]) would hold c <= 14 only: fp16, and larger softcaps,
// run kModSoftcap.
constexpr float kSoftcapBoundedLog2 = 80.f;
constexpr bool fwd_softcap_bounded(int head_dim, bool bf16, bool kv = false) {
  return bf16 && fwd_softcap_instance(head_dim, kv);
}

// Rescaling O only when a row's max grows by more than kLazyRescaleLog2 (fwd_kernel, kLazy)
// pays where O is large against the S tile: d128 / d256 (128 FMUL per warp-step, vs 64 at
// d64, where the warp vote before the exps costs more than it saves). Measured:
// benchmarks/NOTES.md.
constexpr bool fwd_lazy_rescale(int head_dim) { return head_dim > 64; }
constexpr float kLazyRescaleLog2 = 8.f;

// With Q in registers, sQ is idle during the mainloop, so K/V stage 1 lives inside it when
// it fits (sQ is still the O staging area in the epilogue, after the last K/V read).
constexpr bool fwd_stage1_in_q(int head_dim, bool kv = false) {
  return fwd_tile(head_dim, kv).q_in_regs &&
         2 * fwd_tile(head_dim, kv).block_n <= fwd_tile(head_dim, kv).block_m;
}

constexpr int fwd_smem_bytes(int head_dim, bool kv = false) {
  // 2-byte elements: Q tile + 2 stages x (K tile + V tile), less the stage that sQ hosts.
  return 2 * smem_cols(head_dim) *
         (fwd_tile(head_dim, kv).block_m +
          (fwd_stage1_in_q(head_dim, kv) ? 1 : 2) * 2 * fwd_tile(head_dim, kv).block_n);
}

}  // namespace flashattn2
