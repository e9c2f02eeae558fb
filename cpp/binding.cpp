// pybind11 module `flashattn2._C`: the only Python-facing translation unit.
//
// Plain C++17: it sees the host API (flash_api.h, flash.h) and never a .cuh, and it takes no
// torch types. Python passes device pointers and the stream as ints, strides in elements,
// a dtype code and the device index; this file fills FwdParams / BwdParams and calls the
// dispatcher.
// Errors come back as Python exceptions through pybind11's standard translation:
// std::invalid_argument -> ValueError, std::runtime_error (CUDA errors) -> RuntimeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash.h"
#include "flash_api.h"

namespace py = pybind11;

namespace {

using Strides = std::vector<int64_t>;

void check_strides(const char* name, const Strides& strides, std::size_t expected,
                   const char* layout) {
  if (strides.size() != expected) {
    throw std::invalid_argument(std::string(name) + " must have " + std::to_string(expected) +
                                " entries " + layout + ", got " +
                                std::to_string(strides.size()));
  }
}

flashattn2::DType dtype_from_code(int code) {
  switch (code) {
    case static_cast<int>(flashattn2::DType::kFloat16):
      return flashattn2::DType::kFloat16;
    case static_cast<int>(flashattn2::DType::kBFloat16):
      return flashattn2::DType::kBFloat16;
    default:
      throw std::invalid_argument("dtype must be 0 (float16) or 1 (bfloat16), got " +
                                  std::to_string(code));
  }
}

// Copies a checked (batch, row, head) stride tuple into the three fields of a params struct.
void set_strides(const Strides& strides, int64_t& batch, int64_t& row, int64_t& head) {
  batch = strides[0];
  row = strides[1];
  head = strides[2];
}

// The fields FwdParams and BwdParams share: sizes, scale, window, dtype, lse strides.
template <typename Params>
void set_problem(Params& params, const Strides& lse_strides, int batch, int seqlen_q,
                 int seqlen_k, int nheads, int nheads_k, int headdim, float softmax_scale,
                 int window_left, int window_right, int dtype) {
  params.lse_batch_stride = lse_strides[0];
  params.lse_head_stride = lse_strides[1];
  params.batch = batch;
  params.seqlen_q = seqlen_q;
  params.seqlen_k = seqlen_k;
  params.nheads = nheads;
  params.nheads_k = nheads_k;
  params.headdim = headdim;
  params.softmax_scale = softmax_scale;
  params.window_left = window_left;
  params.window_right = window_right;
  params.dtype = dtype_from_code(dtype);
}

// The score-modifier fields (softcap, ALiBi, dropout) of FwdParams / BwdParams.
template <typename Params>
void set_mods(Params& params, float softcap, std::uintptr_t alibi_slopes,
              int64_t alibi_batch_stride, std::uintptr_t rng_state, double dropout_p) {
  if (!(dropout_p >= 0.0 && dropout_p < 1.0)) {
    throw std::invalid_argument("dropout_p must be in [0, 1), got " + std::to_string(dropout_p));
  }
  params.softcap = softcap;
  params.alibi_slopes = reinterpret_cast<const float*>(alibi_slopes);
  params.alibi_batch_stride = alibi_batch_stride;
  params.rng_state = reinterpret_cast<const int64_t*>(rng_state);
  params.dropout_threshold = flashattn2::dropout_threshold_of(dropout_p);
  params.dropout_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
}

void fwd(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
         std::uintptr_t lse, const Strides& q_strides, const Strides& k_strides,
         const Strides& v_strides, const Strides& o_strides, const Strides& lse_strides,
         int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k, int headdim,
         float softmax_scale, int window_left, int window_right, int dtype, int device,
         std::uintptr_t stream, float softcap, std::uintptr_t alibi_slopes,
         int64_t alibi_batch_stride, std::uintptr_t rng_state, double dropout_p) {
  constexpr const char* kRowLayout = "(batch, row, head)";
  check_strides("q_strides", q_strides, 3, kRowLayout);
  check_strides("k_strides", k_strides, 3, kRowLayout);
  check_strides("v_strides", v_strides, 3, kRowLayout);
  check_strides("o_strides", o_strides, 3, kRowLayout);
  check_strides("lse_strides", lse_strides, 2, "(batch, head)");

  flashattn2::FwdParams params{};
  params.q = reinterpret_cast<const void*>(q);
  params.k = reinterpret_cast<const void*>(k);
  params.v = reinterpret_cast<const void*>(v);
  params.o = reinterpret_cast<void*>(o);
  params.lse = reinterpret_cast<float*>(lse);

  set_strides(q_strides, params.q_batch_stride, params.q_row_stride,
              params.q_head_stride);
  set_strides(k_strides, params.k_batch_stride, params.k_row_stride,
              params.k_head_stride);
  set_strides(v_strides, params.v_batch_stride, params.v_row_stride,
              params.v_head_stride);
  set_strides(o_strides, params.o_batch_stride, params.o_row_stride,
              params.o_head_stride);

  set_problem(params, lse_strides, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
              softmax_scale, window_left, window_right, dtype);
  set_mods(params, softcap, alibi_slopes, alibi_batch_stride, rng_state, dropout_p);

  // The launch can block when the GPU's launch queue is full; let other threads run.
  py::gil_scoped_release no_gil;
  flashattn2::mha_fwd(params, device, reinterpret_cast<void*>(stream));
}

void bwd(std::uintptr_t dout, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
         std::uintptr_t o, std::uintptr_t lse, std::uintptr_t dq, std::uintptr_t dk,
         std::uintptr_t dv, std::uintptr_t dq_accum, std::uintptr_t dsum,
         const Strides& do_strides, const Strides& q_strides, const Strides& k_strides,
         const Strides& v_strides, const Strides& o_strides, const Strides& dq_strides,
         const Strides& dk_strides, const Strides& dv_strides, const Strides& lse_strides,
         int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k, int headdim,
         float softmax_scale, int window_left, int window_right, int dtype, int device,
         std::uintptr_t stream, bool deterministic, float softcap, std::uintptr_t alibi_slopes,
         int64_t alibi_batch_stride, std::uintptr_t rng_state, double dropout_p) {
  constexpr const char* kRowLayout = "(batch, row, head)";
  check_strides("do_strides", do_strides, 3, kRowLayout);
  check_strides("q_strides", q_strides, 3, kRowLayout);
  check_strides("k_strides", k_strides, 3, kRowLayout);
  check_strides("v_strides", v_strides, 3, kRowLayout);
  check_strides("o_strides", o_strides, 3, kRowLayout);
  check_strides("dq_strides", dq_strides, 3, kRowLayout);
  check_strides("dk_strides", dk_strides, 3, kRowLayout);
  check_strides("dv_strides", dv_strides, 3, kRowLayout);
  check_strides("lse_strides", lse_strides, 2, "(batch, head)");

  flashattn2::BwdParams params{};
  params.dout = reinterpret_cast<const void*>(dout);
  params.q = reinterpret_cast<const void*>(q);
  params.k = reinterpret_cast<const void*>(k);
  params.v = reinterpret_cast<const void*>(v);
  params.o = reinterpret_cast<const void*>(o);
  params.lse = reinterpret_cast<const float*>(lse);
  params.dq = reinterpret_cast<void*>(dq);
  params.dk = reinterpret_cast<void*>(dk);
  params.dv = reinterpret_cast<void*>(dv);
  params.dq_accum = reinterpret_cast<float*>(dq_accum);
  params.dsum = reinterpret_cast<float*>(dsum);

  set_strides(do_strides, params.do_batch_stride, params.do_row_stride,
              params.do_head_stride);
  set_strides(q_strides, params.q_batch_stride, params.q_row_stride,
              params.q_head_stride);
  set_strides(k_strides, params.k_batch_stride, params.k_row_stride,
              params.k_head_stride);
  set_strides(v_strides, params.v_batch_stride, params.v_row_stride,
              params.v_head_stride);
  set_strides(o_strides, params.o_batch_stride, params.o_row_stride,
              params.o_head_stride);
  set_strides(dq_strides, params.dq_batch_stride, params.dq_row_stride,
              params.dq_head_stride);
  set_strides(dk_strides, params.dk_batch_stride, params.dk_row_stride,
              params.dk_head_stride);
  set_strides(dv_strides, params.dv_batch_stride, params.dv_row_stride,
              params.dv_head_stride);

  set_problem(params, lse_strides, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
              softmax_scale, window_left, window_right, dtype);
  params.deterministic = deterministic;
  set_mods(params, softcap, alibi_slopes, alibi_batch_stride, rng_state, dropout_p);

  py::gil_scoped_release no_gil;  // as in fwd
  flashattn2::mha_bwd(params, device, reinterpret_cast<void*>(stream));
}

void dropout_mask(std::uintptr_t mask, std::uintptr_t rng_state, int batch, int nheads,
                  int seqlen_q, int seqlen_k, double dropout_p, int device,
                  std::uintptr_t stream) {
  if (!(dropout_p >= 0.0 && dropout_p < 1.0)) {
    throw std::invalid_argument("dropout_p must be in [0, 1), got " + std::to_string(dropout_p));
  }
  flashattn2::DropoutMaskParams params{};
  params.mask = reinterpret_cast<uint8_t*>(mask);
  params.rng_state = reinterpret_cast<const int64_t*>(rng_state);
  params.batch = batch;
  params.nheads = nheads;
  params.seqlen_q = seqlen_q;
  params.seqlen_k = seqlen_k;
  params.dropout_threshold = flashattn2::dropout_threshold_of(dropout_p);
  py::gil_scoped_release no_gil;
  flashattn2::dropout_mask(params, device, reinterpret_cast<void*>(stream));
}

// The backward head dims: the built head dims up to the largest backward head dim.
std::vector<int> bwd_head_dims() {
  std::vector<int> dims;
  const int max_head_dim = flashattn2::bwd_max_head_dim();
  for (int d : flashattn2::built_head_dims()) {
    if (d <= max_head_dim) dims.push_back(d);
  }
  return dims;
}

py::dict build_info() {
  py::dict info;
  info["version"] = flashattn2::version();
  info["cuda_version"] = flashattn2::cuda_runtime_version();
  info["archs"] = flashattn2::built_archs();
  info["ptx_archs"] = flashattn2::built_ptx_archs();
  info["head_dims"] = flashattn2::built_head_dims();
  info["bwd_head_dims"] = bwd_head_dims();
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "flashattn2 CUDA kernels (no libtorch): pointers, strides and the stream as ints";

  m.def("fwd", &fwd, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"),
        py::arg("q_strides"), py::arg("k_strides"), py::arg("v_strides"),
        py::arg("o_strides"), py::arg("lse_strides"), py::arg("batch"), py::arg("seqlen_q"),
        py::arg("seqlen_k"), py::arg("nheads"), py::arg("nheads_k"), py::arg("headdim"),
        py::arg("softmax_scale"), py::arg("window_left"), py::arg("window_right"),
        py::arg("dtype"), py::arg("device"), py::arg("stream"), py::arg("softcap") = 0.f,
        py::arg("alibi_slopes") = 0, py::arg("alibi_batch_stride") = 0,
        py::arg("rng_state") = 0, py::arg("dropout_p") = 0.0,
        "Attention forward. q/k/v/o/lse are device pointers; *_strides are in elements, "
        "(batch, row, head) for q, k, v, o and (batch, head) for lse; dtype 0 = float16, "
        "1 = bfloat16; stream is a cudaStream_t as int (0 = default stream). Launches "
        "asynchronously on `stream` with `device` current. Score modifiers: softcap > 0 "
        "caps logits at softcap * tanh(.); alibi_slopes is a float32 device pointer (0 = "
        "none) indexed batch * alibi_batch_stride + head; dropout_p > 0 needs rng_state, a "
        "device pointer to int64 (seed, offset).");

  m.def("bwd", &bwd, py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dq_accum"),
        py::arg("dsum"), py::arg("do_strides"), py::arg("q_strides"), py::arg("k_strides"),
        py::arg("v_strides"), py::arg("o_strides"), py::arg("dq_strides"),
        py::arg("dk_strides"), py::arg("dv_strides"), py::arg("lse_strides"),
        py::arg("batch"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("nheads"),
        py::arg("nheads_k"), py::arg("headdim"), py::arg("softmax_scale"),
        py::arg("window_left"), py::arg("window_right"), py::arg("dtype"), py::arg("device"),
        py::arg("stream"), py::arg("deterministic") = false, py::arg("softcap") = 0.f,
        py::arg("alibi_slopes") = 0, py::arg("alibi_batch_stride") = 0,
        py::arg("rng_state") = 0, py::arg("dropout_p") = 0.0,
        "Attention backward: writes dq, dk, dv from dout, q, k, v, out and lse (the forward's). "
        "Pointers and strides as in fwd; dk and dv are like k and v (the kernel sums each "
        "GQA group); dq_accum and dsum are float32 "
        "workspaces of bwd_workspace_floats(...) floats (no need to zero them). "
        "deterministic=True makes dq bitwise reproducible (ordered accumulation). Score "
        "modifiers as in fwd, with the forward's values (the same rng_state for dropout).");

  m.def("dropout_mask", &dropout_mask, py::arg("mask"), py::arg("rng_state"), py::arg("batch"),
        py::arg("nheads"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("dropout_p"),
        py::arg("device"), py::arg("stream"),
        "Writes the dropout keep mask (uint8 0/1, contiguous (batch, nheads, seqlen_q, "
        "seqlen_k)) that fwd / bwd use for this rng_state and dropout_p.");

  m.def("bwd_workspace_floats", &flashattn2::bwd_workspace_floats, py::arg("batch"),
        py::arg("nheads"), py::arg("seqlen_q"), py::arg("headdim"),
        "(dq_accum, dsum) float32 workspace sizes, in floats, for a backward of these sizes.");

  m.def("bwd_max_head_dim", &flashattn2::bwd_max_head_dim,
        "Largest head dim the backward supports in this build (0 if none).");

  m.def("kernel_head_dim", &flashattn2::kernel_head_dim, py::arg("headdim"),
        "Smallest compiled kernel head dim >= headdim, or -1 if none.");

  m.def("device_unsupported_reason", &flashattn2::device_unsupported_reason, py::arg("device"),
        "Empty string if this build can run on GPU `device`, otherwise why not.");

  m.def("build_info", &build_info,
        "What this build contains: {'version': str, 'cuda_version': int (e.g. 13000), "
        "'archs': SASS compute capabilities, 'ptx_archs': PTX compute capabilities, "
        "'head_dims': kernel head dims, 'bwd_head_dims': backward kernel head dims}.");

  m.attr("__version__") = flashattn2::version();
}
