// The float32 forward for kernel head dim 32 (FLASHATTN2_EXPERIMENTAL=fp32 builds).
#include "fp32/fwd_launch.cuh"

namespace flashattn2 {
template void run_fwd_fp32<32>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
