"""Variable-length batches on the GPU: each packed sequence against the float32 reference of
that sequence alone (the error rule of test_fwd.py, over all sequences), forward and
backward; equal-length varlen against the dense kernel (bitwise); zero-length sequences.
"""
import pytest
import torch
from flashattn2 import (
    _ext,
    flash_attn_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from reference import attention_ref
from test_fwd import ATOL, LSE_ATOL, LSE_RTOL, dtype_id, require_kernel

gpu = pytest.mark.gpu

# (lengths_q, lengths_k): empty sequences, single tokens, ragged tails, sq != sk.
LENGTHS = {
    "ragged": ([17, 0, 1, 130, 257, 64], [33, 5, 1, 130, 200, 0]),
    "same": ([1, 77, 129, 300], [1, 77, 129, 300]),
}


def cu(lengths):
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, device="cuda")
    out[1:] = torch.tensor(lengths, device="cuda").cumsum(0)
    return out


def make_varlen(lengths_q, lengths_k, nheads, nheads_k, headdim, dtype, requires_grad=False):
    require_kernel(headdim)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.randn(total_q, nheads, headdim, device="cuda", dtype=dtype)
    k = torch.randn(total_k, nheads_k, headdim, device="cuda", dtype=dtype)
    v = torch.randn(total_k, nheads_k, headdim, device="cuda", dtype=dtype)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v


def per_sequence(lengths_q, lengths_k):
    sq, sk = [0], [0]
    for a, b in zip(lengths_q, lengths_k):
        sq.append(sq[-1] + a)
        sk.append(sk[-1] + b)
    return [(slice(sq[i], sq[i + 1]), slice(sk[i], sk[i + 1])) for i in range(len(lengths_q))]


def reference(q, k, v, lengths_q, lengths_k, causal, window_size, upcast=True, grad_out=None):
    """Per-sequence reference, packed back: (out, lse (h, total_q)) and, with grad_out, the
    float32 gradients of q, k, v."""
    outs, lses, grads = [], [], []
    for sq, sk in per_sequence(lengths_q, lengths_k):
        qs, ks, vs = (t.detach()[s].unsqueeze(0) for t, s in ((q, sq), (k, sk), (v, sk)))
        if grad_out is not None:
            qs, ks, vs = (t.float().requires_grad_() for t in (qs, ks, vs))
        if ks.shape[1] == 0:
            out = torch.zeros_like(qs)
            lse = torch.full((1, q.shape[1], qs.shape[1]), float("inf"), device=q.device)
        else:
            out, lse = attention_ref(qs, ks, vs, causal=causal, window_size=window_size,
                                     upcast=upcast)
        if grad_out is not None:
            if ks.shape[1] and qs.shape[1]:
                grads.append(torch.autograd.grad(out, (qs, ks, vs), grad_out[sq].unsqueeze(0).float()))
            else:
                grads.append((torch.zeros_like(qs), torch.zeros_like(ks), torch.zeros_like(vs)))
        outs.append(out[0].detach())
        lses.append(lse[0])
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    if grad_out is None:
        return out, lse
    return out, lse, [torch.cat([g[i][0] for g in grads]) for i in range(3)]


def assert_rule(name, got, ref, ref_pt, dtype):
    err = (got.float() - ref.float()).abs().max().item() if got.numel() else 0.0
    err_pt = (ref_pt.float() - ref.float()).abs().max().item() if got.numel() else 0.0
    bound = 2 * err_pt + ATOL[dtype]
    assert err <= bound, f"{name}: max err {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})"


@gpu
@pytest.mark.parametrize("window_size", [(-1, -1), (50, 10)], ids=["nowin", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=str)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
@pytest.mark.parametrize("headdim", [40, 64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_varlen_forward(dtype, headdim, lengths, heads, causal, window_size):
    lengths_q, lengths_k = LENGTHS[lengths]
    q, k, v = make_varlen(lengths_q, lengths_k, *heads, headdim, dtype)
    out, lse, _ = flash_attn_varlen_func(
        q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
        causal=causal, window_size=window_size, return_attn_probs=True,
    )  # fmt: skip
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    out_ref, lse_ref = reference(q, k, v, lengths_q, lengths_k, causal, window_size)
    out_pt, _ = reference(q, k, v, lengths_q, lengths_k, causal, window_size, upcast=False)
    assert not out.isnan().any()
    assert_rule("out", out, out_ref, out_pt, dtype)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)


@gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=str)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
@pytest.mark.parametrize("headdim", [40, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_varlen_backward(dtype, headdim, lengths, heads, causal, deterministic):
    check_varlen_backward(dtype, headdim, lengths, heads, causal, deterministic)


@gpu
@pytest.mark.parametrize(
    "headdim,lengths,heads,causal,deterministic",
    [(256, "ragged", (6, 2), True, False), (256, "same", (4, 4), False, True),
     (160, "ragged", (6, 2), False, True), (192, "same", (6, 2), True, False)],
    ids=["d256-ragged-gqa-causal", "d256-same-det", "d160-ragged-gqa-det", "d192-same-gqa-causal"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_varlen_backward_large_head_dims(dtype, headdim, lengths, heads, causal, deterministic):
    check_varlen_backward(dtype, headdim, lengths, heads, causal, deterministic)


def pytorch_grads(q, k, v, lengths_q, lengths_k, causal, window_size, dout):
    """PyTorch's error at this precision: the gradients of the same-dtype reference of each
    sequence, packed (zero where no sequence reaches)."""
    q16, k16, v16 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    for sq, sk in per_sequence(lengths_q, lengths_k):
        qs, ks, vs = q16[sq].unsqueeze(0), k16[sk].unsqueeze(0), v16[sk].unsqueeze(0)
        if qs.shape[1] and ks.shape[1]:
            o, _ = attention_ref(qs, ks, vs, causal=causal, window_size=window_size,
                                 upcast=False)
            (o * dout[sq].unsqueeze(0)).sum().backward()
    return tuple(torch.zeros_like(t) if t.grad is None else t.grad for t in (q16, k16, v16))


def check_varlen_backward(dtype, headdim, lengths, heads, causal, deterministic):
    """Gradients of each packed sequence against its own reference (the error rule), no NaN;
    deterministic: a second run bitwise equal."""
    lengths_q, lengths_k = LENGTHS[lengths]
    q, k, v = make_varlen(lengths_q, lengths_k, *heads, headdim, dtype, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                 max(lengths_k), causal=causal, deterministic=deterministic)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, _, ref = reference(q, k, v, lengths_q, lengths_k, causal, (-1, -1), grad_out=dout)
    grads_pt = pytorch_grads(q, k, v, lengths_q, lengths_k, causal, (-1, -1), dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref, grads_pt):
        assert g.shape == r.shape and g.dtype == dtype
        assert not g.isnan().any(), f"{name} has NaN"
        assert_rule(name, g, r, p, dtype)
    if deterministic:
        again = torch.autograd.grad(
            flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                   max(lengths_k), causal=causal, deterministic=True),
            (q, k, v), dout)  # fmt: skip
        for g, h in zip(grads, again):
            assert torch.equal(g, h)


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_equal_lengths_match_dense(dtype, causal, monkeypatch):
    """Equal-length varlen runs the dense kernel's arithmetic: bitwise equal out and lse, and
    dk / dv (dq only differs by atomic-add order). The backward compared is the mma.sync one
    on both sides (the Hopper backward takes no varlen)."""
    monkeypatch.setattr(_ext, "SM90_BWD", False)
    # Big enough that flash_attn_func does not split the keys (split-KV rounds differently).
    batch, seqlen, nheads, nheads_k, headdim = 4, 333, 16, 4, 128
    require_kernel(headdim)
    q = torch.randn(batch, seqlen, nheads, headdim, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen, nheads_k, headdim, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen, nheads_k, headdim, device="cuda", dtype=dtype, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    cu_seqlens = cu([seqlen] * batch)
    flat = [t.detach().flatten(0, 1).requires_grad_() for t in (q, k, v)]
    out_v, lse_v, _ = flash_attn_varlen_func(*flat, cu_seqlens, cu_seqlens, seqlen, seqlen,
                                             causal=causal, return_attn_probs=True)
    assert torch.equal(out_v, out.detach().flatten(0, 1))
    assert torch.equal(lse_v, lse.permute(1, 0, 2).flatten(1, 2))
    dout = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), dout)
    gv = torch.autograd.grad(out_v, flat, dout.flatten(0, 1))
    torch.testing.assert_close(gv[0], g[0].flatten(0, 1), atol=2e-3, rtol=0)
    assert torch.equal(gv[1], g[1].flatten(0, 1)) and torch.equal(gv[2], g[2].flatten(0, 1))


@gpu
def test_packed_variants_and_uncovered_rows():
    """qkvpacked / kvpacked give packed gradients; rows past cu_seqlens[-1] get zero grads."""
    dtype, nheads, headdim = torch.bfloat16, 4, 64
    lengths = [50, 0, 7]
    total = sum(lengths) + 5  # 5 trailing rows outside every sequence
    qkv = torch.randn(total, 3, nheads, headdim, device="cuda", dtype=dtype, requires_grad=True)
    cu_seqlens = cu(lengths)
    out = flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max(lengths), causal=True)
    (dqkv,) = torch.autograd.grad(out, qkv, torch.ones_like(out))
    assert dqkv.shape == qkv.shape and not dqkv.isnan().any()
    assert (dqkv[sum(lengths):] == 0).all()
    q, k, v = qkv.detach().unbind(1)
    ref = flash_attn_varlen_func(q[:-5], k[:-5], v[:-5], cu_seqlens, cu_seqlens, max(lengths),
                                 max(lengths), causal=True)
    assert torch.equal(out[: sum(lengths)], ref)
    kv = torch.stack([k, v], dim=1).requires_grad_()
    out_kv = flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens, cu_seqlens, max(lengths),
                                             max(lengths), causal=True)
    assert torch.equal(out_kv[: sum(lengths)], ref)
    (dkv,) = torch.autograd.grad(out_kv, kv, torch.ones_like(out_kv))
    assert dkv.shape == kv.shape and (dkv[sum(lengths):] == 0).all()


@gpu
def test_bad_cu_seqlens_never_leave_the_tensors():
    """cu_seqlens past the tensors (unknowable without a sync) are clamped by the kernels:
    the call finishes and leaves memory around the outputs untouched."""
    q = torch.randn(40, 2, 64, device="cuda", dtype=torch.float16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    bad = torch.tensor([0, 30, 1000], dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, bad, bad, 970, 970)
    torch.cuda.synchronize()
    assert torch.isfinite(out[:30]).all()


# ---- CPU: argument checks ------------------------------------------------------------------


def _t(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "case, message",
    [
        (dict(q=_t(2, 10, 4, 64)), "total_q, nheads, headdim"),
        (dict(cu_seqlens_q=_t(3, dtype=torch.int64)), "int32"),
        (dict(cu_seqlens_q=_t(3, 1, dtype=torch.int32)), "batch \\+ 1"),
        (dict(cu_seqlens_k=_t(4, dtype=torch.int32)), "batch \\+ 1 entries"),
        (dict(max_seqlen_q=-1), "max_seqlen_q"),
        (dict(max_seqlen_k=2.0), "max_seqlen_k"),
        (dict(k=_t(10, 3, 64), v=_t(10, 3, 64)), "must divide"),
        (dict(v=_t(11, 2, 64)), "shape of k"),
        (dict(k=_t(10, 2, 64, dtype=torch.bfloat16)), "dtype"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_arguments(case, message):
    args = dict(q=_t(10, 4, 64), k=_t(10, 2, 64), v=_t(10, 2, 64),
                cu_seqlens_q=_t(3, dtype=torch.int32), cu_seqlens_k=_t(3, dtype=torch.int32),
                max_seqlen_q=5, max_seqlen_k=5)
    args.update(case)
    with pytest.raises(ValueError, match=message):
        flash_attn_varlen_func(**args)


def test_cpu_tensors_are_rejected():
    args = (_t(10, 4, 64), _t(10, 2, 64), _t(10, 2, 64), _t(3, dtype=torch.int32),
            _t(3, dtype=torch.int32), 5, 5)
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_varlen_func(*args)
    with pytest.raises(ValueError, match="CUDA"):  # a well-formed paged call gets that far
        flash_attn_varlen_func(args[0], _t(4, 16, 2, 64), _t(4, 16, 2, 64), *args[3:],
                               block_table=_t(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="qkv"):
        flash_attn_varlen_qkvpacked_func(_t(10, 2, 4, 64), _t(3, dtype=torch.int32), 5)
    with pytest.raises(ValueError, match="kv"):
        flash_attn_varlen_kvpacked_func(_t(10, 4, 64), _t(10, 3, 2, 64), _t(3, dtype=torch.int32),
                                        _t(3, dtype=torch.int32), 5, 5)


@pytest.mark.parametrize(
    "case, message",
    [
        (dict(block_table=_t(2, 1, dtype=torch.int64)), "int32"),
        (dict(block_table=_t(3, 1, dtype=torch.int32)), "batch=2, max_pages"),
        (dict(block_table=_t(2, 2, dtype=torch.int32)[:, :1].t().contiguous().t()),
         "unit last stride"),
        (dict(k=_t(64, 2, 64), v=_t(64, 2, 64)), "num_blocks, page_size"),
        (dict(k=_t(4, 24, 2, 64), v=_t(4, 24, 2, 64)), "power of two"),
        (dict(max_seqlen_k=17), "fewer than max_seqlen_k=17"),
        (dict(k=_t(0, 16, 2, 64), v=_t(0, 16, 2, 64)), "no pages"),
        (dict(v=_t(4, 16, 2, 32)), "shape of k"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_block_table_arguments(case, message):
    args = dict(q=_t(10, 4, 64), k=_t(4, 16, 2, 64), v=_t(4, 16, 2, 64),
                cu_seqlens_q=_t(3, dtype=torch.int32), cu_seqlens_k=_t(3, dtype=torch.int32),
                max_seqlen_q=5, max_seqlen_k=16, block_table=_t(2, 1, dtype=torch.int32))
    args.update(case)
    with pytest.raises(ValueError, match=message):
        flash_attn_varlen_func(**args)


def test_block_table_takes_no_dropout():
    q = _t(10, 4, 64).requires_grad_()
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_varlen_func(q, _t(4, 16, 2, 64), _t(4, 16, 2, 64), _t(3, dtype=torch.int32),
                               _t(3, dtype=torch.int32), 5, 16, dropout_p=0.1,
                               block_table=_t(2, 1, dtype=torch.int32))


def test_block_table_with_grad_reaches_the_device_check():
    """Inputs that require grad take the paged path as far as without (flash-attn runs that
    forward): here the device check, since the tensors are on the CPU."""
    q = _t(10, 4, 64).requires_grad_()
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_varlen_func(q, _t(4, 16, 2, 64), _t(4, 16, 2, 64), _t(3, dtype=torch.int32),
                               _t(3, dtype=torch.int32), 5, 16,
                               block_table=_t(2, 1, dtype=torch.int32))


def paged_varlen_kv(k, v, lengths_k, page_size, gen):
    """Packed k, v (total_k, h_k, d) as pages (num_blocks, page_size, h_k, d) in a shuffled
    order, and the block table (batch, max_pages). Every row that holds no key is NaN, and so
    is the page that table entries past a sequence's pages point to: reading any of them
    would put NaN into the output."""
    pages_per = [-(-n // page_size) for n in lengths_k]
    num_blocks = sum(pages_per) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    shape = (num_blocks, page_size) + tuple(k.shape[1:])
    kp = torch.full(shape, float("nan"), dtype=k.dtype, device=k.device)
    vp = torch.full_like(kp, float("nan"))
    table = torch.full((len(lengths_k), max(pages_per) + 1), perm[-1], dtype=torch.int32)
    start, used = 0, 0
    for b, n in enumerate(lengths_k):
        for j in range(pages_per[b]):
            page = perm[used]
            used += 1
            rows = slice(start + j * page_size, min(start + (j + 1) * page_size, start + n))
            kp[page, : rows.stop - rows.start] = k[rows]
            vp[page, : rows.stop - rows.start] = v[rows]
            table[b, j] = page
        start += n
    return kp, vp, table.to(k.device)


# lengths_q, lengths_k of paged calls: ragged prefill, and decoding-sized queries (the GQA
# packing of the KV kernel) with an empty cache and a query of no row.
PAGED_LENGTHS = {
    "ragged": LENGTHS["ragged"],
    "decode": ([1, 4, 0, 7, 3], [300, 17, 40, 0, 64]),
}


@gpu
@pytest.mark.parametrize("window_size", [(-1, -1), (30, -1)], ids=["nowin", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (8, 1)], ids=str)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("lengths", list(PAGED_LENGTHS), ids=str)
@pytest.mark.parametrize("headdim", [64, 128])
def test_varlen_paged_kv(headdim, lengths, page_size, heads, causal, window_size):
    """block_table (flash-attn v2): each sequence's keys from its pages, against the float32
    reference of that sequence; never a row past a sequence's keys (NaN there)."""
    dtype = torch.float16
    lengths_q, lengths_k = PAGED_LENGTHS[lengths]
    q, k, v = make_varlen(lengths_q, lengths_k, *heads, headdim, dtype)
    kp, vp, table = paged_varlen_kv(k, v, lengths_k, page_size, torch.Generator().manual_seed(3))
    out, lse, _ = flash_attn_varlen_func(
        q, kp, vp, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k),
        causal=causal, window_size=window_size, return_attn_probs=True, block_table=table,
    )  # fmt: skip
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    assert not out.isnan().any() and not lse.isnan().any()
    out_ref, lse_ref = reference(q, k, v, lengths_q, lengths_k, causal, window_size)
    out_pt, _ = reference(q, k, v, lengths_q, lengths_k, causal, window_size, upcast=False)
    assert_rule("out", out, out_ref, out_pt, dtype)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)


@gpu
@pytest.mark.parametrize("window_size", [(-1, -1), (30, 5)], ids=["nowin", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=str)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("lengths", list(PAGED_LENGTHS), ids=str)
@pytest.mark.parametrize("headdim", [59, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_varlen_paged_kv_backward(dtype, headdim, lengths, page_size, heads, causal,
                                  window_size):
    """Gradients through block_table: dq, and dk / dv shaped like the pages, against the
    float32 reference of each sequence (the error rule); rows that hold no key (NaN in the
    pages) get zero gradient, and no NaN leaks from them."""
    lengths_q, lengths_k = PAGED_LENGTHS[lengths]
    q, k, v = make_varlen(lengths_q, lengths_k, *heads, headdim, dtype)
    kp, vp, table = paged_varlen_kv(k, v, lengths_k, page_size, torch.Generator().manual_seed(5))
    q.requires_grad_(), kp.requires_grad_(), vp.requires_grad_()
    out = flash_attn_varlen_func(q, kp, vp, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                 max(lengths_k), causal=causal, window_size=window_size,
                                 block_table=table)
    dout = torch.randn_like(out)
    dq, dkp, dvp = torch.autograd.grad(out, (q, kp, vp), dout)
    assert dkp.shape == kp.shape and dvp.shape == vp.shape
    _, _, (dq_ref, dk_ref, dv_ref) = reference(q, k, v, lengths_q, lengths_k, causal,
                                               window_size, grad_out=dout)
    dq_pt, dk_pt, dv_pt = pytorch_grads(q, k, v, lengths_q, lengths_k, causal, window_size, dout)
    assert not dq.isnan().any()
    assert_rule("dq", dq, dq_ref, dq_pt, dtype)
    for name, got, ref, ref_pt in (("dk", dkp, dk_ref, dk_pt), ("dv", dvp, dv_ref, dv_pt)):
        # The reference gradients laid out as the pages (same shuffle): NaN where no key.
        ref, _, _ = paged_varlen_kv(ref, ref, lengths_k, page_size,
                                    torch.Generator().manual_seed(5))
        ref_pt, _, _ = paged_varlen_kv(ref_pt, ref_pt, lengths_k, page_size,
                                       torch.Generator().manual_seed(5))
        key = ~ref.isnan()
        assert torch.equal(got[~key], torch.zeros_like(got[~key])), f"{name}: rows with no key"
        assert_rule(name, got[key], ref[key], ref_pt[key], dtype)


@gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
def test_varlen_paged_kv_backward_shared_pages(deterministic):
    """Two sequences reading the same pages (a shared prefix): the page gradient is the sum of
    both sequences' key gradients; deterministic gives the same gradients twice."""
    dtype, lengths_q, n = torch.bfloat16, [70, 33], 80
    q, k, v = make_varlen(lengths_q, [n], 6, 2, 64, dtype)
    kp, vp, table = paged_varlen_kv(k, v, [n], 16, torch.Generator().manual_seed(6))
    table = table.expand(2, -1).contiguous()
    q.requires_grad_(), kp.requires_grad_(), vp.requires_grad_()

    def grads():
        out = flash_attn_varlen_func(q, kp, vp, cu(lengths_q), cu([n, n]), max(lengths_q), n,
                                     causal=True, deterministic=deterministic,
                                     block_table=table)
        return torch.autograd.grad(out, (q, kp, vp), dout)

    dout = torch.randn(q.shape, device="cuda", dtype=dtype)
    dq, dkp, dvp = grads()
    k2, v2 = torch.cat([k, k]), torch.cat([v, v])
    _, _, (dq_ref, dk_ref, dv_ref) = reference(q, k2, v2, lengths_q, [n, n], True, (-1, -1),
                                               grad_out=dout)
    dq_pt, dk_pt, dv_pt = pytorch_grads(q, k2, v2, lengths_q, [n, n], True, (-1, -1), dout)
    assert_rule("dq", dq, dq_ref, dq_pt, dtype)
    for name, got, ref, ref_pt in (("dk", dkp, dk_ref, dk_pt), ("dv", dvp, dv_ref, dv_pt)):
        ref = (ref[:n] + ref[n:])
        ref_pt = (ref_pt[:n].float() + ref_pt[n:].float()).to(dtype)
        ref, _, _ = paged_varlen_kv(ref, ref, [n], 16, torch.Generator().manual_seed(6))
        ref_pt, _, _ = paged_varlen_kv(ref_pt, ref_pt, [n], 16, torch.Generator().manual_seed(6))
        key = ~ref.isnan()
        assert torch.equal(got[~key], torch.zeros_like(got[~key])), f"{name}: rows with no key"
        assert_rule(name, got[key], ref[key], ref_pt[key], dtype)
    if deterministic:
        assert all(torch.equal(a, b) for a, b in zip((dq, dkp, dvp), grads()))


@gpu
def test_varlen_paged_kv_under_compile():
    """The flashattn2::varlen_fwd operator takes the block table (no graph break)."""
    torch._dynamo.reset()
    lengths_q, lengths_k = PAGED_LENGTHS["decode"]
    q, k, v = make_varlen(lengths_q, lengths_k, 6, 2, 64, torch.bfloat16)
    kp, vp, table = paged_varlen_kv(k, v, lengths_k, 16, torch.Generator().manual_seed(4))
    args = (q, kp, vp, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k))
    eager = flash_attn_varlen_func(*args, causal=True, block_table=table)
    compiled = torch.compile(
        lambda *a: flash_attn_varlen_func(*a, causal=True, block_table=table), fullgraph=True
    )(*args)
    assert torch.equal(compiled, eager)
    torch._dynamo.reset()


@gpu
@pytest.mark.parametrize("paged", [False, True], ids=["packed", "paged"])
def test_varlen_backward_under_compile(paged):
    """torch.compile(fullgraph) of a varlen forward + backward (the flashattn2::varlen_bwd
    operator, whose lse is (nheads, total_q)) gives the eager gradients (deterministic: bitwise)."""
    torch._dynamo.reset()
    lengths_q, lengths_k = PAGED_LENGTHS["ragged"]
    q, k, v = make_varlen(lengths_q, lengths_k, 6, 2, 64, torch.bfloat16)
    table = None
    if paged:
        k, v, table = paged_varlen_kv(k, v, lengths_k, 16, torch.Generator().manual_seed(7))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)

    def loss(q, k, v):
        out = flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q),
                                     max(lengths_k), causal=True, deterministic=True,
                                     block_table=table)
        return (out * dout).sum()

    eager = torch.autograd.grad(loss(*leaves), leaves)
    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True)(*leaves), leaves)
    for a, b in zip(compiled, eager):
        assert not a.isnan().any() and torch.equal(a, b)
    torch._dynamo.reset()


@gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_score_mods_match_dense(causal):
    """softcap + ALiBi (per batch entry slopes): each sequence as flash_attn_func computes it
    (itself checked against the reference in test_variants.py), forward and backward;
    dropout: reproducible under torch.manual_seed."""
    lengths_q, lengths_k = LENGTHS["ragged"]
    q, k, v = make_varlen(lengths_q, lengths_k, 6, 2, 64, torch.float16, requires_grad=True)
    slopes = torch.rand(len(lengths_q), 6, device="cuda")
    args = (q, k, v, cu(lengths_q), cu(lengths_k), max(lengths_q), max(lengths_k))
    out = flash_attn_varlen_func(*args, causal=causal, softcap=5.0, alibi_slopes=slopes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for b, (sq, sk) in enumerate(per_sequence(lengths_q, lengths_k)):
        if sq.stop == sq.start or sk.stop == sk.start:
            continue
        sub = [t.detach()[s].unsqueeze(0).requires_grad_() for t, s in ((q, sq), (k, sk), (v, sk))]
        ref = flash_attn_func(*sub, causal=causal, softcap=5.0, alibi_slopes=slopes[b : b + 1])
        ref_grads = torch.autograd.grad(ref, sub, dout[sq].unsqueeze(0))
        torch.testing.assert_close(out[sq], ref[0], atol=2e-3, rtol=0)
        for g, r, s in zip(grads, ref_grads, (sq, sk, sk)):
            torch.testing.assert_close(g[s], r[0], atol=5e-3, rtol=0)
    torch.manual_seed(5)
    a = flash_attn_varlen_func(*args, causal=causal, dropout_p=0.3)
    torch.manual_seed(5)
    b = flash_attn_varlen_func(*args, causal=causal, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, out)
    torch.autograd.grad(a, (q, k, v), dout)  # the backward of a dropout call runs


@gpu
def test_kvcache_softcap_and_alibi_match_dense():
    q = torch.randn(2, 3, 8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 300, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    slopes = torch.rand(8, device="cuda")
    seqlens = torch.tensor([100, 300], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True, softcap=8.0,
                                  alibi_slopes=slopes, num_splits=3)
    for b, n in enumerate(seqlens.tolist()):
        ref = flash_attn_func(q[b : b + 1], k[b : b + 1, :n], v[b : b + 1, :n], causal=True,
                              softcap=8.0, alibi_slopes=slopes)
        torch.testing.assert_close(out[b], ref[0], atol=2e-3, rtol=0)
