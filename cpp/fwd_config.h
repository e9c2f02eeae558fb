// Forward tile sizes: one constexpr function read by the launcher (host) and the kernel
// (device), so the two can never disagree.
#pragma once

namespace flashattn2 {

struct FwdTile {
  int block_m;    // query rows per CTA; each warp owns 16 of them
  int block_n;    // key/value rows per mainloop step
  int n_warps;    // block_m / 16
  bool q_in_regs; // Q fragments loaded to registers once (else re-read from shared memory)
};

// Every config fits 96 KiB of shared memory (Q + 2 stages of K and V), so it runs on
// sm_86/sm_89 (99 KiB per block) as well as sm_80/sm_90.
constexpr FwdTile fwd_tile(int head_dim) {
  return head_dim <= 64    ? FwdTile{128, 128, 8, true}
         : head_dim <= 128 ? FwdTile{128, 64, 8, true}
         : head_dim <= 192 ? FwdTile{128, 32, 8, false}
                           : FwdTile{64, 32, 4, false};
}

constexpr int fwd_smem_bytes(int head_dim) {
  // 2-byte elements: Q tile + 2 stages x (K tile + V tile).
  return 2 * head_dim * (fwd_tile(head_dim).block_m + 2 * 2 * fwd_tile(head_dim).block_n);
}

}  // namespace flashattn2
