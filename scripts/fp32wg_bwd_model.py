"""Host model of the Hopper float32 backward (cpp/fp32/wg_bwd_kernel.cuh), no GPU.

Runs the kernel's own index arithmetic (copied by hand from wg_bwd_kernel.cuh: keep in step)
on numpy arrays, with scripts/fp32wg_model.py's pieces (tf32 split, fp32wg::swz, key_pos, the
NaN-filled byte image of shared memory, the 128-byte-swizzled K-major operand read from a
descriptor start address, bounds-checked global loads): per CTA (128 keys) the setup's K lo /
V lo / K^T stores (a thread per key), per step the producer's natural and transposed Q / dO
tiles (a thread per query row; the transposed ones read back from its natural stores) and lse
/ dsum, then per consumer warpgroup the five GEMMs as the wgmma read their operands (register
A fragments: K hi / V hi read back per lane from K^T hi and the setup's V hi scratch in sdS,
P^T / dS^T from the accumulator layout in the order (c0, c2, c1, c3)), the mask, dS^T's stores into sdS, the dQ^T reds into dq_accum (flat
indices, bounds-checked), the dK / dV epilogue. Products in float64: the model checks the
addressing (an index slip gives O(1) errors or NaN), not the tf32 rounding.

Checked on the way: every word of each tile region written exactly once per step (setup:
once per CTA), every element of every wgmma operand the descriptors address equal to the
split of the matrix element the kernel means there, no global load or red out of bounds.

  python3 scripts/fp32wg_bwd_model.py     # several shapes; prints the errors vs float64
"""
import sys

import numpy as np

from fp32wg_model import Gmem, Smem, key_pos, split, swz

D, BN, BM = 64, 128, 32  # Fp32WgBwdTraits<64>: kHeadDim, kBlockN, kBlockM
KB, QB, SB = BN * D * 4, BM * D * 4, BM * BN * 4  # kKBytes, kQBytes, kSBytes
THREADS = [(w, l) for w in range(4) for l in range(32)]  # a warpgroup's (warp, lane)


def kv_float4s(tid):
    """fp32wg::bwd_store_kv's (key, column) of each of consumer thread tid's float4s (kRows8:
    warp w's float4 u is unit w + 4 u of 8 keys x 16 columns, lane l at key + l % 8, column +
    4 (l / 8))."""
    t, depth = tid % 128, D * BN // 512
    units = [t // 32 + 4 * u for u in range(depth)]
    return [(8 * (x % (BN // 8)) + t % 8, 16 * (x // (BN // 8)) + 4 * (t % 32 // 8))
            for x in units]

hi_of = np.vectorize(lambda x: split(x)[0], otypes=[np.float32])
lo_of = np.vectorize(lambda x: split(x)[1], otypes=[np.float32])


def layout():
    """The kernel's shared-memory offsets (from the aligned base)."""
    o = {}
    at = 0
    for name, size in (("Klo", KB), ("Vlo", KB), ("KThi", KB), ("KTlo", KB), ("Qhi", QB),
                       ("Qlo", QB), ("dOhi", QB), ("dOlo", QB), ("QThi", QB), ("QTlo", QB),
                       ("dOThi", QB), ("dOTlo", QB), ("dShi", SB), ("dSlo", SB),
                       ("Lse", 4 * BM), ("Dsum", 4 * BM)):
        o[name] = at
        at += size
    return o, at


def acc_rows_cols(n):
    """(row, col) of accumulator register j of lane (g, q) in warp w, m64nNk8 f32."""
    return lambda w, g, q, j: (16 * w + g + 8 * ((j >> 1) & 1), 8 * (j >> 2) + 2 * q + (j & 1))


def to_regs(mat):
    """A [64 x N] accumulator matrix as the per-thread registers."""
    n = mat.shape[1]
    rc = acc_rows_cols(n)
    return {(w, l): np.array([mat[rc(w, l // 4, l % 4, j)] for j in range(n // 2)])
            for w, l in THREADS}


def from_regs(regs, n):
    mat = np.full((64, n), np.nan)
    rc = acc_rows_cols(n)
    for (w, l), r in regs.items():
        for j in range(n // 2):
            mat[rc(w, l // 4, l % 4, j)] = r[j]
    return mat


def frags_to_a(frag_hi, frag_lo, kk):
    """RS A operand [64 x 8] of k8 step kk from the lanes' fragments (a0 (g, q), a1 (g+8, q),
    a2 (g, q+4), a3 (g+8, q+4))."""
    ahi = np.full((64, 8), np.nan)
    alo = np.full((64, 8), np.nan)
    for (w, l) in THREADS:
        g, q = l // 4, l % 4
        for i in range(4):
            r, c = 16 * w + g + 8 * (i & 1), q + 4 * (i >> 1)
            ahi[r, c] = frag_hi[(w, l)][kk][i]
            if frag_lo is not None:
                alo[r, c] = frag_lo[(w, l)][kk][i]
    return ahi, alo


def acc_to_frags(regs, steps):
    """to_frags: an accumulator's registers as A fragments (c0, c2, c1, c3 per n8 tile), split."""
    order = [0, 2, 1, 3]
    fh, fl = {}, {}
    for t, r in regs.items():
        fh[t] = [[split(r[4 * nt + order[i]])[0] for i in range(4)] for nt in range(steps)]
        fl[t] = [[split(r[4 * nt + order[i]])[1] for i in range(4)] for nt in range(steps)]
    return fh, fl


def run_cta(q, k, v, o_, do, lse, dsum, dq_flat, batch, head_k, n_block, wr, scale):
    """One CTA; adds into dq_flat (dq_accum, (batch, head, row) * d + col, unscaled); returns
    its dK (scaled), dV rows [BN x hd] (NaN where not written)."""
    b, sq, h, hd = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = h // hk
    off, nbytes = layout()
    smem = Smem(nbytes)
    gq, gk, gv, gdo = Gmem(q), Gmem(k), Gmem(v), Gmem(do)
    n0 = n_block * BN
    offset = sk - sq
    m_block_max = (sq + BM - 1) // BM
    m_block_min = 0
    if wr >= 0:
        i_lo = n0 - offset - wr
        m_block_min = 0 if i_lo <= 0 else min(m_block_max, i_lo // BM)
    n_m = m_block_max - m_block_min
    n_steps = n_m * group
    kbase = batch * gk.batch_stride + head_k * gk.head_stride + n0 * gk.row_stride
    vbase = batch * gv.batch_stride + head_k * gv.head_stride + n0 * gv.row_stride

    # ---- setup: K lo, K^T hi / lo (threads 0-127), V lo and V hi into the dS scratch (128-255) ----
    before = smem.writes.copy()
    for tid in range(2 * BN):
        is_k = tid < 128
        g = Gmem(k) if is_k else Gmem(v)
        for key, c in kv_float4s(tid):
            base = (kbase if is_k else vbase) + key * g.row_stride
            x = g.load4(base, 0, key, sk - n0, c, hd, True)
            hs, ls = zip(*(split(e) for e in x))
            smem.st(off["Klo" if is_k else "Vlo"] + swz(BN, key, c), ls)
            if not is_k:
                smem.st(off["dShi"] + swz(BN, key, c), hs)
            if is_k:
                for e in range(4):
                    smem.st(off["KThi"] + swz(D, c + e, key), [hs[e]])
                    smem.st(off["KTlo"] + swz(D, c + e, key), [ls[e]])
    diff = smem.writes - before
    assert diff.max() == 1 and diff.sum() == 5 * KB // 4, "setup words written once"
    kt = np.zeros((BN, D), np.float32)
    vt = np.zeros((BN, D), np.float32)
    nk = max(0, min(BN, sk - n0))
    kt[:nk, :hd] = k[batch, n0:n0 + nk, head_k]
    vt[:nk, :hd] = v[batch, n0:n0 + nk, head_k]

    # consumer registers: K hi / V hi fragments per warpgroup, read back from K^T hi and the
    # V hi scratch (sdS hi and lo), each checked against the split of the element it means
    def hi_frags(c, src):
        fr = {}
        for (w, l) in THREADS:
            g_, q_ = l // 4, l % 4
            key0 = 64 * c + 16 * w + g_
            fr[(w, l)] = [[0.0] * 4 for _ in range(D // 8)]
            for kk in range(D // 8):
                for i in range(4):
                    key, col = key0 + 8 * (i & 1), 8 * kk + q_ + 4 * (i >> 1)
                    a = off["KThi"] + swz(D, col, key) if src is k else off["dShi"] + swz(BN, key, col)
                    want = split(src[batch, n0 + key, head_k, col] if n0 + key < sk and col < hd
                                 else 0.0)[0]
                    assert smem.w[a // 4] == want, "K hi / V hi fragment"
                    fr[(w, l)][kk][i] = smem.w[a // 4]
        return fr

    wgs = [dict(k_hi=hi_frags(c, k), v_hi=hi_frags(c, v), dk={t: np.zeros(D // 2) for t in THREADS},
                dv={t: np.zeros(D // 2) for t in THREADS}) for c in range(BN // 64)]
    for c in range(BN // 64):  # K lo / V lo / K^T operands of this warpgroup, every element
        for kk in range(D // 8):
            xa = (kk // 4) * (BN * 128) + 64 * c * 128 + (kk % 4) * 32
            sl = slice(8 * kk, 8 * kk + 8)
            assert np.array_equal(smem.operand(off["Klo"] + xa, 64), lo_of(kt[64 * c:64 * c + 64, sl]))
            assert np.array_equal(smem.operand(off["Vlo"] + xa, 64), lo_of(vt[64 * c:64 * c + 64, sl]))
        for ch in range(2):
            for kk in range(4):
                chunk = 2 * c + ch
                ka = chunk * (D * 128) + kk * 32
                keys = slice(32 * chunk + 8 * kk, 32 * chunk + 8 * kk + 8)
                assert np.array_equal(smem.operand(off["KThi"] + ka, 64), hi_of(kt[keys, :].T))
                assert np.array_equal(smem.operand(off["KTlo"] + ka, 64), lo_of(kt[keys, :].T))

    for t in range(n_steps):
        head = head_k * group + t // n_m
        m0 = (m_block_min + t % n_m) * BM
        rows = sq - m0
        ws_row0 = (batch * h + head) * sq
        # ---- producer ----
        before = smem.writes.copy()
        for tid in range(128):
            q_row, q_col = tid % BM, 4 * (tid // BM)
            col_step = 4 * (128 // BM)
            q_pos = key_pos(q_row)
            gQ = batch * gq.batch_stride + head * gq.head_stride + (m0 + q_row) * gq.row_stride + q_col
            gO = batch * gdo.batch_stride + head * gdo.head_stride + (m0 + q_row) * gdo.row_stride + q_col
            for src, (gm, base) in enumerate(((gq, gQ), (gdo, gO))):
                for i in range(D // col_step):
                    x = gm.load4(base, 0, q_row, rows, col_step * i, hd - q_col, True)
                    hs, ls = zip(*(split(e) for e in x))
                    o = swz(BM, q_row, q_col + col_step * i)
                    smem.st(off["dOhi" if src else "Qhi"] + o, hs)
                    smem.st(off["dOlo" if src else "Qlo"] + o, ls)
            if tid < BM:
                l_, s_ = (lse[batch, head, m0 + tid], dsum[ws_row0 + m0 + tid]) if tid < rows else (0.0, 0.0)
                smem.st(off["Lse"] + 4 * tid, [l_])
                smem.st(off["Dsum"] + 4 * tid, [s_])
        for tid in range(128):  # the transposed tiles, from the thread's own natural stores
            q_row, q_col = tid % BM, 4 * (tid // BM)
            col_step = 4 * (128 // BM)
            q_pos = key_pos(q_row)
            for i in range(D // col_step):
                off_n = swz(BM, q_row, q_col + col_step * i)
                for src, dst in (("Qhi", "QThi"), ("Qlo", "QTlo"), ("dOhi", "dOThi"), ("dOlo", "dOTlo")):
                    vals = smem.w[(off[src] + off_n) // 4:(off[src] + off_n) // 4 + 4]
                    for e in range(4):
                        smem.st(off[dst] + swz(D, q_col + col_step * i + e, q_pos), [vals[e]])
        diff = smem.writes - before
        span = slice(off["Qhi"] // 4, off["dShi"] // 4)
        assert (diff[span] == 1).all() and diff.sum() == 8 * QB // 4 + 2 * BM, "step words once"
        # the operands the descriptors address, every element
        qm = np.zeros((BM, D), np.float32)
        dom = np.zeros((BM, D), np.float32)
        nr = max(0, min(BM, rows))
        qm[:nr, :hd] = q[batch, m0:m0 + nr, head]
        dom[:nr, :hd] = do[batch, m0:m0 + nr, head]
        perm = [key_pos(x) for x in range(BM)]
        for name, mat in (("Q", qm), ("dO", dom)):
            for kk in range(D // 8):
                yb = (kk // 4) * (BM * 128) + (kk % 4) * 32
                sl = slice(8 * kk, 8 * kk + 8)
                assert np.array_equal(smem.operand(off[name + "hi"] + yb, BM), hi_of(mat[:, sl]))
                assert np.array_equal(smem.operand(off[name + "lo"] + yb, BM), lo_of(mat[:, sl]))
            mt = np.zeros((D, BM), np.float32)
            mt[:, perm] = mat.T  # query x at position key_pos(x)
            for hh in range(D // 32):
                for kk in range(BM // 8):
                    yb = hh * 32 * 128 + kk * 32
                    ref = mt[32 * hh:32 * hh + 32, 8 * kk:8 * kk + 8]
                    assert np.array_equal(smem.operand(off[name + "Thi"] + yb, 32), hi_of(ref))
                    assert np.array_equal(smem.operand(off[name + "Tlo"] + yb, 32), lo_of(ref))

        # ---- consumers ----
        scale_log2 = scale * np.log2(np.e)
        for c, wg in enumerate(wgs):
            wg_key0 = 64 * c

            def gemm_d(x_hi, x_lo_name, y):
                acc = np.zeros((64, BM))
                for kk in range(D // 8):
                    xa = (kk // 4) * (BN * 128) + wg_key0 * 128 + (kk % 4) * 32
                    yb = (kk // 4) * (BM * 128) + (kk % 4) * 32
                    alo = smem.operand(off[x_lo_name] + xa, 64).astype(np.float64)
                    ahi, _ = frags_to_a(x_hi, None, kk)
                    bhi = smem.operand(off[y + "hi"] + yb, BM).astype(np.float64)
                    blo = smem.operand(off[y + "lo"] + yb, BM).astype(np.float64)
                    acc += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
                return to_regs(acc)

            s_regs = gemm_d(wg["k_hi"], "Klo", "Q")
            edge = (m0 + BM > sq or n0 + BN > sk or (wr >= 0 and n0 + BN - 1 > m0 + offset + wr))
            for (w, l), r in s_regs.items():
                g_, q_ = l // 4, l % 4
                lane_key = wg_key0 + 16 * w + g_
                for nt in range(BM // 8):
                    a = 4 * (8 * nt + 2 * q_)
                    lse2 = smem.w[(off["Lse"] + a) // 4], smem.w[(off["Lse"] + a) // 4 + 1]
                    for e in range(4):
                        i = m0 + 8 * nt + 2 * q_ + (e & 1)
                        j = n0 + lane_key + 8 * (e >> 1)
                        vis = (not edge) or (i < sq and j < sk and (wr < 0 or j <= i + offset + wr))
                        x = r[4 * nt + e]
                        r[4 * nt + e] = 2.0 ** (x * scale_log2 - lse2[e & 1] * np.log2(np.e)) if vis else 0.0
            dp_regs = gemm_d(wg["v_hi"], "Vlo", "dO")
            before = smem.writes.copy()
            for (w, l), r in dp_regs.items():
                g_, q_ = l // 4, l % 4
                lane_key = wg_key0 + 16 * w + g_
                for nt in range(BM // 8):
                    a = 4 * (8 * nt + 2 * q_)
                    ds2 = smem.w[(off["Dsum"] + a) // 4], smem.w[(off["Dsum"] + a) // 4 + 1]
                    for e in range(4):
                        x = s_regs[(w, l)][4 * nt + e] * (r[4 * nt + e] - ds2[e & 1])
                        r[4 * nt + e] = x
                        hs, ls = split(x)
                        o = swz(BM, 8 * nt + 2 * q_ + (e & 1), lane_key + 8 * (e >> 1))
                        smem.st(off["dShi"] + o, [hs])
                        smem.st(off["dSlo"] + o, [ls])
            diff = smem.writes - before
            assert diff.max() == 1 and diff.sum() == 2 * 64 * BM, "dS words once"

            def gemm_q(acc_d, regs, y):
                """acc_d (per-thread [D / 2]) += the halves' fresh accumulators (acc_d[h 16 + i])."""
                fh, fl = acc_to_frags(regs, BM // 8)
                for hh in range(D // 32):
                    tt = np.zeros((64, 32))
                    for kk in range(BM // 8):
                        yb = hh * 32 * 128 + kk * 32
                        ahi, alo = frags_to_a(fh, fl, kk)
                        bhi = smem.operand(off[y + "Thi"] + yb, 32).astype(np.float64)
                        blo = smem.operand(off[y + "Tlo"] + yb, 32).astype(np.float64)
                        tt += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
                    for th, r in to_regs(tt).items():
                        acc_d[th][hh * 16:hh * 16 + 16] += r

            gemm_q(wg["dv"], s_regs, "dO")
            gemm_q(wg["dk"], dp_regs, "Q")
            # dQ^T over the warpgroup's keys
            tq = np.zeros((64, BM))
            for ch in range(2):
                for kk in range(4):
                    chunk = 2 * c + ch
                    ka = chunk * (D * 128) + kk * 32
                    sb = chunk * (BM * 128) + kk * 32
                    ahi = smem.operand(off["KThi"] + ka, 64).astype(np.float64)
                    alo = smem.operand(off["KTlo"] + ka, 64).astype(np.float64)
                    bhi = smem.operand(off["dShi"] + sb, BM).astype(np.float64)
                    blo = smem.operand(off["dSlo"] + sb, BM).astype(np.float64)
                    tq += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
            tq_regs = to_regs(tq)
            for (w, l), r in tq_regs.items():
                g_, q_ = l // 4, l % 4
                lane_d = 16 * w + g_
                for i in range(BM // 2):
                    row = 8 * (i // 4) + 2 * q_ + (i & 1)
                    d = lane_d + 8 * ((i // 2) & 1)
                    if m0 + row < sq and d < hd:
                        idx = (ws_row0 + m0) * hd + row * hd + d
                        assert 0 <= idx < dq_flat.size, "dq red out of bounds"
                        dq_flat[idx] += r[i]

    # ---- epilogue ----
    dk_out = np.full((BN, hd), np.nan)
    dv_out = np.full((BN, hd), np.nan)
    for c, wg in enumerate(wgs):
        dkr, dvr = wg["dk"], wg["dv"]
        for (w, l) in THREADS:
            g_, q_ = l // 4, l % 4
            lane_key = 64 * c + 16 * w + g_
            for r in range(2):
                j = n0 + lane_key + 8 * r
                if j < sk:
                    for dt in range(D // 8):
                        col = 8 * dt + 2 * q_
                        if col < hd:
                            dk_out[lane_key + 8 * r, col:col + 2] = dkr[(w, l)][4 * dt + 2 * r:4 * dt + 2 * r + 2] * scale
                            dv_out[lane_key + 8 * r, col:col + 2] = dvr[(w, l)][4 * dt + 2 * r:4 * dt + 2 * r + 2]
    return dk_out, dv_out


def reference(q, k, v, do, causal_wr, scale):
    """float64 attention forward and backward: out, lse (b, h, sq), dq, dk, dv."""
    b, sq, h, hd = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = h // hk
    Q = q.astype(np.float64).transpose(0, 2, 1, 3)
    K = np.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), g, axis=1)
    V = np.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), g, axis=1)
    dO = do.astype(np.float64).transpose(0, 2, 1, 3)
    S = Q @ K.transpose(0, 1, 3, 2) * scale
    if causal_wr >= 0:
        i = np.arange(sq)[:, None]
        j = np.arange(sk)[None, :]
        S = np.where(j > i + sk - sq + causal_wr, -np.inf, S)
    m = S.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    P = np.exp(S - m)
    l = P.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        P = np.where(l > 0, P / np.where(l > 0, l, 1), 0)
        lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1)), np.inf)
    O = P @ V
    dV = P.transpose(0, 1, 3, 2) @ dO
    dP = dO @ V.transpose(0, 1, 3, 2)
    Dsum = (dO * O).sum(-1, keepdims=True)
    dS = P * (dP - Dsum)
    dQ = dS @ K * scale
    dK = dS.transpose(0, 1, 3, 2) @ Q * scale
    dK = dK.reshape(b, hk, g, sk, hd).sum(2)
    dV = dV.reshape(b, hk, g, sk, hd).sum(2)
    t = lambda x: x.transpose(0, 2, 1, 3)
    return t(O), lse, t(dQ), t(dK), t(dV)


def check(b, sq, sk, h, hk, hd, wr, seed=0):
    """Runs every CTA of the problem; returns the max errors of dq, dk, dv vs float64."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, h, hd)).astype(np.float32)
    k = rng.standard_normal((b, sk, hk, hd)).astype(np.float32)
    v = rng.standard_normal((b, sk, hk, hd)).astype(np.float32)
    do = rng.standard_normal((b, sq, h, hd)).astype(np.float32)
    scale = hd ** -0.5
    O, lse, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, wr, scale)
    dsum = (O * do.astype(np.float64)).sum(-1).transpose(0, 2, 1).reshape(-1)  # (b, h, sq) rows
    lse32 = lse.astype(np.float32)
    dq_flat = np.zeros(b * h * sq * hd)
    dk = np.full(k.shape, np.nan)
    dv = np.full(v.shape, np.nan)
    for batch in range(b):
        for head_k in range(hk):
            for n_block in range((sk + BN - 1) // BN):
                dk_t, dv_t = run_cta(q, k, v, O, do, lse32, dsum.astype(np.float32), dq_flat,
                                     batch, head_k, n_block, wr, scale)
                n0 = n_block * BN
                nk = min(BN, sk - n0)
                dk[batch, n0:n0 + nk, head_k] = dk_t[:nk]
                dv[batch, n0:n0 + nk, head_k] = dv_t[:nk]
    dq = (dq_flat.reshape(b, h, sq, hd) * scale).transpose(0, 2, 1, 3)
    err = lambda a, r: np.abs(a - r).max() / max(1.0, np.abs(r).max())
    return err(dq, dq_ref), err(dk, dk_ref), err(dv, dv_ref)


CASES = [  # (b, sq, sk, h, hk, d, wr): wr 0 causal, -1 full
    (1, 33, 70, 1, 1, 64, -1),
    (1, 70, 33, 2, 1, 64, 0),
    (1, 40, 150, 2, 2, 40, 0),
    (2, 1, 129, 2, 1, 64, -1),
    (1, 97, 131, 3, 1, 56, 5),
]

if __name__ == "__main__":
    worst = 0.0
    for case in CASES:
        e = check(*case)
        worst = max(worst, *e)
        print(case, "dq %.2e dk %.2e dv %.2e" % e, flush=True)
    sys.exit(0 if worst < 1e-5 else 1)
