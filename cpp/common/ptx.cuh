// Every inline PTX instruction flashattn2 uses, one small function each.
// Fragment layouts are those of the PTX ISA for mma.m16n8k16 (g = lane / 4, q = lane % 4):
//   A (16x16, row):  a0 = (g, 2q..2q+1)  a1 = (g+8, 2q..)  a2 = (g, 2q+8..)  a3 = (g+8, 2q+8..)
//   B (16x8,  col):  b0 = (k 2q..2q+1, n g)                b1 = (k 2q+8.., n g)
//   C (16x8,  f32):  c0,c1 = (g, 2q..2q+1)                 c2,c3 = (g+8, 2q..2q+1)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace flashattn2 {
namespace ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp.async.cg.shared.global: copy 16 bytes global -> shared, bypassing L1.
// When !pred the source is not read and the 16 destination bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// cp.async.cg.shared.global.L2::{128,256}B: cp_async_16 with a hint that L2 fetch the whole
// aligned kPrefetch-byte block around src from DRAM at once (the decode kernel's K / V rows:
// one 128- or 256-byte row segment per head, at a stride of nheads_k rows).
template <int kPrefetch>
__device__ __forceinline__ void cp_async_16_prefetch(uint32_t dst, const void* src, bool pred) {
  static_assert(kPrefetch == 128 || kPrefetch == 256, "L2 prefetch size");
  const int src_bytes = pred ? 16 : 0;
  if constexpr (kPrefetch == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes));
  } else {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes));
  }
}

// The same with the first src_bytes (0..16) read and the rest of the 16 zero-filled.
__device__ __forceinline__ void cp_async_16_bytes(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// cp.async.ca.shared.global, 4 bytes (for per-row float vectors); zero-fill when !pred.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// cp.async.commit_group: close the group of cp.async issued by this thread so far.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// cp.async.wait_group N: wait until at most N of this thread's groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i..8i+7 give the row addresses of
// matrix i; r[i] of lane t holds row t/4, columns 2(t%4)..2(t%4)+1 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// stmatrix.sync.aligned.m8n8.x4 (sm_90+): the inverse of ldmatrix_x4. Lane t supplies the
// address of row t % 8 of matrix t / 8; r[i] of lane t holds row t / 4, columns 2(t%4)..+1
// of matrix i (the mma accumulator layout, packed to 16 bits).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
#else
  __trap();  // callers check kHasStmatrix
#endif
}
// stmatrix ... .trans (sm_90+): as stmatrix_x4, each matrix stored transposed: row j of matrix
// i in shared memory (at lane 8 i + j's address) is column j of the fragment, the half j % 2
// of r[i] of the lanes t with t % 4 = j / 2, for t / 4 = 0..7 in order.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
#else
  __trap();  // callers check kHasStmatrix
#endif
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kHasStmatrix = true;
#else
constexpr bool kHasStmatrix = false;
#endif

// ldmatrix ... .trans: as above, but r[i] of lane t holds column t/4, rows 2(t%4)..+1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: c += a * b.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (griddepcontrol, sm_90; no-ops on older archs). A grid
// launched with cudaLaunchAttributeProgrammaticStreamSerialization may start once every
// block of the grid before it has called launch_dependents (or exited); its blocks then
// wait in griddep_wait until that grid has completed and its writes are visible.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ld.acquire.gpu.b32: a load that orders the loads and stores after it.
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// red.release.gpu.global.add.s32: an add that orders the loads and stores before it.
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// red.add.global.v4.f32 (sm_90): four consecutive floats at a 16-byte aligned address added
// atomically in one request (four scalar atomics before sm_90).
__device__ __forceinline__ void red_add_v4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.add.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

// red.global.add.v2.f32 (sm_90): two consecutive floats at an 8-byte aligned address added
// atomically in one request (two scalar atomics before sm_90).
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// red.global.add.v2.f32 where `pred` (predicated inside the asm, no "memory" clobber: for
// adds nothing in the kernel reads back; around red_add_v2, a compiler barrier, ptxas put a
// branch per call in the Hopper backward's dbias loop).
__device__ __forceinline__ void red_add_v2_if(float* p, float a, float b, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred v;\nsetp.ne.b32 v, %3, 0;\n@v red.global.add.v2.f32 [%0], {%1, %2};\n}\n"
      ::"l"(p), "f"(a), "f"(b), "r"(int(pred)));
#else
  if (pred) red_add_v2(p, a, b);
#endif
}

// ex2.approx.ftz.f32: 2^x (ex2(-inf) = +0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh.approx.f32 (one MUFU op; max relative error 2^-10.99, tanh(+-inf) = +-1).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two 2-byte values of one 32-bit register -> floats (lo, hi).
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<__half2*>(&v));
}

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

// cvt.rn.{f16x2,bf16x2}.f32: two floats -> one 32-bit register, lo in the low half.
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The A operand (16x16, k = 16 columns) made from the f32 accumulators of two adjacent n8
// tiles of an earlier MMA (columns 0-7 in lo, 8-15 in hi): the C layout of m16n8 matches the
// A layout of m16n8k16, so P and dS never leave registers.
template <typename Element>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack2<Element>(lo[0], lo[1]);
  a[1] = pack2<Element>(lo[2], lo[3]);
  a[2] = pack2<Element>(hi[0], hi[1]);
  a[3] = pack2<Element>(hi[2], hi[3]);
}

}  // namespace ptx
}  // namespace flashattn2
