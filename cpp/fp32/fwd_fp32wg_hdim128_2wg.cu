// The Hopper float32 forward for kernel head dim 128, two consumer warpgroups of 64 query rows
// (wg_config.h two_wg; FwdParams::fp32wg_d128_2wg, FLASHATTN2_FP32WG_D128_2WG=1 at import).
#include "fp32/wg_launch.cuh"

namespace flashattn2 {
template void run_fwd_fp32wg<128, true>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
