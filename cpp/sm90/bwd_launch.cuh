// Launcher of the Hopper backward (first version, GPU-validated 2026-11-25) for one (dtype, head dim);
// instantiated by the generated units bwd_sm90_<dtype>_hdim<D>.cu (built for sm_90a only)
// through FLASHATTN2_INSTANTIATE_BWD_SM90. The preprocess and dQ convert kernels are the
// sm80 backward's (run_bwd_preprocess / run_bwd_convert_dq, instantiated in the sm80 units:
// common/launch.h), so the workspaces are the same.
// BwdParams::pdl (this backward runs on sm_90 GPUs only: mha_bwd): the kernel and the convert
// are launched as programmatic dependents (launch_kernel) of the kernel before each, so that
// each one's launch and prologue overlap that kernel's tail: the preprocess lets its
// dependent start at once (griddep_launch_dependents), the kernel waits for it (griddep_wait)
// before its first access to dsum, dq_accum or the dQ-order counters and lets the convert
// start at once, and the convert waits before it reads dq_accum. The preprocess itself is
// launched plainly: it reads O and dO, which the kernels before it wrote.
#pragma once
#include <cuda_runtime.h>

#include "common/launch.h"
#include "sm90/bwd_kernel.cuh"
#include "sm90/tma_map.h"
#if FLASHATTN2_SM90_BWD_D256
#include "sm90/bwd_d256.cuh"
#endif

namespace flashattn2 {
namespace sm90 {

template <typename Traits, typename Element, bool kVarlen, bool kMods, bool kBias = false,
          bool kDqWarp = false, bool kFirstStore = false, int kDbias = kDbiasNone>
void launch_bwd(const BwdArgs& args, cudaStream_t stream) {
  constexpr auto kernel =
      bwd_kernel<Traits, Element, kVarlen, kMods, kBias, kDqWarp, kFirstStore, kDbias>;
  constexpr int kSmem = Traits::smem_bytes(kBias);
  raise_smem_limit<kernel>(kSmem, "cudaFuncSetAttribute(sm90 bwd_kernel, smem)");
  // Causal: the first key blocks see the most query blocks and launch first.
  const BwdParams& p = args.p;
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.nheads_k, p.batch);
  launch_kernel(kernel, grid, Traits::kThreads, kSmem, stream, p.pdl, "sm90 bwd_kernel launch",
                args);
}

}  // namespace sm90

template <typename Element, int kHeadDim>
bool run_bwd_sm90(const BwdParams& p, cudaStream_t stream) {
#if FLASHATTN2_SM90_BWD_D256
  if constexpr (kHeadDim == 256) return sm90::run_bwd_sm90_d256<Element>(p, stream);
  else {
#endif
  using Traits = sm90::BwdTraits<kHeadDim>;
  sm90::BwdArgs args;
  args.p = p;
  const auto [rows_q, rows_k, batch_q, batch_k] = sm90::map_rows(p);  // varlen: one batch entry
  const bool mapped =
      sm90::make_tma_map(&args.q, p.q, p.dtype, p.headdim, rows_q, p.nheads, batch_q,
                         p.q_row_stride, p.q_head_stride, p.q_batch_stride, Traits::kBlockM) &&
      sm90::make_tma_map(&args.dout, p.dout, p.dtype, p.headdim, rows_q, p.nheads, batch_q,
                         p.do_row_stride, p.do_head_stride, p.do_batch_stride, Traits::kBlockM) &&
      sm90::make_tma_map(&args.k, p.k, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, Traits::kBlockN) &&
      sm90::make_tma_map(&args.v, p.v, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, Traits::kBlockN);
  if (!mapped) return false;
  // Only the instances a build can reach (sm90_bwd_supports) are compiled.
  constexpr bool kVarlenBuilt = FLASHATTN2_SM90_BWD_VARLEN != 0;
  constexpr bool kModsBuilt = FLASHATTN2_SM90_BWD_MODS != 0;
  const bool varlen = kVarlenBuilt && (p.cu_seqlens_q || p.cu_seqlens_k);
  const bool mods = kModsBuilt && (p.softcap > 0.f || p.alibi_slopes);
  // An attention bias (dense, aligned rows: sm90_bwd_supports): its own instance; with its
  // gradient (BwdParams::sm90_dbias, no softcap: sm90_bwd_takes_bias) the kDbias one.
  constexpr bool kBiasBuilt = FLASHATTN2_BIAS && kModsBuilt;
  // dq_warp builds: calls without mods or a bias run the kDqWarp instances (p.dq_warp false:
  // the others, for A/B comparisons and the bitwise test).
  constexpr bool kDqWarpBuilt = Traits::kDqWarpBuilt;
  const bool dq_warp = kDqWarpBuilt && p.dq_warp;
  // dq_first_store: dense calls on the dq_warp instances only (the others zero dq_accum).
  const bool first_store = dq_warp && p.dq_first_store && !varlen && !mods && !has_bias(p);
  args.p.dq_first_store_rows = first_store ? Traits::kBlockM : 0;
  run_bwd_preprocess<Element, kHeadDim>(args.p, stream);
  constexpr int kDbiasElement = kBiasBuilt ? sm90::kDbiasElement : sm90::kDbiasNone;
  constexpr int kDbiasF32 = kBiasBuilt ? sm90::kDbiasF32 : sm90::kDbiasNone;
  constexpr int kDbiasF32Add = kBiasBuilt ? sm90::kDbiasF32Add : sm90::kDbiasNone;
  if (kBiasBuilt && has_dbias(p) && dbias_f32(p) && dbias_add(p))
    sm90::launch_bwd<Traits, Element, false, kBiasBuilt, kBiasBuilt, false, false, kDbiasF32Add>(
        args, stream);
  else if (kBiasBuilt && has_dbias(p) && dbias_f32(p))
    sm90::launch_bwd<Traits, Element, false, kBiasBuilt, kBiasBuilt, false, false, kDbiasF32>(
        args, stream);
  else if (kBiasBuilt && has_dbias(p))  // (in the attention's dtype: bwd_config.h)
    sm90::launch_bwd<Traits, Element, false, kBiasBuilt, kBiasBuilt, false, false,
                     kDbiasElement>(args, stream);
  else if (kBiasBuilt && has_bias(p))
    sm90::launch_bwd<Traits, Element, false, kBiasBuilt, kBiasBuilt>(args, stream);
  else if (varlen && mods)
    sm90::launch_bwd<Traits, Element, kVarlenBuilt, kModsBuilt>(args, stream);
  else if (varlen && dq_warp)
    sm90::launch_bwd<Traits, Element, kVarlenBuilt, false, false, kDqWarpBuilt>(args, stream);
  else if (varlen)
    sm90::launch_bwd<Traits, Element, kVarlenBuilt, false>(args, stream);
  else if (mods)
    sm90::launch_bwd<Traits, Element, false, kModsBuilt>(args, stream);
  else if (first_store)
    sm90::launch_bwd<Traits, Element, false, false, false, kDqWarpBuilt, kDqWarpBuilt>(args,
                                                                                     stream);
  else if (dq_warp)
    sm90::launch_bwd<Traits, Element, false, false, false, kDqWarpBuilt>(args, stream);
  else
    sm90::launch_bwd<Traits, Element, false, false>(args, stream);
  run_bwd_convert_dq<Element, kHeadDim>(args.p, p.pdl, stream);
  return true;
#if FLASHATTN2_SM90_BWD_D256
  }
#endif
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_BWD_SM90(Element, kHeadDim) \
  template bool flashattn2::run_bwd_sm90<Element, kHeadDim>(const flashattn2::BwdParams&, \
                                                              cudaStream_t);
