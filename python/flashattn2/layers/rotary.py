"""Rotary embeddings with the names and semantics of ``flash_attn.layers.rotary``.

``apply_rotary_emb(x, cos, sin)`` rotates the first ``rotary_dim = 2 * cos.shape[-1]``
channels of each head of x by the angle of its position p (row p of cos / sin):

- not interleaved (GPT-NeoX): channel i pairs with i + rotary_dim / 2;
- interleaved (GPT-J): channel 2i pairs with 2i + 1;

``(x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos)``, computed in float32 (float64 for
float64 inputs) and rounded once to x's dtype; channels beyond rotary_dim pass through.
Token t of a sequence sits at position ``t + seqlen_offsets`` (an int, or one per
sequence); with ``cu_seqlens``, t counts from the start of its own packed sequence. Positions past the end of cos / sin (possible with tensor
offsets) are left unrotated, as in flash-attn. The backward rotates the gradient by the
opposite angle; cos and sin get no gradient.

CUDA tensors in float16 / bfloat16 / float32 (x, and cos / sin, in any mix) run one launch of
our rotary kernel (cpp/common/rotary_kernel.cuh, the pair math of the KV-cache append); the
backward is the same kernel with sin negated. CPU tensors, float64 on CUDA and traced calls
(torch.compile, FakeTensorMode) run the PyTorch code below.
"""
import torch

__all__ = [
    "RotaryEmbedding",
    "apply_rotary_emb",
    "apply_rotary_emb_func",
    "apply_rotary_emb_kv_",
    "apply_rotary_emb_qkv_",
    "apply_rotary_emb_torch",
    "rotate_half",
]


def rotate_half(x, interleaved=False):
    """``(x1, x2) -> (-x2, x1)`` over the channel pairs (halves, or even / odd channels)."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_emb_torch(x, cos, sin, interleaved=False):
    """Plain reference: x ``(batch, seqlen, nheads, headdim)``, cos / sin ``(seqlen,
    rotary_dim / 2)`` or ``(batch, seqlen, rotary_dim / 2)``, in x's dtype."""
    ro_dim = cos.shape[-1] * 2
    if interleaved:
        cos, sin = (t.repeat_interleave(2, dim=-1) for t in (cos, sin))
    else:
        cos, sin = (torch.cat((t, t), dim=-1) for t in (cos, sin))
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x_ro = x[..., :ro_dim]
    return torch.cat((x_ro * cos + rotate_half(x_ro, interleaved) * sin, x[..., ro_dim:]), -1)


_KERNEL_DTYPES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _check(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen=None):
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    want = 3 if cu_seqlens is not None else 4
    if x.dim() != want:
        layout = "(total, nheads, headdim)" if cu_seqlens is not None else (
            "(batch, seqlen, nheads, headdim)")
        raise ValueError(f"x must have shape {layout}; got {tuple(x.shape)}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(
            "cos and sin must have the same shape (seqlen_rotary, rotary_dim / 2); got "
            f"{tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if 2 * cos.shape[1] > x.shape[-1]:
        raise ValueError(
            f"rotary_dim = 2 * cos.shape[1] = {2 * cos.shape[1]} must be <= headdim "
            f"{x.shape[-1]}"
        )
    if not (x.is_floating_point() and cos.is_floating_point() and sin.is_floating_point()):
        raise ValueError(f"x, cos and sin must be floating point; got {x.dtype}, {cos.dtype}")
    if cos.dtype != sin.dtype:
        raise ValueError(f"cos and sin must have the same dtype; got {cos.dtype} and {sin.dtype}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}; got {t.device}")
    batch = x.shape[0] if cu_seqlens is None else None
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or (
            cu_seqlens.dtype != torch.int32 or cu_seqlens.shape[0] < 2
        ):
            got = (f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}"
                   if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__)
            raise ValueError(
                f"cu_seqlens must be an int32 tensor of shape (batch + 1,), batch >= 1; got {got}")
        if cu_seqlens.device != x.device:
            raise ValueError(f"cu_seqlens must be on x's device {x.device}")
        batch = cu_seqlens.shape[0] - 1
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.dtype not in (torch.int32,
                                                                             torch.int64):
            raise ValueError(
                f"seqlen_offsets must be an int or an integer tensor of shape (batch,) = "
                f"({batch},); got {seqlen_offsets.dtype} {tuple(seqlen_offsets.shape)}"
            )
        if seqlen_offsets.device != x.device:
            raise ValueError(f"seqlen_offsets must be on x's device {x.device}")
    elif isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, int):
        raise ValueError(f"seqlen_offsets must be an int or a tensor; got {seqlen_offsets!r}")
    elif seqlen_offsets < 0:
        raise ValueError(f"seqlen_offsets must be >= 0; got {seqlen_offsets}")
    else:
        seqlen = x.shape[1] if cu_seqlens is None else max_seqlen
        if seqlen is not None and seqlen_offsets + seqlen > cos.shape[0]:
            raise ValueError(
                f"cos / sin have {cos.shape[0]} positions; seqlen {seqlen} + seqlen_offsets "
                f"{seqlen_offsets} needs more"
            )


def _positions(x, seqlen_offsets, cu_seqlens):
    """int64 position of every token: ``(batch, seqlen)``, or ``(total,)`` with cu_seqlens."""
    device = x.device
    if cu_seqlens is None:
        pos = torch.arange(x.shape[1], device=device).unsqueeze(0)
        if isinstance(seqlen_offsets, torch.Tensor):
            return pos + seqlen_offsets.long().unsqueeze(1)
        return (pos + seqlen_offsets).expand(x.shape[0], -1)
    tokens = torch.arange(x.shape[0], device=device)
    cu = cu_seqlens.long()
    seq = torch.searchsorted(cu[1:], tokens, right=True).clamp(max=max(cu.shape[0] - 2, 0))
    pos = tokens - cu[seq]
    if isinstance(seqlen_offsets, torch.Tensor):
        return pos + seqlen_offsets.long()[seq]
    return pos + seqlen_offsets


def _rotated(x, cos, sin, interleaved, pos, conjugate):
    """The rotated first rotary_dim channels of x, in x's dtype."""
    half = cos.shape[1]
    inside = (pos >= 0) & (pos < cos.shape[0])
    idx = pos.clamp(0, max(cos.shape[0] - 1, 0))
    compute = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64
    c = torch.where(inside.unsqueeze(-1), cos.to(compute)[idx], 1.0).unsqueeze(-2)
    s = torch.where(inside.unsqueeze(-1), sin.to(compute)[idx], 0.0).unsqueeze(-2)
    if conjugate:
        s = -s
    xr = x[..., : 2 * half].to(compute)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).to(x.dtype)
    x1, x2 = xr[..., :half], xr[..., half:]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def _apply(x, cos, sin, interleaved, inplace, pos, conjugate):
    rot = _rotated(x, cos, sin, interleaved, pos, conjugate)
    if inplace:
        x[..., : rot.shape[-1]].copy_(rot)
        return x
    return torch.cat((rot, x[..., rot.shape[-1]:]), dim=-1)


def _kernel(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, conjugate):
    """One launch of the rotary kernel (x, cos, sin checked, on one CUDA device)."""
    from .. import _ext

    if x.stride(-1) != 1:
        if inplace:
            raise ValueError("in place on CUDA, x's last dim must be contiguous (stride 1); got "
                             f"strides {x.stride()}")
        x = x.contiguous()
    cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (cos, sin))
    out = x if inplace else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    device = x.get_device()
    _ext.check_device(device)
    offsets, offset = None, 0
    if isinstance(seqlen_offsets, torch.Tensor):
        offsets = seqlen_offsets.to(torch.int32).contiguous()
    else:
        offset = seqlen_offsets
    if cu_seqlens is None:
        batch, seqlen = x.shape[:2]
        x_strides, out_strides = x.stride()[:3], out.stride()[:3]
    else:
        cu_seqlens = cu_seqlens.contiguous()
        batch, seqlen = cu_seqlens.shape[0] - 1, x.shape[0]
        x_strides, out_strides = (0,) + x.stride()[:2], (0,) + out.stride()[:2]
    _ext._C.rotary(
        x.data_ptr(), out.data_ptr(), x_strides, out_strides, cos.data_ptr(), sin.data_ptr(),
        cos.stride(0), sin.stride(0), 0 if cu_seqlens is None else cu_seqlens.data_ptr(),
        0 if offsets is None else offsets.data_ptr(), offset, batch, seqlen, x.shape[-2],
        x.shape[-1], 2 * cos.shape[1], cos.shape[0], interleaved, conjugate,
        _KERNEL_DTYPES[x.dtype], _KERNEL_DTYPES[cos.dtype], device, _ext.current_stream(device),
    )  # fmt: skip
    return out


def _rotate(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, conjugate):
    """Our kernel for CUDA float16 / bfloat16 / float32, else (and while torch.compile or a
    dispatch mode traces: the kernel takes raw pointers) the PyTorch code."""
    from .._checks import _tracing

    if (x.is_cuda and x.dtype in _KERNEL_DTYPES and cos.dtype in _KERNEL_DTYPES
            and not _tracing()):
        return _kernel(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, conjugate)
    pos = _positions(x, seqlen_offsets, cu_seqlens)
    return _apply(x, cos, sin, interleaved, inplace, pos, conjugate)


class _ApplyRotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens):
        out = _rotate(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, False)
        offsets = seqlen_offsets if isinstance(seqlen_offsets, torch.Tensor) else None
        ctx.save_for_backward(cos, sin, offsets, cu_seqlens)
        ctx.offset, ctx.interleaved = seqlen_offsets if offsets is None else 0, interleaved
        if inplace:
            ctx.mark_dirty(x)
        return out

    @staticmethod
    def backward(ctx, grad):
        cos, sin, offsets, cu_seqlens = ctx.saved_tensors
        offsets = ctx.offset if offsets is None else offsets
        dx = _rotate(grad, cos, sin, ctx.interleaved, False, offsets, cu_seqlens, True)
        return (dx,) + (None,) * 6


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """Rotates the first ``2 * cos.shape[1]`` channels of x (see the module docstring).

    Args:
        x: ``(batch, seqlen, nheads, headdim)``, or ``(total, nheads, headdim)`` with
            ``cu_seqlens``.
        cos, sin: ``(seqlen_rotary, rotary_dim / 2)``.
        interleaved: GPT-J pairs (2i, 2i + 1) instead of GPT-NeoX halves.
        inplace: write the result into x and return x.
        seqlen_offsets: int >= 0, or int32 / int64 ``(batch,)`` (the kernel reads them as
            int32): the position of each sequence's first token.
        cu_seqlens: None, or int32 ``(batch + 1,)`` for packed sequences.
        max_seqlen: not needed; with cu_seqlens and an int offset, checked against cos.

    Returns:
        A tensor like x (x itself when ``inplace``); differentiable in x.
    """
    _check(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)
    return _ApplyRotary.apply(x, cos, sin, bool(interleaved), bool(inplace), seqlen_offsets,
                              cu_seqlens)


apply_rotary_emb_func = apply_rotary_emb


def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False,
                          seqlen_offsets=0, num_heads_q=None):
    """Rotates q and k of a packed ``qkv`` in place and returns it.

    ``qkv``: ``(batch, seqlen, 3, nheads, headdim)``, or ``(batch, seqlen, num_heads_q + 2 *
    num_heads_k, headdim)`` with ``num_heads_q`` (GQA / MQA). ``cos_k`` / ``sin_k`` (default
    cos / sin) rotate k."""
    if not isinstance(qkv, torch.Tensor):
        raise ValueError(f"qkv must be a torch.Tensor; got {type(qkv).__name__}")
    cos_k = cos if cos_k is None else cos_k
    sin_k = sin if sin_k is None else sin_k
    if qkv.dim() == 5 and qkv.shape[2] == 3:
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    elif qkv.dim() == 4 and num_heads_q is not None:
        num_heads_k = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_k <= 0 or qkv.shape[2] != num_heads_q + 2 * num_heads_k:
            raise ValueError(
                f"qkv has {qkv.shape[2]} heads, not num_heads_q + 2 * num_heads_k with "
                f"num_heads_q = {num_heads_q}"
            )
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + num_heads_k]
    else:
        raise ValueError(
            "qkv must have shape (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, "
            f"num_heads_q + 2 * num_heads_k, headdim) with num_heads_q; got {tuple(qkv.shape)}"
            f" and num_heads_q={num_heads_q}"
        )
    apply_rotary_emb(q, cos, sin, interleaved, True, seqlen_offsets)
    apply_rotary_emb(k, cos_k, sin_k, interleaved, True, seqlen_offsets)
    return qkv


def apply_rotary_emb_kv_(kv, cos, sin, interleaved=False, seqlen_offsets=0):
    """Rotates k of a packed ``kv`` ``(batch, seqlen, 2, nheads, headdim)`` in place and
    returns kv."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        got = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv must have shape (batch, seqlen, 2, nheads, headdim); got {got}")
    apply_rotary_emb(kv[:, :, 0], cos, sin, interleaved, True, seqlen_offsets)
    return kv


class RotaryEmbedding(torch.nn.Module):
    """RoPE (Su et al., RoFormer) over the first ``dim`` channels, as flash-attn's module:
    frequencies ``base ** (-2i / dim)``; with ``scale_base``, XPos (Sun et al., 2022): q is
    scaled by ``scale ** ((p - seqlen / 2) / scale_base)`` and k by its inverse.

    ``forward(qkv, kv=None, seqlen_offset=0, max_seqlen=None, num_heads_q=None)`` rotates in
    place and returns qkv, or ``(q, kv)`` when kv is given (q then ``(batch, seqlen, nheads,
    headdim)``). The cos / sin tables are built in float32, cast to the input dtype and
    cached; with a tensor ``seqlen_offset``, pass ``max_seqlen`` to size them.
    """

    def __init__(self, dim, base=10000.0, interleaved=False, scale_base=None, device=None):
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(f"dim must be a positive even int; got {dim}")
        self.dim, self.base = dim, float(base)
        self.interleaved, self.scale_base = interleaved, scale_base
        self.register_buffer("inv_freq", self._inv_freq(device), persistent=False)
        scale = None if scale_base is None else self._scale(device)
        self.register_buffer("scale", scale, persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = self._sin_cached = self._cos_k_cached = self._sin_k_cached = None

    def _inv_freq(self, device=None):
        exponent = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        return 1.0 / self.base**exponent

    def _scale(self, device=None):
        channel = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
        return (channel + 0.4 * self.dim) / (1.4 * self.dim)

    def _update_cos_sin_cache(self, seqlen, device=None, dtype=None):
        cached = self._cos_cached
        if (cached is not None and seqlen <= self._seq_len_cached and cached.device == device
                and cached.dtype == dtype and not (self.training and cached.is_inference())):
            return
        self._seq_len_cached = seqlen
        inv_freq = self.inv_freq
        if inv_freq.dtype != torch.float32:  # the module was cast: recompute in float32
            inv_freq = self._inv_freq(device)
        t = torch.arange(seqlen, device=device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq.to(device))
        cos, sin = torch.cos(freqs), torch.sin(freqs)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        scale = self.scale if self.scale.dtype == torch.float32 else self._scale(device)
        power = (torch.arange(seqlen, device=device, dtype=torch.float32) - seqlen // 2)
        scale = scale.to(device) ** (power / self.scale_base).unsqueeze(1)
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def forward(self, qkv, kv=None, seqlen_offset=0, max_seqlen=None, num_heads_q=None):
        seqlen = qkv.shape[1]
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, qkv.device, qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(seqlen + seqlen_offset, qkv.device, qkv.dtype)
        elif self._cos_cached is None:
            raise ValueError("a tensor seqlen_offset needs max_seqlen to size the tables")
        xpos = self.scale is not None
        cos_k = self._cos_k_cached if xpos else self._cos_cached
        sin_k = self._sin_k_cached if xpos else self._sin_cached
        if kv is None:
            return apply_rotary_emb_qkv_(qkv, self._cos_cached, self._sin_cached, cos_k, sin_k,
                                         self.interleaved, seqlen_offset, num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached, self.interleaved, True,
                             seqlen_offset)
        return q, apply_rotary_emb_kv_(kv, cos_k, sin_k, self.interleaved, seqlen_offset)

