"""The flash-attn (v2) style functions: argument checks, tensor preparation, launch.

Checks run in a fixed order, all before any launch, so that a problem is reported the same
way whatever the device:

1. arguments that are not implemented yet (``dropout_p``, ``softcap``, ``alibi_slopes``)
   and ``window_size``;
2. ranks, dtypes, then shapes (head dim, batch, key/value shapes, ``h % h_k``);
3. devices: CUDA tensors, one device, a GPU this build has code for (cached per device).

Tensors the kernel cannot read directly are copied first (documented here, nowhere else):

- head dim not a multiple of 8: q, k and v are zero-padded to the next multiple of 8 and
  the output is sliced back (a view of the padded output);
- last dim not contiguous, a data pointer that is not 16-byte aligned, or a batch / row /
  head stride that is not a multiple of 8 elements: that tensor is copied to a contiguous
  one.

Any other strides pass through, so views such as ``qkv.unbind(2)`` are not copied.
"""
import operator

import torch
import torch.nn.functional as F

from . import _ext

_C = _ext._C  # module attribute, so tests can intercept launches

_HALF = torch.float16
_BF16 = torch.bfloat16
_FP32 = torch.float32
_CONTIGUOUS = torch.contiguous_format
_MAX_HEADDIM = 256


def _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right, out=None, lse=None):
    """Launches the forward kernel with no argument checks; returns ``(out, lse)``.

    q ``(b, sq, h, d)``, k/v ``(b, sk, h_k, d)`` CUDA fp16/bf16, d a multiple of 8 with a
    compiled kernel, 16-byte aligned pointers, unit last-dim stride and other strides
    multiples of 8 elements. ``out`` (like q, same requirements) and ``lse`` (float32
    ``(b, h, sq)`` with unit last stride) are allocated when not given. Empty problems
    never reach the kernel; ``seqlen_k == 0`` gives out = 0 and lse = +inf.
    """
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k = k.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    if lse is None:
        lse = torch.empty(batch, nheads, seqlen_q, dtype=_FP32, device=q.device)
    if batch == 0 or seqlen_q == 0 or nheads == 0:
        return out, lse
    if seqlen_k == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    device = q.get_device()
    _C.fwd(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        q.stride()[:3], k.stride()[:3], v.stride()[:3], out.stride()[:3], lse.stride()[:2],
        batch, seqlen_q, seqlen_k, nheads, k.shape[2], headdim,
        softmax_scale, window_left, window_right,
        1 if q.dtype is _BF16 else 0,
        device, _ext.current_stream(device),
    )  # fmt: skip
    return out, lse


class _FlashAttnFunc(torch.autograd.Function):
    """Autograd node for the forward; used only when an input requires grad."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, window_left, window_right):
        out, lse = _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        raise NotImplementedError("flashattn2: the backward pass is not implemented yet")


def _check_unsupported(dropout_p, softcap, alibi_slopes):
    if dropout_p:
        raise NotImplementedError(
            f"flashattn2: dropout_p={dropout_p!r} is not supported yet (dropout comes later); "
            "pass dropout_p=0.0"
        )
    if softcap:
        raise NotImplementedError(
            f"flashattn2: softcap={softcap!r} is not supported yet; pass softcap=0.0"
        )
    if alibi_slopes is not None:
        raise NotImplementedError(
            "flashattn2: alibi_slopes is not supported yet; pass alibi_slopes=None"
        )


def _window(window_size, causal):
    """(window_left, window_right) from flash-attn's ``window_size`` and ``causal``."""
    try:
        left, right = window_size
        if isinstance(left, bool) or isinstance(right, bool):
            raise TypeError
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be a pair of ints (left, right); got {window_size!r}"
        ) from None
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size entries must be >= -1 (-1 means unbounded); got {window_size!r}"
        )
    return left, (0 if causal else right)


def _shape_error(name, expected, tensor):
    return ValueError(f"{name} must have shape {expected}; got {tuple(tensor.shape)}")


def _check_qkv(q, k, v):
    """Rank, dtype, shape, then device checks (see the module docstring)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            what = "(batch, seqlen_q, nheads, headdim)" if name == "q" else (
                "(batch, seqlen_k, nheads_k, headdim)")
            raise _shape_error(name, what, t)
    dtype = q.dtype
    if dtype is not _HALF and dtype is not _BF16:
        raise ValueError(f"FlashAttention only supports fp16 and bf16 data type; got q {dtype}")
    if k.dtype is not dtype:
        raise ValueError(f"query and key must have the same dtype; got q {dtype}, k {k.dtype}")
    if v.dtype is not dtype:
        raise ValueError(f"query and value must have the same dtype; got q {dtype}, v {v.dtype}")

    batch, _, nheads, headdim = q.shape
    if headdim == 0 or headdim > _MAX_HEADDIM:
        raise ValueError(
            f"FlashAttention forward only supports head dimension at most {_MAX_HEADDIM} "
            f"(and at least 1); got {headdim}"
        )
    kernel_headdim = _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)]
    if kernel_headdim < 0:
        built = ", ".join(map(str, _ext.build_info()["head_dims"]))
        raise ValueError(
            f"flashattn2: head dim {headdim} needs a kernel head dim >= {headdim}; "
            f"this build has {built}"
        )
    kb, seqlen_k, nheads_k, kd = k.shape
    if kb != batch or kd != headdim:
        raise _shape_error("k", f"(batch={batch}, seqlen_k, nheads_k, headdim={headdim})", k)
    if v.shape != k.shape:
        raise ValueError(
            f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}"
        )
    if nheads_k == 0 or nheads % nheads_k:
        raise ValueError(
            "Number of heads in key/value must divide number of heads in query; "
            f"got {nheads} query heads and {nheads_k} key/value heads"
        )

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_cuda:
            raise ValueError(f"flashattn2 needs CUDA tensors; got {name} on {t.device}")
    device = q.get_device()
    if k.get_device() != device or v.get_device() != device:
        raise ValueError(
            "q, k and v must be on the same device; "
            f"got q on {q.device}, k on {k.device}, v on {v.device}"
        )
    _ext.check_device(device)


def _kernel_ready(t, pad):
    """``t`` itself if the kernel can read it, else a padded / contiguous copy."""
    if pad:
        t = F.pad(t, (0, pad))
    stride = t.stride()
    if (stride[3] != 1 or t.data_ptr() % 16
            or stride[0] % 8 or stride[1] % 8 or stride[2] % 8):  # fmt: skip
        t = t.clone(memory_format=_CONTIGUOUS)
    return t


def _attention(q, k, v, softmax_scale, window_left, window_right, return_attn_probs):
    """Checked inputs in, flash-attn style result out."""
    headdim = q.shape[3]
    if softmax_scale is None:
        softmax_scale = headdim**-0.5
    # flash-attn treats a window bound >= seqlen_k as unbounded.
    seqlen_k = k.shape[1]
    if window_left >= seqlen_k:
        window_left = -1
    if window_right >= seqlen_k:
        window_right = -1
    pad = -headdim % 8
    q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _FlashAttnFunc.apply(q, k, v, float(softmax_scale), window_left, window_right)
    else:
        out, lse = _flash_attn_forward(q, k, v, float(softmax_scale), window_left, window_right)
    if pad:
        out = out[..., :headdim]
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Scaled dot-product attention, flash-attn v2 interface.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k, v: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device; ``nheads``
            must be a multiple of ``nheads_k`` (GQA / MQA).
        dropout_p: must be 0.0 (dropout is not implemented yet).
        softmax_scale: multiplies ``q @ k^T``; default ``headdim ** -0.5``.
        causal: key j is visible to query i only if ``j <= i + seqlen_k - seqlen_q``
            (bottom-right aligned); overrides the right bound of ``window_size`` with 0.
        window_size: ``(left, right)``; key j is visible to query i only if
            ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``;
            -1 (or a bound >= seqlen_k) is unbounded.
        softcap, alibi_slopes: must be 0.0 / None (not implemented yet).
        deterministic: accepted; affects only the backward pass (the forward is always
            deterministic).
        return_attn_probs: also return the log-sum-exp of each row.

    Returns:
        ``out`` like q, or ``(out, softmax_lse, None)`` with ``softmax_lse`` float32
        ``(batch, nheads, seqlen_q)`` when ``return_attn_probs``. Rows that see no key give
        out = 0 and lse = +inf. The backward pass is not implemented yet.
    """
    _check_unsupported(dropout_p, softcap, alibi_slopes)
    window_left, window_right = _window(window_size, causal)
    _check_qkv(q, k, v)
    return _attention(q, k, v, softmax_scale, window_left, window_right, return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """``flash_attn_func`` on ``qkv`` of shape ``(batch, seqlen, 3, nheads, headdim)``.

    q, k and v are read in place as strided views of ``qkv`` (no copy).
    """
    _check_unsupported(dropout_p, softcap, alibi_slopes)
    window_left, window_right = _window(window_size, causal)
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise _shape_error("qkv", "(batch, seqlen, 3, nheads, headdim)", qkv)
    q, k, v = qkv.unbind(2)
    _check_qkv(q, k, v)
    return _attention(q, k, v, softmax_scale, window_left, window_right, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """``flash_attn_func`` with ``kv`` of shape ``(batch, seqlen_k, 2, nheads_k, headdim)``.

    k and v are read in place as strided views of ``kv`` (no copy).
    """
    _check_unsupported(dropout_p, softcap, alibi_slopes)
    window_left, window_right = _window(window_size, causal)
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise _shape_error("kv", "(batch, seqlen_k, 2, nheads_k, headdim)", kv)
    k, v = kv.unbind(2)
    _check_qkv(q, k, v)
    return _attention(q, k, v, softmax_scale, window_left, window_right, return_attn_probs)
