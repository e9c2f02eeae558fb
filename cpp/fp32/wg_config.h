// Tiles of the Hopper float32 forward (cpp/fp32/wg_kernel.cuh, FLASHATTN2_EXPERIMENTAL=fp32wg
// builds), host-safe: the launcher and mha_fwd size shared memory from here. Design and
// budget: /work/helpers/fp32wg.md (benchmarks/NOTES.md once merged).
#pragma once

namespace flashattn2 {

// Kernel head dims of the tf32 wgmma forward (a head dim runs fp32_kernel_head_dim's, when
// that is one of these).
constexpr bool fp32wg_head_dim(int kd) { return kd == 64 || kd == 128; }
// d64: 128 query rows (two consumer warpgroups), Q split into hi / lo in registers (the S
// GEMM's A from registers); d128: 64 rows (one consumer warpgroup), Q hi / lo in shared
// memory (registers: O and its fresh accumulator take 128 of them).
constexpr int fp32wg_block_m(int kd) { return kd <= 64 ? 128 : 64; }
constexpr int fp32wg_block_n(int kd) { return kd <= 64 ? 64 : 32; }
constexpr bool fp32wg_q_regs(int kd) { return kd <= 64; }
constexpr int kFp32WgStages = 2;
// Q hi, lo [block_m x d] (shared-memory Q only) + stages x (K hi, K lo [block_n x d], V^T hi,
// V^T lo [d x block_n]), float32, + the 2 mbarriers per stage, + 1024 bytes to align the
// swizzled tiles: d64 129.1 KiB, d128 193.1 KiB.
constexpr int fp32wg_smem_bytes(int kd) {
  return (fp32wg_q_regs(kd) ? 0 : 2 * fp32wg_block_m(kd) * kd * 4) +
         kFp32WgStages * 4 * fp32wg_block_n(kd) * kd * 4 + 16 * kFp32WgStages + 1024;
}

}  // namespace flashattn2
