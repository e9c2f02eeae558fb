"""``attn_bias``: an additive bias (or a boolean mask) on the logits, forward and backward.

Validated on an H100 and built by default (``FLASHATTN2_EXPERIMENTAL=bias``, listed in
``build_info()["experimental"]``); a build made with ``FLASHATTN2_EXPERIMENTAL=none`` has no
bias kernels and raises NotImplementedError.
What the kernels compute (``cpp/common/flash.h`` BiasLayout):

    logit[b, h, i, j] = softmax_scale * q_i . k_j (or its softcap form) + ALiBi
                        + attn_bias[b, h, i, j]

before the causal / window masks and the softmax, so ``-inf`` hides a key. The bias is read
in place from its broadcast view: any strides, a stride of 0 for a broadcast dim (no copy),
in q's dtype. A bias of another float dtype (float16, bfloat16, float32 are accepted) is cast
to q's first, and a boolean mask (True = attend, as torch's SDPA) becomes 0 / -inf in q's
dtype: one copy each, of the tensor's own size, before the broadcast. (PyTorch's own
attention in q's dtype rounds the bias the same way.) A row whose keys are all hidden gives out = 0 and lse = +inf (torch's SDPA gives
0 too since 2.5).

Gradient: when the bias requires grad, the backward kernel sends d loss / d logit of every
(b, h, i, j) to the tensor that ``dbias_target`` picks:
  - a bias without broadcast dims: the returned gradient itself, stored in the bias's dtype
    (2 bytes a score for bf16 / fp16, no float32 copy, no pass of torch over it);
  - broadcast over batch and / or heads: a float32 buffer without those dims (zeroed), which
    the kernel adds into with float32 atomics, then converted (one small pass);
  - otherwise (deterministic mode with a broadcast, whose sum must not depend on the atomics'
    order): a float32 ``(b, h, sq, sk)`` buffer, then torch sums the broadcast dims.
A broadcast over queries or keys is summed by torch too, after the atomics (if any).
The Hopper backward writes it where it takes the bias (sm_90, head dims 33-64 / 97-128,
16-byte aligned rows) and there is no softcap and the target is in q's dtype or float32; the
mma.sync backward elsewhere, or always with ``FLASHATTN2_SM90_DBIAS=0`` at import
(``_ext.sm90_dbias(False)``). Dense attention only: varlen, KV caches and split-KV raise.

torch.compile / torch.export / dispatch modes trace the ``flashattn2::fwd_bias`` and
``flashattn2::bwd_bias`` operators (``_ops.py``); the mask conversion and the broadcast view
are ordinary torch ops in the graph, the gradient's targets and reduction are inside
``bwd_bias`` (which returns it in the bias's shape and dtype).

Cost: a (b, h, sq, sk) bias is read once per forward and once per backward. The Hopper
kernels (sm_90; the backward for a bias without its gradient) and the mma.sync backward
(dbias, other GPUs; FLASHATTN2_BWD_BIAS_STAGED=0 turns it off) copy each tile of a bias with
16-byte aligned rows and unit key stride into shared memory by cp.async; otherwise one 2-byte
load per score through the L1 cache (the mma.sync forward always).
"""

import torch
import torch.nn.functional as F

from . import _ext
from ._checks import _BF16, _FP32, _HALF, _check_backward, _require_tensor, _tracing
from ._launch import (
    _alibi_ready,
    _flash_attn_backward,
    _flash_attn_forward,
    _kernel_ready,
    _rng_state,
)

_DTYPES = (_HALF, _BF16, _FP32, torch.bool)


def bias_built():
    """True when this build's kernels take an attention bias."""
    return "bias" in _ext.EXPERIMENTAL


def check_bias(attn_bias, full, name="attn_bias"):
    """Type, dtype and shape of ``attn_bias`` (None passes): a tensor of at most 4 dims,
    broadcastable to ``full`` = ``(batch, nheads, seqlen_q, seqlen_k)``; then
    NotImplementedError in builds without the bias kernels. (Its device is checked with
    q's, after every shape.)"""
    if attn_bias is None:
        return
    _require_tensor(name, attn_bias, "a tensor or None")
    if attn_bias.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or bool; got "
                         f"{attn_bias.dtype}")
    full = tuple(full)
    shape = tuple(attn_bias.shape)
    if len(shape) > 4 or any(s not in (1, f) for s, f in zip(shape[::-1], full[::-1])):
        raise ValueError(
            f"{name} must be broadcastable to (batch, nheads, seqlen_q, seqlen_k) = {full}"
            f" (dims of size 1 or equal, at most 4 dims); got {shape}"
        )
    if not bias_built():
        raise NotImplementedError(
            f"flashattn2: {name} needs a build with FLASHATTN2_EXPERIMENTAL=bias (the "
            "default); this one was built without the bias kernels (e.g. "
            "FLASHATTN2_EXPERIMENTAL=none): rebuild with the default"
        )


def bias_view(attn_bias, full, dtype):
    """The kernels' ``(b, h, sq, sk)`` view of a checked bias in ``dtype`` (q's): expanded
    without a copy; a boolean mask first becomes 0 / -inf, a bias of another dtype is cast
    (each a copy of the bias's own, unbroadcast size)."""
    if attn_bias.dtype is torch.bool:
        hidden = torch.full((), float("-inf"), dtype=dtype, device=attn_bias.device)
        attn_bias = torch.where(attn_bias, torch.zeros((), dtype=dtype, device=attn_bias.device),
                                hidden)
    elif attn_bias.dtype is not dtype:
        attn_bias = attn_bias.to(dtype)
    return attn_bias.expand(full)


def dbias_target(shape, dtype, full, device, window_left, window_right, deterministic):
    """``(target, add)``: the 4-D ``(b', h', sq, sk)`` tensor the backward kernel sends dbias
    to, and whether it adds (float32 atomics) rather than stores. ``shape`` and ``dtype``: the
    bias's; ``full``: ``(batch, nheads, seqlen_q, seqlen_k)``. Without broadcast dims the
    target is the gradient itself in ``dtype``; else float32, with b' = 1 (h' = 1) where the
    bias broadcasts over batch (heads) and atomics sum over it, except in deterministic mode
    (then b', h' are full: stores; also for every bias with FLASHATTN2_DBIAS_DIRECT=0,
    ``_ext.DBIAS_DIRECT``). Every visible score is computed by exactly one CTA, so a
    stored target needs the zero fill only under a window or causal mask (8.6 GB of writes at
    8k, b 2, 16 heads in float32: ~2.9 ms on an H100); an added one always. The rows are
    padded (the target is a view without the padding): float32 ones to an even length (the
    kernels write two keys at a time), 2-byte ones to a multiple of 8 (16 bytes: the Hopper
    backward stores 8 keys at a time, writing 0 past seqlen_k)."""
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    broadcast = [p == 1 and f != 1 for p, f in zip(padded, full)]
    if not _ext.DBIAS_DIRECT:  # (A/B switch: the float32 (b, h, sq, sk) buffer for all)
        broadcast, deterministic = [True] * 4, True
    add = not deterministic and (broadcast[0] or broadcast[1])
    dims = tuple(1 if add and broadcast[d] else full[d] for d in range(2)) + tuple(full[2:])
    target_dtype = dtype if not any(broadcast) else _FP32
    windowed = window_left >= 0 or window_right >= 0
    alloc = torch.zeros if add or windowed else torch.empty
    seqlen_k = dims[3]
    row = seqlen_k + (seqlen_k % 2 if target_dtype is _FP32 else -seqlen_k % 8)
    target = alloc(dims[:3] + (row,), dtype=target_dtype, device=device)
    return target[..., :seqlen_k], add


def reduce_to(grad, shape):
    """``grad`` ``(b, h, sq, sk)`` summed over the dims that ``shape`` broadcast, as ``shape``."""
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    dims = [d for d in range(4) if padded[d] == 1 and grad.shape[d] != 1]
    if dims:
        grad = grad.sum(dims, keepdim=True)
    return grad.reshape(shape)


class _FlashAttnBiasFunc(torch.autograd.Function):
    """Autograd node of attention with a bias: differentiable in q, k, v and a float bias.
    As ``interface._FlashAttnFunc`` (kernel-ready inputs saved, padded out returned; while
    tracing, the ``flashattn2::fwd_bias`` / ``bwd_bias`` operators of ``_ops.py``)."""

    @staticmethod
    def forward(ctx, q, k, v, attn_bias, softmax_scale, window_left, window_right,
                deterministic, softcap, alibi_slopes, dropout_p, rng_state):  # fmt: skip
        headdim = q.shape[3]
        pad = -headdim % 8
        full = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        view = bias_view(attn_bias, full, q.dtype)
        if _tracing():
            if pad:
                q, k, v = F.pad(q, (0, pad)), F.pad(k, (0, pad)), F.pad(v, (0, pad))
            out, lse = torch.ops.flashattn2.fwd_bias(q, k, v, view, softmax_scale, window_left,
                                                     window_right, softcap, alibi_slopes,
                                                     dropout_p, rng_state)  # fmt: skip
        else:
            q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
            alibi_slopes = _alibi_ready(alibi_slopes)
            out, lse = _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right,
                                           softcap=softcap, alibi_slopes=alibi_slopes,
                                           dropout_p=dropout_p, rng_state=rng_state,
                                           attn_bias=view)  # fmt: skip
            ctx.set_materialize_grads(False)  # (interface._FlashAttnFunc says why)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state, view)
        ctx.mark_non_differentiable(lse)
        ctx.args = (softmax_scale, window_left, window_right, deterministic)
        ctx.softcap, ctx.dropout_p, ctx.headdim = softcap, dropout_p, headdim
        ctx.bias_shape, ctx.bias_dtype = tuple(attn_bias.shape), attn_bias.dtype
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 12
        q, k, v, out, lse, alibi_slopes, rng_state, view = ctx.saved_tensors
        _check_backward(ctx.headdim, q.device)
        bias_grad = ctx.needs_input_grad[3]
        mods = dict(softcap=ctx.softcap, alibi_slopes=alibi_slopes, dropout_p=ctx.dropout_p,
                    rng_state=rng_state)
        if _tracing():  # (dbias comes back in the bias's shape and dtype)
            scale, left, right, det = ctx.args
            dq, dk, dv, dbias = torch.ops.flashattn2.bwd_bias(
                dout, q, k, v, out, lse, view, scale, left, right, det, bias_grad, **mods,
                bias_shape=list(ctx.bias_shape), bias_dtype=ctx.bias_dtype)
        else:
            dbias, add = None, False
            if bias_grad:
                dbias, add = dbias_target(ctx.bias_shape, ctx.bias_dtype, view.shape, q.device,
                                          *ctx.args[1:])  # fmt: skip
            dq, dk, dv = _flash_attn_backward(dout, q, k, v, out, lse, *ctx.args,
                                              attn_bias=view, dbias=dbias, dbias_add=add,
                                              **mods)  # fmt: skip
            if bias_grad:  # (the target itself where nothing broadcasts)
                dbias = reduce_to(dbias, ctx.bias_shape).to(ctx.bias_dtype)
        if q.shape[3] != ctx.headdim:
            h = ctx.headdim
            dq, dk, dv = dq[..., :h], dk[..., :h], dv[..., :h]
        dbias = dbias if bias_grad else None
        return dq, dk, dv, dbias, None, None, None, None, None, None, None, None


def run_with_bias(q, k, v, attn_bias, softmax_scale, window_left, window_right, deterministic,
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0):  # fmt: skip
    """``(out, lse, rng_state)`` for checked inputs (``check_bias`` included), as
    ``interface._run`` with a bias (always through the autograd node)."""
    rng_state = _rng_state(q.device) if dropout_p > 0 else None
    out, lse = _FlashAttnBiasFunc.apply(q, k, v, attn_bias, softmax_scale, window_left,
                                        window_right, deterministic, softcap, alibi_slopes,
                                        dropout_p, rng_state)  # fmt: skip
    if out.shape[3] != q.shape[3]:
        out = out[..., : q.shape[3]]
    return out, lse, rng_state
