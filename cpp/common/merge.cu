// flashattn2.merge launch (merge_kernel.cuh): one hand-written unit, not per head dim.
#include <cuda_runtime.h>

#include "common/launch.h"
#include "common/merge_kernel.cuh"

namespace flashattn2 {

namespace {

// Whether every tensor allows the 4-wide path: contiguous, 4-aligned columns and a
// 4-element-aligned row start (pointer and batch / row / head strides).
bool merge_vectorizable(const MergeParams& p) {
  if (p.headdim % 4) return false;
  const void* ptrs[3] = {p.out_a, p.out_b, p.out};
  for (int t = 0; t < 3; ++t) {
    const int bytes = p.dtype[t] == kMergeF32 ? 4 : 2;
    if (p.out_strides[t][3] != 1) return false;
    if (reinterpret_cast<uintptr_t>(ptrs[t]) % (4 * bytes)) return false;
    for (int d = 0; d < 3; ++d) {
      if (p.out_strides[t][d] % 4) return false;
    }
  }
  return true;
}

}  // namespace

void run_merge(const MergeParams& params, cudaStream_t stream) {
  const int64_t rows = int64_t(params.batch) * params.nheads * params.seqlen;
  const unsigned blocks = unsigned((rows + 3) / 4);
  if (merge_vectorizable(params)) {
    merge_kernel<4><<<blocks, 128, 0, stream>>>(params);
  } else {
    merge_kernel<1><<<blocks, 128, 0, stream>>>(params);
  }
  check_cuda(cudaGetLastError(), "merge_kernel launch");
}

}  // namespace flashattn2
