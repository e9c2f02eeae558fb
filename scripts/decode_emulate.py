#!/usr/bin/env python3
"""CPU desk check of cpp/sm80/decode_kernel.cuh (no GPU): two numpy emulations.

1. Lanes: the shared-memory tiles and fragments the kernel uses with 16-row tiles for the
   first time -- its per-warp copy_rows (= load_tile_rows<16, d, 32>'s layout, checked),
   load_tile_rows<16, d, 128> (Q), tile.cuh's swizzle, LdsmTile<16> addresses for Q (A),
   K (B) and V (B, .trans), ldmatrix x4, mma m16n8k16 and acc_to_a (PTX ISA fragment
   layouts) -- against S = Q K^T and O = P V per lane, with zero-filled rows / columns and
   several ring stages.
2. Schedule: the split formula, the warps' round-robin 16-key tiles, window / causal tile
   ranges with packed GQA rows, per-warp online softmax in base 2, the warps' LSE merge and
   the split-KV combine -- against a plain softmax, rows without keys included.

    python3 scripts/decode_emulate.py
"""
import math

import numpy as np

rng = np.random.default_rng(1)
LOG2E = 1.4426950408889634


def swizzle(kRows, row, chunk):
    return (chunk >> 2) * (kRows * 32) + row * 32 + (((chunk & 3) ^ ((row >> 1) & 3)) << 3)


def tile_row(kRows, nthr, i, tid):
    return ((i * nthr + tid) >> 2) & (kRows - 1)


def tile_chunk(kRows, nthr, i, tid):
    idx = i * nthr + tid
    return (idx >> 2) // kRows * 4 + (idx & 3)


def load(smem, base_el, X, kRows, D, nthr, rows_valid, headdim):
    for tid in range(nthr):
        for i in range(kRows * D // 8 // nthr):
            r, c = tile_row(kRows, nthr, i, tid), tile_chunk(kRows, nthr, i, tid)
            pred = r < rows_valid and c * 8 < headdim
            off = base_el + swizzle(kRows, r, c)
            smem[off:off + 8] = X[r, c * 8:c * 8 + 8] if pred else 0


def copy_rows(smem, base_el, X, D, rows_valid, headdim):
    """decode_kernel.cuh's copy_rows: lane l, row slot s (row l / 4 + 8 s), chunks l % 4 + 4 m
    at swizzle(row, l % 4) + m segments."""
    for lane in range(32):
        for slot in range(2):
            r = lane // 4 + 8 * slot
            row_ok = r < rows_valid
            dst = base_el + swizzle(16, r, lane % 4)
            for m in range(D // 32):
                col = 8 * (4 * m + lane % 4)
                off = dst + m * 16 * 32
                smem[off:off + 8] = X[r, col:col + 8] if row_ok and col < headdim else 0


class Ldsm:
    def __init__(self, tile_addr, kRows, lane, k_major):
        r = ((lane >> 4) << 3) + (lane & 7) if k_major else lane & 15
        c = (lane >> 3) & 1 if k_major else lane >> 4
        self.kRows = kRows
        self.base = [tile_addr + (blk >> 1) * (kRows * 64) + 2 * swizzle(kRows, r, 2 * (blk & 1) + c)
                     for blk in (0, 1)]
    def plus(self, b):
        t = Ldsm.__new__(Ldsm); t.kRows = self.kRows; t.base = [x + b for x in self.base]; return t
    def __call__(self, i, cb):
        return self.base[cb & 1] + (cb >> 1) * (self.kRows * 64) + i * 1024


def ldmatrix(smem, addrs, trans=False):
    # addrs[lane] bytes; returns regs[lane][4] each a pair of values
    mats = [[smem[addrs[8 * m + r] // 2: addrs[8 * m + r] // 2 + 8] for r in range(8)] for m in range(4)]
    out = []
    for t in range(32):
        regs = []
        for m in range(4):
            M = np.array(mats[m])
            if trans: M = M.T
            regs.append((M[t // 4, 2 * (t % 4)], M[t // 4, 2 * (t % 4) + 1]))
        out.append(regs)
    return out


def mma(c, a, b0, b1):
    # c[lane][4], a[lane][4] pairs, b0/b1[lane] pairs; full warp op
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for t in range(32):
        g, q = t // 4, t % 4
        for e in range(2):
            A[g, 2 * q + e] = a[t][0][e]; A[g + 8, 2 * q + e] = a[t][1][e]
            A[g, 8 + 2 * q + e] = a[t][2][e]; A[g + 8, 8 + 2 * q + e] = a[t][3][e]
            B[2 * q + e, g] = b0[t][e]; B[8 + 2 * q + e, g] = b1[t][e]
    C = A @ B
    for t in range(32):
        g, q = t // 4, t % 4
        c[t][0] += C[g, 2 * q]; c[t][1] += C[g, 2 * q + 1]
        c[t][2] += C[g + 8, 2 * q]; c[t][3] += C[g + 8, 2 * q + 1]


def check(D, headdim, rows_q, keys_valid, stage):
    kStages = 3; kTile = 16 * D
    smem = np.zeros(16 * D + 4 * kStages * 2 * kTile)
    Q = rng.standard_normal((16, D)); K = rng.standard_normal((16, D)); V = rng.standard_normal((16, D))
    load(smem, 0, Q, 16, D, 128, rows_q, headdim)
    warp = 2
    ring = 16 * D + warp * kStages * 2 * kTile  # elements
    copy_rows(smem, ring + stage * 2 * kTile, K, D, keys_valid, headdim)
    copy_rows(smem, ring + stage * 2 * kTile + kTile, V, D, keys_valid, headdim)
    same = np.zeros(2 * kTile)  # the layout of load_tile_rows<16, D, 32>
    load(same, 0, K, 16, D, 32, keys_valid, headdim)
    load(same, kTile, V, 16, D, 32, keys_valid, headdim)
    assert np.array_equal(same, smem[ring + stage * 2 * kTile:ring + (stage + 1) * 2 * kTile])
    Qm = Q.copy(); Qm[rows_q:] = 0; Qm[:, headdim:] = 0
    Km = K.copy(); Km[keys_valid:] = 0; Km[:, headdim:] = 0
    Vm = V.copy(); Vm[keys_valid:] = 0; Vm[:, headdim:] = 0
    qt = [Ldsm(0, 16, l, False) for l in range(32)]
    kt = [Ldsm(2 * ring, 16, l, True).plus(stage * 2 * kTile * 2) for l in range(32)]
    vt = [Ldsm(2 * ring + 2 * kTile, 16, l, False).plus(stage * 2 * kTile * 2) for l in range(32)]
    acc_s = [[[0.0] * 4 for _ in range(32)] for _ in range(2)]
    for kk in range(D // 16):
        a = ldmatrix(smem, [qt[l](0, kk) for l in range(32)])
        b = ldmatrix(smem, [kt[l](0, kk) for l in range(32)])
        mma(acc_s[0], a, [b[t][0] for t in range(32)], [b[t][1] for t in range(32)])
        mma(acc_s[1], a, [b[t][2] for t in range(32)], [b[t][3] for t in range(32)])
    S = Qm @ Km.T
    for t in range(32):
        g, q = t // 4, t % 4
        for nt in range(2):
            for e in range(4):
                assert abs(acc_s[nt][t][e] - S[g + 8 * (e >> 1), 8 * nt + 2 * q + (e & 1)]) < 1e-9
    # P = S (any values), acc_to_a: a0=(lo0,lo1) a1=(lo2,lo3) a2=(hi0,hi1) a3=(hi2,hi3)
    pa = [[(acc_s[0][t][0], acc_s[0][t][1]), (acc_s[0][t][2], acc_s[0][t][3]),
           (acc_s[1][t][0], acc_s[1][t][1]), (acc_s[1][t][2], acc_s[1][t][3])] for t in range(32)]
    acc_o = [[[0.0] * 4 for _ in range(32)] for _ in range(D // 8)]
    for nb in range(D // 16):
        b = ldmatrix(smem, [vt[l](0, nb) for l in range(32)], trans=True)
        mma(acc_o[2 * nb], pa, [b[t][0] for t in range(32)], [b[t][1] for t in range(32)])
        mma(acc_o[2 * nb + 1], pa, [b[t][2] for t in range(32)], [b[t][3] for t in range(32)])
    O = S @ Vm
    for t in range(32):
        g, q = t // 4, t % 4
        for dt in range(D // 8):
            for e in range(4):
                assert abs(acc_o[dt][t][e] - O[g + 8 * (e >> 1), 8 * dt + 2 * q + (e & 1)]) < 1e-9


def kernel(q, k, v, pack, sq, wl, wr, splits, scale):
    # q: (16 rows, d) packed; k,v: (sk, d)
    sk = k.shape[0]; rows_q = sq * pack
    offset = sk - sq
    n_max = (sk + 15) // 16
    if wr >= 0:
        col_hi = sq - 1 + offset + wr
        n_max = 0 if col_hi < 0 else min(n_max, col_hi // 16 + 1)
    n_min = 0
    if wl >= 0:
        col_lo = offset - wl
        n_min = 0 if col_lo <= 0 else col_lo // 16
    n_min = min(n_min, n_max)
    parts = []
    for split in range(splits):
        lo, hi = n_min, n_max
        if splits > 1:
            per = -(-(hi - lo) // splits)  # (hi >= lo: the kernel clamps n_min to n_max)
            lo2 = min(hi, lo + split * per); hi2 = min(hi, lo2 + per); lo, hi = lo2, hi2
        ms, ls, os_ = [], [], []
        for w in range(4):
            n_mine = (hi - lo - w + 3) // 4 if hi - lo - w + 3 >= 0 else 0
            m = np.full(16, -np.inf); l = np.zeros(16); o = np.zeros((16, q.shape[1]))
            for j in range(n_mine):
                nb = hi - 1 - w - 4 * j
                assert lo <= nb < hi
                cols = nb * 16 + np.arange(16)
                s = q @ k[np.minimum(cols, sk - 1)].T
                for r in range(16):
                    i = r // pack
                    ch = min(sk - 1, i + offset + wr) if wr >= 0 else sk - 1
                    cl = i + offset - wl if wl >= 0 else 0
                    s[r, (cols < cl) | (cols > ch)] = -np.inf
                mn = np.maximum(m, s.max(1))
                msc = np.where(mn == -np.inf, 0, mn * scale * LOG2E)
                corr = np.exp2(m * scale * LOG2E - msc)
                p = np.exp2(s * scale * LOG2E - msc[:, None])
                l = l * corr + p.sum(1); o = o * corr[:, None] + p @ v[np.minimum(cols, sk - 1)]
                m = mn
            ms.append(np.where(l == 0, -np.inf, m * scale * LOG2E)); ls.append(l); os_.append(o)
        M = np.max(ms, 0)
        L = sum(np.where(mw == -np.inf, 0, lw * np.exp2(np.where(mw == -np.inf, 0, mw - M))) for mw, lw in zip(ms, ls))
        O = sum(np.where(mw[:, None] == -np.inf, 0, ow * np.exp2(np.where(mw == -np.inf, 0, mw - M))[:, None] / np.where(L == 0, 1, L)[:, None]) for mw, ow in zip(ms, os_))
        lse = np.where(L == 0, -np.inf, M * math.log(2) + np.log(np.where(L == 0, 1, L)))
        parts.append((O, lse))
    if splits == 1:
        O, lse = parts[0]; return O[:rows_q], np.where(lse == -np.inf, np.inf, lse)[:rows_q]
    lses = np.stack([p[1] for p in parts]); mx = lses.max(0)
    w = np.where(mx == -np.inf, 0, np.exp(lses - np.where(mx == -np.inf, 0, mx)))
    sw = w.sum(0)
    O = sum(w[s][:, None] * parts[s][0] for s in range(splits)) / np.where(sw == 0, 1, sw)[:, None]
    lse = np.where(sw == 0, np.inf, mx + np.log(np.where(sw == 0, 1, sw)))
    return O[:rows_q], lse[:rows_q]


def ref(q, k, v, pack, sq, wl, wr, scale):
    sk = k.shape[0]; rows = sq * pack; offset = sk - sq
    s = q[:rows] @ k.T * scale
    for r in range(rows):
        i = r // pack
        for j in range(sk):
            if (wr >= 0 and j > i + offset + wr) or (wl >= 0 and j < i + offset - wl): s[r, j] = -np.inf
    mx = s.max(1, keepdims=True); mxs = np.where(np.isinf(mx), 0, mx)
    e = np.exp(s - mxs); den = e.sum(1)
    o = e @ v / np.where(den == 0, 1, den)[:, None]
    lse = np.where(den == 0, np.inf, mxs[:, 0] + np.log(np.where(den == 0, 1, den)))
    return o, lse


def main():
    n = 0
    for D in (64, 128):
        for headdim in sorted({D, D - 8, D // 2 + 8}):
            for rows_q in (1, 4, 16):
                for keys in (1, 9, 16):
                    for stage in (0, 2):
                        check(D, headdim, rows_q, keys, stage)
                        n += 1
    print("lanes: cases passed:", n)
    bad = n = 0
    with np.errstate(invalid="ignore"):
        for sk in [1, 7, 16, 17, 100, 1000, 4097]:
            for pack, sq in [(1, 1), (4, 1), (4, 4), (8, 2), (16, 1), (1, 16)]:
                for wl, wr in [(-1, -1), (-1, 0), (50, 0), (5, 3), (300, -1)]:
                    for splits in [1, 3, 16]:
                        d = 8
                        q = np.zeros((16, d))
                        q[:sq * pack] = rng.standard_normal((sq * pack, d))
                        k, v = rng.standard_normal((sk, d)), rng.standard_normal((sk, d))
                        o, lse = kernel(q, k, v, pack, sq, wl, wr, splits, 0.3)
                        ro, rl = ref(q, k, v, pack, sq, wl, wr, 0.3)
                        n += 1
                        if not (np.allclose(o, ro, atol=1e-9) and np.allclose(lse, rl)):
                            bad += 1
                            print("MISMATCH", sk, pack, sq, wl, wr, splits)
    print("schedule: cases", n, "mismatches", bad)
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
