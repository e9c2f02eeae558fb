"""Attention variants on the GPU: softcap, ALiBi and dropout, alone and combined with causal /
local masks and GQA, forward and backward, against the reference.

Error rule as in test_fwd.py / test_bwd.py: ``max|x - ref| <= 2 * max|x_pt - ref| + ATOL``
with ``ref`` the float32 reference and ``x_pt`` the same reference in the input dtype, both
with the same modifiers (for dropout: the same keep mask). LSE (of the undropped softmax)
against the float32 reference at ``atol=1e-4, rtol=1e-5`` as in test_fwd.py: the ALiBi bias
(|bias| <= 0.3 * 1000 here) is added in fp32 in both, so only fp32 rounding separates them.

Dropout: the kernels' keep mask is a pure function of (seed, offset, b, h, i, j); its torch
twin ``_reference.dropout_keep_mask`` gives the reference mask for a given ``rng_state``.
The public functions' mask is read back from ``return_attn_probs`` (the sign bit of
``S_dmask``). Keep rates are checked at 6 standard deviations over >= 1M elements.
"""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from flashattn2 import (
    _ext,
    _launch,
    _reference,
    backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    force_sm80,
    forward,
    forward_with_stats,
)
from flashattn2._launch import _flash_attn_backward, _flash_attn_forward
from reference import attention_ref, visible_mask

pytestmark = pytest.mark.gpu

ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}
LSE_ATOL, LSE_RTOL = 1e-4, 1e-5
DTYPES = [torch.float16, torch.bfloat16]


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def require_kernel(headdim, backward=False):
    padded = headdim + (-headdim % 8)
    if _ext.KERNEL_HEAD_DIM[padded] < 0 or (backward and padded > _ext.BWD_MAX_HEAD_DIM):
        pytest.skip(f"this build has no {'backward ' if backward else ''}kernel for d{headdim}")


def make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype):
    """q, k, v, dout."""
    q = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, device="cuda", dtype=dtype)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    return q, k, v, dout


def slopes(shape):
    return torch.rand(shape, device="cuda") * 0.3


def rng_state():
    return torch.randint(2**62, (2,), dtype=torch.int64, device="cuda")


def twin_mask(state, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    seed, offset = state.tolist()
    return _reference.dropout_keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k,
                                        dropout_p, device="cuda")  # fmt: skip


def assert_within_rule(name, x, x_ref, x_pt, dtype):
    err = (x.float() - x_ref.float()).abs().max().item()
    err_pt = (x_pt.float() - x_ref.float()).abs().max().item()
    bound = 2 * err_pt + ATOL[dtype]
    assert err <= bound, f"max |{name} - ref| = {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})"


def ref_kwargs(causal, window_size, softmax_scale, mods, dropout_mask=None):
    kwargs = dict(causal=causal, window_size=window_size, softmax_scale=softmax_scale,
                  softcap=mods.get("softcap", 0.0), alibi_slopes=mods.get("alibi_slopes"))
    if dropout_mask is not None:
        kwargs.update(dropout_p=mods["dropout_p"], dropout_mask=dropout_mask)
    return kwargs


def check_forward(out, lse, q, k, v, kwargs):
    out_ref, lse_ref = attention_ref(q, k, v, **kwargs)
    out_pt, _ = attention_ref(q, k, v, upcast=False, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_within_rule("out", out, out_ref, out_pt, q.dtype)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)
    left, right = kwargs["window_size"]
    seen = visible_mask(q.shape[1], k.shape[1], left, 0 if kwargs["causal"] else right,
                        q.device).any(1)  # fmt: skip
    assert (out[:, ~seen] == 0).all() and lse[:, :, ~seen].isposinf().all()


def reference_grads(q, k, v, dout, upcast, kwargs):
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    q, k, v = (cast(t).requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(q, k, v, upcast=upcast, **kwargs)
    return torch.autograd.grad(out, (q, k, v), cast(dout))


def check_grads(grads, q, k, v, dout, kwargs):
    ref = reference_grads(q, k, v, dout, True, kwargs)
    pt = reference_grads(q, k, v, dout, False, kwargs)
    for name, g, g_ref, g_pt, x in zip(("dq", "dk", "dv"), grads, ref, pt, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype, name
        assert_within_rule(name, g, g_ref, g_pt, x.dtype)


def run_kernels(q, k, v, dout, causal, window_size, softmax_scale, mods):
    """Forward and backward through the kernels alone, into NaN-poisoned outputs (head dim a
    multiple of 8 here). Returns out, lse, (dq, dk, dv)."""
    left, right = window_size
    right = 0 if causal else right
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device="cuda")
    _flash_attn_forward(q, k, v, scale, left, right, out, lse, **mods)
    assert not out.isnan().any() and not lse.isnan().any()
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    _flash_attn_backward(dout, q, k, v, out, lse, scale, left, right, False, *grads, **mods)
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert not g.isnan().any(), f"the kernel left part of {name} unwritten (or wrote NaN)"
    return out, lse, grads


# name -> (mods(batch, nheads), causal, window_size, (seqlen_q, seqlen_k), (nheads, nheads_k))
CASES = {
    "softcap2": (lambda b, h: dict(softcap=2.0), False, (-1, -1), (113, 203), (4, 4)),
    "softcap30-causal": (lambda b, h: dict(softcap=30.0), True, (-1, -1), (203, 113), (4, 2)),
    # bf16 d <= 64 runs softcap <= 55.4 without a running max (fwd_config.h), 60 with one
    "softcap50-gqa": (lambda b, h: dict(softcap=50.0), False, (-1, -1), (203, 150), (4, 2)),
    "softcap60-causal": (lambda b, h: dict(softcap=60.0), True, (-1, -1), (150, 203), (2, 2)),
    "alibi": (lambda b, h: dict(alibi_slopes=slopes(h)), False, (-1, -1), (113, 203), (4, 2)),
    "alibi-batch-causal": (lambda b, h: dict(alibi_slopes=slopes((b, h))), True, (-1, -1),
                           (203, 113), (4, 4)),
    "softcap-alibi-window": (lambda b, h: dict(softcap=3.0, alibi_slopes=slopes(h)), False,
                             (32, 8), (203, 203), (6, 2)),
    "softcap-alibi-causal-window-mqa": (lambda b, h: dict(softcap=4.0,
                                                          alibi_slopes=slopes((b, h))),
                                        True, (48, -1), (255, 257), (4, 1)),
}  # fmt: skip


def case_inputs(case, headdim, dtype, batch=2):
    make_mods, causal, window, (seqlen_q, seqlen_k), (nheads, nheads_k) = CASES[case]
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    return q, k, v, dout, make_mods(batch, nheads), causal, window


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("headdim", [32, 64, 128, 256])  # d <= 64: a softcap-only instance
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_forward(dtype, headdim, case):
    require_kernel(headdim)
    q, k, v, _, mods, causal, window = case_inputs(case, headdim, dtype)
    left, right = window
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device="cuda")
    _flash_attn_forward(q, k, v, headdim**-0.5, left, 0 if causal else right, out, lse, **mods)
    assert not out.isnan().any() and not lse.isnan().any()
    check_forward(out, lse, q, k, v, ref_kwargs(causal, window, None, mods))
    public, public_lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                return_attn_probs=True, **mods)  # fmt: skip
    assert probs is None
    assert torch.equal(public, out) and torch.equal(public_lse, lse)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_backward(dtype, headdim, case):
    require_kernel(headdim, backward=True)
    q, k, v, dout, mods, causal, window = case_inputs(case, headdim, dtype)
    out, lse, grads = run_kernels(q, k, v, dout, causal, window, None, mods)
    kwargs = ref_kwargs(causal, window, None, mods)
    check_forward(out, lse, q, k, v, kwargs)
    check_grads(grads, q, k, v, dout, kwargs)


@pytest.mark.parametrize("headdim", [40, 100])  # padded by the kernel / by a copy
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_autograd_other_head_dims_and_scale(dtype, headdim):
    require_kernel(headdim, backward=True)
    q, k, v, dout = make_inputs(2, 77, 191, 6, 2, headdim, dtype)
    mods = dict(softcap=1.5, alibi_slopes=slopes(6))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=True, softmax_scale=0.3, **mods)
    out.backward(dout)
    kwargs = ref_kwargs(True, (-1, -1), 0.3, mods)
    out_ref, _ = attention_ref(q, k, v, **kwargs)
    assert_within_rule("out", out, out_ref, attention_ref(q, k, v, upcast=False, **kwargs)[0],
                       dtype)  # fmt: skip
    check_grads([t.grad for t in leaves], q, k, v, dout, kwargs)


def test_softcap_saturates():
    # Large scores: the capped logits sit at +-softcap (tanh = +-1 exactly, no NaN / inf).
    q, k, v, dout = make_inputs(1, 64, 96, 2, 2, 64, torch.bfloat16)
    q = q * 30
    out, lse, grads = run_kernels(q, k, v, dout, False, (-1, -1), None, dict(softcap=1.0))
    kwargs = ref_kwargs(False, (-1, -1), None, dict(softcap=1.0))
    check_forward(out, lse, q, k, v, kwargs)
    check_grads(grads, q, k, v, dout, kwargs)


@pytest.mark.parametrize("sm80", [False, True], ids=["default", "sm80"])
@pytest.mark.parametrize("window_size", [(-1, -1), (200, 0)], ids=["nowin", "window"])
@pytest.mark.parametrize("headdim", [32, 59, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_softcap_varlen_backward_precision(dtype, headdim, window_size, sm80):
    """Softcap 50, ~1k packed tokens, causal: dq / dk / dv within the 2x rule. The backward
    recomputes the forward's capped scores, so both must compute them alike: the d <= 64
    sm80 forward once pre-scaled Q by scale / softcap rounded to the input type, and dk was
    then off by more than 3x PyTorch's error (issue 19). Both forward paths (the Hopper one
    where it applies, and force_sm80)."""
    require_kernel(headdim, backward=True)
    lengths, nheads, nheads_k, softcap = [300, 517, 1, 211], 4, 2, 50.0
    total = sum(lengths)
    q = torch.randn(total, nheads, headdim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(total, nheads_k, headdim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(total, nheads_k, headdim, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(total, nheads, headdim, device="cuda", dtype=dtype)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    with force_sm80() if sm80 else contextlib.nullcontext():
        out = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                     window_size=window_size, softcap=softcap)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    kwargs = ref_kwargs(True, window_size, None, dict(softcap=softcap))
    refs, pts, outs_ref, outs_pt = [], [], [], []
    for start, n in zip(cu.tolist(), lengths):
        seq = [t[start : start + n].unsqueeze(0) for t in (q, k, v, dout)]
        refs.append(reference_grads(*seq, True, kwargs))
        pts.append(reference_grads(*seq, False, kwargs))
        outs_ref.append(attention_ref(*seq[:3], **kwargs)[0])
        outs_pt.append(attention_ref(*seq[:3], upcast=False, **kwargs)[0])
    packed = (lambda ts: torch.cat([t[0] for t in ts]))  # fmt: skip
    assert_within_rule("out", out, packed(outs_ref), packed(outs_pt), dtype)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert not grads[i].isnan().any(), name
        assert_within_rule(name, grads[i], packed([r[i] for r in refs]),
                           packed([r[i] for r in pts]), dtype)


@pytest.mark.parametrize("softcap", [50.0, 55.0, 60.0])  # around kSoftcapBoundedLog2 (80)
@pytest.mark.parametrize("headdim", [32, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_softcap_logit_range_ends(dtype, headdim, softcap):
    # Rows whose every logit sits at -softcap, at +softcap, and random rows, with large V:
    # without a running max (bf16, d <= 64) p spans 2^-c .. 2^c (c = softcap log2 e) and
    # O sums p v; nothing may underflow to an empty row or overflow.
    require_kernel(headdim)
    q, k, v, _ = make_inputs(2, 96, 131, 4, 2, headdim, dtype)
    k = k.abs() + 0.5
    q[:, :32] = -50.0
    q[:, 32:64] = 50.0
    v = v * 100
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 96), float("nan"), device="cuda")
    _flash_attn_forward(q, k, v, headdim**-0.5, -1, -1, out, lse, softcap=softcap)
    assert out.isfinite().all() and lse.isfinite().all()
    check_forward(out, lse, q, k, v, ref_kwargs(False, (-1, -1), None, dict(softcap=softcap)))


def test_zero_alibi_slopes_and_large_softcap_match_plain():
    q, k, v, _ = make_inputs(2, 129, 257, 4, 2, 64, torch.float16)
    plain, plain_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    zero, zero_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True,
                                        alibi_slopes=torch.zeros(4, device="cuda"))  # fmt: skip
    # The kMods instance computes the same logits in another order (scale first): equal up
    # to fp32 rounding.
    torch.testing.assert_close(zero, plain, atol=2e-3, rtol=0)
    torch.testing.assert_close(zero_lse, plain_lse, atol=LSE_ATOL, rtol=LSE_RTOL)
    capped = flash_attn_func(q, k, v, causal=True, softcap=1e4)
    torch.testing.assert_close(capped, plain, atol=2e-3, rtol=0)


# ---- dropout --------------------------------------------------------------------------------


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_dropout_mask_kernel_matches_twin_and_keep_rate(dropout_p):
    batch, nheads, seqlen_q, seqlen_k = 2, 3, 517, 1031  # ragged tails, 3.2M elements
    state = rng_state()
    keep = _launch._dropout_keep_mask(state, batch, nheads, seqlen_q, seqlen_k, dropout_p)
    assert keep.shape == (batch, nheads, seqlen_q, seqlen_k) and keep.dtype == torch.bool
    assert torch.equal(keep, twin_mask(state, batch, nheads, seqlen_q, seqlen_k, dropout_p))
    n = keep.numel()
    rate = keep.float().mean().item()
    sigma = math.sqrt(dropout_p * (1 - dropout_p) / n)
    assert abs(rate - (1 - dropout_p)) < 6 * sigma, (rate, 1 - dropout_p, sigma)
    # Heads and batches get different masks; a different state gives a different mask.
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    other = _launch._dropout_keep_mask(rng_state(), batch, nheads, seqlen_q, seqlen_k,
                                       dropout_p)  # fmt: skip
    assert not torch.equal(keep, other)


@pytest.mark.parametrize(
    "headdim,causal,window,mods",
    [(64, False, (-1, -1), {}), (128, True, (-1, -1), dict(softcap=5.0)),
     (64, False, (40, 16), dict(alibi_slopes="bh")),
     (128, True, (64, -1), dict(softcap=3.0, alibi_slopes="h")),
     (256, True, (-1, -1), dict(softcap=5.0)),
     (160, False, (40, 16), dict(softcap=3.0, alibi_slopes="bh"))],
    ids=["d64", "d128-causal-softcap", "d64-window-alibi", "d128-all", "d256-causal-softcap",
         "d160-window-all"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dropout_kernels_match_reference_with_twin_mask(dtype, headdim, causal, window, mods):
    require_kernel(headdim, backward=True)
    batch, nheads, nheads_k, seqlen_q, seqlen_k = 2, 4, 2, 203, 255
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    mods = dict(mods)
    if "alibi_slopes" in mods:
        mods["alibi_slopes"] = slopes(nheads if mods["alibi_slopes"] == "h" else (batch, nheads))
    mods.update(dropout_p=0.17, rng_state=rng_state())
    out, lse, grads = run_kernels(q, k, v, dout, causal, window, None, mods)
    keep = twin_mask(mods["rng_state"], batch, nheads, seqlen_q, seqlen_k, mods["dropout_p"])
    kwargs = ref_kwargs(causal, window, None, mods, dropout_mask=keep)
    check_forward(out, lse, q, k, v, kwargs)
    check_grads(grads, q, k, v, dout, kwargs)


@pytest.mark.parametrize("dropout_p", [0.1, 0.6])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dropout_public_output_and_grads_match_reference_with_returned_mask(dtype, dropout_p):
    batch, nheads, seqlen_q, seqlen_k, headdim = 2, 6, 129, 257, 64
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, nheads, 2, headdim, dtype)
    mods = dict(softcap=8.0, alibi_slopes=slopes(nheads))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(1234)
    out, lse, probs = flash_attn_func(*leaves, dropout_p=dropout_p, causal=True,
                                      return_attn_probs=True, **mods)  # fmt: skip
    out.backward(dout)
    assert probs.shape == (batch, nheads, seqlen_q, seqlen_k) and probs.dtype == dtype
    keep = ~torch.signbit(probs)
    # The mask is the twin's for the rng_state this call drew (first draw after the seed).
    torch.manual_seed(1234)
    state = _launch._rng_state(q.device)
    assert torch.equal(keep, twin_mask(state, batch, nheads, seqlen_q, seqlen_k, dropout_p))
    kwargs = ref_kwargs(True, (-1, -1), None, dict(mods, dropout_p=dropout_p), dropout_mask=keep)
    check_forward(out.detach(), lse, q, k, v, kwargs)
    check_grads([t.grad for t in leaves], q, k, v, dout, kwargs)
    # The probabilities, whatever the sign, in flash-attn's convention: exp(logit - m) with m
    # the running max after each block of 64 keys (d64), walking from the last block. Its
    # tests' recipe (block b times exp(m_b - lse)) turns them into the softmax.
    probs_ref = _reference.blockwise_probs(q, k, 64, causal=True, **mods)
    torch.testing.assert_close(probs.abs().float(), probs_ref, atol=1e-2, rtol=1e-2)
    scores, _ = _reference.attention_scores(q.float(), k.float(), causal=True, **mods)
    maxes = torch.stack([s.amax(-1) for s in scores.split(64, dim=-1)], dim=-1)
    running = maxes.flip(-1).cummax(-1).values.flip(-1)
    normalised = torch.cat([p.abs().float() * (m - lse).exp().unsqueeze(-1) for p, m in
                            zip(probs.split(64, dim=-1), running.unbind(-1))], dim=-1)
    softmax = _reference.attention_probs(q, k, causal=True, **mods)
    torch.testing.assert_close(normalised, softmax, atol=1e-2, rtol=1e-2)
    assert (probs.abs() <= 1).all()


@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_reproducible_under_manual_seed(deterministic):
    require_kernel(128, backward=True)
    q, k, v, dout = make_inputs(2, 300, 300, 4, 2, 128, torch.bfloat16)

    def run(seed):
        torch.manual_seed(seed)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flash_attn_func(*leaves, dropout_p=0.3, causal=True, deterministic=deterministic)
        out.backward(dout)
        return [out] + [t.grad for t in leaves]

    first, again, other = run(7), run(7), run(8)
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    for a, b in zip(first[1:], again[1:]):
        if deterministic:
            assert torch.equal(a, b)
        else:  # dq by f32 atomics in a run-dependent order
            torch.testing.assert_close(a, b)
    assert not torch.equal(first[2], other[2])  # dk differs with another mask


def test_dropout_packed_and_low_level():
    qkv = torch.randn(2, 129, 3, 4, 64, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    torch.manual_seed(3)
    packed, _, probs = flash_attn_qkvpacked_func(qkv, dropout_p=0.2, return_attn_probs=True)
    torch.manual_seed(3)
    plain = flash_attn_func(q, k, v, dropout_p=0.2)
    assert torch.equal(packed, plain)
    torch.manual_seed(3)
    kv_packed = flash_attn_kvpacked_func(q, torch.stack([k, v], 2), dropout_p=0.2)
    assert torch.equal(kv_packed, plain)
    # Low level: the same rng_state in forward_with_stats and backward.
    state = rng_state()
    dout = torch.randn_like(q)
    out, lse = forward_with_stats(q, k, v, dropout_p=0.2, rng_state=state, softcap=6.0)
    assert torch.equal(out, forward(q, k, v, dropout_p=0.2, rng_state=state, softcap=6.0))
    grads = backward(q, k, v, out, lse, dout, dropout_p=0.2, rng_state=state, softcap=6.0)
    keep = twin_mask(state, 2, 4, 129, 129, 0.2)
    kwargs = ref_kwargs(False, (-1, -1), None, dict(softcap=6.0, dropout_p=0.2),
                        dropout_mask=keep)  # fmt: skip
    check_forward(out, lse, q, k, v, kwargs)
    check_grads(grads, q, k, v, dout, kwargs)


def test_dropout_in_cuda_graph_draws_a_new_mask_per_replay():
    q, k, v, _ = make_inputs(2, 128, 128, 4, 4, 64, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_func(q, k, v, dropout_p=0.5)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v, dropout_p=0.5)
    graph.replay()
    first = out.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(first, out)  # the captured generator advances per replay
    assert first.isfinite().all() and out.isfinite().all()


def test_compile_with_modifiers_matches_eager():
    q, k, v, dout = make_inputs(2, 129, 257, 6, 2, 64, torch.bfloat16)
    alibi = slopes(6)

    def loss_fn(q, k, v):
        out = flash_attn_func(q, k, v, causal=True, softcap=5.0, alibi_slopes=alibi)
        return (out.float() * dout.float()).sum(), out

    results = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        loss, out = fn(*leaves)
        loss.backward()
        results.append([out] + [t.grad for t in leaves])
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:], results[1][1:]):
        torch.testing.assert_close(a, b)


def test_compile_with_dropout_runs_and_opcheck():
    q, k, v, dout = make_inputs(2, 65, 130, 4, 2, 64, torch.bfloat16)

    def loss_fn(q, k, v):
        out = flash_attn_func(q, k, v, dropout_p=0.25, alibi_slopes=torch.full(
            (4,), 0.1, device="cuda"))  # fmt: skip
        return (out.float() * dout.float()).sum()

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch.compile(loss_fn, fullgraph=True)(*leaves).backward()
    assert all(t.grad.isfinite().all() for t in leaves)
    state = rng_state()
    mods = (2.0, slopes(4), 0.25, state)
    args = (q, k, v, 0.125, -1, 0, *mods)
    torch.library.opcheck(torch.ops.flashattn2.fwd.default, args)
    out, lse = torch.ops.flashattn2.fwd(*args)
    torch.library.opcheck(torch.ops.flashattn2.bwd.default,
                          (dout, q, k, v, out, lse, 0.125, -1, 0, False, *mods))  # fmt: skip
    torch.library.opcheck(torch.ops.flashattn2.dropout_mask.default, (state, 2, 4, 65, 130, 0.25))
