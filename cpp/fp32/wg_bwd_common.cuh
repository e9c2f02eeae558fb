// The pieces that fp32/wg_bwd_kernel.cuh (kernel head dim 64) and fp32/wg_bwd128_kernel.cuh
// (128) share: CTA coordinates and steps, barriers, the producer's natural tiles and read-back
// transpose, descriptors, the consumers' GEMMs, A fragments, dQ reds and hand-offs. Layouts
// and roles: wg_bwd_kernel.cuh's comment. Everything is forceinline and each kernel compiles
// to the SASS of its former own copy (cuobjdump, both units); the folds that changed it stay
// in the kernels (the masked exp2 of P^T, the dS^T split stores, the epilogues). kSingle (the
// kernels' single-TF32 instances, BwdParams::fp32_tf32): no lo parts stored or multiplied, and
// each GEMM one wgmma chain into its accumulator.
#pragma once
#include <cuda_runtime.h>

#include "common/flash.h"
#include "common/ptx.cuh"
#include "fp32/seq.cuh"
#include "fp32/tf32.cuh"
#include "fp32/wg_common.cuh"
#include "fp32/wg_config.h"
#include "sm90/mbarrier.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_tf32.cuh"

namespace flashattn2 {
namespace fp32wg {

// Probe builds only (-DFLASHATTN2_PROBE_TIMES: kProbeTimes; scripts/bwd_cta_times.py reads
// them): the CTA's 8 words at p.dq_accum (a buffer of the script's: these kernels add into dq
// itself, fp32_dq_direct): slots 0-4 clock64 at points of consumer thread 128 (entry, K / V
// in smem, step 0's tiles in, the K / V fragments in registers, exit); bwd_probe_end
// adds %smid | n_steps << 32 (slot 5) and %globaltimer at the start (6) and the end (7). Each
// written at once: nothing is held live across the walk.
#ifdef FLASHATTN2_PROBE_TIMES
constexpr bool kProbeTimes = true;
#else
constexpr bool kProbeTimes = false;
#endif
__device__ __forceinline__ uint64_t* bwd_probe_slots(const BwdParams& p) {
  const uint64_t cta =
      blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  return reinterpret_cast<uint64_t*>(p.dq_accum) + 8 * cta;
}
__device__ __forceinline__ uint64_t probe_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void bwd_probe(const BwdParams& p, int slot) {
  bwd_probe_slots(p)[slot] = uint64_t(clock64());
}
__device__ __forceinline__ void bwd_probe_start(const BwdParams& p) {
  bwd_probe(p, 0);
  bwd_probe_slots(p)[6] = probe_globaltimer();
}
__device__ __forceinline__ void bwd_probe_end(const BwdParams& p, int n_steps) {
  bwd_probe(p, 4);
  uint32_t smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  bwd_probe_slots(p)[5] = smid | uint64_t(n_steps) << 32;
  bwd_probe_slots(p)[7] = probe_globaltimer();
}

// The CTA's coordinates: keys [n0, n0 + kBlockN) of K / V head head_k (gK, gV: their first
// rows), batch; the query tiles [m_block_min, + n_m) that see one of its keys (bottom-right
// aligned right window; no left one), for each query head of the GQA group: n_steps steps.
struct BwdCta {
  int head_k, batch, group, seqlen_q, seqlen_k, n0, offset;
  int m_block_min, n_m, n_steps;
  const float* gK;
  const float* gV;
};
template <int kBlockM, int kBlockN, bool kTileMajor>
__device__ __forceinline__ BwdCta bwd_cta(const BwdParams& p) {
  BwdCta c;
  // (key block 0 sees the most queries: the first of a tile-major grid)
  const GridTile t = grid_tile(fp32wg_tile_major(kTileMajor, p.window_right, p.nheads_k,
                                                  (p.seqlen_k + kBlockN - 1) / kBlockN));
  c.head_k = t.head;
  c.batch = t.batch;
  c.group = p.nheads / p.nheads_k;
  c.seqlen_q = p.seqlen_q;
  c.seqlen_k = p.seqlen_k;
  c.n0 = t.tile * kBlockN;
  c.offset = c.seqlen_k - c.seqlen_q;
  const int m_block_max = (c.seqlen_q + kBlockM - 1) / kBlockM;
  c.m_block_min = 0;
  if (p.window_right >= 0) {
    const int i_lo = c.n0 - c.offset - p.window_right;
    c.m_block_min = i_lo <= 0 ? 0 : min(m_block_max, i_lo / kBlockM);
  }
  c.n_m = m_block_max - c.m_block_min;
  c.n_steps = c.n_m * c.group;
  c.gK = static_cast<const float*>(p.k) + c.batch * p.k_batch_stride + c.head_k * p.k_head_stride +
         int64_t(c.n0) * p.k_row_stride;
  c.gV = static_cast<const float*>(p.v) + c.batch * p.v_batch_stride + c.head_k * p.v_head_stride +
         int64_t(c.n0) * p.v_row_stride;
  return c;
}

// The CTA's K / V tiles, before the walk (the consumers' threads ct = 0 .. 255 while the
// producer builds step 0): ct < 128 copies K, else V, kDepth float4s each; all loaded at once
// (one memory latency), split; then stored: lo natural in sKlo / sVlo (kLo), K's hi and lo
// transposed in sKThi (kKTHi) and sKTlo (kKTLo), V's hi natural in sVhi (kVHi: where the caller
// then reads its register fragments from). The caller's barrier follows. Which float4s:
// - default (the d128 kernel's): a thread a row, key ct % kBlockN, the kHeadDim * kBlockN / 128
//   columns from (ct % 128) / kBlockN times that (a warp instruction: 32 rows, 32 L1 lines);
//   the K^T stores of a warp (32 keys, one d) hit one 128-byte row: 32 banks;
// - kRows8 (the d64 kernel's: its prologue 1.1-1.4 us shorter, the backward 1.4-1.6 % faster
//   in 3xTF32, NOTES' thirtieth session; the d128 units spill with it): a warp instruction 8
//   rows x 64 bytes (8 lines): warp w's float4 u is unit w + 4 u of the tile's (kBlockN / 8) x
//   (kHeadDim / 16) units of 8 keys x 16 columns (row-block minor), lane l at key + l % 8,
//   column + 4 (l / 8); the K^T stores 2-way (the lanes 8 columns apart share a bank).
template <int kBlockN, int kHeadDim, bool kLo, bool kKTHi, bool kKTLo, bool kVHi = false,
          bool kRows8 = false>
__device__ __forceinline__ void bwd_store_kv(const BwdParams& p, int ct, const float* gK,
                                             const float* gV, int rows, uint32_t sKlo,
                                             uint32_t sVlo, uint32_t sKThi, uint32_t sKTlo,
                                             uint32_t sVhi = 0) {
  using namespace sm90;
  constexpr int kCols = kHeadDim * kBlockN / 128;
  constexpr int kDepth = kCols / 4;
  static_assert(!kRows8 || (kBlockN % 8 == 0 && kHeadDim % 16 == 0 &&
                              4 * kDepth == kBlockN / 8 * (kHeadDim / 16)),
                "whole units of 8 keys x 16 columns, kDepth a warp");
  const bool is_k = ct < 128;
  // (one float4's stores)
  auto put = [&](int key, int c, float4 x) {
    const Split4 sp = split4(x);
    if constexpr (kLo) {
      st_shared_v4((is_k ? sKlo : sVlo) + swz<kBlockN>(key, c), sp.lo.x, sp.lo.y, sp.lo.z, sp.lo.w);
    }
    if constexpr (kVHi) {
      if (!is_k) st_shared_v4(sVhi + swz<kBlockN>(key, c), sp.hi.x, sp.hi.y, sp.hi.z, sp.hi.w);
    }
    if (is_k) {
      const float hi[4] = {sp.hi.x, sp.hi.y, sp.hi.z, sp.hi.w};
      const float lo[4] = {sp.lo.x, sp.lo.y, sp.lo.z, sp.lo.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kKTHi) st_shared(sKThi + swz<kHeadDim>(c + e, key), hi[e]);
        if constexpr (kKTLo) st_shared(sKTlo + swz<kHeadDim>(c + e, key), lo[e]);
      }
    }
  };
  float4 x[kDepth];
  if constexpr (kRows8) {
    const int t = ct % 128;
    auto key_of = [&](int u) { return 8 * ((t / 32 + 4 * u) % (kBlockN / 8)) + t % 8; };
    auto col_of = [&](int u) { return 16 * ((t / 32 + 4 * u) / (kBlockN / 8)) + 4 * (t % 32 / 8); };
    const float* g = is_k ? gK : gV;
    const int64_t stride = is_k ? p.k_row_stride : p.v_row_stride;
#pragma unroll
    for (int u = 0; u < kDepth; ++u) x[u] = load4(g, stride, key_of(u), rows, col_of(u), p.headdim);
#pragma unroll
    for (int u = 0; u < kDepth; ++u) put(key_of(u), col_of(u), x[u]);
  } else {
    const int key = ct % kBlockN, c0 = (ct % 128) / kBlockN * kCols;
    const float* g = is_k ? gK + int64_t(key) * p.k_row_stride : gV + int64_t(key) * p.v_row_stride;
#pragma unroll
    for (int u = 0; u < kDepth; ++u) x[u] = load4(g, 0, key, rows, c0 + 4 * u, p.headdim);
#pragma unroll
    for (int u = 0; u < kDepth; ++u) put(key, c0 + 4 * u, x[u]);
  }
  fence_proxy_async();
}

// The four mbarriers at bars: full_nat, full_tr (the producer's 128 threads), empty_nat (every
// consumer thread), empty_tr (a lane per consumer warp).
__device__ __forceinline__ void bwd_init_bars(uint32_t bars, int consumers) {
  sm90::mbar_init(bars, 128);
  sm90::mbar_init(bars + 8, 128);
  sm90::mbar_init(bars + 16, 128 * consumers);
  sm90::mbar_init(bars + 24, 4 * consumers);
  sm90::mbar_fence_init();
}

// The producer's staging of a step's raw rows (kStaged, bwd_store_natural): this thread's
// 16-byte chunks of Q and dO (as bwd_store_natural reads them: row q_row, columns q_col +
// kColStep i) and, threads below kBlockM, the lse / dsum of row tid, by cp.async (zero-filled
// past the rows and the head dim) into sRaw, one group: chunk i of Q at (i * 128 + tid) * 16
// (a warp's reads back are 512 contiguous bytes), dO's after Q's kBlockM * kHeadDim * 4 bytes,
// then lse [kBlockM], dsum [kBlockM]. Only this thread reads its chunks back, after its
// cp.async.wait_group: no barrier. Its size: fp32wg_bwd_raw_bytes (wg_bwd_config.h).
template <int kBlockM, int kHeadDim>
__device__ __forceinline__ void bwd_stage_natural(const BwdParams& p, int tid, int batch, int head,
                                                  int m0, int rows, int q_row, int q_col,
                                                  uint32_t sRaw) {
  constexpr int kColStep = 4 * (128 / kBlockM);
  constexpr int kIters = kHeadDim / kColStep;
  constexpr int kTile = kBlockM * kHeadDim * 4;
  const bool row_ok = q_row < rows;
  const int64_t r = m0 + (row_ok ? q_row : 0);  // (a valid address where nothing is read)
  const float* gQ = static_cast<const float*>(p.q) + batch * p.q_batch_stride +
                    head * p.q_head_stride + r * p.q_row_stride + q_col;
  const float* gdO = static_cast<const float*>(p.dout) + batch * p.do_batch_stride +
                     head * p.do_head_stride + r * p.do_row_stride + q_col;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const bool ok = row_ok && q_col + kColStep * i < p.headdim;
    const int c = ok ? kColStep * i : 0;
    ptx::cp_async_16(sRaw + (i * 128 + tid) * 16, gQ + c, ok);
    ptx::cp_async_16(sRaw + kTile + (i * 128 + tid) * 16, gdO + c, ok);
  }
  if (tid < kBlockM) {
    const bool ok = tid < rows;
    const int row = m0 + (ok ? tid : 0);
    ptx::cp_async_4(sRaw + 2 * kTile + 4 * tid,
                    p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + row, ok);
    ptx::cp_async_4(sRaw + 2 * kTile + 4 * (kBlockM + tid),
                    p.dsum + fp32_ws_row0(p, Fp32Seq<false>(p, batch), batch, head) + row, ok);
  }
  ptx::cp_async_commit();
}

// bwd_stage_natural of walk step t (its head and first query row from the CTA's walk).
template <int kBlockM, int kHeadDim>
__device__ __forceinline__ void bwd_stage_step(const BwdParams& p, const BwdCta& cta, int tid,
                                               int t, int q_row, int q_col, uint32_t sRaw) {
  const int head = cta.head_k * cta.group + t / cta.n_m;
  const int m0 = (cta.m_block_min + t % cta.n_m) * kBlockM;
  bwd_stage_natural<kBlockM, kHeadDim>(p, tid, cta.batch, head, m0, cta.seqlen_q - m0, q_row,
                                       q_col, sRaw);
}

// The producer's natural tiles of a step (a thread per query row q_row, columns q_col +
// kColStep i; rows = seqlen_q - m0, passed so that the kernels compile as with their own
// copies): Q's loads issued before the wait on empty_nat, dO's after Q's stores (16 data
// registers live, not 32), split, stored (hi, lo); lse / dsum rows to smem; full_nat arrived.
// kStaged: Q, dO, lse and dsum from this thread's staging in sRaw (bwd_stage_natural, issued a
// step earlier), not from global memory: the loads' latency off the step's path.
template <int kBlockM, int kHeadDim, bool kSingle, bool kStaged = false>
__device__ __forceinline__ void bwd_store_natural(const BwdParams& p, int tid, int batch, int head,
                                                  int m0, int rows, int t, int q_row, int q_col,
                                                  uint32_t sQhi, uint32_t sQlo, uint32_t sdOhi,
                                                  uint32_t sdOlo, uint32_t sLse, uint32_t sDsum,
                                                  uint32_t bar_empty_nat, uint32_t bar_full_nat,
                                                  uint32_t sRaw = 0) {
  constexpr int kColStep = 4 * (128 / kBlockM);
  constexpr int kIters = kHeadDim / kColStep;
  constexpr int kTile = kBlockM * kHeadDim * 4;
  using namespace sm90;
  if constexpr (kStaged) {
    // (chunk by chunk from shared memory after the wait: no data registers held across it)
    ptx::cp_async_wait<0>();  // (this thread's chunks of the step)
    mbar_wait(bar_empty_nat, (t & 1) ^ 1);
#pragma unroll
    for (int src = 0; src < 2; ++src)
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const uint32_t off = swz<kBlockM>(q_row, q_col + kColStep * i);
        const Split4 a = split4(ld_shared_float4(sRaw + src * kTile + (i * 128 + tid) * 16));
        st_shared_v4((src ? sdOhi : sQhi) + off, a.hi.x, a.hi.y, a.hi.z, a.hi.w);
        if constexpr (!kSingle) {
          st_shared_v4((src ? sdOlo : sQlo) + off, a.lo.x, a.lo.y, a.lo.z, a.lo.w);
        }
      }
  } else {
    const float* gQ = static_cast<const float*>(p.q) + batch * p.q_batch_stride +
                      head * p.q_head_stride + int64_t(m0 + q_row) * p.q_row_stride + q_col;
    const float* gdO = static_cast<const float*>(p.dout) + batch * p.do_batch_stride +
                       head * p.do_head_stride + int64_t(m0 + q_row) * p.do_row_stride + q_col;
    float4 x[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      x[i] = load4(gQ, 0, q_row, rows, kColStep * i, p.headdim - q_col);
    }
    mbar_wait(bar_empty_nat, (t & 1) ^ 1);
#pragma unroll
    for (int src = 0; src < 2; ++src) {
      if (src == 1) {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          x[i] = load4(gdO, 0, q_row, rows, kColStep * i, p.headdim - q_col);
        }
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const uint32_t off = swz<kBlockM>(q_row, q_col + kColStep * i);
        const Split4 a = split4(x[i]);
        st_shared_v4((src ? sdOhi : sQhi) + off, a.hi.x, a.hi.y, a.hi.z, a.hi.w);
        if constexpr (!kSingle) {
          st_shared_v4((src ? sdOlo : sQlo) + off, a.lo.x, a.lo.y, a.lo.z, a.lo.w);
        }
      }
    }
  }
  if (tid < kBlockM) {
    float lse = 0.f, dsum = 0.f;
    if constexpr (kStaged) {
      lse = ld_shared_float(sRaw + 2 * kTile + 4 * tid);
      dsum = ld_shared_float(sRaw + 2 * kTile + 4 * (kBlockM + tid));
    } else if (tid < rows) {
      lse = p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + m0 + tid];
      dsum = p.dsum[fp32_ws_row0(p, Fp32Seq<false>(p, batch), batch, head) + m0 + tid];
    }
    st_shared(sLse + 4 * tid, lse);
    st_shared(sDsum + 4 * tid, dsum);
  }
  fence_proxy_async();
  mbar_arrive(bar_full_nat);
}

// The producer's transposed tiles (Q^T, dO^T hi / lo, queries at q_pos) from this thread's own
// natural stores (only this thread rewrites them, at the next step), after the wait on
// empty_tr. src: Q hi, Q lo, dO hi, dO lo natural; dst: their transposes (kSingle: hi only).
template <int kBlockM, int kHeadDim, bool kSingle>
__device__ __forceinline__ void bwd_transpose_natural(int t, int q_row, int q_col, int q_pos,
                                                      const uint32_t (&src_n)[4],
                                                      const uint32_t (&dst_t)[4],
                                                      uint32_t bar_empty_tr) {
  constexpr int kColStep = 4 * (128 / kBlockM);
  constexpr int kIters = kHeadDim / kColStep;
  using namespace sm90;
  // Row q_col + kColStep i + e of a transposed tile has row q_col + e's swizzle phase
  // (kColStep % 8 == 0), so its offset is that row's plus kColStep i rows of 128 bytes: four
  // offsets a call, each store's row an immediate (was the swizzle math per store).
  static_assert(kColStep % 8 == 0, "one swizzle phase per e");
  uint32_t off_t[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) off_t[e] = swz<kHeadDim>(q_col + e, q_pos);
  mbar_wait(bar_empty_tr, (t & 1) ^ 1);
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const uint32_t off_n = swz<kBlockM>(q_row, q_col + kColStep * i);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      if (kSingle && (a & 1)) continue;  // (the lo tiles)
      const float4 v = ld_shared_float4(src_n[a] + off_n);
      const float w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) st_shared(dst_t[a] + off_t[e] + kColStep * i * 128, w[e]);
    }
  }
}

// K-major descriptors (sm90/wgmma.cuh desc_k_major) of a step's tiles as one descriptor of
// the step's base plus the tile offset / 16 in its low word (the address field: 14 bits,
// smem < 256 KiB, no carry), not each built from its address: ~2 uniform instructions a
// descriptor instead of ~5. step_base: the kernel's, reset at each step (held by reference:
// a copy, or a function of it, changed the d64 kernel's SASS).
struct KDesc {
  const uint32_t& step_base;
  __device__ __forceinline__ uint64_t operator()(uint32_t addr) const {
    const uint64_t d0 = sm90::desc_k_major(step_base);
    return (d0 & ~uint64_t(0xffffffffu)) | uint32_t(uint32_t(d0) + ((addr - step_base) >> 4));
  }
};

// acc[64 keys x kBlockM] = X Y^T over d (X: the 64 rows from x_row0 of sXlo's kBlockN), two-
// level: per k8 step the three products (Xlo Yhi, Xhi Ylo, Xhi Yhi) into a fresh accumulator t,
// FADD into acc. kBufs 2: two t alternate, the FADD of one step under the next step's wgmma;
// 1: the FADD waits for the step's wgmma (16 registers fewer). kSingle: Xhi Yhi only, one
// chain over d into acc (sXlo, sYlo unread).
template <int kBlockM, int kBlockN, int kKSteps, int kBufs, bool kSingle>
__device__ __forceinline__ void gemm_d(float (&acc)[kBlockM / 2],
                                       const uint32_t (&x_hi)[kKSteps][4], const KDesc& kdesc,
                                       int x_row0, uint32_t sXlo, uint32_t sYhi, uint32_t sYlo) {
  using namespace sm90;
  constexpr int kS = kBlockM / 2;
  if constexpr (kSingle) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const uint32_t yb = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
      WgmmaTf32<kBlockM>::rs(acc, x_hi[kk], kdesc(sYhi + yb), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(acc);
  } else {
    float t[kBufs][kS];
    auto step = [&](float (&tt)[kS], int kk) {
      const uint32_t xa = (kk / 4) * (kBlockN * 128) + x_row0 * 128 + (kk % 4) * 32;
      const uint32_t yb = (kk / 4) * (kBlockM * 128) + (kk % 4) * 32;
      const uint64_t b_hi = kdesc(sYhi + yb);
      wgmma_fence();
      WgmmaTf32<kBlockM>::ss(tt, kdesc(sXlo + xa), b_hi, 0);
      WgmmaTf32<kBlockM>::rs(tt, x_hi[kk], kdesc(sYlo + yb), 1);
      WgmmaTf32<kBlockM>::rs(tt, x_hi[kk], b_hi, 1);
      wgmma_commit();
    };
    if constexpr (kBufs == 2) step(t[0], 0);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      if constexpr (kBufs == 2) {
        if (kk + 1 < kKSteps) {
          step(t[(kk + 1) % 2], kk + 1);
          wgmma_wait<1>();
        } else {
          wgmma_wait<0>();
        }
      } else {
        step(t[0], kk);
        wgmma_wait<0>();
      }
      float(&tk)[kS] = t[kk % kBufs];
      fence_regs(tk);
#pragma unroll
      for (int i = 0; i < kS; ++i) acc[i] = kk == 0 ? tk[i] : acc[i] + tk[i];
    }
  }
}

// acc_d[64 keys x d] += X^T (A fragments a_hi / a_lo, kQSteps k8 steps over the queries)
// sY^T ([d x queries], queries permuted): per kDkvN columns, the kQSteps x 3 products into a
// fresh accumulator, FADD into acc_d (never a tensor-core accumulator across steps).
// kPinFadd: each FADD pinned there by an empty asm, not sunk under the next columns' wgmma
// (d128: ptxas kept up to three fresh accumulators live and spilled dK / dV). kSingle: X^T hi
// sY^T hi only, one chain into acc_d (N = d: sY^T's rows of d are consecutive 128-byte rows).
template <int kHeadDim, int kQSteps, int kDkvN, bool kPinFadd, bool kSingle>
__device__ __forceinline__ void gemm_q(float (&acc_d)[kHeadDim / 2],
                                       const uint32_t (&a_hi)[kQSteps][4],
                                       const uint32_t (&a_lo)[kQSteps][4], const KDesc& kdesc,
                                       uint32_t sYThi, uint32_t sYTlo) {
  using namespace sm90;
  if constexpr (kSingle) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      WgmmaTf32<kHeadDim>::rs(acc_d, a_hi[kk], kdesc(sYThi + kk * 32), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(acc_d);
  } else {
#pragma unroll
    for (int h = 0; h < kHeadDim / kDkvN; ++h) {
      float t[kDkvN / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
        const uint32_t yb = h * kDkvN * 128 + kk * 32;
        const uint64_t b_hi = kdesc(sYThi + yb);
        WgmmaTf32<kDkvN>::rs(t, a_lo[kk], b_hi, kk > 0 ? 1 : 0);
        WgmmaTf32<kDkvN>::rs(t, a_hi[kk], kdesc(sYTlo + yb), 1);
        WgmmaTf32<kDkvN>::rs(t, a_hi[kk], b_hi, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(t);
#pragma unroll
      for (int i = 0; i < kDkvN / 2; ++i) {
        float& a = acc_d[h * (kDkvN / 2) + i];
        a += t[i];
        if constexpr (kPinFadd) asm volatile("" : "+f"(a)::"memory");
      }
    }
  }
}

// An accumulator [64 keys x 8 kQSteps] as A fragments (c0, c2, c1, c3 of each n8 tile), split.
template <int kQSteps>
__device__ __forceinline__ void acc_to_frags(const float (&x)[4 * kQSteps],
                                             uint32_t (&hi)[kQSteps][4],
                                             uint32_t (&lo)[kQSteps][4]) {
#pragma unroll
  for (int nt = 0; nt < kQSteps; ++nt) {
    constexpr int kOrder[4] = {0, 2, 1, 3};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const tf32::Split sp = tf32::split(x[4 * nt + kOrder[i]]);
      hi[nt][i] = sp.hi;
      lo[nt][i] = sp.lo;
    }
  }
}

// dQ^T [the lane's rows lane_d + 8 r of d x the step's queries]: value(i) of the accumulator
// register i times the softmax scale, red.global.add into dq itself (p.fp32_dq_direct: zeroed
// by the preprocess, no convert kernel), ragged tails skipped.
template <int kS, typename Value>
__device__ __forceinline__ void red_dq(const BwdParams& p, int batch, int head, int m0, int q,
                                       int lane_d, int seqlen_q, const Value& value) {
  float* dq = static_cast<float*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
              m0 * p.dq_row_stride;
#pragma unroll
  for (int i = 0; i < kS; ++i) {
    const int row = 8 * (i / 4) + 2 * q + (i & 1);  // the query (N)
    const int d = lane_d + 8 * ((i / 2) & 1);        // M
    if (m0 + row < seqlen_q && d < p.headdim) {
      atomicAdd(dq + row * p.dq_row_stride + d, value(i) * p.softmax_scale);
    }
  }
}

// One arrival a warp on bar (elect.sync picks the arriving lane, as in wg_kernel.cuh).
__device__ __forceinline__ void release_elected(uint32_t bar) {
  __syncwarp();
  uint32_t elected;
  asm volatile("{\n.reg .pred e;\nelect.sync _|e, 0xffffffff;\nselp.u32 %0, 1, 0, e;\n}\n"
               : "=r"(elected));
  if (elected) sm90::mbar_arrive(bar);
}

}  // namespace fp32wg
}  // namespace flashattn2
