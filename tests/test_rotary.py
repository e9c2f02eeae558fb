"""flashattn2.layers.rotary against a complex-multiplication reference in float64: both
pairings, partial rotary dims, int / per-sequence offsets, packed sequences, in place,
gradients, the packed qkv / kv forms and RotaryEmbedding (with XPos)."""
import math

import pytest
import torch
from flashattn2.layers.rotary import (
    RotaryEmbedding,
    apply_rotary_emb,
    apply_rotary_emb_kv_,
    apply_rotary_emb_qkv_,
    apply_rotary_emb_torch,
)


def reference(x, cos, sin, pos, interleaved):
    """x ``(..., tokens, nheads, headdim)`` with int64 ``pos`` ``(..., tokens)``: each channel
    pair times ``cos + i sin`` of its position (unrotated past the table), float64."""
    x = x.double()
    half = cos.shape[1]
    inside = (pos < cos.shape[0]).unsqueeze(-1)
    idx = pos.clamp(max=cos.shape[0] - 1)
    c = torch.where(inside, cos.double()[idx], 1.0).unsqueeze(-2)
    s = torch.where(inside, sin.double()[idx], 0.0).unsqueeze(-2)
    rot = torch.complex(c, s)
    ro = x[..., : 2 * half]
    if interleaved:
        z = torch.complex(ro[..., 0::2], ro[..., 1::2]) * rot
        ro = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        z = torch.complex(ro[..., :half], ro[..., half:]) * rot
        ro = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((ro, x[..., 2 * half:]), dim=-1)


def tables(seqlen, half, dtype=torch.float32):
    angles = torch.rand(seqlen, half, dtype=torch.float64) * 2 * math.pi
    return angles.cos().to(dtype), angles.sin().to(dtype)


def assert_rounded(out, ref):
    """``out`` is the float64 reference rounded once to out's dtype (float32 math inside)."""
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[out.dtype]
    torch.testing.assert_close(out.double(), ref, atol=tol * ref.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 20])
def test_apply_rotary_emb(dtype, interleaved, rotary_dim):
    x = torch.randn(3, 17, 4, 32, dtype=dtype)
    cos, sin = tables(40, rotary_dim // 2, dtype)
    pos = torch.arange(17).expand(3, -1)
    out = apply_rotary_emb(x, cos, sin, interleaved)
    assert out.dtype == dtype and out.shape == x.shape
    assert_rounded(out, reference(x, cos, sin, pos, interleaved))
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])
    torch.testing.assert_close(out, apply_rotary_emb_torch(x, cos[:17], sin[:17], interleaved),
                               atol=2e-2 if dtype != torch.float32 else 1e-5, rtol=1e-2)

    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=23)
    assert_rounded(out, reference(x, cos, sin, pos + 23, interleaved))
    offsets = torch.tensor([0, 5, 30], dtype=torch.int32)  # row 2 runs past the table
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets)
    assert_rounded(out, reference(x, cos, sin, pos + offsets[:, None].long(), interleaved))
    assert torch.equal(out[2, 10:], x[2, 10:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_varlen(interleaved):
    lengths = [5, 0, 9, 1]
    cu = torch.tensor([0, 5, 5, 14, 15], dtype=torch.int32)
    x = torch.randn(15, 2, 16)
    cos, sin = tables(32, 8)
    offsets = torch.tensor([3, 7, 0, 20])
    pos = torch.cat([torch.arange(n) + int(o) for n, o in zip(lengths, offsets)])
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu,
                           max_seqlen=9)
    assert_rounded(out, reference(x, cos, sin, pos, interleaved))
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=2, cu_seqlens=cu)
    pos = torch.cat([torch.arange(n) + 2 for n in lengths])
    assert_rounded(out, reference(x, cos, sin, pos, interleaved))


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradients(inplace, interleaved):
    cos, sin = tables(12, 6, torch.float64)
    offsets = torch.tensor([1, 4])
    leaf = torch.randn(2, 7, 3, 16, dtype=torch.float64, requires_grad=True)

    def fn(x):
        return apply_rotary_emb(x.clone() if inplace else x, cos, sin, interleaved, inplace,
                                seqlen_offsets=offsets)

    assert torch.autograd.gradcheck(fn, (leaf,))


def test_inplace_returns_x():
    x = torch.randn(2, 5, 3, 8)
    cos, sin = tables(5, 4)
    expected = apply_rotary_emb(x, cos, sin)
    y = x.clone()
    out = apply_rotary_emb(y, cos, sin, inplace=True)
    assert out is y
    assert torch.equal(y, expected)


def test_qkv_and_kv_inplace():
    cos, sin = tables(10, 8)
    cos_k, sin_k = tables(10, 8)
    qkv = torch.randn(2, 6, 3, 4, 16)
    expected = qkv.clone()
    expected[:, :, 0] = apply_rotary_emb(qkv[:, :, 0], cos, sin, seqlen_offsets=2)
    expected[:, :, 1] = apply_rotary_emb(qkv[:, :, 1], cos_k, sin_k, seqlen_offsets=2)
    out = apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, seqlen_offsets=2)
    assert out is qkv and torch.equal(qkv, expected)

    packed = torch.randn(2, 6, 6 + 2 * 2, 16)  # GQA: 6 query heads, 2 key/value heads
    expected = packed.clone()
    expected[:, :, :8] = apply_rotary_emb(packed[:, :, :8], cos, sin, interleaved=True)
    apply_rotary_emb_qkv_(packed, cos, sin, interleaved=True, num_heads_q=6)
    assert torch.equal(packed, expected)

    kv = torch.randn(2, 6, 2, 4, 16)
    expected = kv.clone()
    expected[:, :, 0] = apply_rotary_emb(kv[:, :, 0], cos, sin)
    assert apply_rotary_emb_kv_(kv, cos, sin) is kv and torch.equal(kv, expected)


def test_qkv_gradients():
    cos, sin = tables(6, 8, torch.float64)
    leaf = torch.randn(2, 6, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rotary_emb_qkv_(t.clone(), cos, sin), (leaf,))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_module(interleaved):
    dim, seqlen = 16, 9
    rope = RotaryEmbedding(dim, base=500.0, interleaved=interleaved)
    qkv = torch.randn(2, seqlen, 3, 2, 24)
    angles = torch.outer(torch.arange(3, 3 + seqlen, dtype=torch.float64),
                         500.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    pos = torch.arange(seqlen).expand(2, -1)
    expected_q = reference(qkv[:, :, 0], angles.cos(), angles.sin(), pos, interleaved)
    expected_k = reference(qkv[:, :, 1], angles.cos(), angles.sin(), pos, interleaved)
    v = qkv[:, :, 2].clone()
    out = rope(qkv, seqlen_offset=3)
    assert out is qkv
    assert_rounded(qkv[:, :, 0], expected_q)
    assert_rounded(qkv[:, :, 1], expected_k)
    assert torch.equal(qkv[:, :, 2], v)

    q, kv = torch.randn(2, seqlen, 2, 24), torch.randn(2, seqlen, 2, 2, 24)
    expected_q = reference(q, angles.cos(), angles.sin(), pos, interleaved)
    q_out, kv_out = rope(q, kv, seqlen_offset=3)
    assert q_out is q and kv_out is kv
    assert_rounded(q, expected_q)


def test_rotary_embedding_xpos():
    dim, seqlen, scale_base = 8, 6, 4.0
    rope = RotaryEmbedding(dim, scale_base=scale_base)
    qkv = torch.randn(1, seqlen, 3, 1, dim, dtype=torch.float64)
    q0, k0 = qkv[:, :, 0].clone(), qkv[:, :, 1].clone()
    rope(qkv)
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64),
                        10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scale = (torch.arange(0, dim, 2, dtype=torch.float64) + 0.4 * dim) / (1.4 * dim)
    scale = scale ** ((torch.arange(seqlen, dtype=torch.float64) - seqlen // 2) / scale_base)[:, None]
    pos = torch.arange(seqlen)[None]
    torch.testing.assert_close(qkv[:, :, 0], reference(q0, freqs.cos() * scale,
                                                       freqs.sin() * scale, pos, False))
    torch.testing.assert_close(qkv[:, :, 1], reference(k0, freqs.cos() / scale,
                                                       freqs.sin() / scale, pos, False))


def test_bad_arguments():
    cos, sin = tables(8, 4)
    x = torch.randn(2, 8, 2, 8)
    with pytest.raises(ValueError, match="x must be a torch.Tensor"):
        apply_rotary_emb(None, cos, sin)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seqlen"):
        apply_rotary_emb(x[0], cos, sin)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_emb(x[..., :6], cos, sin)
    with pytest.raises(ValueError, match="same shape"):
        apply_rotary_emb(x, cos, sin[:, :2])
    with pytest.raises(ValueError, match="needs more"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=1)
    with pytest.raises(ValueError, match=r"shape \(batch,\)"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"shape \(batch,\)"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(2))
    with pytest.raises(ValueError, match=">= 0"):
        apply_rotary_emb(x[:, :4], cos, sin, seqlen_offsets=-1)
    with pytest.raises(ValueError, match="same dtype"):
        apply_rotary_emb(x, cos, sin.half())
    with pytest.raises(ValueError, match="floating point"):
        apply_rotary_emb(x.int(), cos, sin)
    packed = torch.randn(8, 2, 8)
    for cu in (torch.tensor([0, 8]), torch.tensor([8], dtype=torch.int32), [0, 8]):
        with pytest.raises(ValueError, match="cu_seqlens must be an int32"):
            apply_rotary_emb(packed, cos, sin, cu_seqlens=cu)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="needs more"):
        apply_rotary_emb(packed, cos, sin, seqlen_offsets=4, cu_seqlens=cu, max_seqlen=5)
    with pytest.raises(ValueError, match=r"\(total, nheads, headdim\)"):
        apply_rotary_emb(x, cos, sin, cu_seqlens=cu)
    with pytest.raises(ValueError, match="num_heads_q"):
        apply_rotary_emb_qkv_(torch.randn(2, 8, 5, 8), cos, sin)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    x = torch.randn(2, 33, 4, 64, dtype=torch.bfloat16)
    cos, sin = tables(64, 32, torch.bfloat16)
    offsets = torch.tensor([0, 31])
    out = apply_rotary_emb(x.cuda(), cos.cuda(), sin.cuda(), seqlen_offsets=offsets.cuda())
    expected = apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
    torch.testing.assert_close(out.cpu(), expected, atol=1e-2, rtol=1e-2)
