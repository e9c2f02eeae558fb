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
// d128 `two_wg` (the instance of FwdParams::fp32wg_d128_2wg, FLASHATTN2_FP32WG_D128_2WG=1): 128
// rows in two consumer warpgroups as d64, Q hi in registers (the A of Qhi Klo and Qhi Khi), Q
// lo in shared memory (Qlo Khi: SS), and P V in two 64-column halves of O (a fresh
// accumulator of 32 registers, not 64), so that a consumer fits 208 registers next to the
// 80-register producer. Other head dims ignore two_wg.
constexpr int fp32wg_block_m(int kd, bool two_wg = false) {
  return kd <= 64 || two_wg ? 128 : 64;
}
constexpr int fp32wg_block_n(int kd) { return kd <= 64 ? 64 : 32; }
constexpr bool fp32wg_q_regs(int kd) { return kd <= 64; }
constexpr bool fp32wg_q_hi_regs(int kd, bool two_wg = false) { return kd <= 64 || two_wg; }
// Columns of O per P V wgmma (its N).
constexpr int fp32wg_pv_n(int kd, bool two_wg = false) { return kd > 64 && two_wg ? 64 : kd; }
constexpr int kFp32WgStages = 2;
// Q hi, Q lo [block_m x d] (those in shared memory) + stages x (K hi, K lo [block_n x d], V^T
// hi, V^T lo [d x block_n]), float32, + the 2 mbarriers per stage, + 1024 bytes to align the
// swizzled tiles: d64 129.1 KiB, d128 193.1 KiB, d128 two_wg 193.1 KiB (Q lo 64 + 128).
constexpr int fp32wg_smem_bytes(int kd, bool two_wg = false) {
  return ((fp32wg_q_regs(kd) ? 0 : 1) + (fp32wg_q_hi_regs(kd, two_wg) ? 0 : 1)) *
             fp32wg_block_m(kd, two_wg) * kd * 4 +
         kFp32WgStages * 4 * fp32wg_block_n(kd) * kd * 4 + 16 * kFp32WgStages + 1024;
}

}  // namespace flashattn2
