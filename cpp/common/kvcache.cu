// The KV-cache append kernel's launches for both dtypes (one unit: it is small and does not
// depend on the head dim).
#include "common/kvcache_kernel.cuh"
#include "common/launch.h"

namespace flashattn2 {

void run_append_kv_any(const AppendKvParams& p, cudaStream_t stream) {
  if (p.dtype == DType::kFloat16) {
    run_append_kv<__half>(p, stream);
  } else {
    run_append_kv<__nv_bfloat16>(p, stream);
  }
  check_cuda(cudaGetLastError(), "append_kv_kernel launch");
}

}  // namespace flashattn2
