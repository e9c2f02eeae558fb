// The Hopper float32 backward for kernel head dim 128, its single-TF32 instance
// (BwdParams::fp32_tf32; FLASHATTN2_EXPERIMENTAL=fp32wg builds): fp32/wg_bwd_launch.cuh.
#include "fp32/wg_bwd_launch.cuh"

namespace flashattn2 {
template void run_bwd_fp32wg128<128, true>(const BwdParams&, cudaStream_t);
}  // namespace flashattn2
