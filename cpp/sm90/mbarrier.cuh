// mbarrier (shared-memory barrier objects, sm_90): the full / empty handshakes between the
// TMA producer and the consumer warpgroups. A barrier completes a phase when its pending
// arrivals reach zero and its expected transaction bytes have landed; waits name the phase
// by its parity (0, 1, 0, ...). A fresh barrier is in phase 0, so a wait for parity 1
// returns at once: a producer starts its "empty" waits at parity 1.
#pragma once
#include <cstdint>

namespace flashattn2 {
namespace sm90 {

// mbarrier.init.shared::cta.b64: `count` arrivals complete a phase.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// fence.mbarrier_init.release.cluster: makes the inits visible to the async proxy (TMA)
// before the first use; follow with a block-wide barrier.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// mbarrier.arrive.expect_tx: one arrival, and `bytes` more transaction bytes to wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// mbarrier.arrive: one arrival (a consumer releasing a stage).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// mbarrier.try_wait.parity in a loop: returns once the phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

}  // namespace sm90
}  // namespace flashattn2
