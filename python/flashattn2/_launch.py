"""Kernel launches: the calls into the extension (``_C.fwd`` / ``_C.bwd``, their workspaces
and switches) and the preparation of tensors for them; no argument checks (``_checks.py``).

Dropout: each call draws ``rng_state`` = (seed, offset), two int64 on q's device, from torch's
CUDA generator (reproducible under ``torch.manual_seed``, no host sync, CUDA-graph safe);
the kernels derive each element's keep bit from it with Philox4x32-10, and autograd saves it
for the backward, which regenerates the same mask.

Tensors the kernel cannot read directly are copied first (documented here, nowhere else):

- head dim not a multiple of 8: q, k and v are zero-padded to the next multiple of 8 and
  the output is sliced back (a view of the padded output);
- last dim not contiguous, a data pointer that is not 16-byte aligned, or a batch / row /
  head stride that is not a multiple of 8 elements: that tensor is copied to a contiguous
  one.

Any other strides pass through, so views such as ``qkv.unbind(2)`` are not copied.
"""
import torch
import torch.nn.functional as F

from . import _ext
from ._checks import (
    _BF16,
    _CONTIGUOUS,
    _FP32,
    _HALF,
    _check_fp32,
    _check_fp32_backward,
    _tracing,
)

_C = _ext._C  # module attribute, so tests can intercept launches


def _dtype_code(dtype):
    """The kernels' dtype code (cpp/common/flash.h DType): float16 0, bfloat16 1, float32 2."""
    return 2 if dtype is _FP32 else 1 if dtype is _BF16 else 0


def _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right, out=None, lse=None,
                        softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None,
                        num_splits=0, attn_bias=None):
    """Launches the forward kernel with no argument checks; returns ``(out, lse)``.

    q ``(b, sq, h, d)``, k/v ``(b, sk, h_k, d)`` CUDA fp16/bf16 (or float32 in builds with
    the float32 kernels: no dropout, no bias), d a multiple of 8 with a compiled
    kernel, 16-byte aligned pointers, unit last-dim stride and other strides multiples of
    16 bytes. ``out`` (like q, same requirements) and ``lse`` (float32
    ``(b, h, sq)`` with unit last stride) are allocated when not given. Empty problems
    never reach the kernel; ``seqlen_k == 0`` gives out = 0 and lse = +inf.
    Score modifiers: ``softcap``, ``alibi_slopes`` (float32 ``(h,)`` or ``(b, h)`` with a unit
    last stride, on q's device) and ``dropout_p`` with ``rng_state`` (int64 ``(2,)`` on q's
    device; see ``_rng_state``). ``num_splits``: split-KV count, 0 = the heuristic (splits
    only when the grid would not fill the GPU). ``attn_bias``: None, or a
    ``(b, h, sq, sk)`` view (any strides) in q's dtype added to the logits (``bias.py``;
    builds with FLASHATTN2_EXPERIMENTAL=bias, the default).
    """
    _check_fp32(q, softcap, alibi_slopes, dropout_p, attn_bias)
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
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
    _launch_fwd(q, k, v, out, lse, q.stride()[:3], k.stride()[:3], v.stride()[:3],
                out.stride()[:3], lse.stride()[:2], batch, seqlen_q, seqlen_k, nheads, nheads_k,
                headdim, softmax_scale, window_left, window_right, num_splits,
                _mod_kwargs(softcap, alibi_slopes, dropout_p, rng_state, attn_bias))
    return out, lse


# _C.fwd's arguments after its 22 leading ones, in the binding's order (binding.cpp), with
# their defaults. _launch_fwd passes them all by position: pybind11 matches a keyword by
# name, one dictionary look-up per parameter, which for 27 of them cost ~6 us a call
# (scripts/host_profile.py --mock). tests/test_decode_kernel.py checks the order against the
# binding's signature.
_FWD_LAYOUT = dict(cu_seqlens_q=0, cu_seqlens_k=0, seqused_k=0, leftpad_k=0, kv_batch_idx=0,
                   block_table=0, block_table_batch_stride=0, page_size=0, num_pages=0)
_FWD_VARLEN = dict(total_q=0, total_k=0, seqlen_k_new=0)
_FWD_MODS = dict(softcap=0.0, alibi_slopes=0, alibi_batch_stride=0, rng_state=0, dropout_p=0.0)
_FWD_BIAS = dict(attn_bias=0, bias_strides=(), bias_dtype=-1)
_FWD_OPTIONAL = (tuple(_FWD_LAYOUT) + ("num_splits", "o_accum", "lse_accum") + tuple(_FWD_VARLEN)
                 + tuple(_FWD_MODS) + ("q_pack", "allow_sm90", "tile_counter") + tuple(_FWD_BIAS)
                 + ("allow_decode", "sm90_stage_o", "sm90_narrow_step", "sm90_fa3_order",
                    "fp32_tf32"))
_FWD_KEYS = frozenset(_FWD_LAYOUT) | frozenset(_FWD_VARLEN)  # what **layout may hold
_FWD_MOD_KEYS = frozenset(_FWD_MODS) | frozenset(_FWD_BIAS)  # what mods may hold


def _launch_fwd(q, k, v, out, lse, q_strides, k_strides, v_strides, o_strides, lse_strides,
                batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, softmax_scale,
                window_left, window_right, num_splits=1, mods=None, **layout):
    """``_C.fwd`` with split-KV: ``num_splits`` 0 takes the heuristic's count, and the float32
    workspace of a split run (o_accum and lse_accum, one allocation) is allocated here.
    ``layout``: the optional SeqLayout arguments of ``_C.fwd`` (cu_seqlens_q, seqused_k,
    block_table, ...; ``_FWD_KEYS``); ``mods``: the score modifier arguments (``_mod_kwargs``).

    With GQA (h > h_k), the KV-cache kernel (decoding, paged K/V, split-KV) packs the
    g = h / h_k query heads of each group into its query tiles (``q_pack``, cpp/common/flash.h), so
    each K/V tile is read once per group rather than once per query head; the heuristic then
    counts the packed tiles. Not with ALiBi or dropout, whose values depend on the head.
    (``q_pack`` is passed whenever it applies; the plain kernel, which runs longer unsplit
    problems, ignores it.)
    """
    if layout and not _FWD_KEYS.issuperset(layout):
        raise TypeError(f"_launch_fwd got unknown layout arguments "
                        f"{sorted(set(layout) - _FWD_KEYS)}")
    mods = mods or _FWD_MODS
    if not _FWD_MOD_KEYS.issuperset(mods):
        raise TypeError(f"_launch_fwd got unknown modifier arguments "
                        f"{sorted(set(mods) - _FWD_MOD_KEYS)}")
    dropout = mods.get("dropout_p", 0.0) > 0
    bias = bool(mods.get("attn_bias", 0))
    per_head = mods.get("alibi_slopes", 0) or dropout or bias
    fp32 = q.dtype is _FP32  # (the float32 kernels: dense, no split-KV, cpp/fp32)
    q_pack = 1 if per_head or fp32 else nheads // nheads_k
    device = q.get_device()
    if dropout or bias or fp32:
        num_splits = 1  # no split-KV with dropout or a bias (cpp/sm80/fwd_launch.cuh)
    varlen_q = "cu_seqlens_q" in layout
    sm90 = (seqlen_q > 64 and not _ext.FORCE_SM80 and not fp32
            and _C.sm90_fwd_applies(device, headdim, seqlen_q, dropout, _kv_cache(layout)))
    # The Hopper forward's persistent CTAs take causal, windowed and varlen tiles (unequal
    # work) from a shared counter that starts at 0 (FLASHATTN2_SM90_TILE_WALK=blocks: one CTA
    # per tile instead).
    tile_counter = None
    if sm90 and (window_left >= 0 or window_right >= 0 or varlen_q) and (
            _ext.SM90_TILE_WALK == "counter"):
        tile_counter = _tile_counter(q.device)
    if num_splits == 0:
        # The split count for the kernel that will run: the Hopper forward's tile (no GQA
        # packing) where it applies, else the KV kernel's (decode: the decode kernel's count
        # where it would run; dropout and a bias, which it does not take, never get here,
        # and varlen q never asks). By position, as _C.fwd below.
        if sm90:
            num_splits = _C.num_splits_heuristic(batch, nheads, seqlen_q, seqlen_k, headdim,
                                                 device, True, False)
        else:
            num_splits = _C.num_splits_heuristic(batch, nheads // q_pack, seqlen_q * q_pack,
                                                 seqlen_k, headdim, device, False,
                                                 _ext.DECODE_KERNEL and not varlen_q)
    o_accum = lse_accum = 0
    if sm90 and num_splits == 1 and not layout and window_left < 0 and window_right < 0 and (
            _ext.SM90_STREAM_K):
        # A dense forward whose tiles overrun the SMs by part of a wave: its stream-K tail's
        # float32 workspace (no need to zero it), and the flags after the tile counter.
        floats = _C.sm90_fwd_stream_k_floats(device, batch, nheads, seqlen_q, seqlen_k, headdim)
        if floats:
            workspace = torch.empty(floats, dtype=_FP32, device=q.device)
            o_accum = workspace.data_ptr()
            tile_counter = _tile_counter(q.device)
    if num_splits > 1:
        # o_accum (rows x headdim) then lse_accum (rows) in one float32 buffer; lse_accum
        # stays 16-byte aligned (headdim is a multiple of 8 here).
        rows = num_splits * batch * nheads * seqlen_q
        workspace = torch.empty(rows * (headdim + 1), dtype=_FP32, device=q.device)
        o_accum = workspace.data_ptr()
        lse_accum = o_accum + 4 * rows * headdim
    code = _C.fwd(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        q_strides, k_strides, v_strides, o_strides, lse_strides,
        batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
        softmax_scale, window_left, window_right,
        _dtype_code(q.dtype),
        device, _ext.current_stream(device),
        *map(layout.get, _FWD_LAYOUT, _FWD_LAYOUT.values()),
        num_splits, o_accum, lse_accum,
        *map(layout.get, _FWD_VARLEN, _FWD_VARLEN.values()),
        *map(mods.get, _FWD_MODS, _FWD_MODS.values()),
        q_pack, not _ext.FORCE_SM80 and (not fp32 or _ext.FP32WG),
        0 if tile_counter is None else tile_counter.data_ptr(),
        *map(mods.get, _FWD_BIAS, _FWD_BIAS.values()),
        _ext.DECODE_KERNEL, _ext.SM90_STAGE_O, _ext.SM90_NARROW_STEP, _ext.SM90_FA3_ORDER,
        fp32 and _ext.fp32_tf32(),
    )  # fmt: skip
    _ext.last_fwd_arch, _ext.last_fwd_kernel = _ext.FWD_KERNELS[code]


_TILE_COUNTERS = {}  # (device index, raw stream) -> the Hopper forward's tile counter


def _tile_counter(device):
    """The zeroed int32 the Hopper forward's persistent CTAs take tiles from, followed by its
    stream-K flags. The kernel's last claim zeroes it again (cpp/sm90/fwd_producer.cuh), and
    the second piece of each split tile its flag, so one counter per (device, stream)
    serves every launch on that stream, in stream order, instead of a fresh ``torch.zeros``
    (an allocation and a fill kernel) before each launch. While a CUDA graph is captured, a
    fresh one: the graph owns it and zeroes it at each replay."""
    with torch.cuda.device(device):  # (capture is a property of this device's stream)
        capturing = torch.cuda.is_current_stream_capturing()
    ints = _C.SM90_FWD_COUNTER_INTS  # (the counter, then the stream-K flags, also left zero)
    if capturing:
        return torch.zeros(ints, dtype=torch.int32, device=device)
    key = (device.index, _ext.current_stream(device.index))
    counter = _TILE_COUNTERS.get(key)
    if counter is None:
        counter = _TILE_COUNTERS[key] = torch.zeros(ints, dtype=torch.int32, device=device)
    return counter


def _kv_cache(layout):
    """Whether ``_C.fwd``'s layout arguments describe a KV cache (its kernels are the
    mma.sync ones)."""
    return any(layout.get(key) for key in ("seqused_k", "leftpad_k", "kv_batch_idx",
                                           "block_table", "seqlen_k_new"))


def _mod_kwargs(softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None, attn_bias=None):
    """The score-modifier keyword arguments of ``_C.fwd`` / ``_C.bwd`` (``attn_bias``: a
    ``(b, h, sq, sk)`` view, passed only when given)."""
    if alibi_slopes is None:
        alibi, alibi_batch_stride = 0, 0
    else:
        alibi = alibi_slopes.data_ptr()
        alibi_batch_stride = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    rng = rng_state.data_ptr() if dropout_p > 0 else 0
    mods = dict(softcap=float(softcap), alibi_slopes=alibi, alibi_batch_stride=alibi_batch_stride,
                rng_state=rng, dropout_p=float(dropout_p))
    if attn_bias is not None:  # (in q's dtype: bias.bias_view)
        if attn_bias.dtype not in (_HALF, _BF16):  # the kernels read 2-byte elements
            raise TypeError(f"flashattn2: the kernels' attn_bias is float16 or bfloat16 (q's "
                            f"dtype), got {attn_bias.dtype}; bias.bias_view casts it")
        mods.update(attn_bias=attn_bias.data_ptr(), bias_strides=tuple(attn_bias.stride()),
                    bias_dtype=1 if attn_bias.dtype is _BF16 else 0)
    return mods


def _rng_state(device):
    """(seed, offset) for one dropout call: two int64 drawn on ``device`` by torch's RNG."""
    return torch.randint(2**62, (2,), dtype=torch.int64, device=device)


def _dropout_keep_mask(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """Bool ``(batch, nheads, seqlen_q, seqlen_k)``: the elements the kernels keep for this
    ``rng_state`` and ``dropout_p`` (written by a small kernel from the same Philox code)."""
    if _tracing():
        return torch.ops.flashattn2.dropout_mask(rng_state, batch, nheads, seqlen_q, seqlen_k,
                                                 dropout_p)
    mask = torch.empty(batch, nheads, seqlen_q, seqlen_k, dtype=torch.uint8,
                       device=rng_state.device)
    if mask.numel():
        device = rng_state.get_device()
        _C.dropout_mask(mask.data_ptr(), rng_state.data_ptr(), batch, nheads, seqlen_q, seqlen_k,
                        float(dropout_p), device, _ext.current_stream(device))
    return mask.bool()


def _flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
                         deterministic=False, dq=None, dk=None, dv=None, softcap=0.0,
                         alibi_slopes=None, dropout_p=0.0, rng_state=None, attn_bias=None,
                         dbias=None, dbias_add=False):
    """Launches the backward kernels with no argument checks; returns ``(dq, dk, dv)``.

    q, k, v, out and lse as ``_flash_attn_forward`` takes / returns them (kernel-ready; lse
    16-byte aligned with a unit last stride); ``dout`` like out, copied to a contiguous
    tensor if the kernel cannot read it. ``dq``/``dk``/``dv`` (like q/k/v, kernel-ready) are
    allocated contiguous when not given, and must not overlap the inputs (float32 dq is zeroed
    before the main kernel reads dout, q, k, v); with GQA the kernel sums dk/dv over each group.
    Empty problems never reach the kernel and give zero gradients. ``deterministic`` makes dq
    bitwise reproducible (the kernel orders its accumulation). Score modifiers as the
    forward took them (the same ``rng_state`` regenerates its dropout mask), ``attn_bias``
    too; ``dbias``: None, or a 4-D tensor with a unit last stride (float16, bfloat16 or
    float32) that receives d loss / d logit (``bias.dbias_target``), by float32 atomic adds
    with ``dbias_add`` (not with ``deterministic``).
    """
    if q.dtype is _FP32:
        _check_fp32_backward()
        _check_fp32(q, softcap, alibi_slopes, dropout_p, attn_bias)
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if dq is None:
        dq = torch.empty_like(q, memory_format=_CONTIGUOUS)
    if dk is None:
        dk = torch.empty_like(k, memory_format=_CONTIGUOUS)
    if dv is None:
        dv = torch.empty_like(v, memory_format=_CONTIGUOUS)
    if batch == 0 or seqlen_q == 0 or seqlen_k == 0 or nheads == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    dout = _kernel_ready(dout, 0)
    _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, lse.stride()[:2], batch, seqlen_q,
                seqlen_k, nheads, nheads_k, headdim, softmax_scale, window_left, window_right,
                deterministic, _mod_kwargs(softcap, alibi_slopes, dropout_p, rng_state, attn_bias),
                dbias=dbias, dbias_add=dbias_add)
    return dq, dk, dv


def _dbias_args(dbias, dbias_add):
    """``_C.bwd``'s dbias arguments for a 4-D target ``(b', h', sq, sk)``
    (``bias.dbias_target``). A batch / head dim of size 1 is one plane shared by every batch /
    head (the kernel adds at ``b * batch_stride + h * head_stride``), so its stride goes as 0:
    torch gives a size-1 dim the contiguous stride, which sent batch / head 1 past the buffer
    (GPU run 8: dv NaN, then an illegal address)."""
    strides = tuple(0 if d < 2 and dbias.shape[d] == 1 else dbias.stride(d) for d in range(3))
    return dict(dbias=dbias.data_ptr(), dbias_strides=strides,
                dbias_dtype=_dtype_code(dbias.dtype), dbias_add=dbias_add)


_BWD_NEEDS_DQ_ACCUM = -1  # (flash_api.h kBwdNeedsDqAccum)


def _launch_bwd(dout, q, k, v, out, lse, dq, dk, dv, lse_strides, batch, seqlen_q, seqlen_k,
                nheads, nheads_k, headdim, softmax_scale, window_left, window_right,
                deterministic, mods=None, cu_seqlens_q=None, cu_seqlens_k=None, dbias=None,
                dbias_add=False):
    """``_C.bwd`` with its workspaces. Dense: 4-D tensors. Varlen (cu_seqlens_q/k given):
    3-D ``(total, heads, d)`` tensors read with batch stride 0, lse ``(nheads, total_q)``."""
    if cu_seqlens_q is None:
        strides = [t.stride()[:3] for t in (dout, q, k, v, out, dq, dk, dv)]
        varlen = {}
        total_q = -1
    else:
        strides = [(0,) + t.stride()[:2] for t in (dout, q, k, v, out, dq, dk, dv)]
        total_q = q.shape[0]
        varlen = dict(cu_seqlens_q=cu_seqlens_q.data_ptr(), cu_seqlens_k=cu_seqlens_k.data_ptr(),
                      total_q=total_q, total_k=k.shape[0])
    device = q.get_device()
    if q.dtype is _FP32:
        dq_chains = 1  # (the float32 backward orders its dq adds in one accumulator)
    elif deterministic and _ext.DQ_CHAINS:
        dq_chains = _ext.DQ_CHAINS
    else:
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        dq_chains = _C.bwd_dq_chains(seqlen_q, seqlen_k, headdim, deterministic, window_left,
                                     window_right, num_sms)
    dq_accum_floats, dsum_floats = _C.bwd_workspace_floats(batch, nheads, seqlen_q, headdim,
                                                           total_q, dq_chains)
    dsum = torch.empty(dsum_floats, dtype=_FP32, device=q.device)
    bias_args = {} if dbias is None else dict(_dbias_args(dbias, dbias_add),
                                              sm90_dbias=_ext.SM90_DBIAS)
    if mods and "attn_bias" in mods:
        bias_args["bias_staged"] = _ext.BWD_BIAS_STAGED
    bwd = lambda dq_accum: _C.bwd(
        dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
        dq_accum, dsum.data_ptr(), *strides, lse_strides,
        batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
        softmax_scale, window_left, window_right,
        _dtype_code(q.dtype),
        device, _ext.current_stream(device), deterministic, **varlen, **(mods or {}), **bias_args,
        dq_chains=dq_chains,
        allow_sm90=(not _ext.FORCE_SM80) if q.dtype is _FP32 else _allow_sm90_bwd(headdim),
        dq_warp=_ext.SM90_DQ_WARP,
        pdl=_ext.BWD_PDL,
        convert_lean=_ext.BWD_CONVERT_LEAN, dq_first_store=_ext.BWD_DQ_FIRST_STORE,
        **_fp32wg_bwd_arg(q.dtype),
    )  # fmt: skip
    # float32: first without the dQ accumulator (the Hopper float32 backwards add into dq
    # itself); the kernels that need it run nothing and say so (flash_api.h kBwdNeedsDqAccum).
    code = bwd(0) if q.dtype is _FP32 else _BWD_NEEDS_DQ_ACCUM
    if code == _BWD_NEEDS_DQ_ACCUM:
        dq_accum = torch.empty(dq_accum_floats, dtype=_FP32, device=q.device)
        code = bwd(dq_accum.data_ptr())
    _ext.last_bwd_arch, _ext.last_bwd_kernel = _ext.BWD_KERNELS[code]


def _fp32wg_bwd_arg(dtype):
    """The fp32wg_bwd / fp32wg_bwd128 / fp32_tf32 arguments of ``_C.bwd`` (float32 only: _ext
    switches, and PyTorch's TF32 setting for float32 matmuls, ``_ext.fp32_tf32``)."""
    if dtype is not _FP32:
        return {}
    on = _ext.FP32WG and not _ext.FORCE_SM80
    return {"fp32wg_bwd": _ext.FP32WG_BWD and on, "fp32wg_bwd128": _ext.FP32WG_BWD128 and on,
            "fp32_tf32": _ext.fp32_tf32()}


def _allow_sm90_bwd(headdim):
    """Whether the backward of this head dim may run the Hopper backward (_ext switches)."""
    return (_ext.SM90_BWD and not _ext.FORCE_SM80 and
            (_ext.SM90_BWD_D64 or _ext.KERNEL_HEAD_DIM[headdim] != 64))


def _lse_ready(lse):
    """``lse`` itself if the kernel can read it (unit last stride, 16-byte aligned), else a
    contiguous copy."""
    if lse.stride(-1) != 1 or lse.data_ptr() % 16:
        lse = lse.clone(memory_format=_CONTIGUOUS)
    return lse


def _alibi_ready(alibi_slopes):
    """``alibi_slopes`` itself if the kernel can read it (unit last stride), else a copy."""
    if alibi_slopes is not None and alibi_slopes.stride(-1) != 1:
        alibi_slopes = alibi_slopes.contiguous()
    return alibi_slopes


def _forward_any(q, k, v, softmax_scale, window_left, window_right, softcap=0.0,
                 alibi_slopes=None, dropout_p=0.0, rng_state=None, attn_bias=None):
    """``(out, lse)`` for checked q, k, v of any head dim and strides, no autograd: copies what
    the kernel cannot read; when the head dim is padded, out is a view of the padded out.
    ``attn_bias``: None or the ``(b, h, sq, sk)`` view of ``bias.py``."""
    headdim = q.shape[3]
    pad = -headdim % 8
    q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
    out, lse = _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right,
                                   softcap=softcap, alibi_slopes=_alibi_ready(alibi_slopes),
                                   dropout_p=dropout_p, rng_state=rng_state,
                                   attn_bias=attn_bias)  # fmt: skip
    return (out[..., :headdim] if pad else out), lse


def _backward_any(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
                  deterministic=False, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                  rng_state=None, attn_bias=None, dbias=None, dbias_add=False):
    """``(dq, dk, dv)`` for checked tensors of any head dim and strides, like ``_forward_any``
    (views of the padded gradients when the head dim is padded); ``dbias``, ``dbias_add``
    as ``_flash_attn_backward`` takes them."""
    headdim = q.shape[3]
    pad = -headdim % 8
    grads = _flash_attn_backward(
        _kernel_ready(dout, pad), _kernel_ready(q, pad), _kernel_ready(k, pad),
        _kernel_ready(v, pad), _kernel_ready(out, pad), _lse_ready(lse),
        softmax_scale, window_left, window_right, deterministic,
        softcap=softcap, alibi_slopes=_alibi_ready(alibi_slopes), dropout_p=dropout_p,
        rng_state=rng_state, attn_bias=attn_bias, dbias=dbias, dbias_add=dbias_add,
    )  # fmt: skip
    return tuple(g[..., :headdim] for g in grads) if pad else grads


def _kernel_ready(t, pad):
    """``t`` itself if the kernel can read it, else a padded / contiguous copy."""
    if pad:
        t = F.pad(t, (0, pad))
    *outer, last = t.stride()
    align = 16 // t.element_size()  # 16 bytes: 8 two-byte or 4 float32 elements
    if last != 1 or t.data_ptr() % 16:
        return t.clone(memory_format=_CONTIGUOUS)
    for s in outer:
        if s % align:
            return t.clone(memory_format=_CONTIGUOUS)
    return t
