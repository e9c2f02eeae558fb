// Host side of TMA: CUtensorMap encoding through the driver entry point, so the module links
// only the static CUDA runtime (never libcuda). Compiled into the sm90 launch units.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "common/flash.h"

namespace flashattn2 {
namespace sm90 {

// A tiled map of a 2-byte (batch, rows, heads, d) tensor seen as 4-D (d, rows, heads,
// batch), innermost first; box = 64 columns (one 128-byte swizzled chunk) x box_rows rows of
// one head and batch entry; out-of-bounds elements read as zero. Strides in elements (the
// head-dim stride is 1). Returns false if the driver refuses the layout (the caller then
// runs the mma.sync kernels).
inline bool make_tma_map(CUtensorMap* map, const void* ptr, DType dtype, int64_t d, int64_t rows,
                         int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                         int64_t batch_stride, int box_rows) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  // A dimension of size 1 is never stepped over: give it a stride TMA accepts (a positive
  // multiple of 16 bytes) whatever the tensor's is.
  const int64_t span = ((d + 7) / 8 * 8) * rows * heads;
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(rows), cuuint64_t(heads),
                              cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(rows == 1 ? span : row_stride) * 2,
                                 cuuint64_t(heads == 1 ? span : head_stride) * 2,
                                 cuuint64_t(batch == 1 ? span : batch_stride) * 2};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Rows and batch entries of the maps of the query-side (q, o, dout) and key-side (k, v)
// tensors: a varlen tensor (cu_seqlens, SeqLayout) is one batch entry of total_q / total_k
// rows, a dense one batch entries of seqlen_q / seqlen_k rows.
struct MapRows {
  int64_t rows_q, rows_k, batch_q, batch_k;
};
template <typename Params>
MapRows map_rows(const Params& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  return MapRows{varlen_q ? p.total_q : p.seqlen_q, varlen_k ? p.total_k : p.seqlen_k,
                 varlen_q ? 1 : p.batch, varlen_k ? 1 : p.batch};
}

}  // namespace sm90
}  // namespace flashattn2
