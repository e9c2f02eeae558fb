"""Host model of one CTA of the Hopper float32 forward (cpp/fp32/wg_kernel.cuh), no GPU.

Runs the kernel's own index arithmetic (copied by hand from wg_kernel.cuh and wg_common.cuh:
keep in step) on numpy arrays: the producer's global loads (flat element indices,
bounds-checked against the tensor) and its hi / lo stores into a byte-addressed shared-memory
image (NaN-filled, so a read of an unwritten word shows), the wgmma operands as the hardware
reads them (descriptor start address + 8-row groups SBO apart + 128-byte rows, then the
128-byte swizzle on the address bits: bits [4:6] ^= bits [7:9]), the register fragments of the
A operand (RS) and of the accumulators (PTX ISA / CuTe: A (g, q) (g+8, q) (g, q+4) (g+8, q+4);
D[j] row g + 8 ((j >> 1) & 1), col 8 (j >> 2) + 2 q + (j & 1)), the mask, softmax, P reorder, P
V and the epilogue. Prints max |model - float64 attention| per CTA; a layout slip gives O(1)
errors or NaN, a right model ~1e-6.

  python3 scripts/fp32wg_model.py            # d64 and d128 configs, several shapes

Every stage word is written exactly once per tile, and (check_operands) every element of
every wgmma operand the descriptors address (K hi / lo per k8 step, V^T hi / lo per k8 step
and per P V column block, Q lo of each warpgroup) is the tf32 split of the value the kernel
means there: a swizzle, descriptor or key-permutation slip fails on the first tile.
"""
import sys

import numpy as np

SWZ_CHECK = {}


def tf32(x):
    """Round float32 to tf32 (nearest, ties to even), as cvt.rn.tf32.f32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    lsb = (u >> 13) & 1
    u = ((u + 0xFFF + lsb) & 0xFFFFE000).astype(np.uint32)
    return u.view(np.float32)


def split(x):
    x = np.float32(x)
    hi = tf32(x)
    return hi, tf32(np.float32(x - hi))


def swz(rows, r, c):
    """fp32wg::swz<kRows>(r, c)."""
    return (c // 32) * (rows * 128) + r * 128 + ((((c % 32) // 4) ^ (r % 8)) * 16) + (c % 4) * 4


def key_pos(k):
    return (k & ~7) | ((k & 7) >> 1) | ((k & 1) << 2)


class Smem:
    def __init__(self, nbytes):
        self.w = np.full(nbytes // 4, np.nan, np.float32)
        self.writes = np.zeros(nbytes // 4, np.int32)

    def st(self, addr, vals):
        assert addr % (4 * len(vals)) == 0, "misaligned store"
        for i, v in enumerate(vals):
            self.w[addr // 4 + i] = v
            self.writes[addr // 4 + i] += 1

    def operand(self, start, rows):
        """A K-major 128B-swizzled wgmma operand (rows x 8 tf32) from descriptor start address
        `start` (SBO 1024)."""
        out = np.empty((rows, 8), np.float32)
        for r in range(rows):
            for k in range(8):
                a = start + (r // 8) * 1024 + (r % 8) * 128 + 4 * k
                a ^= ((a >> 7) & 7) << 4
                out[r, k] = self.w[a // 4]
        return out


class Gmem:
    """A (b, s, h, d) float32 tensor as flat storage; load4 checks the flat index."""

    def __init__(self, t):
        self.t = t
        self.flat = t.reshape(-1)
        b, s, h, d = t.shape
        self.batch_stride, self.row_stride, self.head_stride = s * h * d, h * d, d

    def load4(self, base, row_stride, row, rows, c, cols, fixed):
        """fp32wg::load4(g, row_stride, row, rows, c, cols); `base` the flat index of g."""
        if not (row < rows and c < cols):
            return np.zeros(4, np.float32)
        i = base + row * row_stride + c if not fixed else base + row * row_stride + c
        if i < 0 or i + 4 > self.flat.size:
            raise IndexError(f"global load out of bounds: {i} of {self.flat.size}")
        return self.flat[i:i + 4].copy()


def check_operands(smem, cfg, kt, vt, s_addr, q_lo=None, sQlo=0, wg_row0=0):
    """Every element of the wgmma operands of one stage (and of a warpgroup's Q lo): what the
    descriptors address (Smem.operand) against the split of the matrices meant: kt [BN x D]
    (the tile's K, zero past the tensor), vt [D x BN] (its V^T, keys unpermuted), q_lo [64 x
    D]. s_addr: (sKhi, sKlo, sVhi, sVlo) of the stage."""
    D, BM, BN, QREGS, PVN, LEAN = cfg
    sKhi, sKlo, sVhi, sVlo = s_addr
    hi = np.vectorize(lambda x: split(x)[0], otypes=[np.float32])
    lo = np.vectorize(lambda x: split(x)[1], otypes=[np.float32])
    perm = [key_pos(kk) for kk in range(BN)]  # key kk at position key_pos(kk)
    vt_pos = np.empty_like(vt)
    vt_pos[:, perm] = vt
    for kk in range(D // 8):
        kb = (kk // 4) * (BN * 128) + (kk % 4) * 32
        sl = slice(8 * kk, 8 * kk + 8)
        assert np.array_equal(smem.operand(sKhi + kb, BN), hi(kt[:, sl])), ("K hi", kk)
        assert np.array_equal(smem.operand(sKlo + kb, BN), lo(kt[:, sl])), ("K lo", kk)
        if q_lo is not None:
            qa = (kk // 4) * (BM * 128) + wg_row0 * 128 + (kk % 4) * 32
            assert np.array_equal(smem.operand(sQlo + qa, 64), lo(q_lo[:, sl])), ("Q lo", kk)
    for kk in range(BN // 8):
        for h in range(D // PVN):
            vb = (kk // 4) * (D * 128) + h * PVN * 128 + (kk % 4) * 32
            ref = vt_pos[h * PVN:(h + 1) * PVN, 8 * kk:8 * kk + 8]
            assert np.array_equal(smem.operand(sVhi + vb, PVN), hi(ref)), ("V^T hi", kk, h)
            assert np.array_equal(smem.operand(sVlo + vb, PVN), lo(ref)), ("V^T lo", kk, h)


def run_cta(cfg, q, k, v, batch, head, m_block, causal, window_right, fixed, scale):
    D, BM, BN, QREGS, PVN, LEAN = cfg
    nheads, nheads_k = q.shape[2], k.shape[2]
    sq, sk, hd = q.shape[1], k.shape[1], q.shape[3]
    stages = 2
    consumers = BM // 64
    tile = BN * D * 4
    qbytes = 0 if QREGS else BM * D * 4  # Traits::kQBytes: Q lo
    smem = Smem(qbytes + stages * 4 * tile + 64)
    sQlo, sSt = 0, qbytes
    sKhi = lambda s: sSt + s * 4 * tile
    sKlo = lambda s: sKhi(s) + tile
    sVhi = lambda s: sKhi(s) + 2 * tile
    sVlo = lambda s: sKhi(s) + 3 * tile
    gq, gk, gv = Gmem(q), Gmem(k), Gmem(v)
    head_k = head // (nheads // nheads_k)
    row0 = m_block * BM
    offset = sk - sq
    wr = 0 if causal else window_right
    nmax = (sk + BN - 1) // BN
    if wr >= 0:
        col_hi = min(row0 + BM, sq) - 1 + offset + wr
        nmax = 0 if col_hi < 0 else min(nmax, col_hi // BN + 1)

    # ---- producer (one stage per tile; the model runs tile by tile) ----
    def produce(n_block, s):
        before = smem.writes.copy()
        produce_tile(n_block, s)
        span = slice(sKhi(s) // 4, (sKhi(s) + 4 * tile) // 4)
        diff = smem.writes - before
        assert (diff[span] == 1).all() and diff.sum() == 4 * tile // 4, "stage words written once"
        n0 = n_block * BN
        kt = np.zeros((BN, D), np.float32)
        vt = np.zeros((D, BN), np.float32)
        nk = min(BN, sk - n0)
        kt[:nk, :hd] = k[batch, n0:n0 + nk, head_k]
        vt[:hd, :nk] = v[batch, n0:n0 + nk, head_k].T
        check_operands(smem, cfg, kt, vt, (sKhi(s), sKlo(s), sVhi(s), sVlo(s)))

    def produce_tile(n_block, s):
        kbase = batch * gk.batch_stride + head_k * gk.head_stride
        vbase = batch * gv.batch_stride + head_k * gv.head_stride
        n0, rows = n_block * BN, sk - n_block * BN
        col_threads = 128 // BN
        k_row_step = 128 // (D // 4)
        k_period = 1 if k_row_step >= 8 else 8 // k_row_step
        for tid in range(128):
            v_key, v_col = tid % BN, 4 * (tid // BN)
            k_row, k_col = tid // (D // 4), 4 * (tid % (D // 4))
            k_off = [swz(BN, k_row + k_row_step * i, k_col) for i in range(k_period)]
            v_off = [swz(D, v_col + e, key_pos(v_key)) for e in range(4)]
            gkt = kbase + n0 * gk.row_stride
            gvt = vbase + n0 * gv.row_stride
            kiters = BN * D // 4 // 128
            krow_base = gkt + k_row * gk.row_stride + (0 if fixed else k_col)
            for it in range(kiters):
                if LEAN:  # (Traits::kLean: tests against the remainders, column in the pointer)
                    x = gk.load4(krow_base + it * k_row_step * gk.row_stride + k_col, 0,
                                 k_row_step * it, rows - k_row, 0, hd - k_col, fixed)
                else:
                    x = gk.load4(krow_base + it * k_row_step * gk.row_stride, 0,
                                 k_row + k_row_step * it, rows, k_col, hd, fixed)
                hi, lo = zip(*(split(e) for e in x))
                off = k_off[it % k_period] + (it // k_period) * k_period * k_row_step * 128
                smem.st(sKhi(s) + off, hi)
                smem.st(sKlo(s) + off, lo)
            viters = D // (4 * col_threads)
            vrow_base = gvt + v_key * gv.row_stride + (0 if fixed else v_col)
            for it in range(viters):
                c = v_col + 4 * col_threads * it
                g = vrow_base if fixed else vrow_base + 4 * col_threads * it
                if LEAN:
                    x = gv.load4(vrow_base + v_col, 0, v_key, rows, 4 * col_threads * it,
                                 hd - v_col, fixed)
                else:
                    x = gv.load4(g, 0, v_key, rows, c, hd, fixed)
                for e in range(4):
                    hi, lo = split(x[e])
                    off = v_off[e] + 4 * col_threads * it * 128
                    smem.st(sVhi(s) + off, [hi])
                    smem.st(sVlo(s) + off, [lo])

    # ---- consumers ----
    gqbase = batch * gq.batch_stride + head * gq.head_stride
    out = np.full((BM, hd), np.nan)
    lse = np.full(BM, np.nan)
    for c in range(consumers):
        wg_row0 = 64 * c
        wg_first = row0 + wg_row0
        # lane_row per thread (128 threads): 16 warp + g
        thr = [(w, l) for w in range(4) for l in range(32)]
        lane_row = {t: row0 + wg_row0 + 16 * t[0] + t[1] // 4 for t in thr}
        qfrag = {}  # Q hi (and, QREGS, Q lo) as A fragments in registers
        for t in thr:
            g, qq = t[1] // 4, t[1] % 4
            fr = np.zeros((D // 8, 4, 2), np.float32)
            for kk in range(D // 8):
                for i in range(4):
                    row = lane_row[t] + 8 * (i & 1)
                    col = 8 * kk + qq + 4 * (i >> 1)
                    x = q[batch, row, head, col] if row < sq and col < hd else 0.0
                    fr[kk, i] = split(x)
            qfrag[t] = fr
        if not QREGS:
            before = smem.writes.copy()
            for tid in range(128):
                for i in range(tid, 64 * D // 4, 128):
                    r, cc = i // (D // 4), 4 * (i % (D // 4))
                    x = gq.load4(gqbase + (row0 + wg_row0) * gq.row_stride, gq.row_stride, r,
                                 sq - row0 - wg_row0, cc, hd, True)
                    hi, lo = zip(*(split(e) for e in x))
                    smem.st(sQlo + swz(BM, wg_row0 + r, cc), lo)
            diff = smem.writes - before
            qwords = 64 * D  # (the warpgroup's 64 rows of each chunk)
            assert diff.sum() == qwords and diff.max() == 1, "Q words written once"
            qm = np.zeros((64, D), np.float32)
            nr = max(0, min(64, sq - row0 - wg_row0))
            qm[:nr, :hd] = q[batch, row0 + wg_row0:row0 + wg_row0 + nr, head]
            for kk in range(D // 8):  # Q lo of this warpgroup, every element
                qa = (kk // 4) * (BM * 128) + wg_row0 * 128 + (kk % 4) * 32
                ref = np.vectorize(lambda x: split(x)[1], otypes=[np.float32])(
                    qm[:, 8 * kk:8 * kk + 8])
                assert np.array_equal(smem.operand(sQlo + qa, 64), ref), ("Q lo", kk)

        def a_from_regs(kk, which):
            a = np.full((64, 8), np.nan, np.float32)
            for t in thr:
                w, l = t
                g, qq = l // 4, l % 4
                for i in range(4):
                    a[16 * w + g + 8 * (i & 1), qq + 4 * (i >> 1)] = qfrag[t][kk, i, which]
            return a

        def to_regs(dmat):
            """Accumulator matrix (64 x N) -> per-thread register arrays."""
            n = dmat.shape[1]
            regs = {}
            for t in thr:
                w, l = t
                g, qq = l // 4, l % 4
                regs[t] = np.array([dmat[16 * w + g + 8 * ((j >> 1) & 1), 8 * (j >> 2) + 2 * qq + (j & 1)]
                                    for j in range(n // 2)], np.float64)
            return regs

        acc_o = {t: np.zeros(D // 2) for t in thr}
        row_max = {t: [-np.inf, -np.inf] for t in thr}
        row_sum = {t: [0.0, 0.0] for t in thr}
        scale_log2 = scale * np.log2(np.e)
        for j, n_block in enumerate(range(nmax - 1, -1, -1)):
            s = j % stages
            produce(n_block, s)
            # S
            S = np.zeros((64, BN))
            for kk in range(D // 8):
                kb = (kk // 4) * (BN * 128) + (kk % 4) * 32
                bhi = smem.operand(sKhi(s) + kb, BN).astype(np.float64)
                blo = smem.operand(sKlo(s) + kb, BN).astype(np.float64)
                if QREGS:
                    ahi, alo = a_from_regs(kk, 0), a_from_regs(kk, 1)
                else:  # Qlo Khi from shared memory (SS), Q hi from registers (RS)
                    qa = (kk // 4) * (BM * 128) + wg_row0 * 128 + (kk % 4) * 32
                    ahi, alo = a_from_regs(kk, 0), smem.operand(sQlo + qa, 64)
                ahi, alo = ahi.astype(np.float64), alo.astype(np.float64)
                S += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
            acc_s = to_regs(S)
            col0 = n_block * BN
            corr = {}
            for t in thr:
                w, l = t
                qq = l % 4
                a = acc_s[t]
                wrr = wr
                if col0 + BN > sk or (wrr >= 0 and col0 + BN - 1 > wg_first + offset + wrr):
                    for r in range(2):
                        row = lane_row[t] + 8 * r
                        chi = min(sk - 1, row + offset + wrr) if wrr >= 0 else sk - 1
                        for nt in range(BN // 8):
                            for e in (2 * r, 2 * r + 1):
                                if col0 + 8 * nt + 2 * qq + (e & 1) > chi:
                                    a[4 * nt + e] = -np.inf
            # row max over the quad (shfl xor 1, 2), then exp2 and the sums
            mq = {}
            for t in thr:
                w, l = t
                quad = [(w, (l & ~3) | x) for x in range(4)]
                mq[t] = []
                for r in range(2):
                    m = row_max[t][r]
                    for u in quad:
                        for nt in range(BN // 8):
                            m = max(m, acc_s[u][4 * nt + 2 * r], acc_s[u][4 * nt + 2 * r + 1])
                    mq[t].append(m)
            for t in thr:
                corr[t] = [0.0, 0.0]
                for r in range(2):
                    m = mq[t][r]
                    ms = 0.0 if m == -np.inf else m * scale_log2
                    corr[t][r] = 2.0 ** (row_max[t][r] * scale_log2 - ms)
                    ssum = 0.0
                    vals = acc_s[t]
                    for nt in range(BN // 8):
                        for e in (2 * r, 2 * r + 1):
                            idx = 4 * nt + e
                            vals[idx] = 2.0 ** (vals[idx] * scale_log2 - ms)
                            ssum += vals[idx]
                    row_max[t][r] = m
                    row_sum[t][r] = row_sum[t][r] * corr[t][r] + ssum
            # P fragments (c0, c2, c1, c3) and P V
            order = [0, 2, 1, 3]
            for k0, h in ((k0, h) for k0 in range(0, BN // 8, 4) for h in range(D // PVN)):
                T = np.zeros((64, PVN))
                for i in range(4):
                    kk = k0 + i
                    vb = (kk // 4) * (D * 128) + h * PVN * 128 + (kk % 4) * 32
                    bhi = smem.operand(sVhi(s) + vb, PVN).astype(np.float64)
                    blo = smem.operand(sVlo(s) + vb, PVN).astype(np.float64)
                    ahi = np.full((64, 8), np.nan)
                    alo = np.full((64, 8), np.nan)
                    for t in thr:
                        w, l = t
                        g, qq = l // 4, l % 4
                        for ii in range(4):
                            hi, lo = split(acc_s[t][4 * kk + order[ii]])
                            rr, cc = 16 * w + g + 8 * (ii & 1), qq + 4 * (ii >> 1)
                            ahi[rr, cc], alo[rr, cc] = hi, lo
                    T += alo @ bhi.T + ahi @ blo.T + ahi @ bhi.T
                tr = to_regs(T)
                for t in thr:
                    for i in range(PVN // 2):
                        o = h * (PVN // 2) + i
                        if k0 == 0:
                            acc_o[t][o] = acc_o[t][o] * corr[t][(i % 4) // 2] + tr[t][i]
                        else:
                            acc_o[t][o] += tr[t][i]
        # epilogue
        for t in thr:
            w, l = t
            qq = l % 4
            for r in range(2):
                quad = [(w, (l & ~3) | x) for x in range(4)]
                ssum = sum(row_sum[u][r] for u in quad)
                inv = 0.0 if ssum == 0 else 1.0 / ssum
                row = lane_row[t] + 8 * r
                if row < sq:
                    for dt in range(D // 8):
                        col = 8 * dt + 2 * qq
                        if col < hd:
                            out[row - row0, col] = acc_o[t][4 * dt + 2 * r] * inv
                            out[row - row0, col + 1] = acc_o[t][4 * dt + 2 * r + 1] * inv
                    if qq == 0:
                        lse[row - row0] = np.inf if ssum == 0 else row_max[t][r] * scale + np.log(ssum)
    return out, lse


def reference(q, k, v, batch, head, rows, causal, window_right, scale):
    nheads, nheads_k = q.shape[2], k.shape[2]
    hk = head // (nheads // nheads_k)
    sq, sk = q.shape[1], k.shape[1]
    Q = q[batch, rows, head].astype(np.float64)
    K = k[batch, :, hk].astype(np.float64)
    V = v[batch, :, hk].astype(np.float64)
    S = Q @ K.T * scale
    wr = 0 if causal else window_right
    if wr >= 0:
        i = np.arange(rows.start, rows.stop)[:, None]
        jj = np.arange(sk)[None, :]
        S = np.where(jj > i + sk - sq + wr, -np.inf, S)
    m = S.max(1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    P = np.exp(S - m)
    l = P.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        O = np.where(l > 0, P @ V / np.where(l > 0, l, 1), 0)
        lse = np.where(l[:, 0] > 0, m[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1)), np.inf)
    return O, lse


# kernel -> (D, BM, BN, QREGS, PVN, LEAN): Fp32WgTraits<64>, <128>.
CONFIGS = {64: (64, 128, 64, True, 64, False), 128: (128, 128, 32, False, 64, True)}


def check(kd, b, sq, sk, h, hk, d, causal, wr, m_block, fixed, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, sq, h, d)).astype(np.float32)
    k = rng.standard_normal((b, sk, hk, d)).astype(np.float32)
    v = rng.standard_normal((b, sk, hk, d)).astype(np.float32)
    scale = d ** -0.5
    cfg = CONFIGS[kd]
    batch, head = b - 1, h - 1
    try:
        out, lse = run_cta(cfg, q, k, v, batch, head, m_block, causal, wr, fixed, scale)
    except IndexError as e:
        return f"{e}"
    row0 = m_block * cfg[1]
    rows = slice(row0, min(row0 + cfg[1], sq))
    n = rows.stop - rows.start
    O, L = reference(q, k, v, batch, head, rows, causal, wr, scale)
    o = out[:n, :d]
    if np.isnan(o).any():
        return f"NaN in out ({np.isnan(o).sum()} of {o.size})"
    lse_m = lse[:n]
    fin = np.isfinite(L)
    err_o = np.abs(o - O).max()
    err_l = np.abs(lse_m[fin] - L[fin]).max() if fin.any() else 0.0
    if not np.array_equal(np.isfinite(lse_m), fin):
        return f"lse finiteness differs; out err {err_o:.2e}"
    return f"out err {err_o:.2e} lse err {err_l:.2e}"


if __name__ == "__main__":
    fixed = "--buggy" not in sys.argv
    cases = [
        # kd, b, sq, sk, h, hk, d, causal, window_right, m_block
        (64, 1, 113, 203, 4, 2, 64, False, -1, 0),
        (64, 1, 113, 203, 4, 2, 64, True, -1, 0),
        (64, 1, 200, 333, 2, 1, 64, False, 16, 1),
        (64, 1, 70, 70, 2, 2, 40, True, -1, 0),
        # d128: 128-row tiles (rows of the second warpgroup past the end, ragged in either),
        # key tails, causal, a right window, GQA / MQA, d < 128
        (128, 1, 128, 64, 2, 1, 128, False, -1, 0),
        (128, 2, 1, 97, 2, 2, 128, False, -1, 0),
        (128, 1, 64, 33, 2, 1, 128, True, -1, 0),
        (128, 1, 200, 333, 4, 2, 128, True, -1, 1),
        (128, 1, 129, 67, 4, 1, 96, False, -1, 1),
        (128, 2, 150, 97, 2, 2, 72, False, 40, 0),
        (128, 1, 256, 256, 2, 1, 128, True, -1, 0),  # key tiles all masked for rows 0-63
        (128, 1, 300, 100, 2, 2, 128, True, -1, 1),  # rows 128-199 see no key
    ]
    for c in cases:
        print(("fixed " if fixed else "buggy ") + str(c), "->", check(*c, fixed=fixed))
