// The float32 forward for kernel head dim 128 (FLASHATTN2_EXPERIMENTAL=fp32 builds).
#include "fp32/fwd_launch.cuh"

namespace flashattn2 {
template void run_fwd_fp32<128>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
