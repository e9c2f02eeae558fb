#!/usr/bin/env python3
"""Budget model for a d256 Hopper backward (helper bwd256; numbers quoted in bwd256.md).

Per-SM rates (H100 SXM, per clock): tensor 2048 bf16 MAC (989 TFLOP/s at 1.83 GHz, 132 SMs),
shared memory 128 B. A wgmma m64nNk16 takes N / 2 tensor clocks and reads, from shared
memory, A 2 KiB (SS only) + B 32 N bytes (B read once per warpgroup). Everything per CTA
step (block_m query rows against block_n keys).
"""
KIB = 1024
SMEM_MAX = 227 * KIB


def wg(n, ss=True):
    """(tensor clocks, smem bytes) of one m64nNk16."""
    return n / 2, (2048 if ss else 0) + 32 * n


def step(name, gemms, extra_smem, block_m, block_n, d=256):
    """gemms: list of (count, N, ss); extra_smem: TMA writes, st.shared, staging, bytes."""
    t = sum(c * wg(n, ss)[0] for c, n, ss in gemms)
    s = sum(c * wg(n, ss)[1] for c, n, ss in gemms) + extra_smem
    macs = 5 * block_m * block_n * d
    assert abs(t - macs / 2048) < 1e-6, (name, t, macs / 2048)
    l2 = 2 * block_m * d * 2 + block_m * d * 4  # Q + dO loads, dQ f32 reduce-adds
    return dict(name=name, tensor=t, smem_bytes=s, smem_clk=s / 128, ratio=s / 128 / t,
                l2_per_mflop=l2 / (2 * macs / 1e6), l2=l2, mflop=2 * macs / 1e6)


def show(r):
    print(f"{r['name']:<44} tensor {r['tensor']:6.0f} clk  smem {r['smem_bytes'] / KIB:6.1f} KiB "
          f"= {r['smem_clk']:6.0f} clk  ratio {r['ratio']:.3f}  L2 {r['l2'] / KIB:5.0f} KiB/step "
          f"({r['l2_per_mflop'] / KIB:5.2f} KiB/MFLOP)  {r['mflop']:.2f} MFLOP/step")


tma = lambda bm, d: 2 * bm * d * 2  # Q + dO landing per step
rows = []
# Calibration: today's d128 kernel (block_n 128, block_m 64, two WGs of 64 keys, RS dV/dK,
# dq_bulk staging written and read by the bulk reduce).
rows.append(step("d128 today (n128 m64, calibration)",
                 [(2 * 2 * 8, 64, True),      # S^T, dP^T: per WG m64n64, k = 128 -> 8 each
                  (2 * 2 * 4, 128, False),    # dV, dK RS m64n128, k = 64 queries
                  (2 * 8, 64, True)],         # dQ m64n64 over 128 keys
                 tma(64, 128) + 128 * 64 * 2 + 2 * 64 * 128 * 4, 64, 128, d=128))
# A2 (recommended): n64 m64, WG c: S^T / dP^T of query half c (m64n32, k 256), P^T / dS^T
# halves to smem, dV_c / dK_c m64n128 (own half RS, partner's half SS), dQ[:, 128c..] m64n128.
rows.append(step("A2 n64 m64 query-split S/dP, dV/dK RS+SS",
                 [(2 * 2 * 16, 32, True),
                  (2 * 2 * 2, 128, False), (2 * 2 * 2, 128, True),
                  (2 * 4, 128, True)],
                 tma(64, 256) + 2 * 64 * 64 * 2, 64, 64))
rows.append(step("A2 same, dV/dK all SS",
                 [(2 * 2 * 16, 32, True), (2 * 2 * 4, 128, True), (2 * 4, 128, True)],
                 tma(64, 256) + 2 * 64 * 64 * 2, 64, 64))
# A1: WG0 computes S^T (m64n64 k256), WG1 dP^T; P^T / dS^T exchanged (WG1 also reads P^T
# values back, 8 KiB); each WG's dV_c / dK_c: one RS, one SS.
rows.append(step("A1 n64 m64 role-split S / dP",
                 [(16, 64, True), (16, 64, True),
                  (2 * 4, 128, False), (2 * 4, 128, True),
                  (2 * 4, 128, True)],
                 tma(64, 256) + 2 * 64 * 64 * 2 + 64 * 64 * 2, 64, 64))
# A3: S^T / dP^T split by the reduction (each WG k = 128 over its columns), f32 partials
# exchanged: 2 matrices x 64 x 64 f32 written and read by each WG.
rows.append(step("A3 n64 m64 K-split S/dP + f32 exchange",
                 [(2 * 2 * 8, 64, True), (2 * 2 * 4, 128, False), (2 * 4, 128, True)],
                 tma(64, 256) + 64 * 64 * 2 + 2 * 2 * (2 * 64 * 64 * 4), 64, 64))
# F: FA3's sm90 d256 tile: block_n 80, block_m 64; S = Q K^T m64 n40 per WG (keys split);
# dV^T / dK^T swapAB: per WG 2 m64 atoms (128 columns) x n80, k 64, SS; dQ^T swapAB per WG 2
# atoms x n64, k 80 (5 k16), SS; P and dS stored (bf16), dQ by atomics from registers.
rows.append(step("F FA3 n80 m64 (swapAB dKV / dQ, all SS)",
                 [(2 * 2 * 16, 40, True), (2 * 2 * 2 * 4, 80, True), (2 * 2 * 5, 64, True)],
                 tma(64, 256) + 2 * 64 * 80 * 2, 64, 80))
# B: one consumer WG, n64, two passes over 128-column halves: S^T / dP^T twice (7 units).
for r in rows:
    show(r)

print("\nB (one WG, two passes): tensor work 7/5 of A2 per useful FLOP; Q/dO loaded twice:")
l2_b = 2 * (2 * 64 * 256 * 2) + 64 * 256 * 4
print(f"  L2 {l2_b / KIB:.0f} KiB per {2 * 5 * 64 * 64 * 256 / 1e6:.2f} useful MFLOP "
      f"(A2: {rows[1]['l2'] / KIB:.0f})")

# ---- shared memory (bytes) ----
print("\nshared memory")


def smem(name, parts):
    tot = sum(v for _, v in parts)
    print(f"  {name}: " + ", ".join(f"{k} {v / KIB:g}" for k, v in parts) +
          f" -> {tot} B = {tot / KIB:.2f} KiB of 227 ({SMEM_MAX - tot:+d} B)")


bar = 8 * (1 + 4 * 2) + 8  # kv_full, 4 per stage x 2 stages, dQ counter slot
smem("A2/A1 n64 m64 2 stages, sP+sdS x2",
     [("K+V", 2 * 64 * 256 * 2), ("Q+dO x2", 2 * 2 * 64 * 256 * 2), ("sP+sdS x2", 2 * 2 * 64 * 64 * 2),
      ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])
smem("A2 n64 m64 2 stages, sP+sdS x1",
     [("K+V", 2 * 64 * 256 * 2), ("Q+dO x2", 2 * 2 * 64 * 256 * 2), ("sP+sdS x1", 2 * 64 * 64 * 2),
      ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])
smem("A2 sP+sdS x1 + dq_bulk staging (8 warps x 16x128 f32)",
     [("K+V", 2 * 64 * 256 * 2), ("Q+dO x2", 2 * 2 * 64 * 256 * 2), ("sP+sdS x1", 2 * 64 * 64 * 2),
      ("dQ staging", 8 * 16 * 128 * 4), ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])
smem("n64 m128 (Q/dO 1 stage)",
     [("K+V", 2 * 64 * 256 * 2), ("Q+dO x1", 2 * 128 * 256 * 2), ("sP+sdS x1", 2 * 64 * 128 * 2),
      ("LSE/dsum", 2 * 128 * 4), ("bars", bar), ("align", 1024)])
smem("F n80 m64, Q x2, dO x1, P/dS x1 (FA3)",
     [("K+V", 2 * 80 * 256 * 2), ("Q x2", 2 * 64 * 256 * 2), ("dO x1", 64 * 256 * 2),
      ("P+dS", 2 * 64 * 80 * 2), ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])
smem("F n80 m64 with dO x2",
     [("K+V", 2 * 80 * 256 * 2), ("Q+dO x2", 2 * 2 * 64 * 256 * 2), ("P+dS", 2 * 64 * 80 * 2),
      ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])
smem("column-split CTAs (d128 kernel, n128, full-width K/V/Q/dO, 2 stages)",
     [("K+V", 2 * 128 * 256 * 2), ("Q+dO x2", 2 * 2 * 64 * 256 * 2), ("sdS x2", 2 * 128 * 64 * 2),
      ("LSE/dsum", 2 * 2 * 64 * 4), ("bars", bar), ("align", 1024)])

# ---- predictions ----
print("\npredictions (bf16, hidden 2048, 16k tokens; TFLOP/s)")
d128_hopper = {  # results/h100-bwd-2026-11-26-s6.json, flashattn2 d128 bf16 bwd
    (False, 512): 266, (False, 1024): 357, (False, 2048): 403, (False, 4096): 429,
    (False, 8192): 485, (False, 16384): 492, (True, 512): 165, (True, 1024): 258,
    (True, 2048): 334, (True, 4096): 383, (True, 8192): 437, (True, 16384): 492}
cudnn_d256 = {  # results/h100-bwd-final-2026-11-22.json, sdpa_cudnn d256 bf16 bwd
    (False, 512): 216, (False, 1024): 290, (False, 2048): 336, (False, 4096): 350,
    (False, 8192): 357, (False, 16384): 364, (True, 512): 155, (True, 1024): 236,
    (True, 2048): 295, (True, 4096): 338, (True, 8192): 378, (True, 16384): 376}
ours_mma = {  # same file, flashattn2 (mma.sync) d256
    (False, 512): 152, (False, 1024): 200, (False, 2048): 216, (False, 4096): 230,
    (False, 8192): 237, (False, 16384): 240, (True, 512): 125, (True, 1024): 161,
    (True, 2048): 189, (True, 4096): 208, (True, 8192): 230, (True, 16384): 241}
# L2: ncu of the d128 kernel, 8k full: L2 throughput 58.81 % at 2.749e12 FLOP / 5.17 ms = 532
# TFLOP/s (results/h100-ncu-bwd-d128-s8k-full-2026-11-26.txt). L2 % scales with L2 bytes per
# FLOP; usable up to U.
calib = rows[0]
l2_pct_per_tflops_d128 = 58.81 / 532
import math


def predict(r, util):
    """d128's measured TFLOP/s at the same length x (d128's smem / tensor ratio / this one's),
    capped by the L2 rate at which this design's L2 bytes reach `util` of the L2's peak."""
    smem_factor = calib["ratio"] / max(r["ratio"], 1.0)
    l2_scale = r["l2_per_mflop"] / calib["l2_per_mflop"]
    cap = 100 * util / (l2_pct_per_tflops_d128 * l2_scale)
    return {k: min(v * smem_factor, cap) for k, v in d128_hopper.items()}, cap, smem_factor


for r in rows[1:]:
    for util in (0.70, 0.85):
        pred, cap, sf = predict(r, util)
        geo = math.exp(sum(math.log(pred[k] / cudnn_d256[k]) for k in pred) / len(pred))
        worst = min(pred[k] / cudnn_d256[k] for k in pred)
        print(f"  {r['name']:<44} L2 usable {util:.0%}: cap {cap:4.0f}, smem factor {sf:.2f}, "
              f"vs cuDNN geomean {geo:.2f} (worst {worst:.2f})")
geo_mma = math.exp(sum(math.log(ours_mma[k] / cudnn_d256[k]) for k in ours_mma) / 12)
geo_cudnn = math.exp(sum(math.log(v) for v in cudnn_d256.values()) / 12)
print(f"  today (mma.sync) vs cuDNN geomean {geo_mma:.3f}; cuDNN d256 geomean {geo_cudnn:.0f} "
      f"TFLOP/s, 0.9x = {0.9 * geo_cudnn:.0f}")
print("\nA2 per-config (L2 usable 70 %):")
pred, cap, _ = predict(rows[1], 0.70)
for k in sorted(pred):
    print(f"  {'causal' if k[0] else 'full':6} {k[1]:5}: model {pred[k]:4.0f}  cuDNN {cudnn_d256[k]:3}"
          f"  -> {pred[k] / cudnn_d256[k]:.2f}x   (mma.sync today {ours_mma[k]})")
