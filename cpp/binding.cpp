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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/flash.h"
#include "flash_api.h"
#include "sm90/fwd_config.h"

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
    case static_cast<int>(flashattn2::DType::kFloat32):  // (mha_fwd / mha_bwd check the build)
      return flashattn2::DType::kFloat32;
    default:
      throw std::invalid_argument(
          "dtype must be 0 (float16), 1 (bfloat16) or 2 (float32), got " + std::to_string(code));
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

template <typename T>
const T* as_ptr(std::uintptr_t address) {
  return reinterpret_cast<const T*>(address);
}

// The SeqLayout fields (0 = absent).
void set_layout(flashattn2::SeqLayout& layout, std::uintptr_t cu_seqlens_q,
                std::uintptr_t cu_seqlens_k, std::uintptr_t seqused_k = 0,
                std::uintptr_t leftpad_k = 0, std::uintptr_t kv_batch_idx = 0,
                std::uintptr_t block_table = 0, int64_t block_table_batch_stride = 0,
                int page_size = 0, int num_pages = 0) {
  layout.cu_seqlens_q = as_ptr<int>(cu_seqlens_q);
  layout.cu_seqlens_k = as_ptr<int>(cu_seqlens_k);
  layout.seqused_k = as_ptr<int>(seqused_k);
  layout.leftpad_k = as_ptr<int>(leftpad_k);
  layout.kv_batch_idx = as_ptr<int>(kv_batch_idx);
  layout.block_table = as_ptr<int>(block_table);
  layout.block_table_batch_stride = block_table_batch_stride;
  if (block_table) {
    if (page_size < 16 || (page_size & (page_size - 1)) != 0) {
      throw std::invalid_argument("page_size must be a power of two >= 16, got " +
                                  std::to_string(page_size));
    }
    int log2 = 0;
    while ((1 << log2) < page_size) ++log2;
    layout.page_size_log2 = log2;
    if (num_pages < 1) {
      throw std::invalid_argument("a paged cache needs num_pages >= 1 (its first dimension), got " +
                                  std::to_string(num_pages));
    }
    layout.num_pages = num_pages;
  }
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

// The attention-bias fields (BiasLayout) of FwdParams / BwdParams: bias_strides (batch, head,
// row, col) in elements, bias_dtype (0 float16, 1 bfloat16) that of the attention (dtype);
// dbias (the backward's) with dbias_strides (batch, head, row), column stride 1, elements of
// dbias_dtype (0 float16, 1 bfloat16, 2 float32), stored, or with dbias_add (float32 only)
// added by atomics: then a batch or head stride may be 0 (a plane shared by those dims).
// Call after set_problem. A build without FLASHATTN2_EXPERIMENTAL=bias takes none (attn_bias 0).
template <typename Params>
void set_bias(Params& params, std::uintptr_t attn_bias, const Strides& bias_strides,
              int bias_dtype, int dtype, std::uintptr_t dbias, const Strides& dbias_strides,
              int dbias_dtype = 2, bool dbias_add = false) {
  if (!attn_bias) {
    if (dbias) throw std::invalid_argument("dbias needs an attn_bias");
    return;
  }
#if FLASHATTN2_BIAS
  check_strides("bias_strides", bias_strides, 4, "(batch, head, row, col)");
  if (bias_dtype != dtype) {
    throw std::invalid_argument("bias_dtype must be the attention's dtype (" +
                                std::to_string(dtype) + "), got " + std::to_string(bias_dtype));
  }
  params.attn_bias = reinterpret_cast<const void*>(attn_bias);
  params.bias_batch_stride = bias_strides[0];
  params.bias_head_stride = bias_strides[1];
  params.bias_row_stride = bias_strides[2];
  params.bias_col_stride = bias_strides[3];
  if (dbias) {
    check_strides("dbias_strides", dbias_strides, 3, "(batch, head, row)");
    if (dbias_dtype < 0 || dbias_dtype > 2) {
      throw std::invalid_argument("dbias_dtype must be 0 (float16), 1 (bfloat16) or 2 "
                                  "(float32), got " + std::to_string(dbias_dtype));
    }
    if (dbias_add && dbias_dtype != 2) {
      throw std::invalid_argument("dbias_add needs a float32 dbias (dbias_dtype 2)");
    }
    // The kernel writes pairs of keys (BwdParams::dbias_dtype): aligned, and rows of an
    // even length with room for seqlen_k rounded up to even.
    const int64_t bytes = dbias_dtype == 2 ? 4 : 2;
    if (dbias % (2 * bytes)) {
      throw std::invalid_argument("dbias must be aligned to two elements (" +
                                  std::to_string(2 * bytes) + " bytes)");
    }
    if (dbias_strides[0] % 2 || dbias_strides[1] % 2 || dbias_strides[2] % 2 ||
        dbias_strides[2] < params.seqlen_k + params.seqlen_k % 2) {
      throw std::invalid_argument(
          "dbias_strides must be even, the row stride at least seqlen_k rounded up to even (" +
          std::to_string(params.seqlen_k + params.seqlen_k % 2) + ")");
    }
    // A stored plane written for several (batch, head): racing stores, so only adds share.
    if (!dbias_add && ((params.batch > 1 && dbias_strides[0] == 0) ||
                       (params.nheads > 1 && dbias_strides[1] == 0))) {
      throw std::invalid_argument("dbias_strides: a 0 batch or head stride needs dbias_add");
    }
    params.dbias = reinterpret_cast<void*>(dbias);
    params.dbias_batch_stride = dbias_strides[0];
    params.dbias_head_stride = dbias_strides[1];
    params.dbias_row_stride = dbias_strides[2];
    if constexpr (std::is_same_v<Params, flashattn2::BwdParams>) {  // (the forward has none)
      params.dbias_dtype = dbias_dtype;
      params.dbias_add = dbias_add;
    }
  }
#else
  (void)params, (void)bias_strides, (void)bias_dtype, (void)dtype, (void)dbias_strides;
  (void)dbias_dtype, (void)dbias_add;
  throw std::invalid_argument(
      "attn_bias needs a build with bias in FLASHATTN2_EXPERIMENTAL (the default)");
#endif
}

int fwd(std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
         std::uintptr_t lse, const Strides& q_strides, const Strides& k_strides,
         const Strides& v_strides, const Strides& o_strides, const Strides& lse_strides,
         int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k, int headdim,
         float softmax_scale, int window_left, int window_right, int dtype, int device,
         std::uintptr_t stream, std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_k,
         std::uintptr_t seqused_k, std::uintptr_t leftpad_k, std::uintptr_t kv_batch_idx,
         std::uintptr_t block_table, int64_t block_table_batch_stride, int page_size,
         int num_pages, int num_splits, std::uintptr_t o_accum, std::uintptr_t lse_accum, int total_q,
         int total_k, int seqlen_k_new,
         float softcap, std::uintptr_t alibi_slopes,
         int64_t alibi_batch_stride, std::uintptr_t rng_state, double dropout_p, int q_pack,
         bool allow_sm90, std::uintptr_t tile_counter, std::uintptr_t attn_bias,
         const Strides& bias_strides, int bias_dtype, bool allow_decode,
         bool sm90_stage_o, bool sm90_narrow_step,
         bool sm90_fa3_order, bool fp32_tf32) {
  constexpr const char* kRowLayout = "(batch, row, head)";
  check_strides("q_strides", q_strides, 3, kRowLayout);
  check_strides("k_strides", k_strides, 3, kRowLayout);
  check_strides("v_strides", v_strides, 3, kRowLayout);
  check_strides("o_strides", o_strides, 3, kRowLayout);
  check_strides("lse_strides", lse_strides, 2, "(batch, head)");

  flashattn2::FwdParams params{};
  params.q_pack = q_pack;
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
  set_layout(params, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, kv_batch_idx,
             block_table, block_table_batch_stride, page_size, num_pages);
  params.total_q = total_q;
  params.total_k = total_k;
  params.seqlen_k_new = seqlen_k_new;
  params.num_splits = num_splits;
  params.o_accum = reinterpret_cast<float*>(o_accum);
  params.lse_accum = reinterpret_cast<float*>(lse_accum);
  set_mods(params, softcap, alibi_slopes, alibi_batch_stride, rng_state, dropout_p);
  params.tile_counter = reinterpret_cast<int*>(tile_counter);
  params.sm90_stage_o = sm90_stage_o;
  params.sm90_narrow_step = sm90_narrow_step;
  params.sm90_fa3_order = sm90_fa3_order;
  params.fp32_tf32 = fp32_tf32;
  set_bias(params, attn_bias, bias_strides, bias_dtype, dtype, 0, {});

  // The launch can block when the GPU's launch queue is full; let other threads run.
  py::gil_scoped_release no_gil;
  return flashattn2::mha_fwd(params, device, reinterpret_cast<void*>(stream), allow_sm90,
                             allow_decode);
}

int bwd(std::uintptr_t dout, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v,
         std::uintptr_t o, std::uintptr_t lse, std::uintptr_t dq, std::uintptr_t dk,
         std::uintptr_t dv, std::uintptr_t dq_accum, std::uintptr_t dsum,
         const Strides& do_strides, const Strides& q_strides, const Strides& k_strides,
         const Strides& v_strides, const Strides& o_strides, const Strides& dq_strides,
         const Strides& dk_strides, const Strides& dv_strides, const Strides& lse_strides,
         int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k, int headdim,
         float softmax_scale, int window_left, int window_right, int dtype, int device,
         std::uintptr_t stream, bool deterministic, std::uintptr_t cu_seqlens_q,
         std::uintptr_t cu_seqlens_k, int total_q, int total_k,
         float softcap, std::uintptr_t alibi_slopes,
         int64_t alibi_batch_stride, std::uintptr_t rng_state, double dropout_p, int dq_chains,
         int smem_limit, bool allow_sm90, std::uintptr_t attn_bias, const Strides& bias_strides,
         int bias_dtype, std::uintptr_t dbias, const Strides& dbias_strides, int dbias_dtype,
         bool dbias_add, bool bias_staged, bool dq_warp, bool pdl, bool convert_lean,
         bool dq_first_store, bool fp32wg_bwd, bool sm90_dbias, bool fp32wg_bwd128,
         bool fp32_tf32) {
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
  params.dq_chains = dq_chains;
  set_layout(params, cu_seqlens_q, cu_seqlens_k);
  params.total_q = total_q;
  params.total_k = total_k;
  set_mods(params, softcap, alibi_slopes, alibi_batch_stride, rng_state, dropout_p);
  set_bias(params, attn_bias, bias_strides, bias_dtype, dtype, dbias, dbias_strides,
           dbias_dtype, dbias_add);
#if FLASHATTN2_BIAS
  params.bias_staged = bias_staged;
#else
  (void)bias_staged;
#endif
  params.dq_warp = dq_warp;
  params.pdl = pdl;
  params.convert_lean = convert_lean;
  params.dq_first_store = dq_first_store;
  params.fp32wg_bwd = fp32wg_bwd;
  params.sm90_dbias = sm90_dbias;
  params.fp32wg_bwd128 = fp32wg_bwd128;
  params.fp32_tf32 = fp32_tf32;
  if (dbias_add && deterministic) {
    throw std::invalid_argument("dbias_add: atomic adds are not bitwise reproducible; "
                                "deterministic mode needs a stored dbias");
  }

  py::gil_scoped_release no_gil;  // as in fwd
  return flashattn2::mha_bwd(params, device, reinterpret_cast<void*>(stream), smem_limit,
                             allow_sm90);
}

void append_kv(std::uintptr_t k_new, std::uintptr_t v_new, std::uintptr_t k_cache,
               std::uintptr_t v_cache, const Strides& knew_strides, const Strides& vnew_strides,
               const Strides& kc_strides, const Strides& vc_strides,
               std::uintptr_t cache_seqlens, std::uintptr_t kv_batch_idx, std::uintptr_t block_table,
               int64_t block_table_batch_stride, int page_size, int num_pages, int cache_capacity,
               std::uintptr_t rotary_cos, std::uintptr_t rotary_sin, int64_t rotary_row_stride,
               int rotary_dim, int seqlen_ro, bool interleaved, std::uintptr_t q,
               std::uintptr_t q_out, const Strides& q_strides, int seqlen_q, int nheads,
               bool q_positions_increment, int batch, int seqlen_new, int nheads_k,
               int headdim, int dtype, int device, std::uintptr_t stream) {
  constexpr const char* kRowLayout = "(batch, row, head)";
  check_strides("knew_strides", knew_strides, 3, kRowLayout);
  check_strides("vnew_strides", vnew_strides, 3, kRowLayout);
  check_strides("kc_strides", kc_strides, 3, kRowLayout);
  check_strides("vc_strides", vc_strides, 3, kRowLayout);
  check_strides("q_strides", q_strides, 3, kRowLayout);
  flashattn2::AppendKvParams params{};
  params.k_new = as_ptr<void>(k_new);
  params.v_new = as_ptr<void>(v_new);
  params.k_cache = reinterpret_cast<void*>(k_cache);
  params.v_cache = reinterpret_cast<void*>(v_cache);
  set_strides(knew_strides, params.knew_batch_stride, params.knew_row_stride, params.knew_head_stride);
  set_strides(vnew_strides, params.vnew_batch_stride, params.vnew_row_stride, params.vnew_head_stride);
  set_strides(kc_strides, params.kc_batch_stride, params.kc_row_stride, params.kc_head_stride);
  set_strides(vc_strides, params.vc_batch_stride, params.vc_row_stride, params.vc_head_stride);
  set_strides(q_strides, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
  params.cache_seqlens = as_ptr<int>(cache_seqlens);
  params.kv_batch_idx = as_ptr<int>(kv_batch_idx);
  // Reuse the SeqLayout page-size check.
  flashattn2::SeqLayout pages{};
  set_layout(pages, 0, 0, 0, 0, 0, block_table, block_table_batch_stride, page_size, num_pages);
  params.block_table = pages.block_table;
  params.block_table_batch_stride = block_table_batch_stride;
  params.page_size_log2 = pages.page_size_log2;
  params.num_pages = pages.num_pages;
  params.cache_capacity = cache_capacity;
  params.rotary_cos = as_ptr<void>(rotary_cos);
  params.rotary_sin = as_ptr<void>(rotary_sin);
  params.rotary_row_stride = rotary_row_stride;
  params.rotary_dim = rotary_dim;
  params.seqlen_ro = seqlen_ro;
  params.interleaved = interleaved;
  params.q = as_ptr<void>(q);
  params.q_out = reinterpret_cast<void*>(q_out);
  params.seqlen_q = seqlen_q;
  params.nheads = nheads;
  params.q_positions_increment = q_positions_increment;
  params.batch = batch;
  params.seqlen_new = seqlen_new;
  params.nheads_k = nheads_k;
  params.headdim = headdim;
  params.dtype = dtype_from_code(dtype);
  py::gil_scoped_release no_gil;  // as in fwd
  flashattn2::mha_append_kv(params, device, reinterpret_cast<void*>(stream));
}

// dtype codes 0 (float16), 1 (bfloat16), 2 (float32).
flashattn2::DType rotary_dtype_from_code(const char* name, int code) {
  if (code < 0 || code > 2) {
    throw std::invalid_argument(std::string(name) + " must be 0 (float16), 1 (bfloat16) or 2 "
                                "(float32), got " + std::to_string(code));
  }
  return static_cast<flashattn2::DType>(code);
}

void rotary(std::uintptr_t x, std::uintptr_t out, const Strides& x_strides,
            const Strides& out_strides, std::uintptr_t cos, std::uintptr_t sin,
            int64_t cos_row_stride, int64_t sin_row_stride, std::uintptr_t cu_seqlens,
            std::uintptr_t seqlen_offsets, int64_t seqlen_offset, int batch, int seqlen,
            int nheads, int headdim, int rotary_dim, int seqlen_ro, bool interleaved,
            bool conjugate, int dtype, int cs_dtype, int device, std::uintptr_t stream) {
  constexpr const char* kRowLayout = "(batch, row, head)";
  check_strides("x_strides", x_strides, 3, kRowLayout);
  check_strides("out_strides", out_strides, 3, kRowLayout);
  flashattn2::RotaryParams params{};
  params.x = as_ptr<void>(x);
  params.out = reinterpret_cast<void*>(out);
  set_strides(x_strides, params.x_batch_stride, params.x_row_stride, params.x_head_stride);
  set_strides(out_strides, params.out_batch_stride, params.out_row_stride,
              params.out_head_stride);
  params.cos = as_ptr<void>(cos);
  params.sin = as_ptr<void>(sin);
  params.cos_row_stride = cos_row_stride;
  params.sin_row_stride = sin_row_stride;
  params.cu_seqlens = as_ptr<int>(cu_seqlens);
  params.seqlen_offsets = as_ptr<int>(seqlen_offsets);
  params.seqlen_offset = seqlen_offset;
  params.batch = batch;
  params.seqlen = seqlen;
  params.nheads = nheads;
  params.headdim = headdim;
  params.rotary_dim = rotary_dim;
  params.seqlen_ro = seqlen_ro;
  params.interleaved = interleaved;
  params.conjugate = conjugate;
  params.dtype = rotary_dtype_from_code("dtype", dtype);
  params.cs_dtype = rotary_dtype_from_code("cs_dtype", cs_dtype);
  py::gil_scoped_release no_gil;
  flashattn2::rotary(params, device, reinterpret_cast<void*>(stream));
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

void merge(std::uintptr_t out_a, std::uintptr_t lse_a, std::uintptr_t out_b,
           std::uintptr_t lse_b, std::uintptr_t out, std::uintptr_t lse,
           const Strides& out_a_strides, const Strides& lse_a_strides,
           const Strides& out_b_strides, const Strides& lse_b_strides,
           const Strides& out_strides, const Strides& lse_strides, int batch, int seqlen,
           int nheads, int headdim, int dtype_a, int dtype_b, int dtype_out, int device,
           std::uintptr_t stream) {
  constexpr const char* kOutLayout = "(batch, row, head, col)";
  constexpr const char* kLseLayout = "(batch, head, row)";
  const Strides* outs[3] = {&out_a_strides, &out_b_strides, &out_strides};
  const Strides* lses[3] = {&lse_a_strides, &lse_b_strides, &lse_strides};
  const char* out_names[3] = {"out_a_strides", "out_b_strides", "out_strides"};
  const char* lse_names[3] = {"lse_a_strides", "lse_b_strides", "lse_strides"};
  flashattn2::MergeParams params{};
  for (int t = 0; t < 3; ++t) {
    check_strides(out_names[t], *outs[t], 4, kOutLayout);
    check_strides(lse_names[t], *lses[t], 3, kLseLayout);
    for (int d = 0; d < 4; ++d) params.out_strides[t][d] = (*outs[t])[d];
    for (int d = 0; d < 3; ++d) params.lse_strides[t][d] = (*lses[t])[d];
  }
  params.out_a = as_ptr<void>(out_a);
  params.out_b = as_ptr<void>(out_b);
  params.out = reinterpret_cast<void*>(out);
  params.lse_a = as_ptr<float>(lse_a);
  params.lse_b = as_ptr<float>(lse_b);
  params.lse = reinterpret_cast<float*>(lse);
  params.batch = batch;
  params.seqlen = seqlen;
  params.nheads = nheads;
  params.headdim = headdim;
  params.dtype[0] = dtype_a;
  params.dtype[1] = dtype_b;
  params.dtype[2] = dtype_out;
  py::gil_scoped_release no_gil;  // as in fwd
  flashattn2::mha_merge(params, device, reinterpret_cast<void*>(stream));
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

// "a,b" -> ["a", "b"] ("" -> []).
py::list csv_list(const std::string& items) {
  py::list out;
  for (size_t start = 0; start < items.size();) {
    const size_t end = std::min(items.find(',', start), items.size());
    if (end > start) out.append(items.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

py::dict build_info() {
  py::dict info;
  info["version"] = flashattn2::version();
  info["cuda_version"] = flashattn2::cuda_runtime_version();
  info["archs"] = flashattn2::built_archs();
  info["ptx_archs"] = flashattn2::built_ptx_archs();
  info["head_dims"] = flashattn2::built_head_dims();
  info["sm90_fwd_head_dims"] = flashattn2::built_sm90_head_dims();
  info["sm90_bwd_head_dims"] = flashattn2::built_sm90_bwd_head_dims();
  info["sm90_bwd_experimental"] = csv_list(flashattn2::built_sm90_bwd_experimental());
  info["experimental"] = csv_list(FLASHATTN2_EXPERIMENTAL);
  info["bwd_head_dims"] = bwd_head_dims();
  // Kernel head dims of the float32 forward and backward (FLASHATTN2_EXPERIMENTAL=fp32).
  info["fp32_head_dims"] = flashattn2::built_fp32_head_dims();
  info["fp32_bwd"] = !flashattn2::built_fp32_head_dims().empty();  // (the same head dims)
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
        py::arg("dtype"), py::arg("device"), py::arg("stream"), py::arg("cu_seqlens_q") = 0,
        py::arg("cu_seqlens_k") = 0, py::arg("seqused_k") = 0, py::arg("leftpad_k") = 0,
        py::arg("kv_batch_idx") = 0, py::arg("block_table") = 0,
        py::arg("block_table_batch_stride") = 0, py::arg("page_size") = 0,
        py::arg("num_pages") = 0, py::arg("num_splits") = 1, py::arg("o_accum") = 0, py::arg("lse_accum") = 0,
        py::arg("total_q") = 0, py::arg("total_k") = 0, py::arg("seqlen_k_new") = 0,
        py::arg("softcap") = 0.f,
        py::arg("alibi_slopes") = 0, py::arg("alibi_batch_stride") = 0,
        py::arg("rng_state") = 0, py::arg("dropout_p") = 0.0, py::arg("q_pack") = 1,
        py::arg("allow_sm90") = true, py::arg("tile_counter") = 0, py::arg("attn_bias") = 0,
        py::arg("bias_strides") = Strides{}, py::arg("bias_dtype") = -1,
        py::arg("allow_decode") = true,
        py::arg("sm90_stage_o") = false, py::arg("sm90_narrow_step") = false,
        py::arg("sm90_fa3_order") = true, py::arg("fp32_tf32") = false,
        "Attention forward; returns the kernel that ran: 90 (the Hopper "
        "kernels, on sm_90 GPUs for what they support unless allow_sm90 is false), 80 (the "
        "mma.sync kernels), 81 (the decode kernel of builds with "
        "FLASHATTN2_EXPERIMENTAL=decode, for the forwards of at most 16 packed query rows it "
        "supports unless allow_decode is false; flash_api.h kFwdKernelDecode) or 91 (the "
        "Hopper float32 kernel of builds with FLASHATTN2_EXPERIMENTAL=fp32wg, for the float32 "
        "forwards it supports unless allow_sm90 is false; flash_api.h kFwdKernelFp32Wg) or 93 "
        "(its single-TF32 instance, when fp32_tf32 is true: one tf32 product per multiply, "
        "as PyTorch's float32 matmuls with fp32_precision 'tf32'; else 3xTF32); "
        "tile_counter: a zeroed int32 on the device from which its persistent CTAs take "
        "causal / windowed / varlen tiles (0: one CTA per such tile), zeroed again by the "
        "launch's last claim, so one counter serves every launch of a stream (for a dense "
        "forward with a stream-K workspace in o_accum, sm90_fwd_stream_k_floats, "
        "SM90_FWD_COUNTER_INTS of them: its flags follow the counter); sm90_stage_o: the "
        "Hopper forward at d192 / d256 stages O in the last K / V stage (freeing the Q "
        "buffer after the tile's last S) for causal, windowed and varlen tiles too, not only "
        "for dense full attention (an A/B switch); sm90_narrow_step: the Hopper forward runs a "
        "warpgroup's first key step on the block's first 32 or 64 keys where it sees no "
        "others (the causal diagonal; an A/B switch); sm90_fa3_order: the Hopper forward of "
        "plain dense full attention in one split at kernel head dim 256 from 2048 keys takes "
        "FA3's step order there (no ping-pong turn, O rescaled before a step's P V; false: "
        "never). "
        "q/k/v/o/lse are device pointers; *_strides are in elements, "
        "(batch, row, head) for q, k, v, o and (batch, head) for lse; dtype 0 = float16, "
        "1 = bfloat16; stream is a cudaStream_t as int (0 = default stream). Launches "
        "asynchronously on `stream` with `device` current. Optional (0 = absent) int32 "
        "device vectors give the sequence layout (flash.h SeqLayout): cu_seqlens_q/k "
        "(varlen, batch + 1 entries, with total_q/k the rows of q/k; seqlen_q/k are then "
        "the maxima), seqused_k (+ seqlen_k_new), leftpad_k, "
        "kv_batch_idx (KV cache), block_table with its batch stride, page_size and num_pages (paged "
        "K/V; k/v batch strides are then page strides; entries are clamped to [0, num_pages)). num_splits > 1 runs split-KV with "
        "float32 workspaces o_accum (num_splits*batch*nheads*seqlen_q*headdim) and "
        "lse_accum (num_splits*batch*nheads*seqlen_q). "
        "Score modifiers: softcap > 0 "
        "caps logits at softcap * tanh(.); alibi_slopes is a float32 device pointer (0 = "
        "none) indexed batch * alibi_batch_stride + head; dropout_p > 0 needs rng_state, a "
        "device pointer to int64 (seed, offset). q_pack: 1, or nheads / nheads_k to pack "
        "each GQA group's query heads into the KV-cache kernel's query tiles (flash.h "
        "FwdParams::q_pack; not with ALiBi or dropout; the plain kernel ignores it). "
        "attn_bias (builds with FLASHATTN2_EXPERIMENTAL=bias): a device pointer to an "
        "additive logit bias of a (batch, nheads, seqlen_q, seqlen_k) view with bias_strides "
        "(4, elements, 0 = broadcast) and bias_dtype, which must be dtype; "
        "dense attention only (flash.h BiasLayout).");


  m.def("bwd", &bwd, py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("dq_accum"),
        py::arg("dsum"), py::arg("do_strides"), py::arg("q_strides"), py::arg("k_strides"),
        py::arg("v_strides"), py::arg("o_strides"), py::arg("dq_strides"),
        py::arg("dk_strides"), py::arg("dv_strides"), py::arg("lse_strides"),
        py::arg("batch"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("nheads"),
        py::arg("nheads_k"), py::arg("headdim"), py::arg("softmax_scale"),
        py::arg("window_left"), py::arg("window_right"), py::arg("dtype"), py::arg("device"),
        py::arg("stream"), py::arg("deterministic") = false, py::arg("cu_seqlens_q") = 0,
        py::arg("cu_seqlens_k") = 0, py::arg("total_q") = 0, py::arg("total_k") = 0,
        py::arg("softcap") = 0.f,
        py::arg("alibi_slopes") = 0, py::arg("alibi_batch_stride") = 0,
        py::arg("rng_state") = 0, py::arg("dropout_p") = 0.0, py::arg("dq_chains") = 1,
        py::arg("smem_limit") = 0, py::arg("allow_sm90") = true, py::arg("attn_bias") = 0,
        py::arg("bias_strides") = Strides{}, py::arg("bias_dtype") = -1, py::arg("dbias") = 0,
        py::arg("dbias_strides") = Strides{}, py::arg("dbias_dtype") = 2,
        py::arg("dbias_add") = false, py::arg("bias_staged") = true, py::arg("dq_warp") = true,
        py::arg("pdl") = true, py::arg("convert_lean") = false,
        py::arg("dq_first_store") = false, py::arg("fp32wg_bwd") = false,
        py::arg("sm90_dbias") = false, py::arg("fp32wg_bwd128") = false,
        py::arg("fp32_tf32") = false,
        "Attention backward: writes dq, dk, dv from dout, q, k, v, out and lse (the forward's); "
        "returns the generation of the backward that ran: 90 (the Hopper backward, on sm_90 "
        "GPUs for what it supports unless allow_sm90 is false) or 80, or 91 (flash_api.h "
        "kBwdKernelFp32Wg: the Hopper float32 backward of builds with "
        "FLASHATTN2_EXPERIMENTAL=fp32wg, for the float32 backwards it supports when "
        "fp32wg_bwd and allow_sm90 are true), or 92 (kBwdKernelFp32Wg128: its kernel head "
        "dim 128 instance, when fp32wg_bwd128 and allow_sm90 are true), or 93 / 94 (their "
        "single-TF32 instances, when fp32_tf32 is true as well). "
        "Pointers and strides as in fwd; dk and dv are like k and v (the kernel sums each "
        "GQA group); dq_accum and dsum are float32 "
        "workspaces of bwd_workspace_floats(..., dq_chains) floats (no need to zero them); "
        "float32 may pass dq_accum=0 (the Hopper float32 backwards add into dq itself): "
        "where the kernel that takes the call needs it, nothing runs and bwd returns -1 "
        "(kBwdNeedsDqAccum): call again with the workspace. "
        "deterministic=True makes dq bitwise reproducible (ordered accumulation; dq_chains "
        "from bwd_dq_chains makes it faster). "
        "cu_seqlens_q/k: varlen as in fwd, with total_q/k the rows of q/k. Score modifiers "
        "as in fwd, with the forward's values (the same rng_state for dropout). "
        "smem_limit > 0 caps the shared memory per block below the GPU's (a test hook: "
        "the tiles an sm_86 / sm_89 GPU gets). attn_bias as in fwd; dbias (0 = not asked "
        "for): a (batch, nheads, seqlen_q, seqlen_k) tensor with dbias_strides (batch, head, "
        "row) and column stride 1 that receives d loss / d logit of every visible score "
        "(flash.h BiasLayout; zero-fill it under a window or causal mask), pairs of keys at "
        "a time (rows 2-element aligned, of an even stride >= seqlen_k): stored in "
        "dbias_dtype (0 float16, 1 bfloat16, 2 float32), or with dbias_add (float32, not "
        "with deterministic) added by atomics, where a 0 batch or head stride sums over "
        "that dim. bias_staged=False keeps the mma.sync backward from staging a bias with "
        "16-byte aligned rows in shared memory (one global load per score; A/B). "
        "dq_warp=False: in builds with dq_warp (build_info 'sm90_bwd_experimental'), "
        "deterministic Hopper backwards keep the dQ order on the consumer warps (A/B; the "
        "same dq bits). pdl=False: the Hopper backward launches its kernel and dQ convert "
        "plainly, not as programmatic dependents of the kernel before each (A/B; the same "
        "results). convert_lean=True: the dQ convert runs its kernel with every load of a "
        "tile in flight (A/B; the same dq bits). dq_first_store=True: dense Hopper backwards "
        "of d64 / d128 without mods or a bias, in dq_warp builds, store the first dQ of each "
        "query tile instead of adding it to a zeroed accumulator (A/B; deterministic: the "
        "same dq bits). fp32wg_bwd=True: float32 backwards may run the Hopper float32 "
        "backward (dense, full or causal, kernel head dim 64, not deterministic; A/B). "
        "fp32wg_bwd128=True: the same at kernel head dim 128 (cpp/fp32/wg_bwd128_kernel.cuh; "
        "A/B). "
        "sm90_dbias=True: a dbias may run the Hopper backward (d64 / d128, "
        "the bias's rows 16-byte aligned, no softcap), else the mma.sync backward writes it "
        "(A/B; on by default in Python).");

  m.def("append_kv", &append_kv, py::arg("k_new"), py::arg("v_new"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("knew_strides"), py::arg("vnew_strides"),
        py::arg("kc_strides"), py::arg("vc_strides"), py::arg("cache_seqlens"),
        py::arg("kv_batch_idx"), py::arg("block_table"),
        py::arg("block_table_batch_stride"), py::arg("page_size"), py::arg("num_pages"),
        py::arg("cache_capacity"),
        py::arg("rotary_cos"), py::arg("rotary_sin"), py::arg("rotary_row_stride"),
        py::arg("rotary_dim"), py::arg("seqlen_ro"), py::arg("interleaved"), py::arg("q"),
        py::arg("q_out"), py::arg("q_strides"), py::arg("seqlen_q"), py::arg("nheads"),
        py::arg("q_positions_increment"), py::arg("batch"), py::arg("seqlen_new"),
        py::arg("nheads_k"), py::arg("headdim"), py::arg("dtype"), py::arg("device"),
        py::arg("stream"),
        "KV-cache append before attending (flash.h AppendKvParams): writes k_new / v_new "
        "(batch, seqlen_new, nheads_k, headdim) into the cache at rows cache_seqlens[b]..., "
        "paged when block_table is given, with rotary embedding (rotary_dim > 0) applied to "
        "the keys and to q, whose rotated copy goes to q_out (contiguous).");

  m.def("rotary", &rotary, py::arg("x"), py::arg("out"), py::arg("x_strides"),
        py::arg("out_strides"), py::arg("cos"), py::arg("sin"), py::arg("cos_row_stride"),
        py::arg("sin_row_stride"), py::arg("cu_seqlens"), py::arg("seqlen_offsets"),
        py::arg("seqlen_offset"), py::arg("batch"), py::arg("seqlen"), py::arg("nheads"),
        py::arg("headdim"), py::arg("rotary_dim"), py::arg("seqlen_ro"),
        py::arg("interleaved"), py::arg("conjugate"), py::arg("dtype"), py::arg("cs_dtype"),
        py::arg("device"), py::arg("stream"),
        "Rotary embedding (flash.h RotaryParams): out = x (batch, seqlen, nheads, headdim), "
        "or (total = seqlen, nheads, headdim) with cu_seqlens (int32, batch + 1; batch stride "
        "0), with the first rotary_dim channels rotated by the rows of cos / sin "
        "(seqlen_ro, rotary_dim / 2) at each token's position (+ seqlen_offsets[b] (int32) "
        "or seqlen_offset); conjugate negates sin. out == x: in place. dtype / cs_dtype: 0 "
        "float16, 1 bfloat16, 2 float32; strides in elements, unit channel stride.");

  m.def("dropout_mask", &dropout_mask, py::arg("mask"), py::arg("rng_state"), py::arg("batch"),
        py::arg("nheads"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("dropout_p"),
        py::arg("device"), py::arg("stream"),
        "Writes the dropout keep mask (uint8 0/1, contiguous (batch, nheads, seqlen_q, "
        "seqlen_k)) that fwd / bwd use for this rng_state and dropout_p.");

  m.def("merge", &merge, py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"),
        py::arg("lse_b"), py::arg("out"), py::arg("lse"), py::arg("out_a_strides"),
        py::arg("lse_a_strides"), py::arg("out_b_strides"), py::arg("lse_b_strides"),
        py::arg("out_strides"), py::arg("lse_strides"), py::arg("batch"), py::arg("seqlen"),
        py::arg("nheads"), py::arg("headdim"), py::arg("dtype_a"), py::arg("dtype_b"),
        py::arg("dtype_out"), py::arg("device"), py::arg("stream"),
        "Merges two attention results over disjoint key sets by their LSE (flash.h "
        "MergeParams): out_* (batch, seqlen, nheads, headdim) with strides (batch, row, head, "
        "col) and dtype codes 0 float16, 1 bfloat16, 2 float32; lse_* float32 (batch, nheads, "
        "seqlen) with strides (batch, head, row). out / lse may alias out_a / lse_a or "
        "out_b / lse_b. An LSE of +inf or -inf is an empty row; empty in both gives out 0, "
        "lse -inf.");

  m.def("bwd_workspace_floats", &flashattn2::bwd_workspace_floats, py::arg("batch"),
        py::arg("nheads"), py::arg("seqlen_q"), py::arg("headdim"), py::arg("total_q") = -1,
        py::arg("dq_chains") = 1,
        "(dq_accum, dsum) float32 workspace sizes, in floats, for a backward of these sizes "
        "(total_q >= 0: varlen with total_q query rows, seqlen_q the longest) with dq_chains "
        "dQ accumulators (bwd's dq_chains).");
  m.def("bwd_dq_chains", &flashattn2::bwd_dq_chains, py::arg("seqlen_q"), py::arg("seqlen_k"),
        py::arg("headdim"), py::arg("deterministic"), py::arg("window_left"),
        py::arg("window_right"), py::arg("num_sms"),
        "The dq_chains a backward with these arguments should use on a GPU with num_sms SMs "
        "(pass the same value to bwd_workspace_floats and bwd): > 1 only for deterministic "
        "runs without a right window bound (from 1024 keys, or 8192 where the kernel walks "
        "full attention in rotated order), where the K/V tiles add into that many dQ "
        "accumulators in turn.");

  m.def("num_splits_heuristic", &flashattn2::num_splits_heuristic, py::arg("batch"),
        py::arg("nheads"), py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("headdim"),
        py::arg("device"), py::arg("sm90") = false, py::arg("decode") = false,
        "Split-KV count that fills GPU `device` for a forward of these sizes (1 = none), "
        "for the tile of the KV kernel or (sm90) of the Hopper forward, or (decode) of the "
        "decode kernel where it would run.");
  m.def("sm90_fwd_applies", &flashattn2::sm90_fwd_applies, py::arg("device"), py::arg("headdim"),
        py::arg("seqlen_q"), py::arg("dropout"), py::arg("kv_cache_layout"),
        "Whether fwd runs the Hopper kernels for such a forward on `device` (unless "
        "allow_sm90 is false).");
  m.def("sm90_fwd_stream_k_floats", &flashattn2::sm90_fwd_stream_k_floats, py::arg("device"),
        py::arg("batch"), py::arg("nheads"), py::arg("seqlen_q"), py::arg("seqlen_k"),
        py::arg("headdim"),
        "Floats of the float32 workspace a Hopper dense forward (no window, one split) of these "
        "sizes takes for its stream-K tail, passed as o_accum with num_splits 1 and a "
        "tile_counter of SM90_FWD_COUNTER_INTS zeroed int32; 0: it takes none.");
  m.attr("SM90_FWD_COUNTER_INTS") = flashattn2::kSm90FwdCounterInts;
  m.attr("MAX_SPLITS") = flashattn2::kMaxSplits;

  m.def("bwd_max_head_dim", &flashattn2::bwd_max_head_dim,
        "Largest head dim the backward supports in this build (0 if none).");

  m.def("bwd_smem_per_block", &flashattn2::bwd_smem_per_block, py::arg("headdim"),
        "Shared memory per block, in bytes, of the backward kernel for headdim (0 if none).");

  m.def("max_smem_per_block", &flashattn2::max_smem_per_block, py::arg("device"),
        "The most shared memory a block may use on GPU `device` (opt-in limit), in bytes.");

  m.def("kernel_head_dim", &flashattn2::kernel_head_dim, py::arg("headdim"),
        "Smallest compiled kernel head dim >= headdim, or -1 if none (16 only while "
        "set_native_d16 is on).");

  m.def("set_native_d16", &flashattn2::set_native_d16, py::arg("enabled"),
        "Whether head dims 1-16 run the kernel of head dim 16 where built (default True); "
        "False sends them to the next larger kernel (process-wide, an A/B switch).");

  m.def("device_unsupported_reason", &flashattn2::device_unsupported_reason, py::arg("device"),
        "Empty string if this build can run on GPU `device`, otherwise why not.");

  m.def("build_info", &build_info,
        "What this build contains: {'version': str, 'cuda_version': int (e.g. 13000), "
        "'archs': SASS compute capabilities, 'ptx_archs': PTX compute capabilities, "
        "'head_dims': kernel head dims, 'bwd_head_dims': backward kernel head dims, "
        "'sm90_fwd_head_dims' / 'sm90_bwd_head_dims': those of the Hopper forward / backward, "
        "'sm90_bwd_experimental': its optional parts built in (FLASHATTN2_SM90_BWD_EXPERIMENTAL), "
        "'experimental': other optional features built in (FLASHATTN2_EXPERIMENTAL)}.");

  m.attr("__version__") = flashattn2::version();
}
