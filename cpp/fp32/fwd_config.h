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

// Forward: 4 warps of 16 query rows; keys per tile: 64 at d32, else 32 (d64: 50 KiB, three
// CTAs per A100 SM; d128: 98 KiB, within the 99 KiB of sm_86 / sm_89).
constexpr int kFp32FwdBlockM = 64;
constexpr int fp32_fwd_block_n(int head_dim) { return head_dim <= 32 ? 64 : 32; }
// sQ (rows padded by 4 floats) + 2 stages of sK (padded) and sV (unpadded), float32.
constexpr int fp32_fwd_smem_bytes(int head_dim) {
  return 4 * (kFp32FwdBlockM * (head_dim + 4) +
              2 * fp32_fwd_block_n(head_dim) * (2 * head_dim + 4));
}

}  // namespace flashattn2
