// The Hopper float32 backward for kernel head dim 64, its 3xTF32 instance
// (FLASHATTN2_EXPERIMENTAL=fp32wg builds): fp32/wg_bwd_launch.cuh.
#include "fp32/wg_bwd_launch.cuh"

namespace flashattn2 {
template void run_bwd_fp32wg<64, false>(const BwdParams&, cudaStream_t);
}  // namespace flashattn2
