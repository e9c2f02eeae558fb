# Index-level float64 model of bwd_kernel_d256 (helper bwd256): its BwdRange (block_n 64), per-
# warpgroup query halves, need_mask / q_lo / q_hi formulas, LSE / dsum tails, GQA walk,
# sP / sdS assembly from the two halves, column-split dV / dK / dQ; against a dense reference.
import numpy as np
INF = np.inf

def reference(q, k, v, do, scale, wl, wr):
    b, sq, h, d = q.shape; sk, hk = k.shape[1], k.shape[2]; grp = h // hk
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    off = sk - sq
    i = np.arange(sq)[:, None]; j = np.arange(sk)[None, :]
    ok = np.ones((sq, sk), bool)
    if wr >= 0: ok &= j <= i + off + wr
    if wl >= 0: ok &= j >= i + off - wl
    lse = np.full((b, h, sq), INF); out = np.zeros_like(q)
    for bb in range(b):
        for hh in range(h):
            kk = k[bb, :, hh // grp]; vv = v[bb, :, hh // grp]
            s = q[bb, :, hh] @ kk.T * scale; s = np.where(ok, s, -INF)
            m = s.max(1, keepdims=True); m = np.where(np.isfinite(m), m, 0)
            e = np.exp(s - m); l = e.sum(1, keepdims=True)
            p = np.where(l > 0, e / np.where(l > 0, l, 1), 0)
            lse[bb, hh] = np.where(l[:, 0] > 0, np.log(np.where(l[:, 0] > 0, l[:, 0], 1)) + m[:, 0], INF)
            out[bb, :, hh] = p @ vv
            dp = do[bb, :, hh] @ vv.T
            D = (do[bb, :, hh] * out[bb, :, hh]).sum(1, keepdims=True)
            ds = p * (dp - D)
            dq[bb, :, hh] = ds @ kk * scale
            dk[bb, :, hh // grp] += ds.T @ q[bb, :, hh] * scale
            dv[bb, :, hh // grp] += p.T @ do[bb, :, hh]
    dsum = (do * out).sum(-1).transpose(0, 2, 1)  # (b, h, sq)
    return dq, dk, dv, lse, dsum

def kernel(q, k, v, do, lse, dsum, scale, wl, wr):
    b, sq, h, d = q.shape; sk, hk = k.shape[1], k.shape[2]; grp = h // hk
    BM = BN = 64; off = sk - sq
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    def pad_rows(x, n0, n, total):  # TMA: rows past the tensor zero-filled
        outp = np.zeros((n,) + x.shape[1:]); hi = min(n0 + n, total)
        if hi > n0: outp[:hi - n0] = x[n0:hi]
        return outp
    for bb in range(b):
        for hkk in range(hk):
            for nb in range((sk + BN - 1) // BN):
                n0 = nb * BN
                # BwdRange (block_n 64)
                n_last = min(n0 + BN, sk) - 1
                m_lo = max(0, n0 - off - wr) if wr >= 0 else 0
                m_hi = min(sq - 1, n_last - off + wl) if wl >= 0 else sq - 1
                mmin = m_lo // BM; mmax = mmin if m_hi < m_lo else m_hi // BM + 1
                K = pad_rows(k[bb, :, hkk], n0, BN, sk); V = pad_rows(v[bb, :, hkk], n0, BN, sk)
                adk = np.zeros((BN, d)); adv = np.zeros((BN, d))
                for hh in range(hkk * grp, hkk * grp + grp):
                    for mb in range(mmin, mmax):
                        m0 = mb * BM
                        Q = pad_rows(q[bb, :, hh], m0, BM, sq); dO = pad_rows(do[bb, :, hh], m0, BM, sq)
                        rows = m0 + np.arange(BM)
                        L = np.where(rows < sq, lse[bb, hh, np.minimum(rows, sq - 1)], INF)
                        Ds = np.where(rows < sq, dsum[bb, hh, np.minimum(rows, sq - 1)], 0.)
                        PT = np.zeros((BN, BM)); dST = np.zeros((BN, BM))
                        for c in range(2):
                            wq0 = 32 * c; mq0 = m0 + wq0
                            S = K @ Q[wq0:wq0 + 32].T      # 64 keys x 32 queries
                            dP = V @ dO[wq0:wq0 + 32].T
                            need = (n0 + BN > sk or (wr >= 0 and n0 + BN - 1 > mq0 + off + wr) or
                                    (wl >= 0 and n0 < mq0 + 31 + off - wl))
                            if need:
                                for key_i in range(BN):
                                    key = n0 + key_i
                                    for qq in range(4):
                                        q_lo = (key - off - wr if wr >= 0 else 0) - mq0 - 2 * qq
                                        q_hi = (-1 if key >= sk else (key - off + wl if wl >= 0 else sq - 1)) - mq0 - 2 * qq
                                        for nt in range(4):
                                            for e in range(2):
                                                col = 8 * nt + e
                                                if col < q_lo or col > q_hi:
                                                    S[key_i, 8 * nt + 2 * qq + e] = -INF
                            P = np.exp(S * scale - L[wq0:wq0 + 32][None, :])
                            dS = P * (dP - Ds[wq0:wq0 + 32][None, :])
                            PT[:, wq0:wq0 + 32] = P; dST[:, wq0:wq0 + 32] = dS
                        for c in range(2):
                            cols = slice(128 * c, 128 * c + 128)
                            adv[:, cols] += PT @ dO[:, cols]
                            adk[:, cols] += dST @ Q[:, cols]
                            for j in range(2):
                                cs = slice(128 * c + 64 * j, 128 * c + 64 * j + 64)
                                dqt = dST.T @ K[:, cs]   # 64 queries x 64 cols
                                for w in range(4):
                                    r0 = m0 + 16 * w
                                    if r0 < sq:  # 16-row block; rows past sq go to padding
                                        hi = min(16, sq - r0)
                                        dq[bb, r0:r0 + hi, hh, cs] += dqt[16 * w:16 * w + hi]
                for key_i in range(BN):
                    if n0 + key_i < sk:
                        dk[bb, n0 + key_i, hkk] = adk[key_i] * scale
                        dv[bb, n0 + key_i, hkk] = adv[key_i]
    return dq * scale, dk, dv

rng = np.random.default_rng(0)
worst = 0
cases = [(1, 1), (63, 63), (64, 64), (65, 65), (129, 129), (1, 150), (150, 1), (100, 200), (200, 100), (127, 130)]
for sq, sk in cases:
    for (wl, wr) in [(-1, -1), (-1, 0), (32, 8), (100, -1), (-1, 50), (63, 0)]:
        for (h, hk) in [(2, 2), (4, 2)]:
            d = 256
            q = rng.standard_normal((1, sq, h, d)); k = rng.standard_normal((1, sk, hk, d))
            v = rng.standard_normal((1, sk, hk, d)); do = rng.standard_normal((1, sq, h, d))
            scale = d ** -0.5
            rdq, rdk, rdv, lse, dsum = reference(q, k, v, do, scale, wl, wr)
            kdq, kdk, kdv = kernel(q, k, v, do, lse, dsum, scale, wl, wr)
            err = max(np.abs(a - b_).max() for a, b_ in ((rdq, kdq), (rdk, kdk), (rdv, kdv)))
            assert np.isfinite(kdq).all() and np.isfinite(kdk).all() and np.isfinite(kdv).all()
            worst = max(worst, err)
            if err > 1e-9: print("MISMATCH", sq, sk, wl, wr, h, hk, err)
print("cases", len(cases) * 12, "max abs err", worst)
