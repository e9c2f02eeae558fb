"""Where the LSE error of the float32 forwards comes from (numpy, no GPU): the kernels' online
softmax (cpp/fp32/wg_kernel.cuh, fp32/fwd_kernel.cuh) emulated in float32 per key tile, per
thread (4 lanes a row, 2 keys of each n8 tile), against float64 log-sum-exp, for S exact or
S from the 3xTF32 two-level scheme (per k8 step three products into a fresh accumulator,
rounded to nearest or truncated after each wgmma / k4 group, then FADD).

The correction factor of the running sum, exp2(row_max scale_log2 - m scale_log2), contracted
to an FFMA, is exp2 of the rounding error of m scale_log2 (~1e-7) when the max is unchanged:
1 +- 1 ulp at every key tile, a random walk of the sum (O drifts alike and cancels in O / sum;
the LSE does not). exp2((row_max - m) scale_log2) is exactly 1 then.

  python3 scripts/fp32wg_lse.py [rows] [keys] [d] [--s-model]
"""
import sys

import numpy as np
from fp32wg_model import tf32

f32, f64 = np.float32, np.float64


def rz(x):
    """float64 -> float32, rounded toward zero."""
    r = x.astype(f32)
    bad = np.abs(r.astype(f64)) > np.abs(x)
    r[bad] = np.nextafter(r[bad], f32(0))
    return r


def s_3xtf32(q, k, mode):
    """S (float32) as the kernel's two-level 3xTF32: mode rn / rz (after each wgmma) / rz4."""
    def split(x):
        hi = tf32(x)
        return hi, tf32((x - hi).astype(f32))
    (qh, ql), (kh, kl) = split(q), split(k)
    acc = None
    for kk in range(q.shape[1] // 8):
        c = slice(8 * kk, 8 * kk + 8)
        pairs = [(ql[:, c], kh[:, c]), (qh[:, c], kl[:, c]), (qh[:, c], kh[:, c])]
        t = np.zeros((q.shape[0], k.shape[0]), f32)
        if mode == "rn":
            t = sum(a.astype(f64) @ b.astype(f64).T for a, b in pairs).astype(f32)
        else:
            grp = 4 if mode == "rz4" else 8
            for a, b in pairs:
                for g0 in range(0, 8, grp):
                    g = slice(g0, g0 + grp)
                    t = rz(t.astype(f64) + a[:, g].astype(f64) @ b[:, g].astype(f64).T)
        acc = t if acc is None else (acc + t).astype(f32)
    return acc


def kernel_lse(s, scale, block_n, diff):
    """The kernels' LSE from raw scores s [rows, keys] (float32), key tiles from the last;
    diff: the correction as exp2((row_max - m) c), else exp2(fma(row_max, c, -fl(m c)))."""
    rows, keys = s.shape
    c = f32(f32(scale) * f32(1.4426950408889634))
    row_max = np.full(rows, -np.inf, f32)
    row_sum = np.zeros((rows, 4), f32)
    ex2 = lambda x: np.exp2(x.astype(f64)).astype(f32)  # (ex2.approx: ~2 ulp, not modelled)
    for j in range(keys // block_n - 1, -1, -1):
        st = s[:, j * block_n:(j + 1) * block_n]
        m = np.maximum(row_max, st.max(1))
        ms = (m * c).astype(f32)
        with np.errstate(invalid="ignore"):
            arg = ((row_max - m).astype(f32) * c).astype(f32) if diff else \
                (row_max.astype(f64) * c - ms).astype(f32)
        corr = ex2(np.where(np.isinf(row_max), -np.inf, arg))
        p = ex2((st.astype(f64) * c - ms[:, None]).astype(f32))
        for lane in range(4):
            part = np.zeros(rows, f32)
            for nt in range(block_n // 8):
                for e in range(2):
                    part = (part + p[:, 8 * nt + 2 * lane + e]).astype(f32)
            row_sum[:, lane] = (row_sum[:, lane].astype(f64) * corr + part).astype(f32)
        row_max = m
    tot = (row_sum[:, 0] + row_sum[:, 1]).astype(f32) + (row_sum[:, 2] + row_sum[:, 3])
    tot = tot.astype(f32)
    return (row_max * f32(scale)).astype(f32) + np.log(tot).astype(f32)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows, keys, d = (int(a) for a in (args + ["1024", "4096", "128"][len(args):]))
    block_n = 32 if d > 64 else 64  # fp32wg's kBlockN
    rng = np.random.default_rng(0)
    q = rng.standard_normal((rows, d), dtype=f32)
    k = rng.standard_normal((keys, d), dtype=f32)
    scale = d ** -0.5
    s64 = q.astype(f64) @ k.astype(f64).T
    m = (s64 * scale).max(1)
    ref = m + np.log(np.exp(s64 * scale - m[:, None]).sum(1))
    s32 = (q @ k.T) * f32(scale)  # PyTorch-like float32
    m32 = s32.max(1)
    torch_like = (m32 + np.log(np.exp(s32 - m32[:, None]).sum(1, dtype=f32))).astype(f32)
    print(f"{rows} rows x {keys} keys, d{d}, kBlockN {block_n}: max |lse - float64|")
    print(f"  float32 (PyTorch-like)            {np.abs(torch_like - ref).max():.2e}")
    models = ["exact"] + (["rn", "rz", "rz4"] if "--s-model" in sys.argv else [])
    for mode in models:
        s = s64.astype(f32) if mode == "exact" else s_3xtf32(q, k, mode)
        for diff in (False, True):
            err = np.abs(kernel_lse(s, scale, block_n, diff) - ref).max()
            name = "(row_max - m) c" if diff else "fma(row_max, c, -m c)"
            print(f"  S {mode:5s} correction {name:22s} {err:.2e}")


if __name__ == "__main__":
    main()
