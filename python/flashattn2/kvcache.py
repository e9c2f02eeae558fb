"""Inference against a KV cache: ``flash_attn_with_kvcache`` (flash-attn v2 interface).

One call appends the new keys/values to the cache in place (rotary embedding applied to them
and to q when asked; one ``append_kv`` kernel), then runs the forward kernel on the cache:
contiguous ``(batch_cache, seqlen_cache, nheads_k, d)`` or paged
``(num_pages, page_size, nheads_k, d)`` through ``block_table``, with per-batch lengths
``cache_seqlens`` (+ the new tokens), optional left padding and cache batch indices, and
split-KV (``num_splits``; 0 = a heuristic that fills the GPU) merged by the combine kernel.
Nothing here synchronises with the GPU, so a call can be captured in a CUDA graph; under
torch.compile it is the operator ``flashattn2::fwd_kvcache``, which declares its writes to
k_cache and v_cache.
"""
import operator

import torch
import torch.nn.functional as F

from . import _ext
from ._checks import (
    _BF16,
    _CONTIGUOUS,
    _FP32,
    _HALF,
    _MAX_HEADDIM,
    _check_alibi_shape,
    _check_devices,
    _check_mod_values,
    _require_tensor,
    _scale,
    _shape_error,
    _tracing,
    _window,
)
from ._launch import _C, _dtype_code, _kernel_ready, _launch_fwd, _mod_kwargs

_INT32 = torch.int32


def _check_int32_vector(name, t, batch):
    if t.dtype is not _INT32:
        raise ValueError(f"{name} must be int32; got {t.dtype}")
    if t.dim() != 1 or t.shape[0] != batch:
        raise _shape_error(name, f"(batch={batch},)", t)


def _cache_ready(name, t, tracing):
    """The kernels read (and write) the cache in place: it must already be readable (``t``
    4-D; ``tracing``: ``_tracing()``, when there is no pointer: the op checks it)."""
    stride = t.stride()
    if (stride[3] != 1 or stride[0] % 8 or stride[1] % 8 or stride[2] % 8
            or (not tracing and t.data_ptr() % 16)):
        raise ValueError(
            f"{name} must have a unit last stride, a 16-byte aligned data pointer and other "
            f"strides that are multiples of 8 elements (it is used in place); got strides "
            f"{tuple(stride)}"
        )


def _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                   cache_batch_idx, cache_leftpad, block_table, num_splits, alibi_slopes=None,
                   tracing=None):
    """Every argument check, before any launch; returns (capacity, page_size). ``tracing``:
    ``_tracing()``, if the caller has it already."""
    tracing = _tracing() if tracing is None else tracing
    _require_tensor("q", q)
    _require_tensor("k_cache", k_cache)
    _require_tensor("v_cache", v_cache)
    if not (k is None and v is None and rotary_cos is None and rotary_sin is None
            and cache_batch_idx is None and cache_leftpad is None and block_table is None):
        for name, t in (("k", k), ("v", v), ("rotary_cos", rotary_cos),
                        ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("block_table", block_table)):
            if t is not None:
                _require_tensor(name, t, "a torch.Tensor or None")
    if q.dim() != 4:
        raise _shape_error("q", "(batch, seqlen_q, nheads, headdim)", q)
    dtype = q.dtype
    if dtype is not _HALF and dtype is not _BF16:
        raise ValueError(f"FlashAttention only supports fp16 and bf16 data type; got q {dtype}")
    batch, _, nheads, headdim = q.shape
    if headdim == 0 or headdim > _MAX_HEADDIM:
        raise ValueError(
            f"FlashAttention forward only supports head dimension at most {_MAX_HEADDIM} "
            f"(and at least 1); got {headdim}"
        )
    if _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)] < 0:
        built = ", ".join(map(str, _ext.build_info()["head_dims"]))
        raise ValueError(f"flashattn2: head dim {headdim} needs a kernel head dim >= "
                         f"{headdim}; this build has {built}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            layout = "(num_pages, page_size" if block_table is not None else "(batch_cache, seqlen_cache"
            raise _shape_error(name, layout + ", nheads_k, headdim)", t)
        if t.dtype is not dtype:
            raise ValueError(f"{name} must have the dtype of q ({dtype}); got {t.dtype}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_cache.shape)}; got "
                         f"{tuple(v_cache.shape)}")
    nheads_k = k_cache.shape[2]
    if k_cache.shape[3] != headdim:
        raise _shape_error("k_cache", f"(..., nheads_k, headdim={headdim})", k_cache)
    if nheads_k == 0 or nheads % nheads_k:
        raise ValueError(
            "Number of heads in key/value must divide number of heads in query; "
            f"got {nheads} query heads and {nheads_k} key/value heads"
        )
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if block_table is not None:
        if block_table.dtype is not _INT32:
            raise ValueError(f"block_table must be int32; got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise _shape_error("block_table", f"(batch={batch}, max_pages)", block_table)
        if block_table.stride(1) != 1:
            raise ValueError("block_table must have a unit last stride")
        page_size = k_cache.shape[1]
        if page_size < 16 or page_size & (page_size - 1):
            raise ValueError(f"page_size (k_cache.shape[1]) must be a power of two >= 16; got "
                             f"{page_size}")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is not supported with a paged KV cache")
        capacity = block_table.shape[1] * page_size
        if capacity > 0 and k_cache.shape[0] == 0:
            raise ValueError("k_cache and v_cache have no pages (num_pages = 0) but block_table "
                             "has entries")
        named.append(("block_table", block_table))
    else:
        page_size = 0
        capacity = k_cache.shape[1]
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            raise _shape_error("k_cache", f"(batch={batch}, seqlen_cache, nheads_k, headdim)",
                               k_cache)
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[0] != batch or t.shape[2:] != (nheads_k, headdim):
                raise _shape_error(name, f"(batch={batch}, seqlen_new, nheads_k={nheads_k}, "
                                         f"headdim={headdim})", t)
            if t.dtype is not dtype:
                raise ValueError(f"{name} must have the dtype of q ({dtype}); got {t.dtype}")
        if v.shape != k.shape:
            raise ValueError(f"v must have the shape of k {tuple(k.shape)}; got {tuple(v.shape)}")
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required when k and v are appended")
        named += [("k", k), ("v", v)]
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos / rotary_sin need the new k and v (they rotate them)")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if t.dim() != 2:
                raise _shape_error(name, "(seqlen_ro, rotary_dim / 2)", t)
            if t.dtype is not dtype:
                raise ValueError(f"{name} must have the dtype of q ({dtype}); got {t.dtype}")
        if rotary_sin.shape != rotary_cos.shape:
            raise ValueError(f"rotary_sin must have the shape of rotary_cos "
                             f"{tuple(rotary_cos.shape)}; got {tuple(rotary_sin.shape)}")
        if 2 * rotary_cos.shape[1] > headdim or rotary_cos.shape[1] == 0:
            raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {2 * rotary_cos.shape[1]}) "
                             f"must be in [2, headdim={headdim}]")
        if rotary_cos.shape[0] < capacity:
            raise ValueError(f"rotary_cos / rotary_sin need a row per cache position: "
                             f"seqlen_ro {rotary_cos.shape[0]} < cache length {capacity}")
        named += [("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)]
    if isinstance(cache_seqlens, torch.Tensor):
        _check_int32_vector("cache_seqlens", cache_seqlens, batch)
        named.append(("cache_seqlens", cache_seqlens))
    elif cache_seqlens is not None:
        try:
            if isinstance(cache_seqlens, bool):
                raise TypeError
            n = operator.index(cache_seqlens)
        except TypeError:
            raise TypeError(f"cache_seqlens must be an int, an int32 tensor or None; got "
                            f"{type(cache_seqlens).__name__}") from None
        if not 0 <= n <= capacity:
            raise ValueError(f"cache_seqlens={n} is outside [0, {capacity}]")
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_int32_vector(name, t, batch)
            named.append((name, t))
    if type(num_splits) is not int:  # (the common case needs no operator.index)
        try:
            if isinstance(num_splits, bool):
                raise TypeError
            num_splits = operator.index(num_splits)
        except TypeError:
            raise ValueError(f"num_splits must be an int; got {num_splits!r}") from None
    if not 0 <= num_splits <= _C.MAX_SPLITS:
        raise ValueError(f"num_splits must be in [0, {_C.MAX_SPLITS}] (0 = heuristic); got "
                         f"{num_splits}")
    if alibi_slopes is not None:
        _check_alibi_shape(alibi_slopes, batch, nheads)
        named.append(("alibi_slopes", alibi_slopes))
    if headdim % 8 == 0:  # else the kernels run on padded copies
        _cache_ready("k_cache", k_cache, tracing)
        _cache_ready("v_cache", v_cache, tracing)
    _check_devices(*named, tracing=tracing)
    return capacity, page_size


def _kvcache_forward(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, cache_leftpad, block_table, softmax_scale, window_left,
                     window_right, rotary_interleaved, num_splits, softcap=0.0,
                     alibi_slopes=None):
    """Checked inputs (cache_seqlens a tensor or None); appends, attends; ``(out, lse)``."""
    batch, seqlen_q, nheads, headdim = q.shape
    nheads_k = k_cache.shape[2]
    if block_table is not None:
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
    else:
        page_size, capacity = 0, k_cache.shape[1]
    out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    lse = torch.empty(batch, nheads, seqlen_q, dtype=_FP32, device=q.device)
    if batch == 0 or seqlen_q == 0 or nheads == 0:
        return out, lse
    seqlen_new = 0 if k is None else k.shape[1]
    if seqlen_new:
        device = q.get_device()
        ptr = (lambda t: 0 if t is None else t.data_ptr())
        # The append kernel takes q's strides too (it rotates q with rotary): all three
        # must be readable, as for the attention kernel.
        q, k, v = _kernel_ready(q, 0), _kernel_ready(k, 0), _kernel_ready(v, 0)
        rotary_dim = 0 if rotary_cos is None else 2 * rotary_cos.shape[1]
        q_rot = None
        if rotary_dim:
            rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
            q_rot = torch.empty_like(q, memory_format=_CONTIGUOUS)
        _C.append_kv(
            k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
            k.stride()[:3], v.stride()[:3], k_cache.stride()[:3], v_cache.stride()[:3],
            cache_seqlens.data_ptr(), ptr(cache_batch_idx),
            ptr(block_table), 0 if block_table is None else block_table.stride(0), page_size,
            k_cache.shape[0], capacity, ptr(rotary_cos), ptr(rotary_sin),
            0 if rotary_cos is None else rotary_cos.stride(0), rotary_dim,
            0 if rotary_cos is None else rotary_cos.shape[0], bool(rotary_interleaved),
            q.data_ptr(), ptr(q_rot), q.stride()[:3], seqlen_q, nheads,
            window_left >= 0 or window_right >= 0, batch, seqlen_new, nheads_k, headdim,
            _dtype_code(q.dtype), device, _ext.current_stream(device),
        )  # fmt: skip
        if q_rot is not None:
            q = q_rot
    q = _kernel_ready(q, 0)
    if capacity == 0:
        out.zero_()
        lse.fill_(float("inf"))
        return out, lse
    layout = {}
    if cache_seqlens is not None:
        layout.update(seqused_k=cache_seqlens.data_ptr(), seqlen_k_new=seqlen_new)
    if cache_leftpad is not None:
        layout["leftpad_k"] = cache_leftpad.data_ptr()
    if cache_batch_idx is not None:
        layout["kv_batch_idx"] = cache_batch_idx.data_ptr()
    if block_table is not None:
        layout.update(block_table=block_table.data_ptr(),
                      block_table_batch_stride=block_table.stride(0), page_size=page_size,
                      num_pages=k_cache.shape[0])
    mods = _mod_kwargs(softcap, alibi_slopes) if softcap or alibi_slopes is not None else None
    _launch_fwd(q, k_cache, v_cache, out, lse, q.stride()[:3], k_cache.stride()[:3],
                v_cache.stride()[:3], out.stride()[:3], lse.stride()[:2], batch, seqlen_q,
                capacity, nheads, nheads_k, headdim, softmax_scale, window_left, window_right,
                num_splits, mods, **layout)
    return out, lse


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q against a KV cache, appending new keys/values first (flash-attn v2).

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16/bf16, headdim at most 256. A head
            dim that is not a multiple of 8 runs on zero-padded copies of q, k, v and the
            caches (the whole cache is copied each call), and the appended rows are then
            written back into k_cache / v_cache.
        k_cache, v_cache: ``(batch_cache, seqlen_cache, nheads_k, headdim)``, or with
            ``block_table`` paged ``(num_pages, page_size, nheads_k, headdim)`` with
            page_size a power of two >= 16. Updated in place when k, v are given, so (head
            dims that are multiples of 8) unit last stride, 16-byte aligned, other strides
            multiples of 8 elements.
        k, v: optional new keys/values ``(batch, seqlen_new, nheads_k, headdim)``, written at
            positions ``cache_seqlens[b] ...`` of each batch entry's cache before attending
            (positions past the cache's end are not written).
        rotary_cos, rotary_sin: optional ``(seqlen_ro, rotary_dim / 2)`` (q's dtype,
            seqlen_ro >= the cache length): rotary embedding applied to the new k and to q
            over their first rotary_dim features, at position ``cache_seqlens[b] + i`` for
            new key i (its cache row: as in flash-attn, ``cache_leftpad`` is not subtracted);
            q rows at the same positions when causal or local, else all at
            ``cache_seqlens[b]``.
            ``rotary_interleaved``: pairs (2i, 2i + 1) (GPT-J) if True, else (i, i + rotary_dim
            / 2) (GPT-NeoX).
        cache_seqlens: int or int32 ``(batch,)``: tokens already in each cache (default: the
            whole cache). Batch entry b attends to ``cache_seqlens[b] + seqlen_new`` keys.
        cache_batch_idx: int32 ``(batch,)``: the cache batch entry each batch entry uses
            (contiguous caches only).
        cache_leftpad: int32 ``(batch,)``: the cache of entry b starts at this position (keys
            before it are invisible).
        block_table: int32 ``(batch, max_pages)``: page indices of each entry's cache.
            Entries are not checked on the host (that would need a sync): an entry outside
            ``[0, num_pages)`` is clamped into it, so it reads (and appends to) a wrong
            page but never memory outside the cache.
        causal, window_size, softmax_scale, softcap, alibi_slopes: as ``flash_attn_func``
            (bottom-right aligned on each entry's keys); a window bound >= the cache length
            (seqlen_cache, or max_pages * page_size when paged) is unbounded.
        num_splits: split-KV count; 0 picks one that fills the GPU, 1 never splits (the
            plain forward's result), > 1 forces (at most 128).
        return_softmax_lse: also return the float32 ``(batch, nheads, seqlen_q)`` lse.

    Returns:
        ``out`` like q, or ``(out, softmax_lse)``. No autograd (inference only).
    """
    _, softcap = _check_mod_values(0.0, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    tracing = _tracing()
    capacity, _ = _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                 cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                 num_splits, alibi_slopes, tracing)
    # As flash-attn: a bound >= the cache length is unbounded (it then neither masks nor
    # makes rotary rotate q row by row).
    window_left = -1 if window_left >= capacity else window_left
    window_right = -1 if window_right >= capacity else window_right
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=_INT32,
                                   device=q.device)
    rest = (rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
            _scale(q, softmax_scale), window_left, window_right, bool(rotary_interleaved),
            int(num_splits), softcap, alibi_slopes)
    run = torch.ops.flashattn2.fwd_kvcache if tracing else _kvcache_forward
    headdim = q.shape[3]
    pad = -headdim % 8
    if pad == 0:
        out, lse = run(q, k_cache, v_cache, k, v, *rest)
    else:
        # The kernels need head dims that are multiples of 8: run on zero-padded copies,
        # then write the appended rows back into the caches given.
        padded = (lambda t: None if t is None else F.pad(t, (0, pad)))
        kc, vc = padded(k_cache), padded(v_cache)
        out, lse = run(padded(q), kc, vc, padded(k), padded(v), *rest)
        out = out[..., :headdim]
        if k is not None:
            _write_back_appended(k_cache, v_cache, kc, vc, cache_seqlens, k.shape[1],
                                 cache_batch_idx, block_table)
    return (out, lse) if return_softmax_lse else out


def _write_back_appended(k_cache, v_cache, kc, vc, cache_seqlens, seqlen_new, cache_batch_idx,
                         block_table):
    """Copies the rows the append wrote into the padded caches ``kc`` / ``vc`` (rows
    ``cache_seqlens[b] + i`` of entry b, those past the cache's end not written) back into
    ``k_cache`` / ``v_cache``, sliced to their head dim. Indices are clamped as the kernels
    clamp them; where several map to one row, each copies that row's final value."""
    batch = cache_seqlens.shape[0]
    rows = cache_seqlens.long().unsqueeze(1) + torch.arange(seqlen_new, device=kc.device)
    if block_table is not None:
        page_size = k_cache.shape[1]
        capacity = block_table.shape[1] * page_size
        if capacity == 0 or k_cache.shape[0] == 0:
            return
        rows = rows.clamp_(0, capacity - 1)
        pages = block_table.long().gather(1, rows // page_size).clamp_(0, k_cache.shape[0] - 1)
        index = (pages, rows % page_size)
    else:
        if k_cache.shape[1] == 0:
            return
        entries = (torch.arange(batch, device=kc.device) if cache_batch_idx is None
                   else cache_batch_idx.long().clamp(0, k_cache.shape[0] - 1))  # fmt: skip
        index = (entries.unsqueeze(1).expand_as(rows), rows.clamp_(0, k_cache.shape[1] - 1))
    headdim = k_cache.shape[3]
    k_cache[index] = kc[index][..., :headdim]
    v_cache[index] = vc[index][..., :headdim]
