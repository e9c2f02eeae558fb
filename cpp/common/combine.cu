// The split-KV combine's instantiations, in one unit built for every arch (common/launch.h
// says why the sm80 and sm90 forward launchers only declare it).
#include "common/combine_kernel.cuh"

namespace flashattn2 {
template void launch_combine<__half>(const FwdParams&, cudaStream_t);
template void launch_combine<__nv_bfloat16>(const FwdParams&, cudaStream_t);
}  // namespace flashattn2
