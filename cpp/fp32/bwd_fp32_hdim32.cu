// The float32 backward for kernel head dim 32 (FLASHATTN2_EXPERIMENTAL=fp32 builds).
#include "fp32/bwd_launch.cuh"

namespace flashattn2 {
template void run_bwd_fp32<32>(const BwdParams&, cudaStream_t);
}  // namespace flashattn2
