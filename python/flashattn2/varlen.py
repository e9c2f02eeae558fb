"""Variable-length batches (flash-attn v2's ``flash_attn_varlen_*`` functions).

The sequences of a batch are packed along one token dimension: q ``(total_q, nheads, d)``,
k/v ``(total_k, nheads_k, d)``, sequence b being rows ``cu_seqlens[b] : cu_seqlens[b + 1]``
(int32 CUDA vectors of ``batch + 1`` entries). ``max_seqlen_q`` / ``max_seqlen_k`` are Python
ints from the caller (no host synchronisation): they size the grid, so they must be at least
the longest sequence; the kernels clamp every sequence to them and to the tensors, so bad
``cu_seqlens`` contents can give wrong rows but never a read or write outside the tensors.
The kernels are the dense ones reading the packed tensors with a zero batch stride
(``SeqLayout`` in ``cpp/common/flash.h``); the log-sum-exp is ``(nheads, total_q)`` float32.
"""
import operator

import torch
import torch.nn.functional as F

from . import _ext
from ._checks import (
    _CONTIGUOUS,
    _FP32,
    _MAX_HEADDIM,
    _check_alibi_shape,
    _check_backward,
    _check_devices,
    _check_dtypes,
    _check_fp32,
    _check_fp32_backward,
    _check_mod_values,
    _require_tensor,
    _scale,
    _shape_error,
    _tracing,
    _window,
)
from ._launch import _kernel_ready, _launch_bwd, _launch_fwd, _lse_ready, _mod_kwargs, _rng_state


def _check_max_seqlen(name, value):
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a Python int; got {value!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0; got {value}")
    return value


def _check_cu_seqlens(name, cu):
    _require_tensor(name, cu, "an int32 tensor")
    if cu.dtype is not torch.int32:
        raise ValueError(f"{name} must be int32; got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must have shape (batch + 1,); got {tuple(cu.shape)}")


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  alibi_slopes=None, block_table=None, softcap=0.0, dropout_p=0.0):
    """Ranks, dtypes (float32: the features its kernels lack), shapes, then devices; returns
    the checked max_seqlen ints. With ``block_table``, k and v are paged
    ``(num_blocks, page_size, nheads_k, headdim)``."""
    paged = block_table is not None
    kv_layout = "(num_blocks, page_size, nheads_k, headdim)" if paged else "(total_k, nheads_k, headdim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != (3 if name == "q" or not paged else 4):
            raise _shape_error(name, "(total_q, nheads, headdim)" if name == "q" else kv_layout, t)
    dtype = _check_dtypes(q, k, v)
    _check_fp32(q, softcap, alibi_slopes, dropout_p)
    if dtype is _FP32 and paged:
        raise NotImplementedError("flashattn2: float32 inputs do not support a paged KV cache "
                                  "(block_table); float16 / bfloat16 do")
    _, nheads, headdim = q.shape
    if headdim == 0 or headdim > _MAX_HEADDIM:
        raise ValueError(
            f"FlashAttention forward only supports head dimension at most {_MAX_HEADDIM} "
            f"(and at least 1); got {headdim}"
        )
    if _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)] < 0 and dtype is not _FP32:
        built = ", ".join(map(str, _ext.build_info()["head_dims"]))
        raise ValueError(f"flashattn2: head dim {headdim} needs a kernel head dim >= "
                         f"{headdim}; this build has {built}")
    nheads_k = k.shape[-2]
    if k.shape[-1] != headdim:
        raise _shape_error("k", kv_layout.replace("headdim", f"headdim={headdim}"), k)
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")
    if nheads_k == 0 or nheads % nheads_k:
        raise ValueError(
            "Number of heads in key/value must divide number of heads in query; "
            f"got {nheads} query heads and {nheads_k} key/value heads"
        )
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_k must both have batch + 1 entries; got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    max_seqlen_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    _check_alibi_shape(alibi_slopes, cu_seqlens_q.shape[0] - 1, nheads)
    named = [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
             ("cu_seqlens_k", cu_seqlens_k)]
    if paged:
        _check_block_table(block_table, k, cu_seqlens_q.shape[0] - 1, max_seqlen_k)
        named.append(("block_table", block_table))
    if alibi_slopes is not None:
        named.append(("alibi_slopes", alibi_slopes))
    _check_devices(*named)
    return max_seqlen_q, max_seqlen_k


def _check_block_table(block_table, k, batch, max_seqlen_k):
    """Paged varlen: block_table int32 (batch, max_pages), unit last stride; page_size
    (k.shape[1]) a power of two >= 16; pages enough for max_seqlen_k keys."""
    _require_tensor("block_table", block_table, "an int32 tensor")
    if block_table.dtype is not torch.int32:
        raise ValueError(f"block_table must be int32; got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise _shape_error("block_table", f"(batch={batch}, max_pages)", block_table)
    if block_table.stride(1) != 1:
        raise ValueError("block_table must have a unit last stride")
    page_size = k.shape[1]
    if page_size < 16 or page_size & (page_size - 1):
        raise ValueError(f"page_size (k.shape[1]) must be a power of two >= 16; got {page_size}")
    capacity = block_table.shape[1] * page_size
    if max_seqlen_k > capacity:
        raise ValueError(
            f"block_table has {block_table.shape[1]} pages of {page_size} keys per sequence: "
            f"fewer than max_seqlen_k={max_seqlen_k}"
        )
    if max_seqlen_k > 0 and k.shape[0] == 0:
        raise ValueError("k and v have no pages (num_blocks = 0) but max_seqlen_k > 0")


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, window_left, window_right, softcap=0.0, alibi_slopes=None,
                    dropout_p=0.0, rng_state=None, block_table=None):
    """Launch on kernel-ready tensors (see ``_flash_attn_forward``); ``(out, lse)``.

    Paged (``block_table``): k/v ``(num_blocks, page_size, nheads_k, d)``; sequence b's keys
    are its ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` first rows of the pages
    ``block_table[b]``, read as a KV cache (seqused_k = those lengths, computed on the
    device)."""
    total_q, nheads, headdim = q.shape
    nheads_k = k.shape[-2]
    batch = cu_seqlens_q.shape[0] - 1
    out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    lse = torch.empty(nheads, total_q, dtype=_FP32, device=q.device)
    if batch == 0 or total_q == 0 or max_seqlen_q == 0 or nheads == 0:
        return out, lse
    if k.shape[0] == 0 or max_seqlen_k == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    cu_q = cu_seqlens_q.contiguous()
    layout = dict(cu_seqlens_q=cu_q.data_ptr(), total_q=total_q)
    if block_table is None:
        cu_k = cu_seqlens_k.contiguous()
        layout.update(cu_seqlens_k=cu_k.data_ptr(), total_k=k.shape[0])
        k_strides, v_strides = (0,) + k.stride()[:2], (0,) + v.stride()[:2]
    else:
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        layout.update(seqused_k=seqused_k.data_ptr(), block_table=block_table.data_ptr(),
                      block_table_batch_stride=block_table.stride(0), page_size=k.shape[1],
                      num_pages=k.shape[0])
        k_strides, v_strides = k.stride()[:3], v.stride()[:3]
    _launch_fwd(q, k, v, out, lse, (0,) + q.stride()[:2], k_strides, v_strides,
                (0,) + out.stride()[:2], (0, lse.stride(0)), batch, max_seqlen_q, max_seqlen_k,
                nheads, nheads_k, headdim, softmax_scale, window_left, window_right, 1,
                _mod_kwargs(softcap, alibi_slopes, dropout_p, rng_state), **layout)
    return out, lse


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale, window_left, window_right, deterministic,
                     softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Launch on kernel-ready tensors; ``(dq, dk, dv)``, contiguous."""
    total_q, nheads, headdim = q.shape
    nheads_k = k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    dq = torch.empty_like(q, memory_format=_CONTIGUOUS)
    dk = torch.empty_like(k, memory_format=_CONTIGUOUS)
    dv = torch.empty_like(v, memory_format=_CONTIGUOUS)
    if (batch == 0 or total_q == 0 or k.shape[0] == 0 or max_seqlen_q == 0
            or max_seqlen_k == 0 or nheads == 0):  # fmt: skip
        return dq.zero_(), dk.zero_(), dv.zero_()
    # Rows outside every sequence (cu_seqlens[-1] < total) get no write from the kernels:
    # their gradient is zero.
    dq.zero_()
    dk.zero_()
    dv.zero_()
    _launch_bwd(_kernel_ready(dout, 0), q, k, v, out, lse, dq, dk, dv, (0, lse.stride(0)),
                batch, max_seqlen_q, max_seqlen_k, nheads, nheads_k, headdim, softmax_scale,
                window_left, window_right, deterministic,
                _mod_kwargs(softcap, alibi_slopes, dropout_p, rng_state),
                cu_seqlens_q=cu_seqlens_q.contiguous(), cu_seqlens_k=cu_seqlens_k.contiguous())
    return dq, dk, dv


def _varlen_forward_any(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, window_left, window_right, *mods):
    """``(out, lse)`` for checked inputs of any head dim and strides (pads / copies)."""
    headdim = q.shape[2]
    pad = -headdim % 8
    q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
    out, lse = _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale, window_left, window_right, *mods)
    return (out[..., :headdim] if pad else out), lse


def _varlen_backward_any(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, window_left, window_right,
                         deterministic=False, *mods):
    headdim = q.shape[2]
    pad = -headdim % 8
    grads = _varlen_backward(
        _kernel_ready(dout, pad), _kernel_ready(q, pad), _kernel_ready(k, pad),
        _kernel_ready(v, pad), _kernel_ready(out, pad), _lse_ready(lse), cu_seqlens_q,
        cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
        deterministic, *mods,
    )  # fmt: skip
    return tuple(g[..., :headdim] for g in grads) if pad else grads


class _VarlenFunc(torch.autograd.Function):
    """Autograd node of the varlen functions (like ``interface._FlashAttnFunc``)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, window_left, window_right, deterministic, softcap, alibi_slopes,
                dropout_p, rng_state):
        headdim = q.shape[2]
        pad = -headdim % 8
        args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state)
        if _tracing():
            if pad:
                q, k, v = F.pad(q, (0, pad)), F.pad(k, (0, pad)), F.pad(v, (0, pad))
            out, lse = torch.ops.flashattn2.varlen_fwd(q, k, v, *args)
        else:
            q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
            out, lse = _varlen_forward(q, k, v, *args)
            ctx.set_materialize_grads(False)  # (interface._FlashAttnFunc says why)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                              rng_state)
        ctx.mark_non_differentiable(lse)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                    deterministic)
        ctx.softcap, ctx.dropout_p = softcap, dropout_p
        ctx.headdim = headdim
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 15
        headdim = ctx.headdim
        q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state = ctx.saved_tensors
        if q.dtype is _FP32:
            _check_fp32_backward()
        else:
            _check_backward(headdim, q.device)
        args = (dout, q, k, v, out, lse, cu_q, cu_k, *ctx.args, ctx.softcap, alibi_slopes,
                ctx.dropout_p, rng_state)
        if _tracing():
            dq, dk, dv = torch.ops.flashattn2.varlen_bwd(*args)
        else:
            dq, dk, dv = _varlen_backward(*args)
        if q.shape[2] != headdim:
            dq, dk, dv = dq[..., :headdim], dk[..., :headdim], dv[..., :headdim]
        return (dq, dk, dv) + (None,) * 12


def _paged_rows(block_table, cu_seqlens_k, max_seqlen_k, page_size, num_pages):
    """Where key p of sequence b lives, for the ``(batch, max_seqlen_k)`` grid of (b, p):
    ``(pages, rows)``, its page and row in the paged cache (entries clamped into
    ``[0, num_pages)`` as the kernels clamp them); ``packed``, its row ``cu_seqlens_k[b] + p``
    in packed varlen K/V of ``batch * max_seqlen_k + 1`` rows (keys past the sequence's end
    go to the last row, which no sequence reads); ``valid``, whether p is a key of b. Plain
    torch on the device: no host synchronisation."""
    batch = block_table.shape[0]
    pos = torch.arange(max_seqlen_k, device=block_table.device)
    starts = cu_seqlens_k[:-1].long().unsqueeze(1)
    valid = pos < cu_seqlens_k[1:].long().unsqueeze(1) - starts
    pages = block_table.long()[:, pos // page_size].clamp_(0, num_pages - 1)
    rows = (pos % page_size).expand(batch, -1)
    spare = batch * max_seqlen_k
    packed = torch.where(valid, starts + pos, spare).clamp_(0, spare)
    return pages, rows, packed, valid


class _PagedVarlenFunc(torch.autograd.Function):
    """Autograd node of ``flash_attn_varlen_func`` with a ``block_table`` (paged k/v).

    The forward reads the pages in place. The backward gathers each sequence's keys and
    values into packed varlen K/V (``_paged_rows``: ``batch * max_seqlen_k + 1`` rows, so
    O(batch * max_seqlen_k) extra memory for the backward only), runs the varlen backward on
    them, and adds dK / dV back into gradients shaped like the paged k / v (a page that
    several sequences share gets the sum; unused pages get zero)."""

    @staticmethod
    def forward(ctx, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                max_seqlen_k, softmax_scale, window_left, window_right, deterministic, softcap,
                alibi_slopes):
        args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                window_left, window_right, softcap, alibi_slopes, 0.0, None, block_table)
        if _tracing():
            out, lse = torch.ops.flashattn2.varlen_fwd(q, k, v, *args)
        else:
            out, lse = _varlen_forward_any(q, k, v, *args)
            out = out.contiguous()  # a copy only when the head dim was padded
            ctx.set_materialize_grads(False)  # (interface._FlashAttnFunc says why)
        ctx.save_for_backward(q, k, v, out, lse, block_table, cu_seqlens_q, cu_seqlens_k,
                              alibi_slopes)
        ctx.mark_non_differentiable(lse)
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
                    deterministic)
        ctx.softcap = softcap
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:
            return (None,) * 14
        q, k, v, out, lse, block_table, cu_q, cu_k, alibi_slopes = ctx.saved_tensors
        _check_backward(q.shape[2], q.device)
        max_seqlen_k = ctx.args[1]
        pages, rows, packed, valid = _paged_rows(block_table, cu_k, max_seqlen_k, k.shape[1],
                                                 k.shape[0])
        packed_shape = (packed.numel() + 1,) + k.shape[2:]
        k_packed = k.new_zeros(packed_shape).index_put_((packed,), k[pages, rows])
        v_packed = v.new_zeros(packed_shape).index_put_((packed,), v[pages, rows])
        args = (dout, q, k_packed, v_packed, out, lse, cu_q, cu_k, *ctx.args, ctx.softcap,
                alibi_slopes, 0.0, None)
        if _tracing():
            dq, dk_packed, dv_packed = torch.ops.flashattn2.varlen_bwd(*args)
        else:
            dq, dk_packed, dv_packed = _varlen_backward_any(*args)
        keep = valid[..., None, None]
        dk = torch.zeros_like(k).index_put_((pages, rows), torch.where(keep, dk_packed[packed], 0),
                                            accumulate=True)
        dv = torch.zeros_like(v).index_put_((pages, rows), torch.where(keep, dv_packed[packed], 0),
                                            accumulate=True)
        return (dq, dk, dv) + (None,) * 11


def _needs_grad(q, k, v):
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      softmax_scale, window_left, window_right, deterministic,
                      return_attn_probs, softcap, alibi_slopes, dropout_p, block_table=None):
    softmax_scale = _scale(q.unsqueeze(0), softmax_scale)
    if window_left >= max_seqlen_k:
        window_left = -1
    if window_right >= max_seqlen_k:
        window_right = -1
    if return_attn_probs and dropout_p > 0:
        raise NotImplementedError(
            "flashattn2: return_attn_probs with dropout is implemented for flash_attn_func, "
            "not for the varlen functions"
        )
    rng_state = _rng_state(q.device) if dropout_p > 0 else None
    mods = (softcap, alibi_slopes, dropout_p, rng_state)
    if block_table is not None:
        mods += (block_table,)
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
            window_right)
    if block_table is not None and _needs_grad(q, k, v):
        out, lse = _PagedVarlenFunc.apply(q, k, v, block_table, *args, deterministic, softcap,
                                          alibi_slopes)
    elif _needs_grad(q, k, v):
        out, lse = _VarlenFunc.apply(q, k, v, *args, deterministic, *mods)
        if out.shape[2] != q.shape[2]:
            out = out[..., : q.shape[2]]
    elif _tracing():
        out, lse = torch.ops.flashattn2.varlen_fwd(q, k, v, *args, *mods)
    else:
        out, lse = _varlen_forward_any(q, k, v, *args, *mods)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """``flash_attn_func`` on packed variable-length sequences (flash-attn v2 interface).

    Args:
        q: ``(total_q, nheads, headdim)``; k, v: ``(total_k, nheads_k, headdim)``, or with
            ``block_table`` paged ``(num_blocks, page_size, nheads_k, headdim)``.
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)`` on q's device, the cumulative
            sequence lengths (``cu_seqlens[0] == 0``, non-decreasing, last entry the total).
            Sequences of length 0 are fine. With ``block_table``, cu_seqlens_k gives only
            each sequence's number of keys.
        max_seqlen_q, max_seqlen_k: Python ints, at least the longest sequence (a longer
            sequence is truncated to them: rows beyond are left unwritten).
        causal, window_size: per sequence, bottom-right aligned as in ``flash_attn_func``.
        Other arguments as ``flash_attn_func`` (softcap, ALiBi with ``(batch, nheads)`` or
            ``(nheads,)`` slopes, dropout; ``return_attn_probs`` gives no probabilities with
            dropout here).
        block_table: None, or int32 ``(batch, max_pages)`` (paged K/V, flash-attn v2): sequence
            b's keys are the first ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]`` rows of the pages
            ``block_table[b, 0], block_table[b, 1], ...``; page_size a power of two >= 16 and
            ``max_pages * page_size >= max_seqlen_k``. Differentiable: the gradients of k
            and v have their paged shape (a page shared by sequences gets the sum). No
            dropout.

    Returns:
        ``out`` ``(total_q, nheads, headdim)``, or ``(out, softmax_lse, None)`` with
        ``softmax_lse`` float32 ``(nheads, total_q)``. Differentiable in q, k and v.
    """
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    if block_table is not None and dropout_p > 0:
        raise NotImplementedError(
            "flashattn2: flash_attn_varlen_func with block_table (paged k/v) runs without "
            "dropout; pass dropout_p=0.0"
        )
    window_left, window_right = _window(window_size, causal)
    max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, max_seqlen_k, alibi_slopes,
                                               block_table, softcap, dropout_p)
    return _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, window_left, window_right, deterministic,
                             return_attn_probs, softcap, alibi_slopes, dropout_p, block_table)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """``flash_attn_varlen_func`` on ``qkv`` ``(total, 3, nheads, headdim)`` (read in place;
    the gradient is packed like qkv)."""
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    _require_tensor("qkv", qkv)
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise _shape_error("qkv", "(total, 3, nheads, headdim)", qkv)
    q, k, v = qkv.unbind(1)
    max_seqlen, _ = _check_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  alibi_slopes, softcap=softcap, dropout_p=dropout_p)
    return _varlen_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                             softmax_scale, window_left, window_right, deterministic,
                             return_attn_probs, softcap, alibi_slopes, dropout_p)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """``flash_attn_varlen_func`` with ``kv`` ``(total_k, 2, nheads_k, headdim)`` (read in
    place; the gradient is packed like kv)."""
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    _require_tensor("kv", kv)
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise _shape_error("kv", "(total_k, 2, nheads_k, headdim)", kv)
    k, v = kv.unbind(1)
    max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, max_seqlen_k, alibi_slopes,
                                               softcap=softcap, dropout_p=dropout_p)
    return _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, window_left, window_right, deterministic,
                             return_attn_probs, softcap, alibi_slopes, dropout_p)
