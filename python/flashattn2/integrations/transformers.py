"""Hugging Face transformers: ``attn_implementation="flashattn2"``.

    import flashattn2.integrations.transformers            # registers "flashattn2"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashattn2",
                                                 dtype=torch.bfloat16).cuda()

Importing this module (or calling ``register()``) adds ``flashattn2_attention_forward`` to
transformers' ``AttentionInterface`` and transformers' flash-attention mask builder to its
``AttentionMaskInterface``, so the model hands each attention layer the 2-D padding mask
``(batch, kv_len)`` (or None) that flash-attention implementations get. Needs transformers
>= 4.53 (the first with both interfaces); older versions raise ImportError on import.

Per call, in this order:

- a padding mask: the keys, and the queries (all of them when ``q_len == kv_len``, one per
  row when ``q_len == 1``, else the mask's last ``q_len`` columns: left padding) are packed
  and run through ``flash_attn_varlen_func``; padding rows of the output are 0. The mask is
  read on the host once per forward and per mask, not once per layer;
- ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (with ``max_length_q`` / ``max_length_k``) keyword
  arguments: padding-free packed sequences, run as given;
- batch 1 without a cache and ``position_ids`` that restart (at their minimum, as
  transformers' data collators write them): packed sequences, split there;
- otherwise ``flash_attn_func`` on the dense batch (bottom-right aligned causal, so decoding
  against a cache needs no mask).

Causal comes from the ``is_causal`` argument or ``module.is_causal``; ``scaling``, ``softcap``
and ``dropout`` pass through; ``sliding_window`` w (a window of w keys, the current one
included) becomes ``window_size=(w - 1, w - 1)``; ``deterministic`` (or the environment
variable ``FLASH_ATTENTION_DETERMINISTIC=1``) selects the deterministic backward. GQA runs
natively. A value head dim smaller than the query's is zero-padded and cropped. fp32 inputs
under autocast run in the autocast dtype; otherwise the kernels need fp16 / bf16. Attention
sinks (``s_aux``), ``output_attentions=True`` and 4-D masks raise.

transformers >= 5 preloads its own flash-attn loader for every implementation whose name
contains "flash"; ``register()`` makes ``transformers.modeling_utils`` skip that preload for
this name (transformers' continuous-batching generation still goes through that loader and
does not work with "flashattn2").
"""
import os
import weakref

import torch

try:
    import transformers
except ImportError as exc:
    raise ImportError(
        "flashattn2.integrations.transformers needs transformers (pip install transformers)"
    ) from exc

from .._checks import _tracing
from ..bert_padding import _mask_metadata, index_first_axis, pad_input
from ..interface import flash_attn_func
from ..varlen import flash_attn_varlen_func

NAME = "flashattn2"
MIN_VERSION = "4.53"


def _interfaces():
    """(AttentionInterface, AttentionMaskInterface, flash_attention_mask) of the installed
    transformers; ImportError naming the version when one is missing."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as exc:
        raise ImportError(
            f"flashattn2.integrations.transformers needs transformers >= {MIN_VERSION} "
            f"(AttentionInterface and AttentionMaskInterface); found transformers "
            f"{getattr(transformers, '__version__', '?')} ({exc})"
        ) from exc
    return AttentionInterface, AttentionMaskInterface, flash_attention_mask


_registered_names = set()


def _skip_flash_preload():
    """transformers >= 5 calls ``lazy_import_flash_attention(name)`` when a model is created
    with an implementation whose name contains "flash", and that loader knows only
    flash-attn packages and Hub kernels. Wrap the name ``modeling_utils`` calls so that our
    names skip it (its return value is unused there)."""
    modeling_utils = __import__("transformers.modeling_utils", fromlist=["_"])
    original = getattr(modeling_utils, "lazy_import_flash_attention", None)
    if original is None or getattr(original, "_flashattn2_wrapper", False):
        return

    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation in _registered_names:
            return None
        return original(implementation, *args, **kwargs)

    lazy_import_flash_attention._flashattn2_wrapper = True
    lazy_import_flash_attention.__wrapped__ = original
    modeling_utils.lazy_import_flash_attention = lazy_import_flash_attention


def register(name=NAME):
    """Registers ``attn_implementation=name`` (default ``"flashattn2"``) with transformers'
    attention and mask interfaces; safe to call again."""
    attention_interface, mask_interface, flash_mask = _interfaces()
    attention_interface.register(name, flashattn2_attention_forward)
    mask_interface.register(name, flash_mask)
    _registered_names.add(name)
    _skip_flash_preload()


# ---- metadata of a padding mask / packed position ids, computed once per tensor ----

_memo = {}  # id(tensor) -> (weakref to it, its version, key, value)
_MEMO_SIZE = 8


def _memoized(tensor, key, compute):
    """``compute()``, cached on the identity and version of ``tensor`` and on ``key``: every
    layer of a forward gets the same mask / position_ids tensor, and each call to
    ``compute`` synchronises with the GPU. Not cached while tracing or for inference tensors
    (which have no version counter)."""
    if _tracing() or tensor.is_inference():
        return compute()
    entry = _memo.get(id(tensor))
    if (entry is not None and entry[0]() is tensor and entry[1] == tensor._version
            and entry[2] == key):  # fmt: skip
        return entry[3]
    value = compute()
    if len(_memo) >= _MEMO_SIZE:
        for stale in [k for k, e in _memo.items() if e[0]() is None]:
            del _memo[stale]
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
    _memo[id(tensor)] = (weakref.ref(tensor), tensor._version, key, value)
    return value


def _padding_metadata(mask, query_length):
    """Keys: ``(indices, cu_seqlens, max_seqlen)`` of the 2-D mask; queries likewise (indices
    None when every row has one query)."""
    kept = mask.bool()
    keys = _mask_metadata(kept)
    if query_length == mask.shape[1]:
        return keys, keys
    if query_length == 1:
        cu = torch.arange(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
        return keys, (None, cu, 1)
    return keys, _mask_metadata(kept[:, -query_length:])


def _packed_metadata(position_ids):
    """``(cu_seqlens, max_seqlen)`` of the sequences packed in ``position_ids`` ``(1, s)``:
    one starts at 0 and wherever the position is the minimum (None if there is one)."""
    pos = position_ids.reshape(-1)
    is_start = pos == pos.min()
    is_start[0] = True
    starts = is_start.nonzero(as_tuple=False).flatten()
    if starts.numel() == 1:
        return None
    end = torch.tensor([pos.numel()], dtype=starts.dtype, device=starts.device)
    cu = torch.cat([starts, end]).to(torch.int32)
    return cu, int(cu.diff().max())


def _as_int(value):
    return value if isinstance(value, int) else int(value)


# ---- the attention function ----


def _check_kwargs(attention_mask, kwargs):
    if kwargs.get("output_attentions", False):
        raise ValueError(
            "flashattn2 does not return attention weights (output_attentions=True); use "
            'attn_implementation="eager" for them'
        )
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashattn2 does not support attention sinks (s_aux)")
    if attention_mask is not None and (
        not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2
    ):
        what = (
            f"a {attention_mask.dim()}-D tensor" if isinstance(attention_mask, torch.Tensor)
            else type(attention_mask).__name__
        )
        raise ValueError(
            "flashattn2 takes the 2-D padding mask (batch, kv_len) that transformers builds "
            f"for it (or None); got {what}. A model that builds its own 4-D mask, or a "
            'custom 4-D mask, needs attn_implementation="sdpa" or "eager"'
        )


def _autocast_dtype(device_type):
    """The autocast dtype for ``device_type`` if autocast is on there, else None."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if enabled else None
    except (TypeError, AttributeError):  # torch without the device_type forms
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None


def _padded_attention(q, k, v, mask, opts):
    batch, seqlen_q = q.shape[:2]
    mask_len = mask.shape[1]
    if k.shape[1] > mask_len:  # a static cache longer than what has been written
        k, v = k[:, :mask_len], v[:, :mask_len]
    elif k.shape[1] < mask_len:
        raise ValueError(
            f"the attention mask covers {mask_len} keys but the layer has {k.shape[1]}"
        )
    keys, queries = _memoized(mask, seqlen_q, lambda: _padding_metadata(mask, seqlen_q))
    indices_k, cu_k, max_k = keys
    indices_q, cu_q, max_q = queries
    k = index_first_axis(k.reshape((-1,) + k.shape[2:]), indices_k)
    v = index_first_axis(v.reshape((-1,) + v.shape[2:]), indices_k)
    if indices_q is None:
        out = flash_attn_varlen_func(q.reshape((-1,) + q.shape[2:]), k, v, cu_q, cu_k, max_q,
                                     max_k, **opts)
        return out.view(batch, seqlen_q, *out.shape[1:])
    q = index_first_axis(q.reshape((-1,) + q.shape[2:]), indices_q)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **opts)
    return pad_input(out, indices_q, batch, seqlen_q)


def _flat_varlen(q, k, v, cu_q, cu_k, max_q, max_k, opts):
    batch, seqlen_q = q.shape[:2]
    q, k, v = (t.reshape((-1,) + t.shape[2:]) for t in (q, k, v))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **opts)
    return out.view(batch, seqlen_q, *out.shape[1:])


def flashattn2_attention_forward(module, query, key, value, attention_mask, dropout=0.0,
                                 scaling=None, sliding_window=None, softcap=None,
                                 is_causal=None, **kwargs):
    """transformers' attention-function signature: query ``(b, h, q_len, d)``, key / value
    ``(b, h_k, kv_len, d)``, ``attention_mask`` 2-D ``(b, kv_len)`` or None. Returns
    ``(out (b, q_len, h, d), None)``. See the module docstring for the mapping."""
    _check_kwargs(attention_mask, kwargs)
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if q.dtype == torch.float32:
        target = _autocast_dtype(q.device.type)
        if target is not None:
            q, k, v = q.to(target), k.to(target), v.to(target)
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if v_head_dim < head_dim:
        v = torch.nn.functional.pad(v, (0, head_dim - v_head_dim))
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    opts = dict(dropout_p=dropout, softmax_scale=scaling, causal=causal, window_size=window,
                softcap=0.0 if softcap is None else softcap, deterministic=deterministic)

    batch, seqlen_q = q.shape[:2]
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    position_ids = kwargs.get("position_ids")
    packed = None
    if attention_mask is None and cu_q is None and (
        batch == 1 and seqlen_q > 1 and k.shape[1] == seqlen_q
        and isinstance(position_ids, torch.Tensor) and position_ids.shape == (1, seqlen_q)
    ):  # fmt: skip
        packed = _memoized(position_ids, None, lambda: _packed_metadata(position_ids))

    if attention_mask is not None:
        out = _padded_attention(q, k, v, attention_mask, opts)
    elif cu_q is not None and cu_k is not None:
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = int(cu_q.diff().max()) if max_q is None else _as_int(max_q)
        max_k = int(cu_k.diff().max()) if max_k is None else _as_int(max_k)
        out = _flat_varlen(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k,
                           opts)
    elif packed is not None:
        cu, max_len = packed
        out = _flat_varlen(q, k, v, cu, cu, max_len, max_len, opts)
    else:
        out = flash_attn_func(q, k, v, **opts)
    if v_head_dim < head_dim:
        out = out[..., :v_head_dim]
    return out, None


register()
