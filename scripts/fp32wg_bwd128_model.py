"""Host model of the d128 Hopper float32 backward (cpp/fp32/wg_bwd128_kernel.cuh), no GPU.

scripts/fp32wg_bwd_model.py's method for the d128 cut (index arithmetic copied by hand from
wg_bwd128_kernel.cuh: keep in step): per CTA (64 keys) the setup's K lo / V lo / K^T lo
stores (a thread per key and half of d), per step the producer's tiles (16 query rows;
transposed tiles in padded 128-byte rows), then warpgroup 0 (S^T, P^T into sPT, dV) and
warpgroup 1 (dP^T, P^T from sPT by its own thread index, dS^T into sdS, dK), and both
warpgroups' dQ^T rows of d (K^T hi from the lanes' fragments, K^T lo from smem) into
dq_accum; the dK / dV epilogue. Products in float64: the model checks the addressing.

Checked on the way: every word of each tile region written once per step (setup: once per
CTA), every element of every wgmma operand the descriptors address, sPT read back where it
was written, no global load or red out of bounds.

  python3 scripts/fp32wg_bwd128_model.py     # several shapes; prints the errors vs float64
"""
import sys

import numpy as np

from fp32wg_bwd_model import THREADS, acc_to_frags, frags_to_a, hi_of, lo_of, reference, to_regs
from fp32wg_model import Gmem, Smem, key_pos, split, swz

D, BN, BM = 128, 64, 16  # Fp32WgBwd128Traits<128>: kHeadDim, kBlockN, kBlockM
KB, QB, QTB, SB = BN * D * 4, BM * D * 4, 32 * D * 4, BM * BN * 4
DKVN = 64  # kDkvN


def layout():
    o, at = {}, 0
    for name, size in (("Klo", KB), ("Vlo", KB), ("KTlo", KB), ("Qhi", QB), ("Qlo", QB),
                       ("dOhi", QB), ("dOlo", QB), ("QThi", QTB), ("QTlo", QTB), ("dOThi", QTB),
                       ("dOTlo", QTB), ("dShi", SB), ("dSlo", SB), ("PT", SB),
                       ("Lse", 4 * BM), ("Dsum", 4 * BM)):
        o[name] = at
        at += size
    return o, at


def run_cta(q, k, v, do, lse, dsum, dq_flat, batch, head_k, n_block, wr, scale):
    """One CTA; adds into dq_flat; returns its dK (scaled), dV rows [BN x hd]."""
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

    # ---- setup: K lo, K^T lo (threads 0-127), V lo (128-255), a thread per key and half ----
    before = smem.writes.copy()
    for tid in range(256):
        is_k, key, c0 = tid < 128, tid % BN, (tid % 128) // BN * (D // 2)
        g = gk if is_k else gv
        base = (kbase if is_k else vbase) + key * g.row_stride
        for bb in range(D // 8):
            c = c0 + 4 * bb
            x = g.load4(base, 0, key, sk - n0, c, hd, True)
            _, ls = zip(*(split(e) for e in x))
            smem.st(off["Klo" if is_k else "Vlo"] + swz(BN, key, c), ls)
            if is_k:
                for e in range(4):
                    smem.st(off["KTlo"] + swz(D, c + e, key), [ls[e]])
    diff = smem.writes - before
    assert diff.max() == 1 and diff.sum() == 3 * KB // 4, "setup words written once"
    kt = np.zeros((BN, D), np.float32)
    vt = np.zeros((BN, D), np.float32)
    nk = max(0, min(BN, sk - n0))
    kt[:nk, :hd] = k[batch, n0:n0 + nk, head_k]
    vt[:nk, :hd] = v[batch, n0:n0 + nk, head_k]

    def x_frags(src):  # K hi / V hi: A of S^T / dP^T
        fr = {}
        for (w, l) in THREADS:
            g_, q_ = l // 4, l % 4
            key0 = 16 * w + g_
            fr[(w, l)] = [[split(src[key0 + 8 * (i & 1), 8 * kk + q_ + 4 * (i >> 1)])[0]
                           for i in range(4)] for kk in range(D // 8)]
        return fr

    def kt_frags(c):  # K^T hi: A of dQ^T rows 64 c.. of d, k8 steps over the keys
        fr = {}
        for (w, l) in THREADS:
            g_, q_ = l // 4, l % 4
            d0 = 64 * c + 16 * w + g_
            fr[(w, l)] = [[split(kt[8 * kk + q_ + 4 * (i >> 1), d0 + 8 * (i & 1)])[0]
                           for i in range(4)] for kk in range(BN // 8)]
        return fr

    wgs = [dict(x_hi=x_frags(kt if c == 0 else vt), kt_hi=kt_frags(c),
                acc=({t: np.zeros(D // 2) for t in THREADS})) for c in range(2)]
    for kk in range(D // 8):  # K lo / V lo operands, every element
        xa = (kk // 4) * (BN * 128) + (kk % 4) * 32
        sl = slice(8 * kk, 8 * kk + 8)
        assert np.array_equal(smem.operand(off["Klo"] + xa, 64), lo_of(kt[:, sl]))
        assert np.array_equal(smem.operand(off["Vlo"] + xa, 64), lo_of(vt[:, sl]))
    for c in range(2):
        for kg in range(BN // 8):
            ka = (kg // 4) * (D * 128) + c * (64 * 128) + (kg % 4) * 32
            keys = slice(8 * kg, 8 * kg + 8)
            assert np.array_equal(smem.operand(off["KTlo"] + ka, 64),
                                  lo_of(kt[keys, 64 * c:64 * c + 64].T))

    for t in range(n_steps):
        head = head_k * group + t // n_m
        m0 = (m_block_min + t % n_m) * BM
        rows = sq - m0
        ws_row0 = (batch * h + head) * sq
        # ---- producer ----
        before = smem.writes.copy()
        col_step = 4 * (128 // BM)
        for tid in range(128):
            q_row, q_col = tid % BM, 4 * (tid // BM)
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
        for tid in range(128):
            q_row, q_col = tid % BM, 4 * (tid // BM)
            q_pos = key_pos(q_row)
            for i in range(D // col_step):
                off_n = swz(BM, q_row, q_col + col_step * i)
                for src, dst in (("Qhi", "QThi"), ("Qlo", "QTlo"), ("dOhi", "dOThi"), ("dOlo", "dOTlo")):
                    vals = smem.w[(off[src] + off_n) // 4:(off[src] + off_n) // 4 + 4]
                    for e in range(4):
                        smem.st(off[dst] + swz(D, q_col + col_step * i + e, q_pos), [vals[e]])
        diff = smem.writes - before
        assert diff.max() == 1 and diff.sum() == (4 * QB + 4 * QTB // 2) // 4 + 2 * BM, "step words"
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
            mt[:, perm] = mat.T
            for hh in range(D // DKVN):
                for kk in range(BM // 8):
                    yb = hh * DKVN * 128 + kk * 32
                    ref = mt[DKVN * hh:DKVN * hh + DKVN, 8 * kk:8 * kk + 8]
                    assert np.array_equal(smem.operand(off[name + "Thi"] + yb, DKVN), hi_of(ref))
                    assert np.array_equal(smem.operand(off[name + "Tlo"] + yb, DKVN), lo_of(ref))

        # ---- consumers ----
        scale_log2 = scale * np.log2(np.e)

        def gemm_d(x_hi, x_lo_name, y):
            acc = np.zeros((64, BM))
            for kk in range(D // 8):
                xa = (kk // 4) * (BN * 128) + (kk % 4) * 32
                yb = (kk // 4) * (BM * 128) + (kk % 4) * 32
                alo = smem.operand(off[x_lo_name] + xa, 64).astype(np.float64)
                ahi, _ = frags_to_a(x_hi, None, kk)
                bhi = smem.operand(off[y + "hi"] + yb, BM).astype(np.float64)
                blo = smem.operand(off[y + "lo"] + yb, BM).astype(np.float64)
                acc += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
            return to_regs(acc)

        # warpgroup 0: P^T, into sPT (thread slot tt: h * 2048 + 16 tt, 4 floats)
        p_regs = gemm_d(wgs[0]["x_hi"], "Klo", "Q")
        edge = (m0 + BM > sq or n0 + BN > sk or (wr >= 0 and n0 + BN - 1 > m0 + offset + wr))
        for (w, l), r in p_regs.items():
            g_, q_ = l // 4, l % 4
            lane_key = 16 * w + g_
            for nt in range(BM // 8):
                a = 4 * (8 * nt + 2 * q_)
                lse2 = smem.w[(off["Lse"] + a) // 4], smem.w[(off["Lse"] + a) // 4 + 1]
                for e in range(4):
                    i = m0 + 8 * nt + 2 * q_ + (e & 1)
                    j = n0 + lane_key + 8 * (e >> 1)
                    vis = (not edge) or (i < sq and j < sk and (wr < 0 or j <= i + offset + wr))
                    x = r[4 * nt + e]
                    r[4 * nt + e] = 2.0 ** (x * scale_log2 - lse2[e & 1] * np.log2(np.e)) if vis else 0.0
        before = smem.writes.copy()
        for (w, l), r in p_regs.items():
            tt = 32 * w + l
            for hh in range(BM // 2 // 4):
                smem.st(off["PT"] + hh * 2048 + 16 * tt, [np.float32(x) for x in r[4 * hh:4 * hh + 4]])
        assert (smem.writes - before).sum() == SB // 4, "sPT words once"
        # warpgroup 1: dP^T, P^T from its own slots, dS^T into sdS
        dp_regs = gemm_d(wgs[1]["x_hi"], "Vlo", "dO")
        before = smem.writes.copy()
        for (w, l), r in dp_regs.items():
            g_, q_ = l // 4, l % 4
            tt = 32 * w + l
            lane_key = 16 * w + g_
            pt = np.concatenate([smem.w[(off["PT"] + hh * 2048 + 16 * tt) // 4:][:4]
                                 for hh in range(BM // 2 // 4)])
            assert np.array_equal(pt, np.float32(p_regs[(w, l)])), "sPT read where written"
            for nt in range(BM // 8):
                a = 4 * (8 * nt + 2 * q_)
                ds2 = smem.w[(off["Dsum"] + a) // 4], smem.w[(off["Dsum"] + a) // 4 + 1]
                for e in range(4):
                    x = np.float64(pt[4 * nt + e]) * (r[4 * nt + e] - ds2[e & 1])
                    r[4 * nt + e] = x
                    hs, ls = split(x)
                    o = swz(BM, 8 * nt + 2 * q_ + (e & 1), lane_key + 8 * (e >> 1))
                    smem.st(off["dShi"] + o, [hs])
                    smem.st(off["dSlo"] + o, [ls])
        diff = smem.writes - before
        assert diff.max() == 1 and diff.sum() == 2 * 64 * BM, "dS words once"

        def gemm_q(acc_d, regs, y):
            fh, fl = acc_to_frags(regs, BM // 8)
            for hh in range(D // DKVN):
                tt = np.zeros((64, DKVN))
                for kk in range(BM // 8):
                    yb = hh * DKVN * 128 + kk * 32
                    ahi, alo = frags_to_a(fh, fl, kk)
                    bhi = smem.operand(off[y + "Thi"] + yb, DKVN).astype(np.float64)
                    blo = smem.operand(off[y + "Tlo"] + yb, DKVN).astype(np.float64)
                    tt += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
                for th, r in to_regs(tt).items():
                    acc_d[th][hh * (DKVN // 2):(hh + 1) * (DKVN // 2)] += r

        gemm_q(wgs[0]["acc"], p_regs, "dO")   # dV
        gemm_q(wgs[1]["acc"], dp_regs, "Q")   # dK
        for c in range(2):  # dQ^T rows 64 c.. of d
            tq = np.zeros((64, BM))
            for ch in range(2):
                for kk in range(4):
                    ka = ch * (D * 128) + c * (64 * 128) + kk * 32
                    sb = ch * (BM * 128) + kk * 32
                    ahi, _ = frags_to_a(wgs[c]["kt_hi"], None, 4 * ch + kk)
                    alo = smem.operand(off["KTlo"] + ka, 64).astype(np.float64)
                    bhi = smem.operand(off["dShi"] + sb, BM).astype(np.float64)
                    blo = smem.operand(off["dSlo"] + sb, BM).astype(np.float64)
                    tq += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
            for (w, l), r in to_regs(tq).items():
                g_, q_ = l // 4, l % 4
                lane_d = 64 * c + 16 * w + g_
                for i in range(BM // 2):
                    row = 8 * (i // 4) + 2 * q_ + (i & 1)
                    d = lane_d + 8 * ((i // 2) & 1)
                    if m0 + row < sq and d < hd:
                        idx = (ws_row0 + m0) * hd + row * hd + d
                        assert 0 <= idx < dq_flat.size, "dq red out of bounds"
                        dq_flat[idx] += r[i]

    # ---- epilogue: dV (warpgroup 0), dK x scale (1) ----
    outs = [np.full((BN, hd), np.nan), np.full((BN, hd), np.nan)]
    for c in range(2):
        mul = 1.0 if c == 0 else scale
        for (w, l) in THREADS:
            g_, q_ = l // 4, l % 4
            lane_key = 16 * w + g_
            for r in range(2):
                if n0 + lane_key + 8 * r < sk:
                    for dt in range(D // 8):
                        col = 8 * dt + 2 * q_
                        if col < hd:
                            outs[c][lane_key + 8 * r, col:col + 2] = \
                                wgs[c]["acc"][(w, l)][4 * dt + 2 * r:4 * dt + 2 * r + 2] * mul
    return outs[1], outs[0]


def check(b, sq, sk, h, hk, hd, wr, seed=0):
    """Runs every CTA of the problem; returns the max errors of dq, dk, dv vs float64."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, h, hd)).astype(np.float32)
    k = rng.standard_normal((b, sk, hk, hd)).astype(np.float32)
    v = rng.standard_normal((b, sk, hk, hd)).astype(np.float32)
    do = rng.standard_normal((b, sq, h, hd)).astype(np.float32)
    scale = hd ** -0.5
    O, lse, dq_ref, dk_ref, dv_ref = reference(q, k, v, do, wr, scale)
    dsum = (O * do.astype(np.float64)).sum(-1).transpose(0, 2, 1).reshape(-1)
    dq_flat = np.zeros(b * h * sq * hd)
    dk = np.full(k.shape, np.nan)
    dv = np.full(v.shape, np.nan)
    for batch in range(b):
        for head_k in range(hk):
            for n_block in range((sk + BN - 1) // BN):
                dk_t, dv_t = run_cta(q, k, v, do, lse.astype(np.float32),
                                     dsum.astype(np.float32), dq_flat, batch, head_k, n_block,
                                     wr, scale)
                n0 = n_block * BN
                nk = min(BN, sk - n0)
                dk[batch, n0:n0 + nk, head_k] = dk_t[:nk]
                dv[batch, n0:n0 + nk, head_k] = dv_t[:nk]
    dq = (dq_flat.reshape(b, h, sq, hd) * scale).transpose(0, 2, 1, 3)
    err = lambda a, r: np.abs(a - r).max() / max(1.0, np.abs(r).max())
    return err(dq, dq_ref), err(dk, dk_ref), err(dv, dv_ref)


CASES = [  # (b, sq, sk, h, hk, d, wr): wr 0 causal, -1 full
    (1, 16, 64, 1, 1, 128, -1),
    (1, 33, 70, 1, 1, 128, -1),
    (1, 70, 33, 2, 1, 128, 0),
    (1, 20, 90, 2, 2, 96, 0),
    (2, 1, 65, 2, 1, 128, -1),
    (1, 37, 71, 3, 1, 120, 5),
]

if __name__ == "__main__":
    worst = 0.0
    for case in CASES:
        e = check(*case)
        worst = max(worst, *e)
        print(case, "dq %.2e dk %.2e dv %.2e" % e, flush=True)
    sys.exit(0 if worst < 1e-5 else 1)
