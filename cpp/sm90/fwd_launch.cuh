// Launcher of the Hopper forward for one (dtype, head dim); instantiated by the generated
// units fwd_sm90_<dtype>_hdim<D>.cu (built for sm_90a only) through
// FLASHATTN2_INSTANTIATE_FWD_SM90.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>

#include "common/launch.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/tma_map.h"

namespace flashattn2 {

// The launch for one step order (kOrder: fwd_kernel.cuh FwdTraits kOrder_; not 0 for plain
// dense attention in one split only, run_fwd_sm90 checks).
template <typename Element, int kHeadDim, int kOrder>
bool run_fwd_sm90_order(const FwdParams& p, int num_sms, cudaStream_t stream) {
  using Traits = sm90::FwdTraits<kHeadDim, kOrder>;
  sm90::FwdArgs args;
  args.p = p;
  const auto [rows_q, rows_k, batch_q, batch_k] = sm90::map_rows(p);
  const bool mapped =
      sm90::make_tma_map(&args.q, p.q, p.dtype, p.headdim, rows_q, p.nheads, batch_q,
                         p.q_row_stride, p.q_head_stride, p.q_batch_stride, Traits::kBlockM) &&
      sm90::make_tma_map(&args.k, p.k, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k,
                         p.k_row_stride, p.k_head_stride, p.k_batch_stride, Traits::kBlockN) &&
      sm90::make_tma_map(&args.v, p.v, p.dtype, p.headdim, rows_k, p.nheads_k, batch_k,
                         p.v_row_stride, p.v_head_stride, p.v_batch_stride, Traits::kBlockN) &&
      sm90::make_tma_map(&args.o, p.o, p.dtype, p.headdim, rows_q, p.nheads, batch_q,
                         p.o_row_stride, p.o_head_stride, p.o_batch_stride, 64);
  if (!mapped) return false;
  // A persistent grid, one CTA per SM (or per tile if fewer) walking the tiles
  // (fwd_kernel.cuh), so that each tile's loads overlap the previous one's epilogue.
  // Tiles of equal work (dense, no window) take a static stride; causal, windowed and
  // varlen tiles are taken from a shared counter where the caller passes one (it does unless
  // told not to: fwd_config.h), which balances their work (a static walk gave d64 causal s2k
  // 236 instead of 348 TFLOP/s, benchmarks/NOTES.md). Without a counter, one CTA per tile:
  // the block scheduler balances them instead.
  args.m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t tiles = int64_t(args.m_blocks) * p.nheads * p.batch * p.num_splits;
  if (tiles >= (int64_t(1) << 31)) return false;
  args.tiles = int(tiles);
  const bool equal_tiles = p.window_left < 0 && p.window_right < 0 && !p.cu_seqlens_q &&
                           !p.cu_seqlens_k;
  args.tile_counter = equal_tiles ? nullptr : p.tile_counter;
  const bool persistent = equal_tiles || args.tile_counter != nullptr;
  const dim3 grid(unsigned(persistent ? std::min<int64_t>(tiles, num_sms) : tiles));
  // Equal tiles in one split with a workspace (o_accum) and flags (after tile_counter): the
  // last waves' key blocks shared out evenly (fwd_config.h sm90_fwd_stream_k).
  args.sk_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  const Sm90StreamK stream_k =
      equal_tiles && p.num_splits == 1 && p.o_accum && p.tile_counter
          ? sm90_fwd_stream_k(kHeadDim, tiles, num_sms, args.sk_blocks)
          : Sm90StreamK{0, 0};
  args.sk_first = stream_k.first;
  args.sk_units = stream_k.units;
  args.sk_partial = stream_k.units ? p.o_accum : nullptr;
  args.sk_flags = stream_k.units ? p.tile_counter + 1 : nullptr;
  auto launch = [&](auto mods, auto bias, auto bias_smem, auto stage_o, auto narrow_step) {
    constexpr bool kBiasSmem = decltype(bias_smem)::value;
    constexpr auto kernel =
        sm90::fwd_kernel<Traits, Element, decltype(mods)::value, decltype(bias)::value,
                         kBiasSmem, decltype(stage_o)::value, decltype(narrow_step)::value>;
    constexpr int kSmem = Traits::smem_bytes(kBiasSmem);
    raise_smem_limit<kernel>(kSmem, "cudaFuncSetAttribute(sm90 fwd_kernel, smem)");
    kernel<<<grid, Traits::kThreads, kSmem, stream>>>(args);
  };
  constexpr std::false_type no{};
  if constexpr (kOrder != 0) {
    // (One Q buffer, dense: O staged, as the default order's dense instance.)
    static_assert(Traits::kQBufs == 1, "the d > 128 step order stages O");
    launch(no, no, no, std::true_type{}, no);
  } else if (has_bias(p)) {  // (FLASHATTN2_BIAS builds only)
    if constexpr (FLASHATTN2_BIAS) {
      // The staged bias (d64, d128: where the tile fits) copies 16-byte chunks of 8 keys:
      // unit key stride, and every row of every (batch, head) plane 16-byte aligned; else one
      // global load per score.
      constexpr bool kStaged = Traits::kBiasSmemFits;
      if (kStaged && bias_rows_16b(p))
        launch(std::true_type{}, std::true_type{}, std::bool_constant<kStaged>{}, no, no);
      else
        launch(std::true_type{}, std::true_type{}, no, no, no);
    }
  } else if (has_score_mods(p)) {
    launch(std::true_type{}, no, no, no, no);
  } else if (Traits::kQBufs == 1 && (equal_tiles || p.sm90_stage_o)) {
    // One Q buffer (d192, d256): O staged in the tile's last K / V stage, so that the next
    // tile's Q loads under this one's last P V and epilogue (fwd_kernel.cuh kStageO; H100:
    // d256 full s512 / 1k +5-6 %, 2k-4k +1-3 %). Causal, windowed and varlen tiles only with
    // FLASHATTN2_SM90_STAGE_O=1 (causal s512 measured 0.96x, s4k 1.02x, with the tile
    // counter's claim at each tile's start; benchmarks/NOTES.md, ninth session).
    if constexpr (Traits::kQBufs == 1)
      launch(no, no, no, std::true_type{}, no);
  } else if (p.sm90_narrow_step && !equal_tiles && kHeadDim != 128) {
    // Causal, windowed and varlen tiles (FLASHATTN2_SM90_NARROW_STEP, on by default): a
    // warpgroup's first key step runs on the block's first 32 or 64 keys where it sees no
    // others (the causal diagonal, a right window, a key tail; fwd_kernel.cuh kNarrowStep).
    // H100 causal s512-2k: d64 +3-5 %, d256 +2-4 %; d128 0 to -2 %, so it keeps the plain
    // instance (benchmarks/NOTES.md, tenth session). Dense full attention was not measured.
    launch(no, no, no, no, std::true_type{});
  } else {
    launch(no, no, no, no, no);
  }
  check_cuda(cudaGetLastError(), "sm90 fwd_kernel launch");
  if (p.num_splits > 1) launch_combine<Element>(p, stream);
  return true;
}

template <typename Element, int kHeadDim>
bool run_fwd_sm90(const FwdParams& p, int num_sms, cudaStream_t stream) {
  // FA3's step order for d > 128 (fwd_config.h sm90_fwd_fa3_order; FLASHATTN2_SM90_FA3_ORDER=0
  // never takes it): plain dense full attention in one split, d256 from 2048 keys.
  if constexpr (sm90_fwd_fa3_order(kHeadDim, 1 << 30)) {
    if (p.sm90_fa3_order && sm90_fwd_fa3_order(kHeadDim, p.seqlen_k) && p.window_left < 0 &&
        p.window_right < 0 && !p.cu_seqlens_q && !p.cu_seqlens_k && p.num_splits == 1 &&
        !has_bias(p) && !has_score_mods(p))
      return run_fwd_sm90_order<Element, kHeadDim, 3>(p, num_sms, stream);
  }
  return run_fwd_sm90_order<Element, kHeadDim, 0>(p, num_sms, stream);
}

}  // namespace flashattn2

#define FLASHATTN2_INSTANTIATE_FWD_SM90(Element, kHeadDim)                 \
  template bool flashattn2::run_fwd_sm90<Element, kHeadDim>(const flashattn2::FwdParams&, int, \
                                                              cudaStream_t);
