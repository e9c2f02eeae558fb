// The per-row math of merging partial attention results by their log-sum-exp, shared by the
// split-KV combine (combine_kernel.cuh) and flashattn2.merge (merge_kernel.cuh):
//   lse_max = max_s lse_s,  w_s = exp(lse_s - lse_max),  sum = sum_s w_s
//   out = (sum_s w_s out_s) / sum,  lse = lse_max + log(sum)
// A partial with lse = -inf has weight 0; a row with every lse = -inf gets out = 0 and the
// caller's LSE for an empty row.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

namespace flashattn2 {
namespace lse_merge {

// exp(lse - lse_max): the weight of one partial (0 when every partial is empty).
__device__ __forceinline__ float weight(float lse, float lse_max) {
  return lse_max == -INFINITY ? 0.f : expf(lse - lse_max);
}

// The merged LSE from the largest LSE and the sum of the weights (`empty` if sum is 0).
__device__ __forceinline__ float merged_lse(float lse_max, float sum, float empty) {
  return sum == 0.f ? empty : lse_max + logf(sum);
}

// What the weighted sum of outputs is multiplied by: 1 / sum, 0 for an empty row.
__device__ __forceinline__ float inv_sum(float sum) { return sum == 0.f ? 0.f : 1.f / sum; }

}  // namespace lse_merge
}  // namespace flashattn2
