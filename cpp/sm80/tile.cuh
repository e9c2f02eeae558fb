// Shared-memory tiles used by every kernel: the swizzled layout and the cp.async copies
// between global and shared memory.
//
// A [kRows x kHeadDim] tile of 2-byte elements is stored as kHeadDim/32 column segments of
// [kRows x 32] elements (64-byte rows); the 16-byte chunk c of row r sits at chunk
// c ^ ((r / 2) % 4) of its segment, so the 8 row addresses of an ldmatrix and each 8-lane
// phase of a 16-byte copy hit 8 distinct 16-byte bank groups (conflict free). A 16-column
// tile (head dim 16) takes one segment and uses its chunks 0 and 1 (smem_cols, fwd_config.h):
// the fragment addresses stay those of the wider tiles; the other half is never touched.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"

namespace flashattn2 {

// Element offset of the 16-byte chunk `chunk` (8 elements) of row `row` in a swizzled tile
// of kRows rows (layout described at the top of this file).
template <int kRows>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return (chunk >> 2) * (kRows * 32) + row * 32 + (((chunk & 3) ^ ((row >> 1) & 3)) << 3);
}

// ldmatrix lane addresses for the 16x16 blocks of a region of a swizzled tile of kRows rows
// whose first row is a multiple of 8 and first column a multiple of 16. Two lane patterns,
// by what the 4 matrices of an x4 load are:
//  - kKMajor false: rows lane % 16, chunk lane / 16 -- the A operand (m16 x k16) from
//    m-major rows, or the B operand (two n8 x k16) from k-major rows with .trans;
//  - kKMajor true: rows 8 (lane / 16) + lane % 8, chunk (lane / 8) % 2 -- the B operand from
//    n-major rows, or the A operand from k-major rows with .trans.
// Block (i, cb), i.e. rows row0 + 16 i and columns col0 + 16 cb, is at base[cb % 2] +
// (cb / 2) segments + 16 i rows: one add of a compile-time offset once the loops unroll.
template <int kRows>
struct LdsmTile {
  uint32_t base[2];
  __device__ __forceinline__ LdsmTile(uint32_t tile_addr, int row0, int col0, int lane,
                                      bool k_major) {
    const int r = k_major ? ((lane >> 4) << 3) + (lane & 7) : lane & 15;
    const int c = k_major ? (lane >> 3) & 1 : lane >> 4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int blk = col0 / 16 + j;  // 16-column block of parity j
      base[j] = tile_addr + (blk >> 1) * (kRows * 64) +
                2 * swizzle<kRows>(row0 + r, 2 * (blk & 1) + c);
    }
  }
  // The same region `bytes` further on (another stage of a multi-stage buffer).
  __device__ __forceinline__ LdsmTile plus(uint32_t bytes) const {
    LdsmTile t = *this;
    t.base[0] += bytes;
    t.base[1] += bytes;
    return t;
  }
  __device__ __forceinline__ uint32_t operator()(int i, int cb) const {
    return base[cb & 1] + (cb >> 1) * (kRows * 64) + i * (16 * 64);
  }
};

// acc[kMT][2 kNB] (m16n8 tiles) += A (kMT m16 tiles) B (kNB n16 blocks) over kKS k16 steps,
// both from shared memory. A: block (m tile, k step) of `a`, or with kTransA (k-major
// rows, .trans) block (k step, m tile); B: block (n block, k step) of `b`, or with kTransB
// (k-major rows, .trans) block (k step, n block). The LdsmTiles must use the matching
// lane pattern (k_major = !kTransA for A, k_major = !kTransB for B).
//
// warp_gemm_a is the shared k loop, with the A fragments of k step kk (one per m tile, mma
// A layout) supplied by load_a(kk, af); warp_gemm_areg takes them from registers, areg[m
// tile][k step] (e.g. a warp's own products, converted from accumulator layout).
template <typename Element, bool kTransB, int kMT, int kNB, int kKS, int kRowsB, typename LoadA>
__device__ __forceinline__ void warp_gemm_a(float (&acc)[kMT][2 * kNB][4], LoadA&& load_a,
                                            const LdsmTile<kRowsB>& b) {
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) {
    uint32_t af[kMT][4], bf[kNB][4];
    load_a(kk, af);
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
      if constexpr (kTransB) {
        ptx::ldmatrix_x4_trans(bf[nb], b(kk, nb));
      } else {
        ptx::ldmatrix_x4(bf[nb], b(nb, kk));
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nb = 0; nb < kNB; ++nb) {
        ptx::mma_16816<Element>(acc[mt][2 * nb], af[mt], bf[nb][0], bf[nb][1]);
        ptx::mma_16816<Element>(acc[mt][2 * nb + 1], af[mt], bf[nb][2], bf[nb][3]);
      }
  }
}
template <typename Element, bool kTransA, bool kTransB, int kMT, int kNB, int kKS, int kRowsA,
          int kRowsB>
__device__ __forceinline__ void warp_gemm(float (&acc)[kMT][2 * kNB][4], const LdsmTile<kRowsA>& a,
                                          const LdsmTile<kRowsB>& b) {
  warp_gemm_a<Element, kTransB, kMT, kNB, kKS>(
      acc,
      [&](int kk, uint32_t(&af)[kMT][4]) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (kTransA) {
            ptx::ldmatrix_x4_trans(af[mt], a(kk, mt));
          } else {
            ptx::ldmatrix_x4(af[mt], a(mt, kk));
          }
        }
      },
      b);
}
template <typename Element, bool kTransB, int kMT, int kNB, int kKS, int kRowsB>
__device__ __forceinline__ void warp_gemm_areg(float (&acc)[kMT][2 * kNB][4],
                                               const uint32_t (&areg)[kMT][kKS][4],
                                               const LdsmTile<kRowsB>& b) {
  warp_gemm_a<Element, kTransB, kMT, kNB, kKS>(
      acc,
      [&](int kk, uint32_t(&af)[kMT][4]) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) af[mt][i] = areg[mt][kk][i];
      },
      b);
}

// Consecutive lanes that copy one row segment of a tile of kCols columns, a 16-byte chunk
// each: the 4 chunks of a 32-column segment, or the 2 of a 16-column row (head dim 16).
constexpr int copy_lanes(int cols) { return cols >= 32 ? 4 : cols / 8; }

// Row and 16-byte chunk that thread `tid` copies in iteration i of a tile copy (kLanes =
// copy_lanes of the tile's columns). Unsigned power-of-two arithmetic: cheap enough that the
// compiler recomputes it in the epilogue instead of keeping the prologue's values live (and
// spilled) across the mainloop.
template <int kRows, int kNThreads, int kLanes = 4>
__device__ __forceinline__ unsigned tile_row(int i, int tid) {
  static_assert((kRows & (kRows - 1)) == 0, "tile rows must be a power of two");
  return ((unsigned(i) * kNThreads + unsigned(tid)) / kLanes) & (kRows - 1);
}
template <int kRows, int kNThreads, int kLanes = 4>
__device__ __forceinline__ unsigned tile_chunk(int i, int tid) {
  const unsigned idx = unsigned(i) * kNThreads + unsigned(tid);
  return idx / kLanes / kRows * 4 + idx % kLanes;
}

// The rows one thread copies in a tile copy: tile_row(i, tid) is row(i % kSlots, tid), a
// compile-time slot once the copy loop is unrolled. Per-row state (the pages of a paged
// K/V tile) can so be computed once per tile and slot rather than once per 16-byte chunk.
template <int kRows, int kNThreads, int kLanes = 4>
struct TileThreadRows {
  static constexpr int kStep = kNThreads / kLanes;  // rows between a thread's rows
  static constexpr int kSlots = kRows >= kStep ? kRows / kStep : 1;
  static_assert(kLanes == 4 || kLanes == 2, "lanes per row");
  static_assert(kRows < kStep || kRows % kStep == 0,
                "tile rows must be a multiple of threads / lanes per row");
  __device__ __forceinline__ static int row(int slot, int tid) {
    const int r = tid >> (kLanes == 4 ? 2 : 1);
    return kRows >= kStep ? r + kStep * slot : r & (kRows - 1);
  }
};

// Global -> shared copy of a [kRows x kHeadDim] tile with cp.async; row r comes from
// row_ptr(r, slot), slot = the thread's row slot (TileThreadRows) (a row may live anywhere:
// pages of a KV cache, query heads of a GQA group). Rows >= rows_valid and columns >= headdim
// are zero-filled (their source is never read; row_ptr(0, slot) must be computable). Lanes
// 4i..4i+3 copy the 64 contiguous bytes of one row segment (d16: lanes 2i, 2i+1 the 32 of a
// row): full 32-byte sectors in global memory.
template <int kRows, int kHeadDim, int kNThreads, typename Element, typename RowPtr>
__device__ __forceinline__ void load_tile_rows(Element* smem, RowPtr&& row_ptr, int rows_valid,
                                               int headdim, int tid) {
  constexpr int kChunks = kRows * kHeadDim / 8;
  constexpr int kLanes = copy_lanes(kHeadDim);
  constexpr int kSlots = TileThreadRows<kRows, kNThreads, kLanes>::kSlots;
  static_assert(kChunks % kNThreads == 0, "tile copy must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kNThreads; ++i) {
    const int row = int(tile_row<kRows, kNThreads, kLanes>(i, tid));
    const int chunk = int(tile_chunk<kRows, kNThreads, kLanes>(i, tid));
    const bool pred = row < rows_valid && chunk * 8 < headdim;
    // (Not read when !pred; computing it unconditionally avoids a select the compiler
    // keeps live: +120 B of spills in the d128 forward.)
    const Element* src = row_ptr(pred ? row : 0, i % kSlots) + (pred ? chunk * 8 : 0);
    ptx::cp_async_16(ptx::smem_addr(smem + swizzle<kRows>(row, chunk)), src, pred);
  }
}

// load_tile_rows for rows at a fixed stride from gmem. When the thread's rows are those of
// TileThreadRows (kRows a multiple of kNThreads / 4), each of its chunks sits at a
// compile-time offset from its first one, in shared memory (the swizzle of a row repeats
// every 8 rows) and in gmem (slot s is s * kStep rows further, chunk group j is 32 columns
// further): one base address per thread instead of a row, chunk and 64-bit address per
// chunk. (The backward copies a query tile every step: this cut its loop by ~100
// instructions and the registers the compiler kept for it; benchmarks/NOTES.md.)
template <int kRows, int kHeadDim, int kNThreads, typename Element>
__device__ __forceinline__ void load_tile(Element* smem, const Element* gmem, int64_t row_stride,
                                          int rows_valid, int headdim, int tid) {
  constexpr int kLanes = copy_lanes(kHeadDim);
  using Rows = TileThreadRows<kRows, kNThreads, kLanes>;
  if constexpr (kRows >= Rows::kStep) {
    constexpr int kChunks = kRows * kHeadDim / 8;
    static_assert(kChunks % kNThreads == 0 && Rows::kStep % 8 == 0, "tile copy shape");
    const int row0 = Rows::row(0, tid), chunk0 = tid & (kLanes - 1);
    const uint32_t dst = ptx::smem_addr(smem + swizzle<kRows>(row0, chunk0));
    // Byte addresses: slot s of the thread's rows at src[s], chunk group j 64 bytes on.
    const int64_t row_bytes = row_stride * int64_t(sizeof(Element));
    const int64_t offset = int64_t(unsigned(row0)) * row_bytes + chunk0 * 16;
    const char* src[Rows::kSlots];
#pragma unroll
    for (int slot = 0; slot < Rows::kSlots; ++slot) {
      src[slot] = reinterpret_cast<const char*>(gmem) + offset + slot * Rows::kStep * row_bytes;
    }
#pragma unroll
    for (int i = 0; i < kChunks / kNThreads; ++i) {
      const int slot = i % Rows::kSlots, group = i / Rows::kSlots;  // chunk 4 group + chunk0
      const bool pred =
          row0 + Rows::kStep * slot < rows_valid && (4 * group + chunk0) * 8 < headdim;
      // (Not read when !pred: src-size 0.)
      ptx::cp_async_16(dst + 2 * (group * kRows * 32 + slot * Rows::kStep * 32),
                       src[slot] + 64 * group, pred);
    }
  } else {
    load_tile_rows<kRows, kHeadDim, kNThreads>(
        smem, [&](int row, int) { return gmem + row * row_stride; }, rows_valid, headdim, tid);
  }
}

// Shared -> global copy of a [kRows x kHeadDim] tile with 16-byte stores (rows < rows_valid,
// columns < headdim only); row r goes to row_ptr(r).
template <int kRows, int kHeadDim, int kNThreads, typename Element, typename RowPtr>
__device__ __forceinline__ void store_tile_rows(RowPtr&& row_ptr, const Element* smem,
                                                int rows_valid, int headdim, int tid) {
  constexpr int kChunks = kRows * kHeadDim / 8;
  constexpr int kLanes = copy_lanes(kHeadDim);
  static_assert(kChunks % kNThreads == 0, "tile copy must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kNThreads; ++i) {
    const int row = int(tile_row<kRows, kNThreads, kLanes>(i, tid));
    const int chunk = int(tile_chunk<kRows, kNThreads, kLanes>(i, tid));
    if (row < rows_valid && chunk * 8 < headdim) {
      *reinterpret_cast<uint4*>(row_ptr(row) + chunk * 8) =
          *reinterpret_cast<const uint4*>(smem + swizzle<kRows>(row, chunk));
    }
  }
}

// store_tile_rows for rows at a fixed stride from gmem.
template <int kRows, int kHeadDim, int kNThreads, typename Element>
__device__ __forceinline__ void store_tile(Element* gmem, const Element* smem, int64_t row_stride,
                                           int rows_valid, int headdim, int tid) {
  store_tile_rows<kRows, kHeadDim, kNThreads>(
      [&](int row) { return gmem + row * row_stride; }, smem, rows_valid, headdim, tid);
}

}  // namespace flashattn2
