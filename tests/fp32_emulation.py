"""Lane-level emulation of the float32 kernels (cpp/fp32/fwd_kernel.cuh, bwd_kernel.cuh) on
the CPU: the kernels' shared-memory layouts, per-lane offsets and fragment assignments
transcribed line by line, with mma.m16n8k8 .tf32 emulated from the PTX ISA fragment layouts
(A a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4); B b0 (k q, n g), b1 (k q+4, n g); C as
for bf16) and 3xTF32 products accumulated in float32 as the tensor core does (tc_add: not
round to nearest). It catches layout and index bugs without a GPU (test_fp32.py), and the
accumulation order's error; keep it in step with the kernels. Where the kernels split an
operand once in shared memory (d <= 64) rather than per warp, the values are the same, so
the emulation splits at each use (but mirrors the PairTile order those tiles are stored in);
it mirrors each warp's m16 tiles one at a time. tf32() rounds ties away from zero as sm_80's
cvt.rna (sm_90's cvt.rn rounds ties to even: a difference at exact ties only).

forward(q, k, v, scale, window_left, window_right, kernel_head_dim): one head, q (sq, d),
k / v (sk, d) float32 numpy -> (out, lse). backward(q, k, v, o, lse, dout, scale, window_left,
window_right, kernel_head_dim, group): q / o / dout (h, sq, d), k / v (h_k, sk, d), lse (h, sq)
-> (dq, dk, dv).
"""
import numpy as np

def tf32(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x1000) & 0xffffe000).astype(np.uint32)
    return u.view(np.float32)

def split(x):
    x = np.asarray(x, np.float32)
    hi = tf32(x); lo = tf32((x - hi).astype(np.float32)); return hi, lo

def _floor_log2(x):  # floor(log2 |x|) of float64 x, a large negative number for 0
    return np.where(x == 0, -1000, np.frexp(x)[1] - 1)

# The tensor core's float32 accumulation (a model after Fasi et al., "Numerical behavior of
# NVIDIA tensor cores", 2021): c plus a group of TC_GROUP exact products, each aligned to the
# largest exponent among them and truncated (toward zero) below the float32 ulp of that
# exponent, summed exactly, the sum truncated to float32. So an MMA into a large accumulator
# loses up to an ulp of it, always toward zero: the bias that grew the kernels' error with
# the length before their two-level accumulation. TC_GROUP = 0: round to nearest instead.
TC_GROUP = 4
def tc_add(c, p):
    """c [..., n] float32 + the products p [..., k, n] (exact in float64), as the MMA sums them."""
    c = c.astype(np.float64)
    if TC_GROUP == 0:
        return (c + p.sum(-2)).astype(np.float32)
    for k0 in range(0, p.shape[-2], TC_GROUP):
        terms = np.concatenate([c[..., None, :], p[..., k0:k0 + TC_GROUP, :]], -2)
        ulp = np.ldexp(1.0, _floor_log2(np.abs(terms).max(-2, keepdims=True)) - 23)
        c = (np.trunc(terms / ulp) * ulp).sum(-2)
        ulp = np.ldexp(1.0, _floor_log2(c) - 23)
        c = np.trunc(c / ulp) * ulp
    return c.astype(np.float32)

L = np.arange(32); G = L // 4; Q = L % 4
def mma(c, a, b):  # c [32,4] f32, a [32,4], b [32,2] tf32 values; PTX m16n8k8 layouts
    A = np.zeros((16, 8)); B = np.zeros((8, 8))
    A[G, Q] = a[:, 0]; A[G + 8, Q] = a[:, 1]; A[G, Q + 4] = a[:, 2]; A[G + 8, Q + 4] = a[:, 3]
    B[Q, G] = b[:, 0]; B[Q + 4, G] = b[:, 1]
    C = np.zeros((16, 8), np.float32)
    C[G, 2*Q] = c[:, 0]; C[G, 2*Q+1] = c[:, 1]; C[G+8, 2*Q] = c[:, 2]; C[G+8, 2*Q+1] = c[:, 3]
    D = tc_add(C, A.astype(np.float64)[:, :, None] * B.astype(np.float64)[None])
    return np.stack([D[G, 2*Q], D[G, 2*Q+1], D[G+8, 2*Q], D[G+8, 2*Q+1]], 1)

def mma3(c, a4, b0, b1):
    ah, al = split(a4); bh0, bl0 = split(b0); bh1, bl1 = split(b1)
    c = mma(c, al, np.stack([bh0, bh1], 1))
    c = mma(c, ah, np.stack([bl0, bl1], 1))
    return mma(c, ah, np.stack([bh0, bh1], 1))

def mma3_add(c, a4, b0, b1):  # tf32.cuh mma3_add: through a fresh accumulator, then FADD
    return c + mma3(np.zeros_like(c), a4, b0, b1)

PV_STEPS = 4  # k8 steps of P V per two-level step (fwd_kernel.cuh kPVSteps)
def forward(q, k, v, scale, wl, wr, D):  # q [sq, d], k/v [sk, d] float32 one head
    sq, d = q.shape; sk = k.shape[0]
    MT = 2 if D <= 64 else 1  # m16 tiles per warp (fwd_config.h fp32_fwd_m_tiles)
    BM = 64 * MT; BN = 64 if D <= 32 else 32
    qs = D + 4
    presplit = D <= 64  # (fwd_config.h fp32_fwd_presplit): sK a PairTile, else rows padded
    ks = D if presplit else D + 4
    q_off_r = lambda r, c: r * qs + c
    k_off = (lambda r, c: pair_raw_off(r, c, D)) if presplit else (lambda r, c: r * ks + c)
    v_off = lambda r, c: r * D + (c ^ ((r & 3) << 3))
    out = np.full((sq, d), np.nan, np.float32); lse = np.full(sq, np.nan, np.float32)
    offset = sk - sq
    for m_block in range((sq + BM - 1) // BM):
        row0 = m_block * BM
        sQ = np.zeros(BM * qs, np.float32)
        for r in range(BM):
            for c in range(0, D, 4):
                if r < sq - row0 and c < d: sQ[q_off_r(r, c):q_off_r(r, c)+4] = q[row0+r, c:c+4]
        i_first = row0; i_last = min(row0 + BM, sq) - 1
        nmax = (sk + BN - 1) // BN
        if wr >= 0:
            hi = i_last + offset + wr; nmax = 0 if hi < 0 else min(nmax, hi // BN + 1)
        nmin = 0
        if wl >= 0:
            lo = i_first + offset - wl; nmin = 0 if lo <= 0 else lo // BN
        for warp, mt in ((w, m) for w in range(4) for m in range(MT)):
            # (each m tile's arithmetic is independent: the kernel shares only the split B
            # fragments between them, which are the same values)
            wr0 = warp * 16 * MT + 16 * mt
            if row0 + wr0 >= sq: continue  # (rows the kernel computes but never writes)
            key_g = (G >> 1) + 4 * (G & 1)
            qo = q_off_r(wr0 + G, Q)
            ko = (2 * Q) ^ (pair_h(key_g) << 3) if presplit else k_off(key_g, Q)
            vo = [BN * ks + v_off(Q, 8 * j + G) for j in range(4)]
            acc_o = np.zeros((D // 8, 32, 4), np.float32)
            rmax = np.full((32, 2), -np.inf, np.float32); rsum = np.zeros((32, 2), np.float32)
            corrs = np.zeros((32, 2), np.float32)
            sl2 = np.float32(scale * 1.4426950408889634)
            for n_block in range(nmax - 1, nmin - 1, -1):
                n0 = n_block * BN
                sKV = np.zeros(BN * ks + BN * D, np.float32)
                for r in range(BN):
                    for c in range(0, D, 4):
                        if r < sk - n0 and c < d:
                            sKV[k_off(r, c):k_off(r, c)+4] = k[n0+r, c:c+4]
                            o = BN * ks + v_off(r, c); sKV[o:o+4] = v[n0+r, c:c+4]
                if presplit:
                    split_pairs(sKV[:BN * ks])
                acc_s = np.zeros((BN // 8, 32, 4), np.float32)
                for kk in range(D // 8):
                    a = sQ[qo + 8*kk]; a1 = sQ[qo + 8*kk + 8*qs]; a2 = sQ[qo + 8*kk + 4]; a3 = sQ[qo + 8*kk + 8*qs + 4]
                    a4 = np.stack([a, a1, a2, a3], 1)
                    for nt in range(BN // 8):
                        if presplit:  # the pair (b0, b1) side by side
                            base = (key_g + 8 * nt) * D + 32 * (kk // 4) + ((8 * (kk % 4)) ^ ko)
                            b1 = base + 1
                        else:
                            base = ko + 8 * nt * ks + 8 * kk; b1 = base + 4
                        acc_s[nt] = mma3_add(acc_s[nt], a4, sKV[base], sKV[b1])
                # mask (always applied in emulation: identical to need_mask result on tiles that don't need it)
                for r in range(2):
                    row = row0 + wr0 + G + 8 * r
                    chi = np.minimum(sk - 1, row + offset + wr) if wr >= 0 else np.full(32, sk - 1)
                    clo = row + offset - wl if wl >= 0 else np.zeros(32, int)
                    for nt in range(BN // 8):
                        for e in (2*r, 2*r+1):
                            col = n0 + 8 * nt + Q + 4 * (e & 1)
                            acc_s[nt][(col < clo) | (col > chi), e] = -np.inf
                for r in range(2):
                    m = rmax[:, r].copy()
                    for nt in range(BN // 8):
                        m = np.maximum(m, np.maximum(acc_s[nt][:, 2*r], acc_s[nt][:, 2*r+1]))
                    m = m.reshape(8, 4).max(1).repeat(4)
                    ms = np.where(m == -np.inf, 0, m * sl2).astype(np.float32)
                    with np.errstate(invalid='ignore'):
                        corr = np.exp2((rmax[:, r] * sl2 - ms).astype(np.float32)).astype(np.float32)
                    corr = np.nan_to_num(corr, nan=0.0)
                    rmax[:, r] = m
                    s = np.zeros(32, np.float32)
                    for nt in range(BN // 8):
                        for e in (2*r, 2*r+1):
                            acc_s[nt][:, e] = np.exp2((acc_s[nt][:, e] * sl2 - ms).astype(np.float32))
                            s += acc_s[nt][:, e]
                    rsum[:, r] = rsum[:, r] * corr + s
                    corrs[:, r] = corr
                # O = O corr + P V: per n8 tile of O, the k chain of PV_STEPS k8 steps into a
                # fresh accumulator, then one FFMA / FADD into acc_o (two-level)
                for nt0 in range(0, BN // 8, PV_STEPS):
                    for dt in range(D // 8):
                        t = np.zeros((32, 4), np.float32)
                        for nt in range(nt0, nt0 + PV_STEPS):
                            a4 = np.stack([acc_s[nt][:, 0], acc_s[nt][:, 2], acc_s[nt][:, 1], acc_s[nt][:, 3]], 1)
                            base = np.array(vo)[dt % 4] + 8 * nt * D + 32 * (dt // 4)
                            t = mma3(t, a4, sKV[base], sKV[base + 4 * D])
                        if nt0 == 0:
                            acc_o[dt] = (acc_o[dt].astype(np.float64) * corrs[:, [0, 0, 1, 1]] + t).astype(np.float32)
                        else:
                            acc_o[dt] = acc_o[dt] + t
            for r in range(2):
                s = rsum[:, r].reshape(8, 4).sum(1).repeat(4)
                inv = np.where(s == 0, 0, 1 / np.where(s == 0, 1, s)).astype(np.float32)
                row = row0 + wr0 + G + 8 * r
                for dt in range(D // 8):
                    col = 8 * dt + 2 * Q
                    ok = (row < sq) & (col < d)
                    out[row[ok], col[ok]] = acc_o[dt][ok, 2*r] * inv[ok]
                    out[row[ok], col[ok] + 1] = acc_o[dt][ok, 2*r+1] * inv[ok]
                ok = (row < sq) & (Q == 0)
                lse[row[ok]] = np.where(s[ok] == 0, np.inf, rmax[ok, r] * scale + np.log(np.where(s[ok]==0,1,s[ok])))
    return out, lse

def swz(r): return ((r & 3) << 3) | (r & 4)
def swz_off(r, c, kcols): return r * kcols + (c ^ swz(r))
def row_off(r, c, kcols): return r * (kcols + 4) + c
# PairTile (tf32.cuh; at d <= 64 the forward's sK, the backward's sQ / sdO): cp.async at
# pair_raw_off, then split_pairs stores each 8-column group in the order 0 4 1 5 2 6 3 7.
def pair_h(r): return (r & 3) ^ ((r & 4) >> 1)
def pair_pos(k): return 2 * (k & 3) + (k >> 2)
def pair_raw_off(r, c, kcols): return r * kcols + (c ^ (pair_h(r) << 3))
PAIR_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
def split_pairs(tile):  # in place, group by group (the values; the emulation splits at use)
    tile.reshape(-1, 8)[:] = tile.reshape(-1, 8)[:, PAIR_ORDER]

def backward(q, k, v, o, lse, dout, scale, wl, wr, D, group):
    # q/o/dout [H, sq, d]; k/v [Hk, sk, d]; lse [H, sq]
    H, sq, d = q.shape; Hk, sk = k.shape[:2]
    BN = 64; BM = 32 if D <= 32 else 16
    s_off = swz_off if BM == 32 else row_off
    dq_acc = np.zeros((H, sq, d), np.float32)
    dsum = np.einsum('hsd,hsd->hs', o.astype(np.float32), dout).astype(np.float32)
    dk = np.full((Hk, sk, d), np.nan, np.float32); dv = np.full((Hk, sk, d), np.nan, np.float32)
    offset = sk - sq
    sl2 = np.float32(scale * 1.4426950408889634); L2E = np.float32(1.4426950408889634)
    perm_g = (G >> 1) + 4 * (G & 1)
    lane_a = Q ^ swz(G); lane_b = Q ^ swz(perm_g); lane_k = [G ^ swz(Q), G ^ swz(Q + 4)]
    presplit = D <= 64  # (fwd_config.h fp32_bwd_presplit): sQ / sdO are PairTiles
    pair_b = (2 * Q) ^ (pair_h(perm_g) << 3)
    pair_k = [pair_pos(G) ^ (pair_h(Q) << 3), pair_pos(G) ^ (pair_h(Q + 4) << 3)]
    q_off = pair_raw_off if presplit else swz_off
    for hk in range(Hk):
        for n_block in range((sk + BN - 1) // BN):
            n0 = n_block * BN
            mmin, mmax = 0, (sq + BM - 1) // BM
            if wr >= 0:
                ilo = n0 - offset - wr; mmin = 0 if ilo <= 0 else min(mmax, ilo // BM)
            if wl >= 0:
                ihi = min(sk, n0 + BN) - 1 + wl - offset; mmax = 0 if ihi < 0 else min(mmax, ihi // BM + 1)
            n_m = max(0, mmax - mmin)
            sK = np.zeros(BN * D, np.float32); sV = np.zeros(BN * D, np.float32)
            for r in range(BN):
                for c in range(0, D, 4):
                    if r < sk - n0 and c < d:
                        o_ = swz_off(r, c, D); sK[o_:o_+4] = k[hk, n0+r, c:c+4]; sV[o_:o_+4] = v[hk, n0+r, c:c+4]
            acc_dk = np.zeros((4, D // 8, 32, 4), np.float32); acc_dv = np.zeros((4, D // 8, 32, 4), np.float32)
            for t in range(n_m * group):
                head = hk * group + t // n_m; m0 = (mmin + t % n_m) * BM
                sQ = np.zeros(BM * D, np.float32); sdO = np.zeros(BM * D, np.float32)
                for r in range(BM):
                    for c in range(0, D, 4):
                        if r < sq - m0 and c < d:
                            o_ = q_off(r, c, D); sQ[o_:o_+4] = q[head, m0+r, c:c+4]; sdO[o_:o_+4] = dout[head, m0+r, c:c+4]
                if presplit:
                    split_pairs(sQ); split_pairs(sdO)
                sLse = np.array([lse[head, m0+i] if m0+i < sq else 0 for i in range(BM)], np.float32)
                sDs = np.array([dsum[head, m0+i] if m0+i < sq else 0 for i in range(BM)], np.float32)
                sdS = np.full(BN * (BM + 4), np.nan, np.float32)
                for warp in range(4):
                    key_row = warp * 16 + G
                    off_a = lambda kc, x8, c4: (key_row + x8) * kc + 32 * (c4 // 8) + ((4 * (c4 % 8)) ^ lane_a)
                    off_b = lambda kc, x8, c4: (perm_g + x8) * kc + 32 * (c4 // 8) + ((4 * (c4 % 8)) ^ lane_b)
                    off_k = lambda kc, x8, jj, c8: (Q + 4 * jj + x8) * kc + 32 * (c8 // 4) + ((8 * (c8 % 4)) ^ lane_k[jj])
                    if presplit:  # sQ / sdO reads: n-major 64-bit pairs, k-major permuted
                        pair_off = lambda row, lane_off, c8: row * D + 32 * (c8 // 4) + ((8 * (c8 % 4)) ^ lane_off)
                        off_b = lambda kc, x8, c4: pair_off(perm_g + x8, pair_b, c4 // 2) + c4 % 2
                        off_k = lambda kc, x8, jj, c8: pair_off(Q + 4 * jj + x8, pair_k[jj], c8)
                    def gkq(sA, sB):
                        acc = np.zeros((BM // 8, 32, 4), np.float32)
                        for kk in range(D // 8):
                            a4 = np.stack([sA[off_a(D, 0, 2*kk)], sA[off_a(D, 8, 2*kk)], sA[off_a(D, 0, 2*kk+1)], sA[off_a(D, 8, 2*kk+1)]], 1)
                            for nt in range(BM // 8):
                                acc[nt] = mma3_add(acc[nt], a4, sB[off_b(D, 8*nt, 2*kk)], sB[off_b(D, 8*nt, 2*kk+1)])
                        return acc
                    def gacc(acc_d, x, sB):  # two-level: the step's k chain, then FADD
                        for dt in range(D // 8):
                            t = np.zeros((32, 4), np.float32)
                            for nt in range(BM // 8):
                                a4 = np.stack([x[nt][:, 0], x[nt][:, 2], x[nt][:, 1], x[nt][:, 3]], 1)
                                t = mma3(t, a4, sB[off_k(D, 8*nt, 0, dt)], sB[off_k(D, 8*nt, 1, dt)])
                            acc_d[dt] = acc_d[dt] + t
                    acc_s = gkq(sK, sQ)
                    for nt in range(BM // 8):
                        for e in range(4):
                            ql = 8 * nt + Q + 4 * (e & 1); i = m0 + ql; j = n0 + key_row + 8 * (e >> 1)
                            vis = (i < sq) & (j < sk)
                            if wr >= 0: vis &= j <= i + offset + wr
                            if wl >= 0: vis &= j >= i + offset - wl
                            val = np.exp2((acc_s[nt][:, e] * sl2 - sLse[ql] * L2E).astype(np.float32))
                            acc_s[nt][:, e] = np.where(vis, val, 0)
                    gacc(acc_dv[warp], acc_s, sdO)
                    acc_dp = gkq(sV, sdO)
                    for nt in range(BM // 8):
                        for e in range(4):
                            ql = 8 * nt + Q + 4 * (e & 1)
                            acc_dp[nt][:, e] = acc_s[nt][:, e] * (acc_dp[nt][:, e] - sDs[ql])
                            sdS[s_off(key_row + 8 * (e >> 1), ql, BM)] = acc_dp[nt][:, e]
                    gacc(acc_dk[warp], acc_dp, sQ)
                MT = BM // 16; half = (D // 8) * MT // 4
                for warp in range(4):
                    mq = 16 * (warp % MT); dt0 = half * (warp // MT)
                    acc_dq = np.zeros((half, 32, 4), np.float32)
                    for kk in range(BN // 8):
                        r = 8 * kk + Q
                        a4 = np.stack([sdS[s_off(r, mq + G, BM)], sdS[s_off(r, mq + G + 8, BM)], sdS[s_off(r + 4, mq + G, BM)], sdS[s_off(r + 4, mq + G + 8, BM)]], 1)
                        assert not np.isnan(a4).any(), "sdS read outside what was written"
                        for ii in range(half):
                            dt = dt0 + ii
                            acc_dq[ii] = mma3_add(acc_dq[ii], a4, sK[swz_off(r, 8 * dt + G, D)], sK[swz_off(r + 4, 8 * dt + G, D)])
                    for rr in range(2):
                        row = m0 + mq + G + 8 * rr
                        for ii in range(half):
                            c = 8 * (dt0 + ii) + 2 * Q
                            ok = (row < sq) & (c < d)
                            np.add.at(dq_acc[head], (row[ok], c[ok]), acc_dq[ii][ok, 2*rr])
                            np.add.at(dq_acc[head], (row[ok], c[ok] + 1), acc_dq[ii][ok, 2*rr+1])
            for warp in range(4):
                for rr in range(2):
                    j = n0 + warp * 16 + G + 8 * rr
                    for dt in range(D // 8):
                        c = 8 * dt + 2 * Q; ok = (j < sk) & (c < d)
                        dk[hk, j[ok], c[ok]] = acc_dk[warp][dt][ok, 2*rr] * np.float32(scale)
                        dk[hk, j[ok], c[ok]+1] = acc_dk[warp][dt][ok, 2*rr+1] * np.float32(scale)
                        dv[hk, j[ok], c[ok]] = acc_dv[warp][dt][ok, 2*rr]; dv[hk, j[ok], c[ok]+1] = acc_dv[warp][dt][ok, 2*rr+1]
    return dq_acc * np.float32(scale), dk, dv
