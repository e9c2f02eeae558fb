"""``scaled_dot_product_attention``: the signature and semantics of
``torch.nn.functional.scaled_dot_product_attention`` on the flash kernels.

The inputs are ``(..., heads, seqlen, headdim)`` (BHSD); they are handed to the kernels as
``(batch, seqlen, heads, headdim)`` transposed views, so a contiguous BHSD tensor is read in
place. How torch's semantics map onto the kernels':

- leading dims broadcast as in torch (size-1 dims expand, without a copy up to 4-D; more
  leading dims are flattened, which copies where they cannot be viewed as one);
- heads: equal, or key/value with 1 head (the kernels' MQA), or query with 1 head (expanded,
  no copy); with ``enable_gqa`` any ``Hq % Hk == 0`` (the kernels' GQA shares each key/value
  head among consecutive query heads: torch's ``repeat_interleave``);
- ``is_causal`` is top-left aligned (key j visible to query i iff j <= i), the kernels'
  causal is bottom-right aligned: with ``Lq <= Lk`` only the first ``Lq`` keys can be seen,
  so k and v are sliced to them (a view) and the kernels' causal is the same mask; with
  ``Lq > Lk`` the window ``(left -1, right Lq - Lk)`` of the kernels' convention is exactly
  ``j <= i``. Every row sees key 0, so no row is empty unless there are no keys (out = 0,
  as torch gives);
- ``scale`` None is ``1 / sqrt(E)`` of the query's head dim ``E``, also when it is padded;
- head dims ``E != Ev``: q, k and v are zero-padded (a copy) to the larger one, rounded up
  to a multiple of 8, and the output sliced back (zeros change neither q.k nor the output);
- float16 and bfloat16 inputs, and float32 where the float32 kernels (3xTF32, ``cpp/fp32``,
  build item ``fp32``) serve the call as they serve ``flash_attn_func``: head dims up to 128,
  every mapping above (their causal, windows and GQA), deterministic backward. float32 with
  dropout or an ``attn_mask`` raises NotImplementedError (the float32 kernels have neither,
  as in ``flash_attn_func``), and float64 always does;
- ``dropout_p`` as in torch (applied to the attention weights, kept weights scaled by
  ``1 / (1 - dropout_p)``), drawn from torch's CUDA generator;
- deterministic backward when ``torch.are_deterministic_algorithms_enabled()``;
- ``attn_mask`` (builds with the bias kernels, ``bias.py``): broadcast to ``(..., Hq, L, S)``
  and flattened like the leading dims, then read in place as the kernels' attention bias
  (a bool mask becomes 0 / -inf first).
"""
import math

import torch
import torch.nn.functional as F

from . import _checks, interface
from ._checks import _BF16, _FP32, _FP32_MAX_HEADDIM, _HALF, _MAX_HEADDIM
from .bias import bias_built, check_bias, run_with_bias

_NAMES = ("query", "key", "value")
_TORCH_SDPA = "torch.nn.functional.scaled_dot_product_attention"


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):  # fmt: skip
    """``torch.nn.functional.scaled_dot_product_attention`` on the flash kernels.

    Args:
        query: ``(..., Hq, L, E)``; key: ``(..., Hk, S, E)``; value: ``(..., Hk, S, Ev)``:
            float16, bfloat16 or float32 CUDA tensors of one dtype and device, at least 2-D,
            leading dims broadcastable as in torch, ``E, Ev <= 256`` (float32: ``<= 128``).
            float32 runs the float32 kernels (3xTF32, as ``flash_attn_func``; build item
            ``fp32``, the default).
        attn_mask: None, or broadcastable to ``(..., Hq, L, S)``: bool (True = attend) or
            float16 / bfloat16 / float32 (added to the scaled scores), as torch; not with
            ``is_causal``, nor with float32 inputs. A float mask that requires grad gets its
            gradient. Needs the bias kernels (``FLASHATTN2_EXPERIMENTAL=bias``, the default;
            ``bias.py``): builds without them raise NotImplementedError. A row whose keys are
            all masked gives 0 (as torch >= 2.5).
        dropout_p: in [0, 1) (torch also takes 1.0); 0 with float32 inputs.
        is_causal: top-left aligned causal mask, as torch: key j visible to query i iff j <= i.
        scale: positive and finite (torch also takes 0 and negative values); default
            ``1 / sqrt(E)``.
        enable_gqa: allow ``Hq`` to be a multiple of ``Hk`` (grouped-query attention).

    Returns:
        ``(..., Hq, L, Ev)`` in the input dtype (leading dims and heads broadcast as in
        torch), differentiable in query, key and value. It is a transposed view of a
        contiguous ``(..., L, Hq, Ev)`` buffer (``.contiguous()`` copies it to BHSD).

    Raises:
        NotImplementedError for what torch computes and this function does not: an
        ``attn_mask`` in builds without the bias kernels, float64 inputs, float32 inputs
        with an ``attn_mask``, with ``dropout_p > 0`` or with a head dim above 128, float32
        in builds without the float32 kernels (``_checks.Float32NotBuilt``, a ValueError
        too), a head dim above 256, ``scale <= 0``.
        ValueError for what torch rejects too (shapes, dtypes, heads), for ``dropout_p = 1``,
        for key and value with different head counts, and for CPU tensors or tensors on
        different devices.
    """
    if attn_mask is not None and not bias_built():
        raise NotImplementedError(
            "flashattn2.scaled_dot_product_attention: attn_mask needs a build with "
            "FLASHATTN2_EXPERIMENTAL=bias (the default; this build was made without it); use "
            "is_causal=True for a causal mask, flashattn2.flash_attn_func(window_size=...) for "
            "a sliding window, flash_attn_varlen_func for padding masks (packed sequences), "
            "or torch.nn.functional.scaled_dot_product_attention for other masks"
        )
    if attn_mask is not None and is_causal is True:
        raise ValueError("attn_mask and is_causal=True cannot both be given (as in torch)")
    dropout_p, _ = _checks._check_mod_values(dropout_p, 0.0)
    for name, flag in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool; got {flag!r}")
    if scale is not None:
        scale = _checks._real("scale", scale)
        if not 0.0 < scale < math.inf:
            raise NotImplementedError(
                f"flashattn2.scaled_dot_product_attention needs a positive, finite scale; got "
                f"{scale!r} (torch.nn.functional.scaled_dot_product_attention takes any float)"
            )
    batch_shape, heads = _check_shapes(query, key, value, enable_gqa)
    _checks._check_fp32(query, dropout_p=dropout_p, attn_bias=attn_mask,
                        also=f"; {_TORCH_SDPA} does in float32")  # fmt: skip
    named = list(zip(_NAMES, (query, key, value)))
    if attn_mask is not None:
        mask = _mask_as_bias(attn_mask, batch_shape, heads, query.shape[-2], key.shape[-2])
        named.append(("attn_mask", attn_mask))
    _checks._check_devices(*named)

    seqlen_q, headdim = query.shape[-2:]
    seqlen_k, headdim_v = value.shape[-2:]
    q, k, v = (_to_bshd(t, batch_shape) for t in (query, key, value))
    if q.shape[2] == 1 < heads:  # query heads broadcast against key/value heads
        q = q.expand(-1, -1, heads, -1)
    window_right = -1
    if is_causal:
        if seqlen_q <= seqlen_k:
            k, v = k.narrow(1, 0, seqlen_q), v.narrow(1, 0, seqlen_q)
            window_right = 0
        else:
            window_right = seqlen_q - seqlen_k
    if headdim != headdim_v:
        # One head dim for q, k and v, padded to a multiple of 8 at once, so that the kernels'
        # padding (_launch._kernel_ready, for any other head dim) copies nothing more.
        padded = max(headdim, headdim_v)
        padded += -padded % 8
        q, k, v = (t if t.shape[3] == padded else F.pad(t, (0, padded - t.shape[3]))
                   for t in (q, k, v))  # fmt: skip
    _checks._check_qkv_shapes(q, k, v)  # the build has a kernel for this head dim
    softmax_scale = headdim**-0.5 if scale is None else scale
    deterministic = torch.are_deterministic_algorithms_enabled()
    if attn_mask is None:
        out = interface._run(q, k, v, softmax_scale, -1, window_right, deterministic,
                             dropout_p=dropout_p)[0]  # fmt: skip
    else:
        out = run_with_bias(q, k, v, mask, softmax_scale, -1, -1, deterministic,
                            dropout_p=dropout_p)[0]  # fmt: skip
    if out.shape[3] != headdim_v:
        out = out.narrow(3, 0, headdim_v)  # (narrow: indexing trips make_fx on fake CUDA)
    out = out.transpose(1, 2)
    rank = max(query.dim(), key.dim(), value.dim())
    lead = (*batch_shape, heads) if rank > 2 else ()
    return out.reshape(*lead, seqlen_q, headdim_v)


def _mask_as_bias(attn_mask, batch_shape, heads, seqlen_q, seqlen_k):
    """``attn_mask`` (bool, True = attend, or float, added), broadcastable to torch's
    ``(*batch_shape, heads, L, S)``, as the kernels' ``(batch, heads, L, S)`` bias: a view
    (a copy only where several broadcast leading dims must be flattened)."""
    _checks._require_tensor("attn_mask", attn_mask, "a tensor or None")
    full = (*batch_shape, heads, seqlen_q, seqlen_k)
    try:
        ok = torch.broadcast_shapes(attn_mask.shape, full) == torch.Size(full)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"attn_mask must be broadcastable to (..., heads, L, S) = {full}; got "
            f"{tuple(attn_mask.shape)}"
        )
    mask = attn_mask.expand(full).reshape(math.prod(batch_shape), heads, seqlen_q, seqlen_k)
    check_bias(mask, mask.shape, "attn_mask")
    return mask


def _heads(t):
    return t.shape[-3] if t.dim() > 2 else 1


def _check_shapes(query, key, value, enable_gqa):
    """Types, ranks, dtypes, then shapes; returns ``(batch_shape, heads)``: the broadcast
    leading dims before the head dim, and the output's head count."""
    for name, t in zip(_NAMES, (query, key, value)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor; got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(
                f"{name} must have shape (..., seqlen, headdim), at least 2-D; got "
                f"{tuple(t.shape)}"
            )
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype:
        raise ValueError(
            "query, key and value must have the same dtype; got "
            f"query {dtype}, key {key.dtype}, value {value.dtype}"
        )
    if dtype is _FP32:
        _checks._check_fp32_built("query")
    elif dtype is not _HALF and dtype is not _BF16:
        message = (f"flashattn2.scaled_dot_product_attention supports float16, bfloat16 and "
                   f"float32; got {dtype}")  # fmt: skip
        if dtype.is_floating_point:
            raise NotImplementedError(
                message + f". Cast the inputs (e.g. .to(torch.float32)) or use {_TORCH_SDPA}"
            )
        raise ValueError(message)

    headdim, headdim_k, headdim_v = query.shape[-1], key.shape[-1], value.shape[-1]
    if headdim_k != headdim:
        raise ValueError(
            f"key must have the head dim of query (E = {headdim}); got key "
            f"{tuple(key.shape)}, query {tuple(query.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key and value must have the same sequence length; got key {tuple(key.shape)}, "
            f"value {tuple(value.shape)}"
        )
    if headdim == 0 or headdim_v == 0:
        raise ValueError(f"head dims must be at least 1; got E = {headdim}, Ev = {headdim_v}")
    if max(headdim, headdim_v) > _MAX_HEADDIM:
        raise NotImplementedError(
            f"flashattn2.scaled_dot_product_attention supports head dims up to {_MAX_HEADDIM};"
            f" got E = {headdim}, Ev = {headdim_v}"
        )
    if dtype is _FP32 and max(headdim, headdim_v) > _FP32_MAX_HEADDIM:
        raise NotImplementedError(
            f"flashattn2.scaled_dot_product_attention supports float32 head dims up to "
            f"{_FP32_MAX_HEADDIM} (the float32 kernels'); got E = {headdim}, Ev = {headdim_v}. "
            f"Cast the inputs to float16 / bfloat16 (head dims up to {_MAX_HEADDIM}) or use "
            f"{_TORCH_SDPA}"
        )

    heads_q, heads_k, heads_v = _heads(query), _heads(key), _heads(value)
    if heads_k != heads_v:
        raise ValueError(
            f"key and value must have the same number of heads (dim -3); got key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if enable_gqa:
        if heads_k == 0 or heads_q % heads_k:
            raise ValueError(
                "Number of heads in key and value must divide the number of heads in query; "
                f"got {heads_q} query heads and {heads_k} key/value heads"
            )
    elif heads_q != heads_k and 1 not in (heads_q, heads_k):
        raise ValueError(
            f"query has {heads_q} heads and key/value {heads_k} (dim -3): they must be equal "
            "or 1 (broadcast); pass enable_gqa=True for grouped-query attention"
        )
    try:
        batch_shape = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    except RuntimeError:
        raise ValueError(
            "the leading dims of query, key and value (before heads, seqlen, headdim) must "
            f"broadcast; got query {tuple(query.shape)}, key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}"
        ) from None
    return tuple(batch_shape), (heads_k if heads_q == 1 else heads_q)


def _to_bshd(t, batch_shape):
    """``t`` ``(..., h, s, d)`` as ``(batch, s, h, d)``: leading dims broadcast to
    ``batch_shape`` and flattened, then a transposed view."""
    t = t.expand(*batch_shape, _heads(t), *t.shape[-2:])
    return t.reshape(math.prod(batch_shape), *t.shape[-3:]).transpose(1, 2)
