// Tensor memory accelerator (TMA, sm_90): bulk tensor copies between global and shared
// memory described by a CUtensorMap (built on the host: tma_map.h), completing on an mbarrier
// (loads) or in a bulk async-group (stores). Coordinates are in elements, innermost first.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace flashattn2 {
namespace sm90 {

// prefetch.tensormap: bring a __grid_constant__ tensor map into the descriptor cache.
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes: the box at
// (c0, c1, c2, c3) into shared memory at dst; its bytes count towards mbarrier bar (boxes
// partly outside the tensor are zero-filled and count in full).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                         int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// cp.async.bulk.tensor.4d.global.shared::cta.bulk_group: shared memory at src to the box at
// (c0, c1, c2, c3); the parts of the box outside the tensor are not written.
__device__ __forceinline__ void tma_store(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                          int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// An L2 policy that keeps the lines it touches past the streamed ones (createpolicy, evict
// last, all of them): the backward's bulk writes of dq_accum carry it, because every K/V
// block of a head adds into the same query tiles again, while Q, dO, K and V stream through
// (twenty-third session: +0.1-0.8 % per head dim and mask, d64-d256; NOTES).
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32: adds `bytes` (a
// multiple of 16; both addresses 16-byte aligned) of f32 at shared address src element-wise
// into global memory at dst, each element a reduction in L2 as red.add's, with the
// l2_evict_last policy; completes in a bulk async-group like tma_store (commit, then
// wait_read before src is overwritten).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, "
      "%3;\n" ::"l"(dst),
      "r"(src), "r"(bytes), "l"(l2_evict_last())
      : "memory");
}
// cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint: stores `bytes` (as
// bulk_reduce_add_f32's, the same policy) of shared address src at global dst; completes in
// the same bulk async-groups.
__device__ __forceinline__ void bulk_store_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n" ::"l"(dst),
      "r"(src), "r"(bytes), "l"(l2_evict_last())
      : "memory");
}
// cp.async.bulk.commit_group / wait_group 0: close this thread's bulk stores into a group;
// wait until they are complete (their global writes performed).
__device__ __forceinline__ void tma_store_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// cp.async.bulk.wait_group.read 0: wait until this thread's bulk stores have read their
// shared memory (it may be overwritten; the global writes may still be in flight).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace sm90
}  // namespace flashattn2
