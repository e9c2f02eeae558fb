// Host-safe parameter block shared by the binding, the dispatcher and the kernels.
// No torch, no CUDA types: plain pointers, sizes and strides (in elements).
#pragma once
#include <cstdint>

#include "built_config.h"

namespace flashattn2 {

// kFloat32: the rotary kernel (RotaryParams), and attention in builds with
// FLASHATTN2_EXPERIMENTAL=fp32 (the 3xTF32 kernels of cpp/fp32; dense or varlen layout, no
// dropout or bias).
enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2 };

// Where each batch's sequences live, shared by the forward and the backward. Every field is
// optional (null / 0 = the dense layout: batch b at b * batch_stride, seqlen_q / seqlen_k
// rows). The kernels read it through SeqInfo (seqlen.cuh), nowhere else.
struct SeqLayout {
  // Varlen: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1]) of a tensor whose batch
  // stride is 0 (cu_seqlens_q: q, o, dq, dout and lse, which is then (nheads, total_q);
  // cu_seqlens_k: k, v, dk, dv). seqlen_q / seqlen_k are then the maxima over the batch.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int total_q = 0, total_k = 0;  // varlen: rows of q / k; sequences are clamped to them
                                 // and to seqlen_q / seqlen_k, whatever cu_seqlens holds
  // KV cache: batch b has seqused_k[b] keys (<= seqlen_k, the cache capacity), the first
  // leftpad_k[b] of them hidden (padding on the left), read from cache batch
  // kv_batch_idx[b].
  const int* seqused_k = nullptr;
  const int* leftpad_k = nullptr;
  const int* kv_batch_idx = nullptr;
  // Paged K/V: key row r of batch b is row r % page_size of page
  // block_table[b * block_table_batch_stride + r / page_size]; k/v batch strides are then the
  // page strides. page_size is a power of two (log2 kept for the kernels). Entries are
  // clamped to [0, num_pages) (the cache's first dimension), so a bad table reads (and
  // append_kv writes) a wrong page, never outside the cache.
  const int* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int page_size_log2 = 0;
  int num_pages = 0;
  // Keys appended after seqused_k[b] (a KV-cache call with new keys): batch b then has
  // seqused_k[b] + seqlen_k_new keys. Visible keys are clamped to [0, seqlen_k].
  int seqlen_k_new = 0;
};

// Additive attention bias (flashattn2's attn_bias), in builds with FLASHATTN2_EXPERIMENTAL=bias
// only: without it the parameter blocks keep the layout the default kernels were validated
// with. Element (b, h, i, j) of a (batch, nheads, seqlen_q, seqlen_k) view, at
//   attn_bias + b * bias_batch_stride + h * bias_head_stride + i * bias_row_stride
//             + j * bias_col_stride        (elements of the attention's dtype, fp16 / bf16;
//                                           0 strides broadcast),
// is added to the logit in natural units (after softmax_scale, softcap and ALiBi, before the
// masks; -inf hides the key). Dense attention only (mha_fwd / mha_bwd refuse varlen, KV
// caches and split-KV with it): the plain-tile mma.sync kernels and the Hopper forward (the
// Hopper backward passes it on to the mma.sync one).
// The backward, when dbias is not null, sends d loss / d logit of every visible (b, h, i, j) to
//   dbias + b * dbias_batch_stride + h * dbias_head_stride + i * dbias_row_stride + j
// (elements of BwdParams::dbias_dtype) and nothing elsewhere (the caller zero-fills what a
// window or causal mask hides): a store, or with BwdParams::dbias_add a float32 atomic add
// (a 0 batch / head stride then sums a broadcast bias's gradient over those dims).
struct BiasLayout {
  const void* attn_bias = nullptr;
  int64_t bias_batch_stride = 0, bias_head_stride = 0, bias_row_stride = 0, bias_col_stride = 0;
  void* dbias = nullptr;
  int64_t dbias_batch_stride = 0, dbias_head_stride = 0, dbias_row_stride = 0;
};
#if FLASHATTN2_BIAS
#define FLASHATTN2_BIAS_BASE , BiasLayout
#else
#define FLASHATTN2_BIAS_BASE
#endif

struct FwdParams : SeqLayout FLASHATTN2_BIAS_BASE {
  const void* q;  // (batch, seqlen_q, nheads,   headdim)
  const void* k;  // (batch, seqlen_k, nheads_k, headdim)
  const void* v;  // (batch, seqlen_k, nheads_k, headdim)
  void* o;        // (batch, seqlen_q, nheads,   headdim), same dtype as q
  float* lse;     // (batch, nheads, seqlen_q) float32, row stride 1

  // Strides in elements; the head-dim stride is 1 for every tensor.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_k;
  int headdim;  // the real head dim (multiple of 8, <= 256); kernels pad to their tile

  float softmax_scale;  // multiplies q.k before softmax
  // Key j is visible to query i iff
  //   j <= i + seqlen_k - seqlen_q + window_right   (window_right >= 0)
  //   j >= i + seqlen_k - seqlen_q - window_left    (window_left  >= 0)
  // A negative bound is unbounded. causal == (window_left < 0, window_right == 0).
  int window_left, window_right;

  DType dtype;

  // Split-KV: num_splits > 1 CTAs share each query tile's keys (blockIdx.z = batch *
  // num_splits + split). Each writes its normalised partial O and LSE, float32, to
  //   o_accum  [num_splits, batch, nheads, seqlen_q, headdim]
  //   lse_accum[num_splits, batch, nheads, seqlen_q]          (-inf: the split saw no key)
  // and combine_kernel (combine_kernel.cuh) merges them into o and lse. With num_splits 1,
  // o_accum may hold the Hopper dense forward's stream-K workspace instead
  // (sm90_fwd_stream_k_floats in flash_api.h; null: none).
  int num_splits;
  float* o_accum;
  float* lse_accum;
  // GQA packing in the KV-cache kernel (fwd_launch.cuh use_kv_kernel): 1 = off, or
  // nheads / nheads_k. The CTAs then tile the seqlen_q * q_pack rows of one KV head: tile row
  // m is query position m / q_pack of query head head_k * q_pack + m % q_pack, so each K/V
  // tile is read once per group. Results are those of q_pack = 1; the plain kernel ignores
  // it. Not with ALiBi or dropout (their values depend on the query head).
  int q_pack = 1;
  // Score modifiers (score_mod.cuh), appended last; all zero / null = plain attention.
  float softcap;               // > 0: logit = softcap * tanh(softmax_scale * q.k / softcap)
  const float* alibi_slopes;   // null, or float32 slopes: bias -slope |i + sk - sq - j|
  int64_t alibi_batch_stride;  // slope of (batch, head) at batch * stride + head (0: shared)
  const int64_t* rng_state;    // dropout (seed, offset) on the device
  uint32_t dropout_threshold;  // drop iff the element's Philox word < this; 0: no dropout
  float dropout_scale;         // 1 / (1 - dropout_p)
  // Hopper forward (cpp/sm90): a zeroed int32 the persistent CTAs take causal / windowed /
  // varlen tiles from (null: one CTA per such tile); the launch leaves it zeroed again. With a
  // stream-K workspace (o_accum, num_splits 1), kSm90FwdCounterInts of them: the stream-K
  // flags follow the counter, also left zeroed.
  int* tile_counter = nullptr;
  // Hopper forward, d192 / d256 (one Q buffer): the plain instance stages each warpgroup's O
  // in the K or V buffer of the tile's last stage, so that the Q buffer is free after the
  // tile's last S (sm90/fwd_kernel.cuh kStageO). Dense full attention always does; true
  // (FLASHATTN2_SM90_STAGE_O, off by default): causal, windowed and varlen tiles too.
  bool sm90_stage_o = false;
  // Hopper forward, plain attention (FLASHATTN2_SM90_NARROW_STEP, a prototype, off by
  // default): a warpgroup's first key step runs on the block's first 32 or 64 keys where it
  // sees none of the others (sm90/fwd_kernel.cuh kNarrowStep).
  bool sm90_narrow_step = false;
  // Hopper forward, plain dense full attention in one split: true (FLASHATTN2_SM90_FA3_ORDER,
  // on by default) takes FA3's step order where sm90/fwd_config.h sm90_fwd_fa3_order says
  // (d256 from 2048 keys); false never does. (Last: the struct's tail padding holds it, so the
  // kernels' parameter offsets stay as they were.)
  bool sm90_fa3_order = false;
  // Float32: one tf32 product per multiply where the Hopper float32 forward runs (its kSingle
  // instances: inputs rounded to tf32, float32 accumulation, as PyTorch's matmuls under
  // fp32_precision "tf32"); false: 3xTF32 (float32-accurate). The other float32 kernels ignore
  // it. Host only (the instance is chosen at launch).
  bool fp32_tf32 = false;
};

// Backward (FA2 Algorithm 2). Same shapes and masking as FwdParams; all strides in elements
// with a unit head-dim stride. dk/dv are summed over each GQA group by the kernel.
struct BwdParams : SeqLayout FLASHATTN2_BIAS_BASE {
  const void* q;     // (batch, seqlen_q, nheads,   headdim)
  const void* k;     // (batch, seqlen_k, nheads_k, headdim)
  const void* v;     // (batch, seqlen_k, nheads_k, headdim)
  const void* o;     // (batch, seqlen_q, nheads,   headdim)
  const void* dout;  // (batch, seqlen_q, nheads,   headdim)
  const float* lse;  // (batch, nheads, seqlen_q), row stride 1
  void* dq;          // (batch, seqlen_q, nheads, headdim)
  void* dk;          // (batch, seqlen_k, nheads_k, headdim)
  void* dv;          // (batch, seqlen_k, nheads_k, headdim)
  float* dq_accum;   // workspace, bwd_workspace_floats(...).first floats: dq_chains
                     // f32 dQ accumulators
  float* dsum;       // workspace, bwd_workspace_floats(...).second floats: rowsum(dO * O),
                     // then per chain one int counter per (batch, head, 64-row query tile)

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim;
  float softmax_scale;
  int window_left, window_right;
  DType dtype;
  // Bitwise-reproducible dq: the CTAs that add into one query tile's dQ do so in a fixed
  // order (a counter per tile), instead of racing: descending K/V tile index with a right
  // window bound (causal), where the CTAs are then launched last tile first; the order of
  // the steps in the rotated walk of full attention; else ascending (dq_order.cuh).
  bool deterministic;
  // K/V tile n adds its dQ into accumulator n % dq_chains (a power of two, bwd_dq_chains;
  // the workspace sizes depend on it), ordered within its chain (deterministic mode, either
  // backward); the convert kernel sums the chains in order.
  int dq_chains = 1;
  // Deterministic full attention walks the query tiles in rotated order (bwd_kernel.cuh)
  // only with at most this many K/V tiles per (batch, head), so that they all fit on the GPU
  // at once (set by mha_bwd: the SM count).
  int dq_rotate_tiles = 0;
  // The Hopper float32 backwards (fp32/wg_bwd_launch.cuh): dQ * softmax_scale added straight
  // into dq (zeroed by the preprocess), no dq_accum and no convert kernel.
  bool fp32_dq_direct = false;

  // Score modifiers as in FwdParams; all zero / null = plain attention.
  float softcap;               // > 0: logit = softcap * tanh(softmax_scale * q.k / softcap)
  const float* alibi_slopes;   // null, or float32 slopes: bias -slope |i + sk - sq - j|
  int64_t alibi_batch_stride;  // slope of (batch, head) at batch * stride + head (0: shared)
  const int64_t* rng_state;    // dropout (seed, offset) on the device
  uint32_t dropout_threshold;  // drop iff the element's Philox word < this; 0: no dropout
  float dropout_scale;         // 1 / (1 - dropout_p)
#if FLASHATTN2_BIAS
  // dbias (BiasLayout), here at the end so that the other fields keep their offsets (and the
  // instances without a bias their code): its DType code; dbias_add: float32 atomic adds
  // instead of stores. The kernel writes two keys at a time (j even, one store or atomic),
  // so every row of dbias starts 2-element aligned and has an even number of elements, at
  // least seqlen_k (the binding checks it): with an odd seqlen_k the last one is padding.
  int dbias_dtype = static_cast<int>(DType::kFloat32);
  bool dbias_add = false;
  // The mma.sync backward may stage a bias with 16-byte aligned rows in shared memory
  // (sm80/bwd_launch.cuh); false: one global load per score (for A/B comparisons).
  bool bias_staged = true;
#endif
  // Builds with dq_warp (FLASHATTN2_SM90_BWD_EXPERIMENTAL): Hopper backwards without mods or
  // a bias run its instances, where producer warp 2 issues the dQ reduces (sm90/bwd_launch.cuh);
  // false runs the others (for A/B comparisons). Host only, here at the end so that the other fields keep their
  // offsets.
  bool dq_warp = true;
  // Hopper backwards: the main kernel and the dQ convert are launched as programmatic
  // dependents of the kernel before them (sm90/bwd_launch.cuh), so that their prologues
  // overlap its tail; false launches them plainly (for A/B comparisons). Host only.
  bool pdl = true;
  // The dQ convert runs bwd_convert_dq_lean_kernel (sm80/bwd_kernel.cuh: every load of a tile
  // in flight, the same bits) instead of bwd_convert_dq_kernel (for A/B comparisons). Host only.
  bool convert_lean = false;
  // Hopper backwards on the dq_warp instances (dense, d64 / d128, no mods / bias): the first
  // visitor of each query tile (and chain) stores its dQ instead of adding it, so the
  // preprocess does not zero dq_accum (sm90/bwd_producer.cuh dq_order_warp; for A/B). Host
  // only: run_bwd_sm90 turns it into dq_first_store_rows for the calls it applies to.
  bool dq_first_store = false;
  // Set by run_bwd_sm90 (0 elsewhere): the main kernel's query tile rows (64 or 128) when the
  // first visitors store; then the preprocess does not zero dq_accum and the (lean) convert
  // reads a chain's tile only where its counter shows a visitor (else it adds 0).
  int dq_first_store_rows = 0;
  // Builds with fp32wg: float32 backwards that the Hopper float32 backward supports
  // (fp32/wg_bwd_kernel.cuh; flash_api_bwd.cpp fp32wg_bwd_supports) run it on sm_90 GPUs
  // (FLASHATTN2_FP32WG_BWD, on by default in Python: an A/B switch). Host only.
  bool fp32wg_bwd = false;
  // Builds with fp32wg: float32 backwards at kernel head dim 128 that the d128 Hopper float32
  // backward supports (fp32/wg_bwd128_kernel.cuh; flash_api_bwd.cpp fp32wg_bwd128_supports) run
  // it on sm_90 GPUs (FLASHATTN2_FP32WG_BWD128, on by default in Python: an A/B switch).
  // Host only.
  bool fp32wg_bwd128 = false;
  // A bias's gradient (dbias) may run the Hopper backward (its kDbias instance, where
  // sm90/bwd_config.h sm90_bwd_takes_bias allows); false: the mma.sync backward writes it (for
  // A/B comparisons). Host only.
  bool sm90_dbias = false;
  // Float32: the Hopper float32 backwards' single-TF32 instances (FwdParams::fp32_tf32). Host
  // only.
  bool fp32_tf32 = false;
};

// KV-cache update before attending (flash_attn_with_kvcache): new keys/values are written
// into the cache at rows cache_seqlens[b] ... of batch b, optionally with rotary embedding
// applied to the keys and to q (rotated q goes to q_out). Rows beyond the cache capacity are
// not written. Rotary position of new key i: its cache row cache_seqlens[b] + i (as
// flash-attn: left padding is not subtracted); of query row i: the same with i
// (q_positions_increment) or 0.
struct AppendKvParams {
  const void* k_new;  // (batch, seqlen_new, nheads_k, headdim)
  const void* v_new;
  void* k_cache;      // (cache batch or page, row, nheads_k, headdim)
  void* v_cache;
  int64_t knew_batch_stride, knew_row_stride, knew_head_stride;
  int64_t vnew_batch_stride, vnew_row_stride, vnew_head_stride;
  int64_t kc_batch_stride, kc_row_stride, kc_head_stride;
  int64_t vc_batch_stride, vc_row_stride, vc_head_stride;
  const int* cache_seqlens;  // (batch,)
  const int* kv_batch_idx;   // (batch,) or null (contiguous cache only)
  const int* block_table;    // (batch, max_pages) or null
  int64_t block_table_batch_stride;
  int page_size_log2;
  int num_pages;       // entries clamped to [0, num_pages) as in SeqLayout
  int cache_capacity;  // rows per cache batch entry (max_pages * page_size when paged)

  // Rotary (rotary_dim == 0: none). cos/sin (seqlen_ro, rotary_dim / 2), q's dtype.
  const void* rotary_cos;
  const void* rotary_sin;
  int64_t rotary_row_stride;
  int rotary_dim, seqlen_ro;
  bool interleaved;
  const void* q;  // (batch, seqlen_q, nheads, headdim), rotated into q_out (contiguous)
  void* q_out;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int seqlen_q, nheads;
  bool q_positions_increment;

  int batch, seqlen_new, nheads_k, headdim;
  DType dtype;
};

// Rotary embedding of x into out (rotary_kernel.cuh): out = x with channel pairs of the
// first rotary_dim channels of each head rotated by the angle of the token's position,
// (cos, sin) = row `position` of the tables (positions outside [0, seqlen_ro): unrotated).
// Dense: x (batch, seqlen, nheads, headdim), token i of batch b at position i + offset[b].
// Varlen (cu_seqlens): x (seqlen = total, nheads, headdim) with batch stride 0; token t
// belongs to the last sequence b < batch with cu_seqlens[b] <= t and sits at position
// t - cu_seqlens[b] + offset[b]. offset[b] = seqlen_offsets[b], or seqlen_offset if null.
// out == x: in place (equal strides; channels past rotary_dim are not touched).
struct RotaryParams {
  const void* x;
  void* out;
  int64_t x_batch_stride, x_row_stride, x_head_stride;  // elements; the channel stride is 1
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  const void* cos;  // (seqlen_ro, rotary_dim / 2), cs_dtype, unit channel stride
  const void* sin;
  int64_t cos_row_stride, sin_row_stride;
  const int* cu_seqlens;      // (batch + 1,) or null
  const int* seqlen_offsets;  // (batch,) or null
  int64_t seqlen_offset;
  int batch, seqlen, nheads, headdim, rotary_dim, seqlen_ro;
  bool interleaved;
  bool conjugate;  // rotate by the opposite angle (sin negated): the backward
  DType dtype, cs_dtype;
};

// The dropout keep mask as a tensor (tests, return_attn_probs): mask[b, h, i, j] = 1 where
// the forward keeps element (b, h, i, j), else 0; contiguous uint8 (batch, nheads, sq, sk).
// flashattn2.merge (merge_kernel.cuh): two attention results over disjoint key sets,
// (out_a, lse_a) and (out_b, lse_b), merged by their LSE into (out, lse). out_* are
// (batch, seqlen, nheads, headdim) of element type dtype_* (0 float16, 1 bfloat16,
// 2 float32); lse_* float32 (batch, nheads, seqlen). Strides in elements, any values (the
// kernel uses 4-wide loads where every tensor allows them); out / lse may alias the inputs.
struct MergeParams {
  const void* out_a;
  const void* out_b;
  void* out;
  const float* lse_a;
  const float* lse_b;
  float* lse;
  int64_t out_strides[3][4];  // [a, b, out][batch, row, head, col]
  int64_t lse_strides[3][3];  // [a, b, out][batch, head, row]
  int batch, seqlen, nheads, headdim;
  int dtype[3];  // [a, b, out]
};

struct DropoutMaskParams {
  uint8_t* mask;
  const int64_t* rng_state;
  int batch, nheads, seqlen_q, seqlen_k;
  uint32_t dropout_threshold;
};

// The forward's kernel instances by score modifier (fwd_kernel's kMods): kModSoftcap is
// softcap alone (no ALiBi, no dropout), only where fwd_softcap_instance() (fwd_config.h);
// kModSoftcapBounded the same without a running max (bf16, fwd_softcap_bounded());
// kModBias / kModBiasDropout are kModLogits / kModDropout with an attention bias
// (FLASHATTN2_BIAS builds only), so that the instances without a bias keep their registers.
enum FwdMods : int {
  kModNone = 0,
  kModLogits = 1,
  kModDropout = 2,
  kModSoftcap = 3,
  kModSoftcapBounded = 4,
  kModBias = 5,
  kModBiasDropout = 6
};

// True when an attention bias is given (BiasLayout; always false without FLASHATTN2_BIAS).
template <typename Params>
constexpr bool has_bias(const Params& p) {
#if FLASHATTN2_BIAS
  return p.attn_bias != nullptr;
#else
  return (void)p, false;
#endif
}

// True when every row of every (batch, head) plane of the bias starts on 16 bytes and its
// keys are contiguous (the staged bias of the Hopper forward).
template <typename Params>
bool bias_rows_16b(const Params& p) {
#if FLASHATTN2_BIAS
  return p.bias_col_stride == 1 && p.bias_row_stride % 8 == 0 && p.bias_head_stride % 8 == 0 &&
         p.bias_batch_stride % 8 == 0 && reinterpret_cast<uintptr_t>(p.attn_bias) % 16 == 0;
#else
  return (void)p, false;
#endif
}

// True when any score modifier is on (the kernels then run their kMods instance).
template <typename Params>
bool has_score_mods(const Params& p) {
  return p.softcap > 0.f || p.alibi_slopes != nullptr || p.dropout_threshold != 0 || has_bias(p);
}

// Dropout threshold of a probability p in [0, 1): an element is dropped iff its 32-bit
// Philox word is below floor(p * 2^32) (p * 2^32 is exact in double).
inline uint32_t dropout_threshold_of(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

}  // namespace flashattn2
