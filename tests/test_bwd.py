"""Backward pass on the GPU against the reference.

Error rule (flash-attn's), for each of dq, dk, dv:
``max|g - g_ref| <= 2 * max|g_pt - g_ref| + ATOL``, where ``g_ref`` is autograd through the
float32 reference (``attention_ref``) on the upcast inputs and upcast dout, and ``g_pt``
autograd through the same reference run in the input dtype: PyTorch's own error.

ATOL covers the cases where PyTorch's low-precision gradients are (nearly) exact, so that
twice their error is ~0. With seqlen_k = 1, P = 1 and O = V exactly, so dS = P (dP - D) is
0 up to the fp32 rounding of dP = dO.V against D = rowsum(dO * O) (summed in another
order): dq and dk are ~1e-5 instead of 0, and dv = sum of dO rows is exact in fp32 and then
rounded once, like PyTorch's. So the kernel may differ from an exact PyTorch result by fp32
summation order plus the final rounding of a gradient of size ~4: fp16 1e-3 (about one ulp
at |g| ~ 1), bf16 4e-3 (half an ulp in [1, 2)), as for the forward. Everywhere else the 2x
term dominates by orders of magnitude.

``run_backward`` drives ``_flash_attn_backward`` directly with NaN-poisoned dq/dk/dv and
fails if any NaN survives, so every element the kernel must write is checked (with GQA the
kernel's per-query-head dk/dv are temporaries summed into the poisoned dk/dv; their
elements are covered by the comparison with the reference).
"""
import pytest
import torch
import torch.nn.functional as F
from flashattn2 import (
    _ext,
    backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    forward_with_stats,
)
from flashattn2._launch import _flash_attn_backward, _flash_attn_forward
from reference import attention_ref, visible_mask

pytestmark = pytest.mark.gpu

ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}

DTYPES = [torch.float16, torch.bfloat16]
KERNEL_HEAD_DIMS = [32, 64, 96, 128]
OTHER_HEAD_DIMS = [8, 40, 72]  # padded to a kernel head dim by the kernel
# d > 128: 64-key tiles whose 4 column groups of warps own d / 4 columns of dK, dV each. 136
# and 200 leave the last groups' columns partly past the head dim (kernels 192 / 256).
LARGE_HEAD_DIMS = [136, 160, 192, 200, 256]
SEQLENS = [(1, 1), (17, 113), (113, 17), (128, 128), (255, 257), (1023, 1025)]
HEADS = [(4, 4), (6, 2), (4, 1)]


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def require_backward(headdim):
    padded = headdim + (-headdim % 8)
    if _ext.KERNEL_HEAD_DIM[padded] < 0 or padded > _ext.BWD_MAX_HEAD_DIM:
        pytest.skip(f"this build has no backward kernel for head dim {headdim}")


def make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, device="cuda"):
    """q, k, v and dout."""
    require_backward(headdim)
    q = torch.randn(batch, seqlen_q, nheads, headdim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, device=device, dtype=dtype)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, device=device, dtype=dtype)
    return q, k, v, dout


def window_bounds(causal, window_size):
    left, right = window_size
    return left, (0 if causal else right)


def run_backward(q, k, v, dout, causal=False, window_size=(-1, -1), softmax_scale=None,
                 deterministic=False):
    """Forward and backward through the kernels alone; gradients written into NaN-poisoned
    tensors (head dim zero-padded to a multiple of 8 as the public functions do)."""
    headdim = q.shape[-1]
    if softmax_scale is None:
        softmax_scale = headdim**-0.5
    window_left, window_right = window_bounds(causal, window_size)
    pad = -headdim % 8
    if pad:
        q, k, v, dout = (F.pad(t, (0, pad)) for t in (q, k, v, dout))
    out, lse = _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    result = _flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, window_left,
                                  window_right, deterministic, dq=dq, dk=dk, dv=dv)  # fmt: skip
    assert result[0] is dq and result[1] is dk and result[2] is dv
    for name, g in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        assert not g.isnan().any(), f"the kernel left part of {name} unwritten (or wrote NaN)"
    return dq[..., :headdim], dk[..., :headdim], dv[..., :headdim]


def reference_grads(q, k, v, dout, upcast, **kwargs):
    """Autograd through attention_ref: float32 on upcast inputs, or in the input dtype."""
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    q, k, v = (cast(t).requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(q, k, v, upcast=upcast, **kwargs)
    return torch.autograd.grad(out, (q, k, v), cast(dout))


def check_grads(grads, q, k, v, dout, causal=False, window_size=(-1, -1), softmax_scale=None):
    """The error rule of the module docstring, and zero dq for rows that see no key."""
    kwargs = dict(causal=causal, window_size=window_size, softmax_scale=softmax_scale)
    ref = reference_grads(q, k, v, dout, upcast=True, **kwargs)
    pt = reference_grads(q, k, v, dout, upcast=False, **kwargs)
    for name, g, g_ref, g_pt, x in zip(("dq", "dk", "dv"), grads, ref, pt, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and g.device == x.device, name
        err = (g.float() - g_ref).abs().max().item()
        err_pt = (g_pt.float() - g_ref).abs().max().item()
        bound = 2 * err_pt + ATOL[x.dtype]
        assert err <= bound, f"max |{name} - ref| = {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})"
    seen = visible_mask(q.shape[1], k.shape[1], *window_bounds(causal, window_size), q.device)
    assert (grads[0][:, ~seen.any(1)] == 0).all(), "rows that see no key must have dq = 0"


def check_kernel(q, k, v, dout, causal=False, window_size=(-1, -1), softmax_scale=None):
    grads = run_backward(q, k, v, dout, causal, window_size, softmax_scale)
    check_grads(grads, q, k, v, dout, causal, window_size, softmax_scale)
    return grads


def autograd_grads(func, inputs, dout, **kwargs):
    """dq, dk, dv (or the packed gradients) of ``func(*inputs, **kwargs)`` by autograd."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = func(*inputs, **kwargs)
    out.backward(dout)
    return [t.grad for t in inputs]


# ---- the matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("seqlens", [(17, 113), (113, 17), (255, 257)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", KERNEL_HEAD_DIMS + OTHER_HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_head_dims(dtype, headdim, causal, seqlens):
    seqlen_q, seqlen_k = seqlens
    check_kernel(*make_inputs(2, seqlen_q, seqlen_k, 6, 2, headdim, dtype), causal=causal)


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_seqlens_and_heads(dtype, headdim, causal, seqlens, heads):
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, heads
    inputs = make_inputs(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    check_kernel(*inputs, causal=causal)


@pytest.mark.parametrize("seqlens", [(113, 203), (257, 129)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", LARGE_HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_head_dims(dtype, headdim, causal, seqlens):
    seqlen_q, seqlen_k = seqlens
    check_kernel(*make_inputs(2, seqlen_q, seqlen_k, 6, 2, headdim, dtype), causal=causal)


@pytest.mark.parametrize(
    "heads,causal,window_size",
    [((4, 1), True, (-1, -1)), ((4, 2), False, (32, 8)), ((4, 4), False, (-1, 0))],
    ids=["mqa-causal", "gqa-window", "mha-window-right0"],
)  # fmt: skip
@pytest.mark.parametrize("headdim", [192, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_head_dims_heads_and_windows(dtype, headdim, heads, causal, window_size):
    q, k, v, dout = make_inputs(2, 203, 255, *heads, headdim, dtype)
    check_kernel(q, k, v, dout, causal=causal, window_size=window_size)


@pytest.mark.parametrize("headdim", [250, 192])  # 250: padded to 256 by a copy
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_large_head_dims_autograd(dtype, headdim):
    q, k, v, dout = make_inputs(2, 77, 191, 6, 2, headdim, dtype)
    grads = autograd_grads(flash_attn_func, (q, k, v), dout, causal=True)
    check_grads(grads, q, k, v, dout, causal=True)
    kernel = run_backward(q, k, v, dout, causal=True)
    assert torch.equal(grads[1], kernel[1]) and torch.equal(grads[2], kernel[2])
    torch.testing.assert_close(grads[0], kernel[0])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_batch(dtype, causal):
    check_kernel(*make_inputs(7, 65, 129, 3, 1, 96, dtype), causal=causal)


@pytest.mark.parametrize("window_size", [(16, 0), (32, 8)], ids=str)
@pytest.mark.parametrize("seqlens", [(113, 203), (203, 113)], ids=str)
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_window(dtype, headdim, seqlens, window_size):
    seqlen_q, seqlen_k = seqlens
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, 4, 2, headdim, dtype)
    check_kernel(q, k, v, dout, window_size=window_size)
    grads = autograd_grads(flash_attn_func, (q, k, v), dout, window_size=window_size)
    check_grads(grads, q, k, v, dout, window_size=window_size)


@pytest.mark.parametrize("seqlens", [(4, 4), (1, 4), (4, 1)], ids=str)
@pytest.mark.parametrize("headdim", [8, 4])  # 8: padded by the kernel; 4: by Python too
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tiny(dtype, headdim, seqlens):
    seqlen_q, seqlen_k = seqlens
    q, k, v, dout = make_inputs(1, seqlen_q, seqlen_k, 2, 1, headdim, dtype)
    check_kernel(q, k, v, dout, causal=True)
    check_grads(autograd_grads(flash_attn_func, (q, k, v), dout), q, k, v, dout)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rows_that_see_no_key(dtype):
    seqlen_q, seqlen_k = 300, 100  # causal, bottom-right: rows 0..199 see no key
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, 4, 2, 128, dtype)
    dq, dk, dv = check_kernel(q, k, v, dout, causal=True)
    empty = seqlen_q - seqlen_k
    assert (dq[:, :empty] == 0).all()
    assert (dq[:, empty:] != 0).any(dim=(0, 2, 3)).all()
    assert dk.abs().sum() > 0 and dv.abs().sum() > 0


@pytest.mark.parametrize("scale", [0.05, 0.5])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_softmax_scale(dtype, scale):
    q, k, v, dout = make_inputs(2, 129, 257, 4, 4, 64, dtype)
    grads = autograd_grads(flash_attn_func, (q, k, v), dout, causal=True, softmax_scale=scale)
    check_grads(grads, q, k, v, dout, causal=True, softmax_scale=scale)


# ---- the public functions ------------------------------------------------------------------


@pytest.mark.parametrize("headdim", [64, 100, 20])  # 100, 20: padded by a copy
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_autograd_matches_kernel(dtype, headdim):
    q, k, v, dout = make_inputs(2, 77, 191, 6, 2, headdim, dtype)
    dq, dk, dv = autograd_grads(flash_attn_func, (q, k, v), dout, causal=True)
    check_grads((dq, dk, dv), q, k, v, dout, causal=True)
    kernel = run_backward(q, k, v, dout, causal=True)
    # dk, dv: one CTA each, no atomics, so bitwise; dq adds partial sums by f32 atomics
    # in a run-dependent order, so within the rounding of a few fp32 sums.
    assert torch.equal(dk, kernel[1]) and torch.equal(dv, kernel[2])
    torch.testing.assert_close(dq, kernel[0])


@pytest.mark.parametrize("headdim", [64, 100, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_qkvpacked(dtype, headdim):
    require_backward(headdim)
    qkv = torch.randn(2, 129, 3, 4, headdim, device="cuda", dtype=dtype)
    dout = torch.randn(2, 129, 4, headdim, device="cuda", dtype=dtype)
    (dqkv,) = autograd_grads(flash_attn_qkvpacked_func, (qkv,), dout, causal=True)
    assert dqkv.shape == qkv.shape and dqkv.dtype == dtype
    check_grads(dqkv.unbind(2), *qkv.unbind(2), dout, causal=True)


@pytest.mark.parametrize("headdim", [64, 100])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_kvpacked(dtype, headdim):
    require_backward(headdim)
    q = torch.randn(2, 113, 6, headdim, device="cuda", dtype=dtype)
    kv = torch.randn(2, 203, 2, 2, headdim, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)
    dq, dkv = autograd_grads(flash_attn_kvpacked_func, (q, kv), dout, window_size=(32, 8))
    assert dkv.shape == kv.shape
    check_grads((dq, *dkv.unbind(2)), q, *kv.unbind(2), dout, window_size=(32, 8))


def strided_views(dtype):
    """(name, q, k, v, dout) with views the kernel reads in place or after a copy."""
    bhsd = torch.randn(2, 4, 150, 64, device="cuda", dtype=dtype)
    wide = torch.randn(2, 170, 2, 96, device="cuda", dtype=dtype)
    flat = torch.randn(2 * 170 * 2 * 64 + 8, device="cuda", dtype=dtype)
    odd_rows = torch.randn(2, 170, 2, 68, device="cuda", dtype=dtype)
    k = torch.randn(2, 170, 2, 64, device="cuda", dtype=dtype)
    v = torch.randn(2, 170, 2, 64, device="cuda", dtype=dtype)
    q = bhsd.transpose(1, 2)
    dout = torch.randn(2, 150, 4, 64, device="cuda", dtype=dtype)
    return [
        ("q transposed from (b, h, s, d)", q, k, v, dout),
        ("k, v slices of a wider head dim", q, wide[..., :64], wide[..., 32:], dout),
        ("k misaligned by 2 elements", q, flat[2 : 2 + k.numel()].view(k.shape), v, dout),
        ("v head stride 68", q, k, odd_rows[..., :64], dout),
        ("q last dim strided", torch.randn(2, 150, 4, 128, device="cuda", dtype=dtype)[..., ::2],
         k, v, dout),  # fmt: skip
        ("dout transposed from (b, h, s, d)", q, k, v,
         torch.randn(2, 4, 150, 64, device="cuda", dtype=dtype).transpose(1, 2)),  # fmt: skip
        ("dout last dim strided", q, k, v,
         torch.randn(2, 150, 4, 128, device="cuda", dtype=dtype)[..., 1::2]),  # fmt: skip
    ]


@pytest.mark.parametrize("index", range(7))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_views(dtype, index):
    name, q, k, v, dout = strided_views(dtype)[index]
    grads = autograd_grads(flash_attn_func, (q, k, v), dout, causal=True)
    check_grads(grads, q, k, v, dout, causal=True)
    contiguous = autograd_grads(flash_attn_func, (q.contiguous(), k.contiguous(),
                                                  v.contiguous()), dout.contiguous(), causal=True)
    for g, c in zip(grads, contiguous):
        torch.testing.assert_close(g, c, msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gradients_written_into_strided_views(dtype):
    # dq, dk, dv as slices of one packed (b, s, 3, h, d) buffer: the kernel writes through
    # their strides and leaves the rest of the buffer alone.
    q, k, v, dout = make_inputs(2, 150, 150, 4, 4, 64, dtype)
    out, lse = _flash_attn_forward(q, k, v, 0.125, -1, 0)
    dqkv = torch.full((2, 150, 3, 4, 72), float("nan"), device="cuda", dtype=dtype)
    dq, dk, dv = dqkv[..., :64].unbind(2)
    _flash_attn_backward(dout, q, k, v, out, lse, 0.125, -1, 0, dq=dq, dk=dk, dv=dv)
    assert not dqkv[..., :64].isnan().any() and dqkv[..., 64:].isnan().all()
    check_grads((dq, dk, dv), q, k, v, dout, causal=True, softmax_scale=0.125)


@pytest.mark.parametrize("headdim", [64, 20])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_low_level_forward_and_backward(dtype, headdim):
    q, k, v, dout = make_inputs(2, 113, 203, 6, 2, headdim, dtype)
    out, lse = forward_with_stats(q, k, v, causal=True)
    expected, expected_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    grads = backward(q, k, v, out, lse, dout, causal=True)
    assert not any(g.requires_grad for g in grads)
    check_grads(grads, q, k, v, dout, causal=True)


# ---- deterministic mode ----------------------------------------------------------------------


@pytest.mark.parametrize("packing", ["none", "qkv", "kv"])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_gradients_are_bitwise_reproducible(packing, causal):
    # Enough key tiles (1025 keys, 128 per tile: 9) that many CTAs add into each query tile's
    # dQ: without ordering, float atomics make dq differ in the last bits from run to run.
    q, k, v, dout = make_inputs(2, 1025, 1025, 4, 2, 128, torch.bfloat16)

    def grads(deterministic):
        if packing == "qkv":
            qkv = torch.stack([q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)], 2)
            qkv.requires_grad_()
            flash_attn_qkvpacked_func(qkv, causal=causal, deterministic=deterministic).backward(dout)
            return (qkv.grad,)
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        if packing == "kv":
            kv = torch.stack([kk, vv], 2).detach().requires_grad_()
            out = flash_attn_kvpacked_func(qq, kv, causal=causal, deterministic=deterministic)
            out.backward(dout)
            return qq.grad, kv.grad
        flash_attn_func(qq, kk, vv, causal=causal, deterministic=deterministic).backward(dout)
        return qq.grad, kk.grad, vv.grad

    first = grads(True)
    for _ in range(2):
        for a, b in zip(first, grads(True)):
            assert torch.equal(a, b)
    # Same result as the default (atomic) order up to float rounding of the sums.
    for a, b in zip(first, grads(False)):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1025, 1025), True, (-1, -1)),  # descending order, reversed launch
     ((700, 1500), True, (-1, -1)),  # sq < sk
     ((1500, 700), True, (-1, -1)),  # sq > sk: the first query tiles see no key
     ((1025, 1025), False, (256, 64)),  # band: descending
     ((1025, 1025), False, (-1, 300)),  # right bound only: descending, every tile from m 0
     ((1025, 1025), False, (256, -1)),  # left bound only: ascending, 4 chains
     ((1025, 1025), False, (-1, -1)),  # rotated walk, one chain (up to 8k keys)
     ((1500, 700), False, (-1, -1)),  # rotated, fewer K/V tiles than query tiles
     ((300, 1025), False, (-1, -1)),  # ascending, 4 chains, few query tiles
     ((129, 1100), False, (-1, -1))],  # ascending, 4 chains, 3 query tiles
    ids=["causal", "causal-sq<sk", "causal-sq>sk", "band", "right", "left", "full",
         "full-sq>sk", "full-sq<sk", "full-sq<<sk"],
)  # fmt: skip
@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_deterministic_orders(headdim, seqlens, causal, window_size, chains):
    # Each order (descending for a right window bound; rotated for full attention with at
    # most as many K/V as query tiles; else ascending), in the chains bwd_dq_chains picks or
    # forced to 4 (dq_order.cuh; the rotated walk then counts its chain-mates across the
    # wrap): gradients right by the error rule, and three runs bitwise equal.
    q, k, v, dout = make_inputs(2, *seqlens, 4, 2, headdim, torch.bfloat16)

    def grads():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attn_func(*leaves, causal=causal, window_size=window_size, deterministic=True)
        with _ext.dq_chains(chains):
            out.backward(dout)
        return [t.grad for t in leaves]

    first = grads()
    check_grads(first, q, k, v, dout, causal=causal, window_size=window_size)
    for _ in range(2):
        for a, b in zip(first, grads()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [160, 256])
def test_deterministic_large_head_dims(headdim, causal):
    # The 8 warps of a CTA add to disjoint dq blocks between the same ordering
    # barriers: three runs bitwise equal, and right.
    q, k, v, dout = make_inputs(2, 1025, 1025, 4, 2, headdim, torch.bfloat16)

    def grads(deterministic):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        flash_attn_func(*leaves, causal=causal, deterministic=deterministic).backward(dout)
        return [t.grad for t in leaves]

    first = grads(True)
    check_grads(first, q, k, v, dout, causal=causal)
    for _ in range(2):
        for a, b in zip(first, grads(True)):
            assert torch.equal(a, b)
    for a, b in zip(first, grads(False)):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_small_smem_tiles(monkeypatch, headdim, causal, deterministic):
    # GPUs whose blocks get 99 KiB (sm_86 / sm_89) run d64 on 64-query steps instead of 128,
    # and d128 on 64-key tiles of 4 warps instead of 128-key tiles of 8 (bwd_config.h); the
    # binding's smem_limit selects these tiles on any GPU.
    require_backward(headdim)
    bwd = _ext._C.bwd
    limit = [99 * 1024]
    monkeypatch.setattr(_ext._C, "bwd", lambda *a, **kw: bwd(*a, **kw, smem_limit=limit[0]))
    q, k, v, dout = make_inputs(2, 300, 1025, 4, 2, headdim, torch.bfloat16)
    if not deterministic:
        check_kernel(q, k, v, dout, causal)
    else:
        def grads():
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            flash_attn_func(*leaves, causal=causal, deterministic=True).backward(dout)
            return [t.grad for t in leaves]

        first = grads()
        check_grads(first, q, k, v, dout, causal=causal)
        for a, b in zip(first, grads()):
            assert torch.equal(a, b)
    # The hook reaches the kernel choice: below the small tile's need nothing fits.
    limit[0] = _ext._C.bwd_smem_per_block(headdim) - 16
    with pytest.raises(ValueError, match="shared memory per block"):
        run_backward(q, k, v, dout, causal)


class _BlockGrad(torch.autograd.Function):
    """Identity forward; its backward gives no gradient (None)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def _paged(q, k, v, cu_q, cu_k, max_q, max_k):
    """flash_attn_varlen_func on k / v cut into 16-key pages, read in reverse page order."""
    pages = k.shape[0] // 16
    table = torch.arange(pages - 1, -1, -1, device="cuda", dtype=torch.int32)[None]
    paged = lambda x: x.view(pages, 16, *x.shape[1:]).flip(0)  # noqa: E731
    return flash_attn_varlen_func(q, paged(k), paged(v), cu_q, cu_k, max_q, max_k,
                                  causal=True, block_table=table)


@pytest.mark.parametrize("kind", ["dense", "bias", "varlen", "paged"])
def test_no_gradient_reaching_out_gives_none(kind):
    """Where nothing downstream of out passes a gradient back, the autograd node receives
    None (eager calls do not materialise zero gradients) and gives None for q, k and v: the
    gradient of q is then exactly that of its other path, and k, v are unused."""
    q, k, v, _ = make_inputs(1, 64, 64, 2, 2, 64, torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if kind in ("dense", "bias"):
        bias = torch.randn(1, 2, 64, 64, device="cuda") if kind == "bias" else None
        out = flash_attn_func(q, k, v, causal=True, attn_bias=bias)
    else:
        cu = torch.tensor([0, 64], device="cuda", dtype=torch.int32)
        call = flash_attn_varlen_func if kind == "varlen" else _paged
        extra = {"causal": True} if kind == "varlen" else {}
        out = call(q[0], k[0], v[0], cu, cu, 64, 64, **extra)
    loss = _BlockGrad.apply(out).float().sum() + 3 * q.float().sum()
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v), allow_unused=True)
    assert torch.equal(dq, torch.full_like(q, 3)) and dk is None and dv is None


# ---- properties of the launch -----------------------------------------------------------------


def test_current_stream_is_used():
    q, k, v, dout = make_inputs(2, 512, 512, 8, 8, 128, torch.bfloat16)
    out, lse = _flash_attn_forward(q, k, v, 128**-0.5, -1, 0)
    expected = _flash_attn_backward(dout, q, k, v, out, lse, 128**-0.5, -1, 0)
    late_dout = torch.full_like(dout, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        # The side stream is busy for a while, then fills dout. A backward that ignored the
        # current stream would run right away on a NaN dout.
        torch.cuda._sleep(100_000_000)
        late_dout.copy_(dout)
        grads = _flash_attn_backward(late_dout, q, k, v, out, lse, 128**-0.5, -1, 0)
    side.synchronize()
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.large
def test_64bit_offsets():
    # q, out, dout and dq hold more than 2^31 elements, so row * row_stride overflows 32 bits
    # for the last rows. Non-causal: dq of a row needs only that row of q, out, dout.
    batch, nheads, headdim, seqlen_k = 1, 16, 128, 128
    seqlen_q = 2**31 // (nheads * headdim) + 1024
    elements = batch * seqlen_q * nheads * headdim
    assert elements > 2**31
    needed = 4 * elements * 2 + elements * 4 + elements  # 4 bf16 tensors, f32 dq_accum, a bool
    if torch.cuda.get_device_properties(0).total_memory < needed * 1.2:
        pytest.skip(f"needs ~{needed * 1.2 / 2**30:.0f} GiB of GPU memory")
    q, k, v, dout = make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads // 4, headdim,
                                torch.bfloat16)  # fmt: skip
    out, lse = _flash_attn_forward(q, k, v, headdim**-0.5, -1, -1)
    dq = torch.full_like(q, float("nan"))
    _flash_attn_backward(dout, q, k, v, out, lse, headdim**-0.5, -1, -1, dq=dq)
    assert not dq.isnan().any()
    boundary = 2**31 // (nheads * headdim)  # first row whose offset is >= 2^31 elements
    for start in (0, boundary - 64, seqlen_q - 128):
        rows = slice(start, start + 128)
        ref, pt = (reference_grads(q[:, rows], k, v, dout[:, rows], upcast=u)[0]
                   for u in (True, False))  # fmt: skip
        err = (dq[:, rows].float() - ref).abs().max().item()
        err_pt = (pt.float() - ref).abs().max().item()
        assert err <= 2 * err_pt + ATOL[torch.bfloat16], (start, err, err_pt)
