// The Hopper float32 forward for kernel head dim 128 (FLASHATTN2_EXPERIMENTAL=fp32wg builds).
#include "fp32/wg_launch.cuh"

namespace flashattn2 {
template void run_fwd_fp32wg<128, false>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
