// Warpgroup roles (sm_90a): register reallocation between producer and consumers, and named
// barriers between warpgroups.
#pragma once
#include <cstdint>

namespace flashattn2 {
namespace sm90 {

// setmaxnreg.{inc,dec}.sync.aligned.u32: this warpgroup's per-thread register count becomes
// kRegs (a multiple of 8 in [24, 256]). Takes effect only with a register cap at entry
// (__launch_bounds__(threads, 1)) and each role in one branch of one if/else.
template <int kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// setmaxnreg only moves registers within the launch's allocation, 8 * floor(64 Ki / threads
// / 8) per thread: one producer and `consumers` consumer warpgroups fit iff this holds, else
// the consumers' setmaxnreg.inc waits forever (sm90/fwd_config.h).
constexpr bool setmaxnreg_fits(int consumers, int producer_regs, int consumer_regs) {
  const int launch_regs = 65536 / (128 * (1 + consumers)) / 8 * 8;
  return producer_regs + consumers * consumer_regs <= (1 + consumers) * launch_regs;
}

// bar.sync id, n: wait until n threads (this one included) reached barrier id (1..15; 0 is
// __syncthreads). bar.arrive id, n: count this thread's warp without waiting.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// bar.red.or.pred id, n: bar.sync that also returns whether `cond` held in any of the n
// threads.
__device__ __forceinline__ bool named_sync_or(int id, int threads, bool cond) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred c, a;\n setp.ne.u32 c, %1, 0;\n"
      " bar.red.or.pred a, %2, %3, c;\n selp.u32 %0, 1, 0, a;\n}\n"
      : "=r"(any) : "r"(uint32_t(cond)), "r"(id), "r"(threads) : "memory");
  return any != 0;
}

// fence.proxy.async.shared::cta: this thread's ordinary shared-memory stores become visible
// to the async proxy (TMA, wgmma) after the next barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// fence.proxy.async.global: orders this thread's async-proxy global accesses (completed bulk
// reduces) with its generic-proxy ones (the release of the deterministic dQ order).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// st.shared.b32 / st.shared.f32 / ld.shared.v2.f32 at a shared-memory address (the sm90
// kernels address shared memory as 32-bit offsets, as TMA and wgmma do).
__device__ __forceinline__ void st_shared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_shared(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
// st.shared.b64 / ld.shared.b64: a global address kept in shared memory.
__device__ __forceinline__ void st_shared_u64(uint32_t addr, uint64_t v) {
  asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_shared_u64(uint32_t addr) {
  uint64_t v;
  asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(v) : "r"(addr));
  return v;
}
// ld.shared.u16, zero-extended: a 2-byte element in the low half.
__device__ __forceinline__ uint32_t ld_shared_u16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ float2 ld_shared_float2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

}  // namespace sm90
}  // namespace flashattn2
