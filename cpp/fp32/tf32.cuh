// The float32 kernels' PTX (3xTF32 on mma.sync) and their shared-memory tiles.
//
// mma.m16n8k8 .tf32 fragments (PTX ISA "Matrix Fragments for mma.m16n8k8", g = lane / 4,
// q = lane % 4):
//   A (16x8, row):  a0 = (g, q)  a1 = (g+8, q)  a2 = (g, q+4)  a3 = (g+8, q+4)
//   B (8x8,  col):  b0 = (k q, n g)             b1 = (k q+4, n g)
//   C (16x8, f32):  c0, c1 = (g, 2q), (g, 2q+1)  c2, c3 = (g+8, 2q), (g+8, 2q+1)
// 3xTF32: x = hi + lo, hi = tf32(x), lo = tf32(x - hi) (round to nearest); a * b is taken
// as lo_a hi_b + hi_a lo_b + hi_a hi_b (three MMAs, small terms first; lo_a lo_b < 2^-22 |ab|
// is dropped), accumulated in f32 in two levels (mma3_chain / mma3_add below).
#pragma once
#include <cstdint>

#include "common/ptx.cuh"

namespace flashattn2 {
namespace tf32 {

// x rounded to tf32 (10 mantissa bits), as a b32 register (the float with the low 13 bits
// clear). sm_90 and up: cvt.rn.tf32.f32 (ties to even), one SASS instruction (F2FP.TF32);
// sm_80 / sm_86 / sm_89 have only cvt.rna.tf32.f32 (ties away), which ptxas expands to three
// (a NaN test, the add of half an ulp, the mask). Either is a valid split (below).
__device__ __forceinline__ uint32_t round_tf32(float x) {
  uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#else
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
#endif
  return r;
}

// The same for a finite x: before sm_90 as integer ops (half a tf32 ulp added to the
// magnitude bits, then the low 13 bits cleared: ties away from zero, carries into the
// exponent as rna does), 2 SASS instructions instead of cvt.rna's 3. Equal to round_tf32 for
// every finite x and +-inf; a NaN may come out as another value (hence only for lo, below).
__device__ __forceinline__ uint32_t round_tf32_finite(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return round_tf32(x);
#else
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
#endif
}

// x as (hi, lo): hi = tf32(x), lo = tf32(x - hi) (x - hi is exact in f32). A NaN x keeps
// hi NaN (cvt), so it reaches the products.
struct Split {
  uint32_t hi, lo;
};
__device__ __forceinline__ Split split(float x) {
  const uint32_t hi = round_tf32(x);
  return {hi, round_tf32_finite(x - __uint_as_float(hi))};
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: c += a * b (one tf32 product).
__device__ __forceinline__ void mma_1688(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment (a0..a3 as floats) split once, reused over several B fragments.
struct FragA {
  uint32_t hi[4], lo[4];
  FragA() = default;
  // From values split earlier (a0..a3).
  __device__ __forceinline__ FragA(Split a0, Split a1, Split a2, Split a3)
      : hi{a0.hi, a1.hi, a2.hi, a3.hi}, lo{a0.lo, a1.lo, a2.lo, a3.lo} {}
  __device__ __forceinline__ FragA(float a0, float a1, float a2, float a3) {
    const float a[4] = {a0, a1, a2, a3};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const Split s = split(a[i]);
      hi[i] = s.hi;
      lo[i] = s.lo;
    }
  }
};

// B fragment (b0, b1 as floats) split once, reused over several A fragments.
struct FragB {
  Split b0, b1;
  FragB() = default;
  __device__ __forceinline__ FragB(float x0, float x1) : b0(split(x0)), b1(split(x1)) {}
  __device__ __forceinline__ FragB(Split x0, Split x1) : b0(x0), b1(x1) {}
};

// c += a * b in 3xTF32.
__device__ __forceinline__ void mma3(float (&c)[4], const FragA& a, const FragB& b) {
  mma_1688(c, a.lo, b.b0.hi, b.b1.hi);
  mma_1688(c, a.hi, b.b0.lo, b.b1.lo);
  mma_1688(c, a.hi, b.b0.hi, b.b1.hi);
}
// The same with b given as floats (b0, b1).
__device__ __forceinline__ void mma3(float (&c)[4], const FragA& a, float b0, float b1) {
  mma3(c, a, FragB(b0, b1));
}

// Two-level accumulation. The tensor core's float32 accumulation truncates (toward zero,
// relative to the largest term), so every MMA into a sum that grows large loses up to an ulp
// of it, always with the sign of the sum: a bias that grows with the number of MMAs into one
// accumulator (measured before: dK / dV, summed over every query tile, 44x PyTorch's float32
// error at 4k tokens; the CPU model of fp32_emulation.py reproduces it). So no running sum is
// an MMA's accumulator: each group of MMAs goes into a fresh one (its truncation relative to
// the group's own sum), which is then added with FADD (round to nearest).
//
// t = sum over kN k8 steps of a[i] * b[i] in 3xTF32, in a fresh accumulator (the caller adds
// it to its sum).
template <int kN>
__device__ __forceinline__ void mma3_chain(float (&t)[4], const FragA* a, const FragB* b) {
  t[0] = t[1] = t[2] = t[3] = 0.f;
#pragma unroll
  for (int i = 0; i < kN; ++i) mma3(t, a[i], b[i]);
}
// c += a * b in 3xTF32 through a fresh accumulator (one k8 step per FADD: the k chains over
// the head dim, e.g. S = Q K^T, measured 2-4x more accurate so than chained in c); first:
// c = a * b (c's value unused, no FADD).
__device__ __forceinline__ void mma3_add(float (&c)[4], const FragA& a, const FragB& b,
                                         bool first) {
  float t[4];
  mma3_chain<1>(t, &a, &b);
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = first ? t[e] : c[e] + t[e];
}

// A value split earlier into two shared-memory arrays of one layout: hi[off], lo[off].
__device__ __forceinline__ Split split_at(const float* hi, const float* lo, int off) {
  return {__float_as_uint(hi[off]), __float_as_uint(lo[off])};
}

// The B fragment (b0, b1) of columns c, c + 4 of a PairTile (below) split earlier, at off:
// one 64-bit LDS from hi, one from lo.
__device__ __forceinline__ FragB split_pair_at(const float* hi, const float* lo, int off) {
  const float2 h = *reinterpret_cast<const float2*>(hi + off);
  const float2 l = *reinterpret_cast<const float2*>(lo + off);
  return FragB(Split{__float_as_uint(h.x), __float_as_uint(l.x)},
               Split{__float_as_uint(h.y), __float_as_uint(l.y)});
}

// The kN floats at hi (16-byte aligned) split in place: hi[i] = tf32(x), lo[i] = tf32(x - hi[i]),
// by float4 (one LDS.128 and two STS.128 per 4 values); thread tid of kThreads takes the
// float4s tid + kThreads j.
template <int kN, int kThreads>
__device__ __forceinline__ void split_in_place(float* hi, float* lo, int tid) {
  static_assert(kN % 4 == 0, "whole float4s");
  constexpr int kN4 = kN / 4;
#pragma unroll
  for (int j = 0; j < (kN4 + kThreads - 1) / kThreads; ++j) {
    const int i = tid + j * kThreads;
    if (kN4 % kThreads != 0 && i >= kN4) break;
    const float4 x = reinterpret_cast<const float4*>(hi)[i];
    const Split s0 = split(x.x), s1 = split(x.y), s2 = split(x.z), s3 = split(x.w);
    reinterpret_cast<float4*>(hi)[i] = make_float4(__uint_as_float(s0.hi), __uint_as_float(s1.hi),
                                                   __uint_as_float(s2.hi), __uint_as_float(s3.hi));
    reinterpret_cast<float4*>(lo)[i] = make_float4(__uint_as_float(s0.lo), __uint_as_float(s1.lo),
                                                   __uint_as_float(s2.lo), __uint_as_float(s3.lo));
  }
}

// The same for a PairTile (below) of kN floats: each 8-column group (8 floats, 32-byte
// aligned) split and stored in the order 0 4 1 5 2 6 3 7; thread tid takes the groups
// tid + kThreads j.
template <int kN, int kThreads>
__device__ __forceinline__ void split_pairs(float* hi, float* lo, int tid) {
  static_assert(kN % (8 * kThreads) == 0, "whole groups, every thread alike");
#pragma unroll
  for (int j = 0; j < kN / (8 * kThreads); ++j) {
    float4* const h4 = reinterpret_cast<float4*>(hi) + 2 * (tid + j * kThreads);
    float4* const l4 = reinterpret_cast<float4*>(lo) + 2 * (tid + j * kThreads);
    const float4 x = h4[0], y = h4[1];
    const Split s0 = split(x.x), s1 = split(x.y), s2 = split(x.z), s3 = split(x.w);
    const Split s4 = split(y.x), s5 = split(y.y), s6 = split(y.z), s7 = split(y.w);
    auto f = [](uint32_t u) { return __uint_as_float(u); };
    h4[0] = make_float4(f(s0.hi), f(s4.hi), f(s1.hi), f(s5.hi));
    h4[1] = make_float4(f(s2.hi), f(s6.hi), f(s3.hi), f(s7.hi));
    l4[0] = make_float4(f(s0.lo), f(s4.lo), f(s1.lo), f(s5.lo));
    l4[1] = make_float4(f(s2.lo), f(s6.lo), f(s3.lo), f(s7.lo));
  }
}

}  // namespace tf32

// Shared-memory tiles of float32 [kRows x kCols] (kCols a multiple of 32), two layouts by
// the fragment a warp reads with 32-bit LDS (bank = word offset mod 32):
//  - RowTile (rows padded by 4 floats): A fragments (row g, col q) and B fragments read
//    from n-major rows (row n = g, col k = q): word 4g + q + const, 32 distinct banks.
//  - KRowTile (unpadded; 16-byte chunk c of row r at chunk c ^ 2 (r % 4)): B fragments
//    read from k-major rows (row k = q, col n = g): word 8 ((col / 8) ^ q) + g + const,
//    32 distinct banks for the 4 q x 8 g lanes.
template <int kRows, int kCols>
struct RowTile {
  static constexpr int kStride = kCols + 4;
  static constexpr int kFloats = kRows * kStride;
  __device__ __forceinline__ static int offset(int r, int c) { return r * kStride + c; }
};
template <int kRows, int kCols>
struct KRowTile {
  static_assert(kCols % 32 == 0, "the swizzle permutes 8-column groups within 32 columns");
  static constexpr int kFloats = kRows * kCols;
  __device__ __forceinline__ static int offset(int r, int c) {
    return r * kCols + (c ^ ((r & 3) << 3));
  }
};

//  - SwzTile (unpadded; column c of row r at c ^ f(r), f(r) = 8 (r % 4) + 4 ((r / 4) % 2)):
//    conflict free for both reads: n-major (rows g, col q + const): bank bits 0-1 = q, bits
//    2-4 = f(g) (a bijection of g); k-major (rows q (+4), col g + const): bits 0-2 = g (bit 2
//    ^ the +4), bits 3-4 ^= q. (The backward reads Q, dO, K and dS both ways.)
template <int kRows, int kCols>
struct SwzTile {
  static_assert(kCols % 32 == 0, "the swizzle permutes columns within 32-column groups");
  static constexpr int kFloats = kRows * kCols;
  __device__ __forceinline__ static int offset(int r, int c) {
    return r * kCols + (c ^ (((r & 3) << 3) | (r & 4)));
  }
};

//  - PairTile (unpadded; split K of the forward, Q / dO of the backward, d <= 64): cp.async writes
//    column c of row r at c ^ 8 h(r), h(r) = (r % 4) ^ 2 ((r / 4) % 2) (an 8-column group
//    stays whole), then split_pairs stores each group in the order 0 4 1 5 2 6 3 7
//    (pair_offset), so that columns c and c + 4, a fragment's (a0, a2) / (b0, b1), are one
//    64-bit LDS. Conflict free (a 64-bit LDS is served per half-warp): n-major (rows g or
//    perm(g), pair 2q + const): bits 1-2 = q, bits 3-4 = h(row), a bijection on each
//    half-warp's rows {0..3}, {4..7}, {0,4,1,5}, {2,6,3,7}; k-major 32-bit (rows q (+4),
//    col g + const): bits 0-2 = the permuted g, bits 3-4 ^= h(q).
template <int kRows, int kCols>
struct PairTile {
  static_assert(kCols % 32 == 0, "the swizzle permutes 8-column groups within 32 columns");
  static constexpr int kFloats = kRows * kCols;
  __device__ __forceinline__ static int h(int r) { return (r & 3) ^ ((r & 4) >> 1); }
  __device__ __forceinline__ static int pos(int k) { return 2 * (k & 3) + (k >> 2); }
  __device__ __forceinline__ static int offset(int r, int c) {
    return r * kCols + (c ^ (h(r) << 3));
  }
  __device__ __forceinline__ static int pair_offset(int r, int c) {
    return r * kCols + (((c & ~7) | pos(c & 7)) ^ (h(r) << 3));
  }
};

// cp.async of a [rows x cols] float32 block at g (row stride in elements, 16-byte aligned
// rows) into a Tile; rows >= `rows` and columns >= `cols` (a multiple of 4) are zero-filled.
template <typename Tile, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_f32(float* s, const float* g, int64_t row_stride,
                                              int rows, int cols, int tid) {
  constexpr int kChunks = kCols / 4;
  constexpr int kIters = (kRows * kChunks + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = tid + it * kThreads;
    if (kIters * kThreads != kRows * kChunks && i >= kRows * kChunks) break;
    const int r = i / kChunks, c = (i % kChunks) * 4;
    const bool pred = r < rows && c < cols;
    ptx::cp_async_16(ptx::smem_addr(s + Tile::offset(r, c)), pred ? g + r * row_stride + c : g,
                     pred);
  }
}

}  // namespace flashattn2
