// Tiles of the Hopper float32 forward (cpp/fp32/wg_kernel.cuh, FLASHATTN2_EXPERIMENTAL=fp32wg
// builds), host-safe: the launcher and mha_fwd size shared memory from here. Design and
// budget: /work/helpers/fp32wg.md (benchmarks/NOTES.md once merged).
#pragma once

namespace flashattn2 {

// Kernel head dims of the tf32 wgmma forward (a head dim runs fp32_kernel_head_dim's, when
// that is one of these).
constexpr bool fp32wg_head_dim(int kd) { return kd == 64 || kd == 128; }
// 128 query rows in two consumer warpgroups of 64, Q split into hi / lo once: Q hi in
// registers (the A of Qhi Klo and Qhi Khi: RS), Q lo in registers too at d64 (q_regs) and in
// shared memory at d128 (Qlo Khi: SS), and P V per 64 columns of O (d128: two halves, a
// fresh accumulator of 32 registers, not 64), so that a d128 consumer fits 216 registers
// next to the 72-register producer.
constexpr int kFp32WgBlockM = 128;
// single (the single-TF32 instances, FwdParams::fp32_tf32): no lo tiles, so d128 takes 64 keys
// a tile in the same shared memory.
constexpr int fp32wg_block_n(int kd, bool single = false) { return kd <= 64 || single ? 64 : 32; }
constexpr bool fp32wg_q_regs(int kd) { return kd <= 64; }  // Q lo (Q hi always)
constexpr int kFp32WgPVN = 64;  // columns of O per P V wgmma (its N)
constexpr int kFp32WgStages = 2;
// Q lo [128 x d] (where in shared memory) + stages x (K hi, K lo [block_n x d], V^T hi, V^T lo
// [d x block_n]), float32, + the 2 mbarriers per stage, + 1024 bytes to align the swizzled
// tiles: d64 129.1 KiB, d128 193.1 KiB.
// single: Q hi [128 x d] in shared memory (SS: an A in registers that the loop reads each tile,
// ptxas gave the d64 instance's P fragments the same registers: wrong results, run 2 of the
// twenty-fourth session), and stages of K hi and V^T hi only (d64 97 KiB, d128 193 KiB).
constexpr int fp32wg_smem_bytes(int kd, bool single = false) {
  return (fp32wg_q_regs(kd) && !single ? 0 : kFp32WgBlockM * kd * 4) +
         kFp32WgStages * (single ? 2 : 4) * fp32wg_block_n(kd, single) * kd * 4 +
         16 * kFp32WgStages + 1024;
}

// The float32 wgmma kernels' grids (fp32wg_grid, launch.h): (tiles, heads, batch), or
// tile-major (heads, tiles, batch) where the tiles do different work (a right window bound:
// causal) and there are at most 32 heads. CTAs start in linear-index order, so a batch entry's
// heads start their longest tiles first and the grid ends on short ones: list scheduling of
// the causal grids on 132 SMs (scripts/grid_order_sim.py) puts the head-major order's tail at
// 3-7 % of the time. At most 32 heads: about as many heads' K / V (forward) or Q / dO
// (backward) in flight as head-major (132 CTAs of 8-16 tiles a head at 1k-2k); and the tiles
// within gridDim.y's limit. kernel: the kernel's own switch (its traits' kTileMajor): measured
// (twenty-seventh session, run 3, causal 1k-4k against head-major) the forward d128 gains
// 0.5-4.8 % (3xTF32) and 1.7-3.7 % (TF32), the backward d64 1-3 %; the forward d64 lost (TF32:
// 8-20 %, two CTAs an SM; 3xTF32 2.7 % at 4k), and the 3xTF32 d128 backward 2.5 % at 4k: they
// stay head-major.
constexpr bool fp32wg_tile_major(bool kernel, int window_right, int heads, int tiles) {
  return kernel && window_right >= 0 && heads <= 32 && tiles <= 65535;
}

}  // namespace flashattn2
