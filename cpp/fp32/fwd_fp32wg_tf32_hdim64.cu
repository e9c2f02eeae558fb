// The Hopper float32 forward's single-TF32 instance for kernel head dim 64
// (FwdParams::fp32_tf32; FLASHATTN2_EXPERIMENTAL=fp32wg builds).
#include "fp32/wg_launch.cuh"

namespace flashattn2 {
template void run_fwd_fp32wg<64, true>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
