"""Randomized differential test: sampled configurations of flash_attn_func (and its packed
forms), flash_attn_varlen_func (packed forms, paged K/V) and flash_attn_with_kvcache against
the float32 reference, forward and backward.

A case samples batch, sequence lengths (0 and 1 included), heads and GQA ratio, head dim
(1-256), memory layout (strided views: slices of one packed buffer, transposed storage,
padded or misaligned rows), dtype, causal / window / softcap / ALiBi / dropout / softmax
scale; varlen lengths and paged K/V; KV-cache lengths, paging, appended k/v, rotary,
cache_batch_idx, cache_leftpad and num_splits. Shapes stay small so that the reference is
cheap: a minute covers a few hundred cases.

Each result is held to the error rule of test_fwd.py / test_bwd.py: ``max|x - ref| <=
2 * max|x_pt - ref| + ATOL``, ref the float32 reference and x_pt the same reference in the
input dtype (dropout: with the kernels' keep mask, from the package's mask helper), with
two refinements for what small random cases reach: ATOL scaled to the binade of max|ref|,
and for gradients the closer of two float32 references (``reference``). LSE as in
test_fwd.py, plus the softcap tanh.approx bound. Every tensor the package allocates with torch.empty / torch.empty_like
during the call starts NaN-filled (outputs, LSE, workspaces), so an element the kernels
leave unwritten fails the case. The appended cache rows are checked exactly (within one
rounding with rotary), and nothing else in the cache may change.

Environment:
  FLASHATTN2_FUZZ_SECONDS  time budget of the three GPU tests together (default 60), split
                           evenly between them
  FLASHATTN2_FUZZ_SEED     seed of the first case of each test (default 0); case i uses
                           seed + i, for its configuration and its tensors
  FLASHATTN2_FUZZ_CASES    stop each test after this many cases (default: no limit)
  FLASHATTN2_FUZZ_PENDING  1: also sample the three divergences whose fixes are pending
                           (fuzz_sampling.PENDING_PARITY_FIXES_MERGED, the switch that
                           turns them on for good)
A failing case reports its seed, its configuration and the command that reruns it alone.
The configurations come from fuzz_sampling.py (pure Python, checked on the CPU below).
"""
import contextlib
import math
import os
import time

import pytest
import torch
from flashattn2 import (
    _checks,
    _ext,
    _launch,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
import fuzz_sampling
from reference import attention_ref, attention_scores
from test_fwd import ATOL, LSE_ATOL, LSE_RTOL
from test_kvcache import rotate_ref

SECONDS = float(os.environ.get("FLASHATTN2_FUZZ_SECONDS", "60"))
SEED = int(os.environ.get("FLASHATTN2_FUZZ_SEED", "0"))
MAX_CASES = int(os.environ.get("FLASHATTN2_FUZZ_CASES", "0")) or None

DEVICE = "cuda"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
ROTARY_TOL = dict(atol=1e-5, rtol=2**-7)  # one rounding of the rotated value (FMA contraction)


# ---- tensors -----------------------------------------------------------------------------------


def randn(shape, dtype, layout="contiguous", requires_grad=False):
    """N(0, 1) values of logical ``shape`` (..., seqlen, heads, d) stored as ``layout``; with
    ``requires_grad`` the storage is the leaf and the result a view of it."""
    d = shape[-1]
    if layout == "transposed":
        base = torch.randn(*shape[:-3], shape[-2], shape[-3], d, device=DEVICE, dtype=dtype)
    elif layout in ("padded", "offset"):
        base = torch.randn(*shape[:-1], d + 3, device=DEVICE, dtype=dtype)
    else:
        base = torch.randn(*shape, device=DEVICE, dtype=dtype)
    base.requires_grad_(requires_grad)
    if layout == "transposed":
        return base.transpose(-3, -2)
    if layout == "padded":
        return base[..., :d]
    if layout == "offset":
        return base[..., 1 : d + 1]
    return base


def make_qkv(c, lead_q, lead_k, grad):
    """q (*lead_q, h, d), k, v (*lead_k, h_k, d) laid out as c["layout"] says; returns q, k,
    v and the tensors the call takes and the gradients are taken for."""
    dtype, d, h, hk, lay = DTYPES[c["dtype"]], c["headdim"], c["nheads"], c["nheads_k"], c["layout"]
    packed_dim = len(lead_q)
    if c["api"] == "qkvpacked":
        qkv = randn((*lead_q, 3, h, d), dtype, lay["qkv"], grad)
        return (*qkv.unbind(packed_dim), (qkv,))
    if c["api"] == "kvpacked":
        q = randn((*lead_q, h, d), dtype, lay["q"], grad)
        kv = randn((*lead_k, 2, hk, d), dtype, lay["kv"], grad)
        return (q, *kv.unbind(packed_dim), (q, kv))
    if lay.get("qkv") == "split-heads":
        q, k, v = randn((*lead_q, h + 2 * hk, d), dtype, "contiguous", grad).split([h, hk, hk], -2)
    else:
        q = randn((*lead_q, h, d), dtype, lay["q"], grad)
        k, v = (randn((*lead_k, hk, d), dtype, lay[name], grad) for name in ("k", "v"))
    return q, k, v, (q, k, v)


def unpack_grads(c, grads, dim):
    if c["api"] == "qkvpacked":
        return grads[0].unbind(dim)
    if c["api"] == "kvpacked":
        return (grads[0], *grads[1].unbind(dim))
    return grads


def alibi_slopes(kind, batch, nheads):
    if kind is None:
        return None
    return torch.rand((nheads,) if kind == "h" else (batch, nheads), device=DEVICE) * 0.3


def window_for(c, bound):
    """flash-attn: a window bound >= ``bound`` (seqlen_k, max_seqlen_k, the cache length) is
    unbounded."""
    return tuple(-1 if w >= bound else w for w in c["window_size"])


def backward_supported(headdim):
    try:
        _checks._check_backward(headdim, torch.device(DEVICE, torch.cuda.current_device()))
    except NotImplementedError:
        return False
    return True


@contextlib.contextmanager
def nan_filled_allocations():
    """Inside, torch.empty and torch.empty_like, which the package allocates outputs, LSE and
    workspaces with, return NaN-filled floating-point tensors: what the kernels leave
    unwritten stays NaN."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(factory):
        def make(*args, **kwargs):
            t = factory(*args, **kwargs)
            if t.is_floating_point():
                t.fill_(float("nan"))
            return t

        return make

    torch.empty, torch.empty_like = poisoned(empty), poisoned(empty_like)
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like


def replayed_keep_mask(cuda_rng, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """The keep mask of the call that started from CUDA RNG state ``cuda_rng`` (its one draw
    of rng_state), from the package's mask helper."""
    torch.cuda.set_rng_state(cuda_rng)
    state = _launch._rng_state(torch.device(DEVICE, torch.cuda.current_device()))
    return _launch._dropout_keep_mask(state, batch, nheads, seqlen_q, seqlen_k, dropout_p)


# ---- reference and checks ----------------------------------------------------------------------


def reference(q, k, v, dout, out_given=None, **kwargs):
    """((out, lse, grads, grads_given) in float32, (out, grads) in q's dtype) for q (b, sq, h,
    d), k, v (b, sk, h_k, d); grads None without dout. No query or no key: out 0, lse +inf.

    grads_given (with dout and ``out_given``, the output the kernels returned): the float32
    gradients of the FA2 backward (Algorithm 2) evaluated at that output, whose D =
    rowsum(dO * out) is taken from the rounded output rather than the exact one. Where
    PyTorch's gradients are exact (one visible key and dropout: dS = 0 up to that D), the
    kernels' error is this rounding of out, which the 2x rule cannot absorb."""
    batch, seqlen_q, nheads, _ = q.shape
    if batch == 0 or seqlen_q == 0 or k.shape[1] == 0:
        out = torch.zeros(q.shape, device=q.device)
        lse = torch.full((batch, nheads, seqlen_q), float("inf"), device=q.device)
        grads = None if dout is None else [torch.zeros(t.shape, device=q.device) for t in (q, k, v)]
        return (out, lse, grads, None), (out, grads)
    results = []
    grads_given = None
    for upcast in (True, False):
        cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
        leaves = [cast(t).requires_grad_(dout is not None) for t in (q, k, v)]
        out, lse = attention_ref(*leaves, upcast=upcast, **kwargs)
        grads = None if dout is None else torch.autograd.grad(out, leaves, cast(dout))
        if upcast and grads is not None and out_given is not None:
            shift = d_shift(leaves, dout, out_given.float() - out.detach(), kwargs)
            grads_given = [grads[0] - shift[0], grads[1] - shift[1], grads[2]]
        results.append((out.detach(), lse, grads))
    (out, lse, grads), (out_pt, _, grads_pt) = results
    return (out, lse, grads, grads_given), (out_pt, grads_pt)


def d_shift(leaves, dout, out_error, kwargs):
    """(dq, dk) that D = rowsum(dO * out) + delta adds to the FA2 backward, delta = rowsum(dO *
    out_error): dS_ij = P_ij (dP_ij - D_i) changes by -P_ij delta_i (P undropped), which is
    the gradient, through the logits, of sum_ij P_ij delta_i S_ij with P held fixed."""
    q, k = leaves[0], leaves[1]
    scores, mask = attention_scores(q, k, kwargs.get("causal", False),
                                    kwargs.get("window_size", (-1, -1)),
                                    kwargs.get("softmax_scale"), kwargs.get("softcap", 0.0),
                                    kwargs.get("alibi_slopes"))  # fmt: skip
    probs = torch.softmax(scores.detach(), dim=-1).nan_to_num(0.0)  # rows without keys: 0
    delta = (dout.float() * out_error).sum(-1).transpose(1, 2)  # (b, h, sq)
    weighted = probs * delta.unsqueeze(-1) * torch.where(mask, scores, 0.0)
    return torch.autograd.grad(weighted.sum(), (q, k))


def check_rule(name, got, ref, ref_pt, dtype, ref_given=None):
    """The error rule; ``ref_given`` (gradients): the float32 FA2 backward at the kernels'
    output (``reference``), the closer of the two references counts."""
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)}, not {tuple(ref.shape)}"
    assert not got.isnan().any(), f"{name} has NaN: an element left unwritten or computed as NaN"
    if got.numel() == 0:
        return
    err = (got.float() - ref.float()).abs().max().item()
    if ref_given is not None:
        err = min(err, (got.float() - ref_given.float()).abs().max().item())
    err_pt = (ref_pt.float() - ref.float()).abs().max().item()
    # ATOL is a rounding at magnitude 1 (test_bwd.py); sampled cases reach larger values (rows
    # that see one or two keys give |out| ~ |v| up to ~4), where one rounding is that much
    # larger: ATOL times the binade of the largest reference value.
    peak = ref.float().abs().max().item()
    binade = 2.0 ** math.floor(math.log2(peak)) if peak >= 1 else 1.0
    bound = 2 * err_pt + ATOL[dtype] * binade
    assert err <= bound, (f"{name}: max |{name} - ref| = {err:.3e} > {bound:.3e} "
                          f"(PyTorch: {err_pt:.3e})")


def check_lse(lse, lse_ref, atol=LSE_ATOL):
    assert not lse.isnan().any(), "lse has NaN: an element left unwritten or computed as NaN"
    torch.testing.assert_close(lse, lse_ref, atol=atol, rtol=LSE_RTOL)


def check_results(c, out, lse, grads, ref, ref_pt, lse_atol=LSE_ATOL):
    dtype = DTYPES[c["dtype"]]
    assert out.dtype == dtype
    check_rule("out", out, ref[0], ref_pt[0], dtype)
    if lse is not None:
        # softcap: tanh.approx.f32 (relative error <= 2^-10.99) moves each logit by up to
        # softcap * 2^-10.99, and the LSE (a smooth max of the logits) by no more.
        check_lse(lse, ref[1], lse_atol + c["softcap"] * 2**-10.99)
    if grads is not None:
        given = ref[3] if ref[3] is not None else (None,) * 3
        for name, g, g_ref, g_pt, g_given in zip(("dq", "dk", "dv"), grads, ref[2], ref_pt[1],
                                                 given):  # fmt: skip
            assert g.dtype == dtype, name
            check_rule(name, g, g_ref, g_pt, dtype, g_given)


def run_dense(c):
    dtype, batch, sq, sk = DTYPES[c["dtype"]], c["batch"], c["seqlen_q"], c["seqlen_k"]
    grad = c["grad"] and backward_supported(c["headdim"])
    q, k, v, inputs = make_qkv(c, (batch, sq), (batch, sk), grad)
    alibi = alibi_slopes(c["alibi"], batch, c["nheads"])
    dout = randn(q.shape, dtype, c["layout"]["dout"])
    kwargs = dict(dropout_p=c["dropout_p"], softmax_scale=c["softmax_scale"], causal=c["causal"],
                  window_size=c["window_size"], softcap=c["softcap"], alibi_slopes=alibi,
                  deterministic=c["deterministic"], return_attn_probs=True)  # fmt: skip
    fn = dict(func=flash_attn_func, kvpacked=flash_attn_kvpacked_func,
              qkvpacked=flash_attn_qkvpacked_func)[c["api"]]  # fmt: skip
    cuda_rng = torch.cuda.get_rng_state()
    with nan_filled_allocations():
        out, lse, _ = fn(*inputs, **kwargs)
        grads = torch.autograd.grad(out, inputs, dout) if grad else None
    if grads is not None:
        grads = unpack_grads(c, grads, 2)
    ref_kwargs = dict(causal=c["causal"], window_size=window_for(c, sk),
                      softmax_scale=c["softmax_scale"], softcap=c["softcap"], alibi_slopes=alibi)
    if c["dropout_p"]:
        keep = replayed_keep_mask(cuda_rng, batch, c["nheads"], sq, sk, c["dropout_p"])
        ref_kwargs.update(dropout_p=c["dropout_p"], dropout_mask=keep)
    ref, ref_pt = reference(q, k, v, dout if grad else None, out, **ref_kwargs)
    check_results(c, out, lse, grads, ref, ref_pt)


def cu_seqlens(lengths):
    return torch.tensor([0] + lengths, device=DEVICE).cumsum(0).to(torch.int32)


def page_rows(lengths, table, page_size):
    """(page, row in page) of every packed row of the sequences, for a block table."""
    pages, rows = [], []
    for b, n in enumerate(lengths):
        r = torch.arange(n, device=DEVICE)
        pages.append(table[b].long()[r // page_size])
        rows.append(r % page_size)
    return torch.cat(pages), torch.cat(rows)


def run_varlen(c):
    dtype, lq, lk = DTYPES[c["dtype"]], c["lengths_q"], c["lengths_k"]
    batch, h, max_q, max_k = len(lq), c["nheads"], c["max_seqlen_q"], c["max_seqlen_k"]
    grad = c["grad"] and backward_supported(c["headdim"])
    q, k, v, inputs = make_qkv(c, (sum(lq),), (sum(lk),), grad)
    kwargs = {}
    if c["page_size"]:
        # Pages of every sequence in a random order among spare ones (random values).
        max_pages = max(1, -(-max_k // c["page_size"])) + 1
        num_blocks = batch * max_pages + 2
        table = torch.randperm(num_blocks, device=DEVICE)[: batch * max_pages]
        table = table.view(batch, max_pages).to(torch.int32)
        at = page_rows(lk, table, c["page_size"])
        paged = []
        for t in (k, v):
            p = torch.randn(num_blocks, c["page_size"], *t.shape[1:], device=DEVICE, dtype=dtype)
            p[at] = t.detach()
            paged.append(p.requires_grad_(grad))
        inputs = (q, *paged)
        kwargs["block_table"] = table
    alibi = alibi_slopes(c["alibi"], batch, h)
    dout = randn(q.shape, dtype, c["layout"]["dout"])
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    kwargs.update(dropout_p=c["dropout_p"], softmax_scale=c["softmax_scale"], causal=c["causal"],
                  window_size=c["window_size"], softcap=c["softcap"], alibi_slopes=alibi,
                  deterministic=c["deterministic"], return_attn_probs=not c["dropout_p"])
    args = (cu_q, max_q) if c["api"] == "qkvpacked" else (cu_q, cu_k, max_q, max_k)
    fn = dict(func=flash_attn_varlen_func, kvpacked=flash_attn_varlen_kvpacked_func,
              qkvpacked=flash_attn_varlen_qkvpacked_func)[c["api"]]  # fmt: skip
    cuda_rng = torch.cuda.get_rng_state()
    grads = None
    with nan_filled_allocations():
        result = fn(*inputs, *args, **kwargs)
        out, lse = result[:2] if isinstance(result, tuple) else (result, None)
        if grad:
            try:
                grads = torch.autograd.grad(out, inputs, dout)
            except NotImplementedError:
                if not c["page_size"]:
                    raise  # paged K/V: a backward that is not implemented may say so
    keep = None
    if c["dropout_p"]:
        keep = replayed_keep_mask(cuda_rng, batch, h, max_q, max_k, c["dropout_p"])
    refs, refs_pt = [], []
    start_q = start_k = 0
    for b in range(batch):
        sq, sk = slice(start_q, start_q + lq[b]), slice(start_k, start_k + lk[b])
        start_q, start_k = sq.stop, sk.stop
        slopes = alibi if alibi is None or alibi.dim() == 1 else alibi[b : b + 1]
        ref_kwargs = dict(causal=c["causal"], window_size=window_for(c, max_k),
                          softmax_scale=c["softmax_scale"], softcap=c["softcap"],
                          alibi_slopes=slopes)  # fmt: skip
        if keep is not None:
            ref_kwargs.update(dropout_p=c["dropout_p"],
                              dropout_mask=keep[b : b + 1, :, : lq[b], : lk[b]])
        ref, ref_pt = reference(q[sq][None], k[sk][None], v[sk][None],
                                None if grads is None else dout[sq][None], out[sq][None],
                                **ref_kwargs)  # fmt: skip
        refs.append(ref)
        refs_pt.append(ref_pt)
    ref_grads = ref_grads_pt = ref_given = None
    if grads is not None:
        ref_grads = [torch.cat([r[2][i][0] for r in refs]) for i in range(3)]
        ref_grads_pt = [torch.cat([r[1][i][0] for r in refs_pt]) for i in range(3)]
        # Per sequence, the FA2 backward at the kernels' output (the exact one where a
        # sequence has no query or key).
        ref_given = [torch.cat([(r[3] or r[2])[i][0] for r in refs]) for i in range(3)]
        if c["page_size"]:
            for i in (1, 2):  # the gradient of a paged k / v: zero outside the sequences
                for g in (ref_grads, ref_grads_pt, ref_given):
                    full = torch.zeros(inputs[i].shape, dtype=g[i].dtype, device=DEVICE)
                    full[at] = g[i]
                    g[i] = full
        else:
            grads = unpack_grads(c, grads, 1)
    ref = (torch.cat([r[0][0] for r in refs]), torch.cat([r[1][0] for r in refs], dim=1), ref_grads,
           ref_given)  # fmt: skip
    ref_pt = (torch.cat([r[0][0] for r in refs_pt]), ref_grads_pt)
    check_results(c, out, lse, grads, ref, ref_pt)


def run_kvcache(c):
    dtype, d, batch = DTYPES[c["dtype"]], c["headdim"], c["batch"]
    h, hk = c["nheads"], c["nheads_k"]
    capacity, sq, new, lay = c["capacity"], c["seqlen_q"], c["seqlen_new"], c["layout"]
    page_size = c["page_size"]
    kwargs = {}
    if page_size:
        num_pages = batch * c["pages_per_seq"] + c["spare_pages"]
        table = torch.randperm(num_pages, device=DEVICE)[: batch * c["pages_per_seq"]]
        table = table.view(batch, c["pages_per_seq"]).to(torch.int32)
        k_cache, v_cache = (randn((num_pages, page_size, hk, d), dtype) for _ in range(2))
        kwargs["block_table"] = table
    else:
        cache_batch = c["cache_batch"] or batch
        k_cache, v_cache = (randn((cache_batch, capacity, hk, d), dtype, lay["cache"])
                            for _ in range(2))  # fmt: skip
        if c["cache_batch"]:
            idx = torch.randperm(cache_batch, device=DEVICE)[:batch]
            kwargs["cache_batch_idx"] = idx.to(torch.int32)

    def where(b, positions):
        """Index of cache rows ``positions`` of batch entry b in k_cache / v_cache."""
        if page_size:
            return table[b].long()[positions // page_size], positions % page_size
        return (kwargs["cache_batch_idx"][b].long() if c["cache_batch"] else b), positions

    q = randn((batch, sq, h, d), dtype, lay["q"])
    k_new = v_new = None
    if new:
        k_new, v_new = (randn((batch, new, hk, d), dtype, lay[n]) for n in ("k", "v"))
    seqlens, pads = c["seqlens"], c["leftpad"] or [0] * batch
    if c["cache_seqlens"] == "tensor":
        kwargs["cache_seqlens"] = torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    elif c["cache_seqlens"] == "int":
        kwargs["cache_seqlens"] = seqlens[0]
    if c["leftpad"]:
        kwargs["cache_leftpad"] = torch.tensor(pads, dtype=torch.int32, device=DEVICE)
    cos = sin = None
    if c["rotary"]:
        angle = torch.rand(c["seqlen_ro"], c["rotary_dim"] // 2, device=DEVICE) * 2 * math.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        kwargs.update(rotary_cos=cos, rotary_sin=sin,
                      rotary_interleaved=c["rotary"] == "interleaved")
    alibi = alibi_slopes(c["alibi"], batch, h)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    with nan_filled_allocations():
        out, lse = flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, softmax_scale=c["softmax_scale"],
            causal=c["causal"], window_size=c["window_size"], softcap=c["softcap"],
            alibi_slopes=alibi, num_splits=c["num_splits"], return_softmax_lse=True, **kwargs,
        )  # fmt: skip

    left, right = window_for(c, capacity)
    per_row = c["causal"] or left >= 0 or right >= 0  # q rotated per row, else all at one position
    refs, refs_pt = [], []
    for b in range(batch):
        n, pad = seqlens[b], pads[b]
        q_b = q[b]
        if new:
            k_b = k_new[b]
            if c["rotary"]:
                # flash-attn's positions: new token i at cache_seqlens[b] + i.
                interleaved = c["rotary"] == "interleaved"
                positions = torch.arange(n, n + new, device=DEVICE)
                k_b = rotate_ref(k_b, cos, sin, positions, interleaved)
                q_pos = torch.arange(sq, device=DEVICE) if per_row else torch.zeros(
                    sq, dtype=torch.long, device=DEVICE)  # fmt: skip
                q_b = rotate_ref(q_b, cos, sin, q_pos + n, interleaved)
            rows = where(b, torch.arange(n, n + new, device=DEVICE))
            expected_k[rows] = k_b
            expected_v[rows] = v_new[b]
        keys = where(b, torch.arange(pad, n + new, device=DEVICE))
        slopes = alibi if alibi is None or alibi.dim() == 1 else alibi[b : b + 1]
        ref, ref_pt = reference(q_b[None], expected_k[keys][None], expected_v[keys][None], None,
                                causal=c["causal"], window_size=(left, right),
                                softmax_scale=c["softmax_scale"], softcap=c["softcap"],
                                alibi_slopes=slopes)  # fmt: skip
        refs.append(ref)
        refs_pt.append(ref_pt)
    if c["rotary"]:
        torch.testing.assert_close(k_cache, expected_k, **ROTARY_TOL)
    else:
        assert torch.equal(k_cache, expected_k), "k_cache differs from the expected append"
    assert torch.equal(v_cache, expected_v), "v_cache differs from the expected append"
    ref = (torch.cat([r[0] for r in refs]), torch.cat([r[1] for r in refs]), None, None)
    ref_pt = (torch.cat([r[0] for r in refs_pt]), None)
    # A rotated q may differ from the reference's by one rounding: LSE as in test_kvcache.py.
    check_results(c, out, lse, None, ref, ref_pt, lse_atol=1e-2 if c["rotary"] else LSE_ATOL)


# ---- the tests ---------------------------------------------------------------------------------

RUNNERS = {"dense": run_dense, "varlen": run_varlen, "kvcache": run_kvcache}


def fuzz(family):
    """Runs cases seed SEED, SEED + 1, ... until a third of the time budget is spent (or
    MAX_CASES ran); returns the number of cases."""
    run = RUNNERS[family]
    start = time.monotonic()
    count = 0
    while MAX_CASES is None or count < MAX_CASES:
        if count and time.monotonic() - start >= SECONDS / len(RUNNERS):
            break
        seed = SEED + count
        config = fuzz_sampling.sample(family, seed)
        torch.manual_seed(seed)
        try:
            run(config)
        except Exception as exc:
            pending = "FLASHATTN2_FUZZ_PENDING=1 " if fuzz_sampling.SAMPLE_PENDING else ""
            raise AssertionError(
                f"fuzz case {family} seed {seed} failed: {type(exc).__name__}: {exc}\n"
                f"config: {config}\n"
                f"rerun it alone: {pending}FLASHATTN2_FUZZ_SEED={seed} FLASHATTN2_FUZZ_CASES=1 "
                f"python -m pytest 'tests/test_fuzz.py::test_fuzz_{family}'"
            ) from exc
        count += 1
    print(f"test_fuzz_{family}: {count} cases (seeds {SEED}..{SEED + count - 1}) in "
          f"{time.monotonic() - start:.1f} s")
    return count


@pytest.mark.gpu
def test_fuzz_dense():
    """flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func."""
    assert fuzz("dense") > 0


@pytest.mark.gpu
def test_fuzz_varlen():
    """flash_attn_varlen_func (with and without block_table) and its packed forms."""
    assert fuzz("varlen") > 0


@pytest.mark.gpu
def test_fuzz_kvcache():
    """flash_attn_with_kvcache."""
    assert fuzz("kvcache") > 0


# ---- the sampler, on the CPU -------------------------------------------------------------------


def sampled(family, count=500):
    return [fuzz_sampling.sample(family, seed) for seed in range(count)]


def values(configs, key):
    return {repr(c[key]) for c in configs}


@pytest.mark.parametrize("family", list(RUNNERS))
def test_sampler_is_seeded_valid_and_covers_the_options(family):
    configs = sampled(family)
    assert configs == sampled(family)  # a seed names a case
    assert len(values(configs, "dtype")) == 2 and len({repr(c) for c in configs}) == len(configs)
    for c in configs:
        d = c["headdim"]
        assert 1 <= d <= 256 and _ext.KERNEL_HEAD_DIM[d + (-d % 8)] >= 0, c
        assert c["nheads"] % c["nheads_k"] == 0, c
    for key in ("causal", "softmax_scale", "softcap"):
        assert len(values(configs, key)) > 1, key
    assert values(configs, "alibi") == {"None", "'h'", "'bh'"}
    assert any(c["window_size"][0] >= 0 for c in configs)
    assert any(c["window_size"][1] >= 0 for c in configs)
    layouts = {v for c in configs for v in c["layout"].values()}
    if family == "dense":
        for key in ("seqlen_q", "seqlen_k"):
            assert {0, 1} <= {c[key] for c in configs}, key
        assert values(configs, "api") == {"'func'", "'kvpacked'", "'qkvpacked'"}
        assert set(fuzz_sampling.LAYOUTS) | {"split-heads"} <= layouts
        assert any(c["headdim"] % 8 for c in configs)
        assert any(c["dropout_p"] for c in configs) and len(values(configs, "grad")) == 2
    elif family == "varlen":
        assert values(configs, "api") == {"'func'", "'kvpacked'", "'qkvpacked'"}
        assert any(0 in c["lengths_q"] and 1 in c["lengths_k"] for c in configs)
        assert any(c["max_seqlen_k"] > max(c["lengths_k"]) for c in configs)
        assert any(c["page_size"] for c in configs) and any(c["dropout_p"] for c in configs)
        for c in configs:
            assert len(c["lengths_q"]) == len(c["lengths_k"]), c
            assert c["max_seqlen_q"] >= max(c["lengths_q"]), c
            assert c["max_seqlen_k"] >= max(c["lengths_k"]), c
            assert not (c["page_size"] and (c["dropout_p"] or c["api"] != "func")), c
            if c["api"] == "qkvpacked":
                assert c["lengths_q"] == c["lengths_k"] and c["nheads"] == c["nheads_k"], c
    else:
        assert values(configs, "cache_seqlens") == {"'tensor'", "'int'", "'none'"}
        assert values(configs, "rotary") == {"None", "'interleaved'", "'neox'"}
        assert {1, 2} <= {c["seqlen_q"] for c in configs}
        assert {0, 1} <= {c["seqlen_new"] for c in configs}
        assert any(c["page_size"] for c in configs) and any(c.get("cache_batch") for c in configs)
        assert any(c["leftpad"] for c in configs) and any(c["num_splits"] > 1 for c in configs)
        assert {"transposed", "offset"} <= layouts
        for c in configs:
            assert len(c["seqlens"]) == c["batch"], c
            assert all(n + c["seqlen_new"] <= c["capacity"] for n in c["seqlens"]), c
            assert all(0 <= p <= n for p, n in zip(c["leftpad"] or [], c["seqlens"])), c
            if c["rotary"]:
                assert c["seqlen_new"] and 2 <= c["rotary_dim"] <= c["headdim"], c
                assert c["rotary_dim"] % 2 == 0 and c["seqlen_ro"] >= c["capacity"], c
                assert c["seqlen_ro"] >= max(c["seqlens"]) + c["seqlen_q"], c
            if not c["page_size"] and c["cache_batch"]:
                assert c["cache_batch"] >= c["batch"], c


@pytest.mark.parametrize("pending", [False, True], ids=["off", "on"])
def test_pending_divergences_are_sampled_only_behind_the_switch(monkeypatch, pending):
    monkeypatch.setattr(fuzz_sampling, "SAMPLE_PENDING", pending)
    kvcache, varlen = sampled("kvcache"), sampled("varlen")
    found = [
        any(c["headdim"] % 8 for c in kvcache),
        any(c["rotary"] and c["leftpad"] for c in kvcache),
        any(c["page_size"] and c["grad"] for c in varlen),
    ]
    assert found == [pending] * 3
