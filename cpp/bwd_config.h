// Backward tile sizes: constexpr functions read by the host (launch, the shared-memory
// check) and by the kernel (BwdTraits, bwd_kernel.cuh), so the two agree.
#pragma once

namespace flashattn2 {

// dK and dV of a warp's 16 key rows stay in f32 registers over the warp's output columns:
// 2 * 4 registers per thread per 8 columns, so 128 columns take 128 registers per thread,
// about what fits next to S^T, dP^T and the addresses (d128 is at the 255-register limit
// already). Wider head dims split their output columns between two groups of 4 warps.
constexpr int kBwdMaxColsPerWarp = 128;

struct BwdTile {
  int block_m;     // query rows per step (16 per warp of a group)
  int block_n;     // key rows per CTA (16 per warp of a group)
  int n_warps;     // 4 * d_split
  int d_split;     // warp groups, each owning head_dim / d_split output columns
  int min_blocks;  // CTAs per SM the register allocation must allow (__launch_bounds__)
};

constexpr BwdTile bwd_tile(int head_dim) {
  return head_dim <= kBwdMaxColsPerWarp ? BwdTile{64, 64, 4, 1, 2} : BwdTile{64, 64, 8, 2, 1};
}

// sK, sV [block_n x d], sQ, sdO [block_m x d], sdS [block_n x block_m] (2-byte elements),
// LSE and dsum of the query tile [block_m] f32: d192 104.5 KiB, d256 136.5 KiB, more than
// the 99 KiB a block may use on sm_86 / sm_89 (the host refuses there).
constexpr int bwd_smem_bytes(int head_dim) {
  return 2 * (2 * bwd_tile(head_dim).block_n * head_dim + 2 * bwd_tile(head_dim).block_m * head_dim +
              bwd_tile(head_dim).block_n * bwd_tile(head_dim).block_m) +
         2 * bwd_tile(head_dim).block_m * int(sizeof(float));
}

// Deterministic mode orders the dQ adds of the K/V tiles that visit a query tile. Without a
// right window bound every K/V tile starts at query tile 0, so each CTA of a head runs one
// step behind the one before it in the order (bwd_kernel.cuh). There the tiles are dealt
// round-robin to up to this many chains (a power of two, as is the count used), each
// adding into its own f32 dQ accumulator in its own order (summed in a fixed order at the
// end): the stagger shrinks by that factor, for as many times the accumulator memory.
constexpr int kBwdMaxDqChains = 4;

}  // namespace flashattn2
