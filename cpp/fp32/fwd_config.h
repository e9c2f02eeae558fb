// Tiles of the float32 kernels (cpp/fp32), host-safe: the launchers and mha_fwd / mha_bwd
// size shared memory from here.
#pragma once

namespace flashattn2 {

// Head dims of the float32 kernels; a head dim runs the smallest one >= it.
constexpr int kFp32HeadDims[] = {32, 64, 128};
constexpr int fp32_kernel_head_dim(int headdim) {
  for (int d : kFp32HeadDims) {
    if (d >= headdim) return d;
  }
  return -1;
}

// Forward: 4 warps of m16 query tiles, two per warp up to d64 (each K / V fragment split
// once for 32 rows; d128 has no registers for a second acc_o), so 128 / 64 query rows per
// CTA; keys per tile: 64 at d32, else 32.
constexpr int fp32_fwd_m_tiles(int head_dim) { return head_dim <= 64 ? 2 : 1; }
constexpr int fp32_fwd_block_m(int head_dim) { return 4 * 16 * fp32_fwd_m_tiles(head_dim); }
constexpr int fp32_fwd_block_n(int head_dim) { return head_dim <= 32 ? 64 : 32; }
// d <= 64: each K / V tile split into (hi, lo) once in shared memory after it lands (hi in
// place, lo in one extra stage-sized buffer) instead of by every warp; d128 has no room
// (131 KiB).
constexpr bool fp32_fwd_presplit(int head_dim) { return head_dim <= 64; }
// sQ (rows padded by 4 floats) + 2 stages of sK (padded; unpadded when presplit) and sV
// (unpadded) + the lo stage when presplit, float32: d32 66 KiB, d64 82 KiB, d128 98 KiB.
constexpr int fp32_fwd_smem_bytes(int head_dim) {
  const bool presplit = fp32_fwd_presplit(head_dim);
  return 4 * (fp32_fwd_block_m(head_dim) * (head_dim + 4) +
              (presplit ? 3 : 2) * fp32_fwd_block_n(head_dim) *
                  (2 * head_dim + (presplit ? 0 : 4)));
}

// Backward: 4 warps of 16 keys (a K/V tile of 64 keys per CTA); query tiles of 32 at d32,
// else 16 (with 32, d64 spilled 16 bytes at the 255-register limit: dK + dV alone take
// d / 2 registers per thread); 2 CTAs per SM.
constexpr int kFp32BwdBlockN = 64;
constexpr int fp32_bwd_block_m(int head_dim) { return head_dim <= 32 ? 32 : 16; }
constexpr int fp32_bwd_min_blocks(int) { return 2; }
// d <= 64: operands split into (hi, lo) once in shared memory instead of by every warp in
// registers: K and V once per CTA (they stay for all its query tiles), Q and dO once per
// query tile. d128 keeps register splits: 149 KiB of smem otherwise, and its registers
// spill with the split Q / dO reads.
constexpr bool fp32_bwd_presplit(int head_dim) { return head_dim <= 64; }
// sK, sV [64 x d] + sQ, sdO [block_m x d] (each twice when presplit: the lo halves) + sdS
// [64 x block_m] (rows padded by 4 floats when block_m is 16) + lse, dsum [block_m], float32
// (d32: 56.3 KiB; d64: 85.1; d128: 85.1).
constexpr int fp32_bwd_smem_bytes(int head_dim) {
  const int m = fp32_bwd_block_m(head_dim);
  const int copies = fp32_bwd_presplit(head_dim) ? 2 : 1;
  return 4 * (copies * 2 * (kFp32BwdBlockN + m) * head_dim +
              kFp32BwdBlockN * (m == 16 ? m + 4 : m) + 2 * m);
}

}  // namespace flashattn2
