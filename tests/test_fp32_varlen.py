"""float32 varlen and deterministic backward (issue 21; the kVarlen / kGeneral instances of
cpp/fp32, FLASHATTN2_EXPERIMENTAL=fp32 builds).

CPU: the refusals that remain (paged K/V, dropout on varlen) and a model of the
deterministic dQ order (bwd_kernel.cuh's query-tile walk with dq_order.cuh's ranks): every
64-row group's visitors have the ranks 0 .. n - 1, and a scheduler that runs the CTAs in
launch order with few resident never deadlocks. GPU: each packed sequence against float64
with the 2x rule of test_fp32.py (outputs NaN-poisoned first), and deterministic gradients
bitwise equal over 3 runs (and accurate).
"""
import math

import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from fp32_checks import GRADS, check_2x, grads, ref_attention
from test_fp32 import _qkv, needs_fp32, needs_fp32_bwd

gpu = pytest.mark.gpu
NAN = float("nan")


def _cu(lengths, device="cuda"):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    out[1:] = torch.tensor(lengths, device=device).cumsum(0)
    return out


def _packed(lengths_q, lengths_k, h, hk, d, device="cuda"):
    q = torch.randn(sum(lengths_q), h, d, device=device)
    k = torch.randn(sum(lengths_k), hk, d, device=device)
    v = torch.randn(sum(lengths_k), hk, d, device=device)
    return q, k, v


# ---- CPU: refusals ------------------------------------------------------------------------


def test_fp32_varlen_unbuilt_says_how_to_build(monkeypatch):
    """A build without the float32 kernels (simulated in builds that have them)."""
    monkeypatch.setattr(_ext, "EXPERIMENTAL", _ext.EXPERIMENTAL - {"fp32"})
    q, k, v = _packed([5], [5], 2, 2, 16, device="cpu")
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL including fp32"):
        flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)
    with pytest.raises(ValueError, match="query and key must have the same dtype"):
        flashattn2.flash_attn_varlen_func(q.half(), k, v, cu, cu, 5, 5)


@needs_fp32
def test_fp32_varlen_refusals():
    q, k, v = _packed([5], [5], 2, 2, 16, device="cpu")
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="float32 inputs do not support dropout_p"):
        flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, dropout_p=0.1, softcap=3.0)
    with pytest.raises(NotImplementedError, match="do not support dropout_p"):
        flashattn2.flash_attn_varlen_qkvpacked_func(torch.stack((q, k, v), 1), cu, 5,
                                                    dropout_p=0.5, alibi_slopes=torch.ones(2))
    with pytest.raises(NotImplementedError, match="do not support dropout_p"):
        flashattn2.flash_attn_varlen_kvpacked_func(q, torch.stack((k, v), 1), cu, cu, 5, 5,
                                                   dropout_p=0.1)
    pages = torch.randn(2, 16, 2, 16)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="float32 inputs do not support a paged KV"):
        flashattn2.flash_attn_varlen_func(q, pages, pages, cu, cu, 5, 5, block_table=table)
    with pytest.raises(ValueError, match="float32 supports head dims up to 128; got 136"):
        q, k, v = _packed([5], [5], 2, 2, 136, device="cpu")
        flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors"):
        q, k, v = _packed([5], [5], 2, 2, 16, device="cpu")
        flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)


# ---- CPU: the deterministic order, modelled -------------------------------------------------

BLOCK_N, GROUP = 64, 64  # fwd_config.h kFp32BwdBlockN; bwd_kernel.cuh kFp32DqGroupRows


def _visits(n, sq, sk, block_m, wl, wr, heads):
    """(head, 64-row group) of each step of K/V tile n, in order (bwd_kernel.cuh's walk)."""
    offset, n0 = sk - sq, n * BLOCK_N
    lo, hi = 0, (sq + block_m - 1) // block_m
    if wr >= 0:
        i_lo = n0 - offset - wr
        lo = 0 if i_lo <= 0 else min(hi, i_lo // block_m)
    if wl >= 0:
        i_hi = min(sk, n0 + BLOCK_N) - 1 + wl - offset
        hi = 0 if i_hi < 0 else min(hi, i_hi // block_m + 1)
    out = []
    for h in range(heads):
        for m in range(lo, hi):
            g = m * block_m // GROUP
            if not out or out[-1] != (h, g):
                out.append((h, g))
    return out


def _rank(n, g, sq, sk, wl, wr):
    """dq_order.cuh DqOrder<64, 64>::rank without rotation."""
    offset = sk - sq
    if wr >= 0:  # descending
        x = (g + 1) * GROUP - 1 + offset + wr
        return min((sk - 1) // BLOCK_N, max(x, 0) // BLOCK_N) - n
    x = g * GROUP + offset - wl
    return n - (x // BLOCK_N if wl >= 0 and x > 0 else 0)


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize("shape", [(300, 300, -1, -1), (300, 300, -1, 0), (100, 700, -1, 0),
                                   (700, 100, -1, -1), (500, 450, 70, 20), (450, 500, 100, -1),
                                   (513, 513, -1, 40), (64, 1000, 0, 0), (1000, 64, 3, -1)],
                         ids=str)
def test_fp32_deterministic_order_model(block_m, shape):
    sq, sk, wl, wr = shape
    if wr >= sq:  # (mha_bwd's window normalisation)
        wr = -1
    if wl >= sk:
        wl = -1
    heads, n_tiles = 2, (sk + BLOCK_N - 1) // BLOCK_N
    walks = {n: _visits(n, sq, sk, block_m, wl, wr, heads) for n in range(n_tiles)}
    visitors = {}
    for n, walk in walks.items():
        for hg in walk:
            visitors.setdefault(hg, []).append(_rank(n, hg[1], sq, sk, wl, wr))
    for hg, ranks in visitors.items():
        assert sorted(ranks) == list(range(len(ranks))), f"group {hg}: ranks {sorted(ranks)}"
    # Launch order: descending runs the last tile first. Two CTAs resident at a time.
    order = sorted(walks, reverse=wr >= 0)
    counters, pos, resident, pending = {}, dict.fromkeys(walks, 0), [], list(order)
    while pending or resident:
        while pending and len(resident) < 2:
            resident.append(pending.pop(0))
        moved = False
        for n in list(resident):
            if pos[n] == len(walks[n]):
                resident.remove(n)
                moved = True
                continue
            hg = walks[n][pos[n]]
            if counters.get(hg, 0) == _rank(n, hg[1], sq, sk, wl, wr):
                counters[hg] = counters.get(hg, 0) + 1
                pos[n] += 1
                moved = True
        assert moved, f"deadlock: resident {resident} at {[walks[n][pos[n]] for n in resident]}"


# ---- GPU: accuracy against float64 ---------------------------------------------------------


def _per_sequence_ref(lengths_q, lengths_k, causal, window, softcap=0.0, slopes=None):
    """A ref for check_2x: packed q, k, v -> out (total_q, h, d) (differentiable), lse
    (h, total_q), sequence by sequence in q's dtype; slopes (h,) or (batch, h)."""
    def ref(q, k, v):
        outs, lses, bq, bk = [], [], 0, 0
        for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
            if lk == 0 or lq == 0:
                outs.append(torch.zeros_like(q[bq:bq + lq]))
                lses.append(torch.full((q.shape[1], lq), math.inf, dtype=q.dtype, device=q.device))
            else:
                s = slopes if slopes is None or slopes.dim() == 1 else slopes[b:b + 1]
                seq = [t[a:a + n][None] for t, a, n in ((q, bq, lq), (k, bk, lk), (v, bk, lk))]
                out, lse = ref_attention(causal, window, softcap, s)(*seq)
                outs.append(out[0])
                lses.append(lse[0])
            bq, bk = bq + lq, bk + lk
        return torch.cat(outs), torch.cat(lses, dim=1)
    return ref


# (lengths_q, lengths_k): empty sequences (no queries, no keys), single tokens, ragged tails,
# sq != sk; "long": 2k-token sequences of several K/V and query tiles.
LENGTHS = {
    "ragged": ([17, 0, 1, 130, 257, 64, 3], [33, 5, 1, 130, 200, 0, 90]),
    "long": ([1000, 2048], [1500, 2048]),
}
CASES = [(4, 2, 64, False, (-1, -1)), (4, 2, 64, True, (-1, -1)), (2, 2, 32, True, (-1, -1)),
         (6, 2, 128, False, (-1, -1)), (3, 1, 40, False, (48, 16)), (4, 4, 96, True, (-1, -1))]


def _case_id(case):
    h, hk, d, causal, window = case
    return f"h{h}:{hk}-d{d}" + ("-causal" if causal else "") + (
        f"-w{window[0]},{window[1]}" if window != (-1, -1) else "")


def _varlen_kernel_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr):
    """The varlen forward kernel alone into NaN-poisoned out / lse (varlen._varlen_forward's
    launch)."""
    out = torch.full_like(q, NAN)
    lse = torch.full((q.shape[1], q.shape[0]), NAN, device=q.device)
    _launch._launch_fwd(q, k, v, out, lse, (0,) + q.stride()[:2], (0,) + k.stride()[:2],
                          (0,) + v.stride()[:2], (0,) + out.stride()[:2], (0, lse.stride(0)),
                          cu_q.shape[0] - 1, max_q, max_k, q.shape[1], k.shape[1], q.shape[2],
                          scale, wl, wr, 1, None, cu_seqlens_q=cu_q.data_ptr(),
                          total_q=q.shape[0], cu_seqlens_k=cu_k.data_ptr(), total_k=k.shape[0])
    return out, lse


def _varlen_kernel_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, wl, wr,
                       deterministic):
    """The varlen backward kernels alone into NaN-poisoned dq / dk / dv (every row belongs to
    a sequence, so every row must be written)."""
    dq, dk, dv = (torch.full_like(t, NAN) for t in (q, k, v))
    _launch._launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, (0, lse.stride(0)),
                          cu_q.shape[0] - 1, max_q, max_k, q.shape[1], k.shape[1], q.shape[2],
                          scale, wl, wr, deterministic, None, cu_seqlens_q=cu_q,
                          cu_seqlens_k=cu_k)
    return dq, dk, dv


@gpu
@needs_fp32
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_fp32_varlen_forward_against_float64(lengths, case):
    h, hk, d, causal, window = case
    lq, lk = LENGTHS[lengths]
    q, k, v = _packed(lq, lk, h, hk, d)
    cu_q, cu_k = _cu(lq), _cu(lk)
    wl, wr = window[0], 0 if causal else window[1]
    out, lse = _varlen_kernel_fwd(q, k, v, cu_q, cu_k, max(lq), max(lk), d**-0.5, wl, wr)
    check_2x(("out", "lse"), (out, lse), _per_sequence_ref(lq, lk, causal, window), (q, k, v))
    public = flashattn2.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk),
                                               causal=causal, window_size=window)
    assert torch.equal(public, out)


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_fp32_varlen_backward_against_float64(lengths, case, deterministic):
    h, hk, d, causal, window = case
    lq, lk = LENGTHS[lengths]
    q, k, v = _packed(lq, lk, h, hk, d)
    dout = torch.randn_like(q)
    cu_q, cu_k = _cu(lq), _cu(lk)
    wl, wr = window[0], 0 if causal else window[1]
    ref = _per_sequence_ref(lq, lk, causal, window)
    out, lse = _varlen_kernel_fwd(q, k, v, cu_q, cu_k, max(lq), max(lk), d**-0.5, wl, wr)
    runs = [_varlen_kernel_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max(lq), max(lk), d**-0.5,
                               wl, wr, deterministic) for _ in range(3 if deterministic else 1)]
    check_2x(GRADS, runs[0], ref, (q, k, v), dout)  # (every row must be written: no NaN)
    for run in runs[1:]:
        for name, a, b in zip(GRADS, runs[0], run):
            assert torch.equal(a, b), f"deterministic {name} differs between runs"
    # The public function (autograd) gives the same gradients.
    public = grads(lambda *t: flashattn2.flash_attn_varlen_func(
        *t, cu_q, cu_k, max(lq), max(lk), causal=causal, window_size=window,
        deterministic=deterministic), (q, k, v), dout)
    if deterministic:
        for name, a, b in zip(GRADS, runs[0], public):
            assert torch.equal(a, b), f"public {name} differs from the kernel's"
    else:
        check_2x(["public " + name for name in GRADS], public, ref, (q, k, v), dout)


@gpu
@needs_fp32
@needs_fp32_bwd
def test_fp32_varlen_packed_variants():
    """qkvpacked / kvpacked varlen: q, k, v read in place from the packed tensors; the
    gradients packed like them."""
    lengths = [70, 0, 129, 33]
    cu = _cu(lengths)
    qkv = torch.randn(sum(lengths), 3, 4, 64, device="cuda", requires_grad=True)
    out = flashattn2.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lengths), causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q = qkv.detach()[:, 0]
    check_2x(["qkvpacked " + name for name in GRADS], qkv.grad.unbind(1),
             _per_sequence_ref(lengths, lengths, True, (-1, -1)), qkv.detach().unbind(1), dout)
    kv = torch.randn(sum(lengths), 2, 2, 64, device="cuda", requires_grad=True)
    out = flashattn2.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lengths), max(lengths))
    out.backward(dout)
    ref = _per_sequence_ref(lengths, lengths, False, (-1, -1))
    check_2x(("kvpacked dk", "kvpacked dv"), kv.grad.unbind(1),
             lambda k, v: ref(q.to(k.dtype), k, v), kv.detach().unbind(1), dout)


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("headdim", [20, 100])
def test_fp32_varlen_head_dims_not_multiples_of_8(headdim):
    """Zero-padded to a multiple of 8 by the public function (a copy): out and the gradients
    sliced back, under the 2x rule."""
    lq, lk = LENGTHS["ragged"]
    q, k, v = _packed(lq, lk, 4, 2, headdim)
    cu_q, cu_k = _cu(lq), _cu(lk)
    ref = _per_sequence_ref(lq, lk, True, (-1, -1))
    run = lambda *t: flashattn2.flash_attn_varlen_func(*t, cu_q, cu_k, max(lq), max(lk),
                                                        causal=True)  # fmt: skip
    out = run(q, k, v)
    assert out.shape == q.shape
    check_2x(("out",), (out,), ref, (q, k, v))
    check_2x(GRADS, run, ref, (q, k, v), torch.randn_like(q))


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): the three orders of
# dq_order.cuh (ascending: full attention and a left window only; descending: causal and a
# right bound), GQA groups of 4 (a CTA walks 4 heads), sq != sk.
DET_SHAPES = [
    (2, 1000, 1000, 4, 1, 64, False, (-1, -1)),
    (1, 1500, 700, 4, 2, 128, True, (-1, -1)),
    (1, 700, 1500, 2, 2, 32, False, (200, -1)),
    (2, 513, 600, 4, 2, 40, False, (100, 30)),
    (1, 2048, 2048, 2, 1, 64, True, (-1, -1)),
]


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("shape", DET_SHAPES, ids=str)
def test_fp32_deterministic_backward(shape):
    """deterministic=True: dq, dk, dv bitwise equal over 3 runs, and within the 2x rule."""
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    dout = torch.randn_like(q)
    ours = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window,
                                                 deterministic=True)
    first = check_2x(GRADS, ours, ref_attention(causal, window), (q, k, v), dout)
    for _ in range(2):
        for name, a, b in zip(GRADS, first, grads(ours, (q, k, v), dout)):
            assert torch.equal(a, b), f"deterministic {name} differs between runs"


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp32_varlen_softcap_alibi(causal, deterministic):
    """softcap and ALiBi ((batch, nheads) slopes) on packed sequences, forward and backward."""
    lq, lk = LENGTHS["ragged"]
    h, hk, d, softcap = 4, 2, 64, 3.0
    q, k, v = _packed(lq, lk, h, hk, d)
    slopes = torch.rand(len(lq), h, device="cuda") * 0.5
    dout = torch.randn_like(q)
    cu_q, cu_k = _cu(lq), _cu(lk)
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn2.flash_attn_varlen_func(
        *inputs, cu_q, cu_k, max(lq), max(lk), causal=causal, softcap=softcap,
        alibi_slopes=slopes, deterministic=deterministic, return_attn_probs=True)
    out.backward(dout)
    ref = _per_sequence_ref(lq, lk, causal, (-1, -1), softcap, slopes)
    check_2x(("out", "lse"), (out.detach(), lse), ref, (q, k, v))
    check_2x(GRADS, [t.grad for t in inputs], ref, (q, k, v), dout)
