"""The count behind the d128 float32 backward on tf32 wgmma (issue 21; no GPU): per design,
shared memory, registers, and per CTA step the tensor clocks and shared-memory bytes of every
wgmma plus the generic traffic (producer stores and read-back, exchanges between warpgroups),
then a predicted speed from one efficiency model fitted to two measured fp32wg kernels.

Machine (H100 SXM): tf32 dense 495 TFLOP/s = 2048 FLOP/clk/SM, so a wgmma m64nNk8 takes N/2
tensor clocks; shared memory 128 B/clk/SM. A wgmma reads its B operand (N x 8 x 4 bytes) from
shared memory, and SS also its A (64 x 8 x 4 = 2 KiB); RS takes A from registers.

Model: efficiency (fraction of the tf32 peak) = k / ratio, ratio = smem clocks / tensor clocks
of a step. Fitted: the d64 backward as built (ratio 1.10, measured 60-77 attention TFLOP/s =
36-47 %) gives k = 0.40-0.52; the d128 two-warpgroup forward (ratio 0.83, measured 93-102 =
56-62 %) gives k = 0.47-0.51: one k fits both. Attention TFLOP/s counts 5 GEMMs (bench.py:
backward = 2.5 x 4 s^2 d); 3xTF32 issues each GEMM 3 times.

  python3 scripts/fp32wg_bwd128_count.py
"""
PEAK, SMEM_BW, KIB = 495.0, 128, 1024
K_LO, K_HI = 0.40, 0.52


def gemm(k_steps, n, ss, rs, reps=1):
    """`reps` chains of k_steps k8 steps, each with `ss` SS and `rs` RS wgmma of width n:
    (tensor clocks, shared-memory bytes)."""
    calls = reps * k_steps
    return (calls * (ss + rs) * n // 2, calls * (ss * (2048 + 32 * n) + rs * 32 * n))


def step(wgs, extra_kib):
    """wgs: per consumer warpgroup a list of gemm() tuples. -> (tensor clk, smem clk)."""
    tensor = sum(c for wg in wgs for c, _ in wg)
    smem = sum(b for wg in wgs for _, b in wg) + extra_kib * KIB
    return tensor, smem / SMEM_BW


# Designs: per CTA step (name, [warpgroups' GEMMs], generic KiB, share of the 5 counted GEMMs
# the kernel does (None: a forward), smem KiB, registers per consumer thread).
def designs():
    d64 = [gemm(8, 32, 1, 2), gemm(8, 32, 1, 2),          # S^T, dP^T (K lo / V lo SS)
           gemm(4, 32, 0, 3, 2), gemm(4, 32, 0, 3, 2),    # dV, dK (2 halves of 32 cols)
           gemm(8, 32, 3, 0)]                             # dQ^T = K^T dS^T, M = d = 64
    fwd = [gemm(16, 32, 1, 2), gemm(4, 64, 0, 3, 2)]      # S (Q lo SS), P V (2 halves)
    # (a) kernel 1: 64 keys, BM 32; warpgroup 0 S^T + dV (K hi regs), 1 dP^T + dK (V hi).
    a1_wg = [gemm(16, 32, 1, 2), gemm(4, 64, 0, 3, 2)]
    # (a) kernel 2: 64 queries, BN 16; wg 0 S (Q hi regs) + dQ[:, :64], wg 1 dP + dQ[:, 64:].
    a2_wg = [gemm(16, 16, 1, 2), gemm(2, 64, 0, 3)]
    # R: 64 keys, BM 16; wg 0 S^T + dV + dQ^T rows 0-63 (K hi, K^T hi half in registers,
    # K lo / K^T lo SS), wg 1 dP^T + dK + dQ^T rows 64-127.
    r_wg = [gemm(16, 16, 1, 2), gemm(2, 64, 0, 3, 2), gemm(8, 16, 1, 2)]
    return [
        ("d64 as built (calibration)", [d64, d64], 96 + 32, 1.0,
         "225.3", "232: K hi, V hi 64 + dK, dV 64 + 64 peak"),
        ("d128 fwd 2wg (calibration)", [fwd, fwd], 64, None,
         "193.1", "216: Q hi 64 + O 64 + ~80"),
        ("(a) dK/dV kernel", [a1_wg, a1_wg], 128 + 64 + 16, 4 / 5,
         "K lo, V lo 64 + Q, dO nat 64 + ^T 64 + P^T 8 = 200", "~216: K hi 64 + dV 64 + 88"),
        ("(a) dQ kernel", [a2_wg, a2_wg], 48 + 16 + 24, 3 / 5,
         "Q lo, dO lo 64 + 2 stages x (K, V nat, K^T: 48) = 160", "~200: Q hi 64 + dQ/2 32 + ~100"),
        ("R: one kernel, role split", [r_wg, r_wg], 32 + 32 + 32 + 8 + 8, 1.0,
         "K lo, V lo, K^T lo 96 + Q, dO nat 32 + ^T 32 (64 if padded) + P^T 4 + dS 8 = 172-204",
         "~224: K hi 64 + K^T hi half 32 + dV 64 + 64 peak"),
        ("R, ^T tiles from a 2nd L2 load", [r_wg, r_wg], 32 + 32 + 8 + 8, 1.0,
         "as R", "as R (producer: 16 float4 in flight)"),
    ]


def main():
    print(f"{'design':32} {'tensor clk':>10} {'smem clk':>9} {'ratio':>6} {'eff':>10}"
          f" {'attn TFLOP/s':>13}")
    rows = {}
    for name, wgs, extra, share, smem, regs in designs():
        tensor, smem_clk = step(wgs, extra)
        ratio = smem_clk / tensor
        eff = (K_LO / ratio, K_HI / ratio)
        # (one-kernel designs only: 3 tensor FLOPs per counted FLOP; (a)'s two kernels below)
        tf = tuple(PEAK * e / 3 for e in eff) if share == 1.0 else None
        rows[name] = eff
        tf_s = "" if tf is None else f"{tf[0]:5.0f}-{tf[1]:.0f}"
        print(f"{name:32} {tensor:10d} {smem_clk:9.0f} {ratio:6.2f} {eff[0]:4.2f}-{eff[1]:.2f}"
              f" {tf_s:>13}")
        print(f"    smem KiB: {smem}; registers/thread: {regs}")
    # (a): the two kernels one after the other; kernel i spends (gemms_i x 3) / eff_i.
    e1, e2 = rows["(a) dK/dV kernel"], rows["(a) dQ kernel"]
    a = [PEAK / 3 * 5 / (4 / e1[i] + 3 / e2[i]) for i in (0, 1)]
    print(f"(a) both kernels: {a[0]:.0f}-{a[1]:.0f} attention TFLOP/s")
    print("targets: today (mma.sync) 32.9-33.7; SDPA-efficient 35.5-36.2; SDPA-math 41.9-44.6;"
          " 2x math 84-89")
    need5, need7 = 87 * 3 / PEAK, 87 * 3 * 7 / 5 / PEAK
    print(f"87 TFLOP/s needs {need5:.0%} of the tf32 peak with 5 GEMMs, {need7:.0%} with 7")


if __name__ == "__main__":
    main()
