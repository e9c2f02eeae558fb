"""flashattn2.layers.rotary on CUDA (our rotary kernel) against the float64 reference of
test_rotary.py: forward and gradients, both pairings, partial rotary dims, int / tensor
offsets, varlen, in place, the qkv_ / kv_ forms, fp16 / bf16 / fp32 x and tables. The error
must stay within 2x that of the PyTorch code (the CPU path, same dtypes) plus a small atol.
x lives inside a sentinel-filled buffer: the kernel must neither read nor write around it.
"""
import pytest
import torch
from flashattn2.layers.rotary import (
    apply_rotary_emb,
    apply_rotary_emb_kv_,
    apply_rotary_emb_qkv_,
)
from test_rotary import reference, tables

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ATOL = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}
SENTINEL = float("nan")


def padded(shape, dtype, pad=(3, 1, 8)):
    """(buffer, x): random x of ``shape``, a view into a NaN buffer that is larger by ``pad``
    in the last len(pad) dims."""
    big = list(shape)
    for i, p in enumerate(pad, start=len(shape) - len(pad)):
        big[i] += p
    buf = torch.full(big, SENTINEL, dtype=dtype, device="cuda")
    x = buf[tuple(slice(0, n) for n in shape)]
    x.copy_(torch.randn(shape, device="cuda"))
    return buf, x


def outside(buf, x):
    """The elements of buf that are not in the view x (a boolean mask over buf)."""
    mask = torch.ones(buf.shape, dtype=torch.bool, device=buf.device)
    mask[tuple(slice(0, n) for n in x.shape)] = False
    return buf[mask]


def check(out, ref, torch_out):
    """out's error vs the float64 ref is at most 2x the PyTorch code's plus ATOL."""
    assert out.dtype == torch_out.dtype and out.shape == ref.shape
    assert torch.isfinite(out).all(), "the kernel read or wrote outside x"
    err = (out.double() - ref.to(out.device)).abs().max().item()
    torch_err = (torch_out.double() - ref.cpu()).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 2 * torch_err + ATOL[out.dtype] * scale, (err, torch_err)


def cpu_rotary(x, cos, sin, *args, **kwargs):
    """The PyTorch code path on CPU copies (the baseline)."""
    kwargs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return apply_rotary_emb(x.detach().cpu(), cos.cpu(), sin.cpu(), *args, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cs_dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [64, 40])
@pytest.mark.parametrize("inplace", [False, True])
def test_forward(dtype, cs_dtype, interleaved, rotary_dim, inplace):
    batch, seqlen, nheads, headdim = 3, 37, 5, 64
    cos, sin = (t.cuda() for t in tables(100, rotary_dim // 2, cs_dtype))
    pos = torch.arange(seqlen).expand(batch, -1)
    for offsets, shift in ((0, 0), (41, 41), (torch.tensor([0, 9, 80], device="cuda"), None)):
        buf, x = padded((batch, seqlen, nheads, headdim), dtype)
        x0 = x.clone()
        if shift is None:  # batch 2 runs past the table from token 20: unrotated there
            p = pos + offsets.cpu()[:, None].long()
        else:
            p = pos + shift
        ref = reference(x0.cpu(), cos.cpu(), sin.cpu(), p, interleaved)
        base = cpu_rotary(x0, cos, sin, interleaved, seqlen_offsets=offsets)
        out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets=offsets)
        assert (out is x) == inplace
        check(out, ref, base)
        assert torch.equal(out[..., rotary_dim:], x0[..., rotary_dim:])
        assert outside(buf, x).isnan().all(), "written outside x"
        if shift is None:
            assert torch.equal(out[2, 20:], x0[2, 20:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_gradients(dtype, interleaved, inplace):
    batch, seqlen, nheads, headdim, rotary_dim = 2, 29, 3, 48, 32
    cos, sin = (t.cuda() for t in tables(64, rotary_dim // 2, torch.float32))
    offsets = torch.tensor([3, 30], dtype=torch.int32, device="cuda")
    pos = torch.arange(seqlen).expand(batch, -1) + offsets.cpu()[:, None].long()
    leaf = torch.randn(batch, seqlen, nheads, headdim, device="cuda", dtype=dtype,
                       requires_grad=True)
    grad = torch.randn_like(leaf)
    x = leaf.clone() if inplace else leaf
    out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets=offsets)
    out.backward(grad)
    # d/dx of a rotation is the rotation by the opposite angle
    ref = reference(grad.cpu(), cos.cpu(), -sin.cpu(), pos, interleaved)
    cpu_leaf = leaf.detach().cpu().requires_grad_()
    cpu_x = cpu_leaf.clone() if inplace else cpu_leaf
    apply_rotary_emb(cpu_x, cos.cpu(), sin.cpu(), interleaved, inplace,
                     seqlen_offsets=offsets.cpu()).backward(grad.cpu())
    check(leaf.grad, ref, cpu_leaf.grad)
    assert torch.equal(leaf.grad[..., rotary_dim:], grad[..., rotary_dim:])

    # A gradient with stride 0 everywhere (from .sum()) and a strided one.
    leaf.grad = None
    apply_rotary_emb(leaf, cos, sin, interleaved, seqlen_offsets=offsets).sum().backward()
    ones = torch.ones(leaf.shape, dtype=dtype)
    check(leaf.grad, reference(ones, cos.cpu(), -sin.cpu(), pos, interleaved),
          cpu_rotary(ones, cos, -sin, interleaved, seqlen_offsets=offsets))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_varlen(dtype, interleaved, inplace):
    lengths = [5, 0, 70, 1, 13]
    cu = torch.tensor([0, 5, 5, 75, 76, 89], dtype=torch.int32, device="cuda")
    nheads, headdim, rotary_dim = 4, 32, 24
    cos, sin = (t.cuda() for t in tables(96, rotary_dim // 2, torch.bfloat16))
    for offsets in (7, torch.tensor([3, 7, 0, 95, 90], device="cuda")):
        if isinstance(offsets, int):
            pos = torch.cat([torch.arange(n) + offsets for n in lengths])
        else:
            pos = torch.cat([torch.arange(n) + int(o) for n, o in zip(lengths, offsets.cpu())])
        buf, x = padded((89, nheads, headdim), dtype, pad=(2, 4))
        x0 = x.clone()
        leaf = x0.clone().requires_grad_()
        ref = reference(x0.cpu(), cos.cpu(), sin.cpu(), pos, interleaved)
        base = cpu_rotary(x0, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu)
        out = apply_rotary_emb(x, cos, sin, interleaved, inplace, seqlen_offsets=offsets,
                               cu_seqlens=cu, max_seqlen=70)
        check(out, ref, base)
        assert torch.equal(out[..., rotary_dim:], x0[..., rotary_dim:])
        assert outside(buf, x).isnan().all(), "written outside x"

        grad = torch.randn_like(x0)
        apply_rotary_emb(leaf, cos, sin, interleaved, seqlen_offsets=offsets,
                         cu_seqlens=cu).backward(grad)
        check(leaf.grad, reference(grad.cpu(), cos.cpu(), -sin.cpu(), pos, interleaved),
              cpu_rotary(grad, cos, -sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_qkv_and_kv(dtype, interleaved):
    batch, seqlen, nheads, headdim, rotary_dim = 2, 19, 3, 64, 48
    cos, sin = (t.cuda() for t in tables(32, rotary_dim // 2, dtype))
    cos_k, sin_k = (t.cuda() for t in tables(32, rotary_dim // 2, dtype))
    pos = torch.arange(seqlen).expand(batch, -1) + 4

    buf, qkv = padded((batch, seqlen, 3, nheads, headdim), dtype)
    q0, k0, v0 = (qkv[:, :, i].clone() for i in range(3))
    assert apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, interleaved, 4) is qkv
    check(qkv[:, :, 0], reference(q0.cpu(), cos.cpu(), sin.cpu(), pos, interleaved),
          cpu_rotary(q0, cos, sin, interleaved, seqlen_offsets=4))
    check(qkv[:, :, 1], reference(k0.cpu(), cos_k.cpu(), sin_k.cpu(), pos, interleaved),
          cpu_rotary(k0, cos_k, sin_k, interleaved, seqlen_offsets=4))
    assert torch.equal(qkv[:, :, 2], v0)
    assert outside(buf, qkv).isnan().all()

    buf, packed = padded((batch, seqlen, 4 + 2 * 2, headdim), dtype)  # GQA: 4 q, 2 k / v heads
    p0 = packed.clone()
    apply_rotary_emb_qkv_(packed, cos, sin, interleaved=interleaved, seqlen_offsets=4,
                          num_heads_q=4)
    check(packed[:, :, :6], reference(p0[:, :, :6].cpu(), cos.cpu(), sin.cpu(), pos,
                                      interleaved),
          cpu_rotary(p0[:, :, :6], cos, sin, interleaved, seqlen_offsets=4))
    assert torch.equal(packed[:, :, 6:], p0[:, :, 6:])
    assert outside(buf, packed).isnan().all()

    buf, kv = padded((batch, seqlen, 2, nheads, headdim), dtype)
    kv0 = kv.clone()
    assert apply_rotary_emb_kv_(kv, cos, sin, interleaved, 4) is kv
    check(kv[:, :, 0], reference(kv0[:, :, 0].cpu(), cos.cpu(), sin.cpu(), pos, interleaved),
          cpu_rotary(kv0[:, :, 0], cos, sin, interleaved, seqlen_offsets=4))
    assert torch.equal(kv[:, :, 1], kv0[:, :, 1])
    assert outside(buf, kv).isnan().all()


def test_strided_inputs_and_errors():
    cos, sin = (t.cuda() for t in tables(16, 8, torch.float32))
    x = torch.randn(2, 16, 3, 32, device="cuda").transpose(-1, -2).contiguous().transpose(-1, -2)
    assert x.stride(-1) != 1
    pos = torch.arange(16).expand(2, -1)
    out = apply_rotary_emb(x, cos.t().contiguous().t(), sin, True)  # copies, then the kernel
    check(out, reference(x.cpu(), cos.cpu(), sin.cpu(), pos, True), cpu_rotary(x, cos, sin, True))
    with pytest.raises(ValueError, match="last dim must be contiguous"):
        apply_rotary_emb(x, cos, sin, inplace=True)
    with pytest.raises(ValueError, match="device"):
        apply_rotary_emb(x, cos.cpu(), sin.cpu())
    empty = torch.empty(0, 16, 3, 32, device="cuda")
    assert apply_rotary_emb(empty, cos, sin).shape == empty.shape
