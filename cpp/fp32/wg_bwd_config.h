// Tiles of the Hopper float32 backward (cpp/fp32/wg_bwd_kernel.cuh, FLASHATTN2_EXPERIMENTAL=fp32wg
// builds, BwdParams::fp32wg_bwd), host-safe: the launcher and mha_bwd_fp32 size shared memory
// from here. Design and budget: /work/helpers/fp32bwdwg.md (benchmarks/NOTES.md once merged).
#pragma once

namespace flashattn2 {

// Kernel head dims of the tf32 wgmma backward (d128's tiles need twice the shared memory).
constexpr bool fp32wg_bwd_head_dim(int kd) { return kd == 64; }
// Keys per CTA (two consumer warpgroups of 64 keys each) and query rows per step.
constexpr int kFp32WgBwdBlockN = 128;
constexpr int kFp32WgBwdBlockM = 32;
// Float32 tiles: K lo, V lo [N x d] and K^T hi, lo [d x N] (once per CTA); Q hi, lo, dO hi,
// lo [M x d] and Q^T, dO^T hi, lo [d x M] (per step); dS hi, lo [M x N]; lse, dsum [M]; + 1024
// bytes to align the swizzled tiles + 4 mbarriers. d64: 225.3 KiB (of 227). single (the
// single-TF32 instance): the hi tiles, then the producer's staging of the next step's raw Q,
// dO [M x d], lse, dsum [M] (fp32wg::bwd_stage_natural): 97.6 KiB.
// The producer's staging of a step (fp32wg::bwd_stage_natural): raw Q, dO [m x kd], lse, dsum [m].
constexpr int fp32wg_bwd_raw_bytes(int m, int kd) { return 4 * (2 * m * kd + 2 * m); }
constexpr int fp32wg_bwd_smem_bytes(int kd, bool single = false) {
  const int lo = single ? 0 : 1;
  return 4 * ((1 + 3 * lo) * kFp32WgBwdBlockN * kd + 4 * (1 + lo) * kFp32WgBwdBlockM * kd +
              (1 + lo) * kFp32WgBwdBlockM * kFp32WgBwdBlockN + 2 * kFp32WgBwdBlockM) +
         1024 + 32 + (single ? fp32wg_bwd_raw_bytes(kFp32WgBwdBlockM, kd) : 0);
}

// d128 (cpp/fp32/wg_bwd128_kernel.cuh, BwdParams::fp32wg_bwd128; design count:
// scripts/fp32wg_bwd128_count.py, /work/helpers/fp32bwd128.md): 64 keys per CTA, two consumer
// warpgroups split the roles (0: S^T, dV; 1: dP^T, dK; dQ^T by rows of d), 16 queries a step.
// single (the single-TF32 instance, BwdParams::fp32_tf32): no lo tiles, so 32 queries a step.
constexpr int kFp32WgBwd128BlockN = 64;
constexpr int fp32wg_bwd128_block_m(bool single) { return single ? 32 : 16; }
// K lo, V lo [N x d], K^T lo [d x N]; Q hi, lo, dO hi, lo [M x d]; Q^T, dO^T hi, lo [d x M]
// (rows of 16 queries padded to the 128-byte swizzle's 32 columns); P^T exchange [N x M]; dS
// hi, lo [M x N]; lse, dsum [M]; + 1024 to align + 4 mbarriers: 205.2 KiB at d128; single:
// K^T hi (in shared memory: dQ^T's A by SS, no register A that lives across the loop, see
// wg_config.h) and the hi tiles, P^T and lse / dsum at 32 queries, 113.3 KiB.
// Single, then the producer's staging of the next step's raw Q, dO [M x d], lse, dsum [M]
// (fp32wg::bwd_stage_natural): 145.5 KiB.
constexpr int fp32wg_bwd128_smem_bytes(int kd, bool single = false) {
  const int m = fp32wg_bwd128_block_m(single), lo = single ? 0 : 1;
  return 4 * ((1 + 2 * lo) * kFp32WgBwd128BlockN * kd + 2 * (1 + lo) * m * kd +
              2 * (1 + lo) * 32 * kd + (2 + lo) * m * kFp32WgBwd128BlockN + 2 * m) +
         1024 + 32 + (single ? fp32wg_bwd_raw_bytes(m, kd) : 0);
}

}  // namespace flashattn2
