// The rotary kernel's launches for every (x dtype, cos / sin dtype) of fp16, bf16, fp32.
#include "common/launch.h"
#include "common/rotary_kernel.cuh"

namespace flashattn2 {

namespace {

template <typename F>
void dispatch_rotary_dtype(DType dtype, F&& f) {
  if (dtype == DType::kFloat16) {
    f(__half{});
  } else if (dtype == DType::kBFloat16) {
    f(__nv_bfloat16{});
  } else {
    f(float{});
  }
}

}  // namespace

void run_rotary_any(const RotaryParams& p, cudaStream_t stream) {
  dispatch_rotary_dtype(p.dtype, [&](auto x) {
    dispatch_rotary_dtype(p.cs_dtype, [&](auto cs) {
      run_rotary<decltype(x), decltype(cs)>(p, stream);
    });
  });
  check_cuda(cudaGetLastError(), "rotary_kernel launch");
}

}  // namespace flashattn2
