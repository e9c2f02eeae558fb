"""The flash-attn (v2) style functions: argument checks, tensor preparation, launch.

Checks run in a fixed order, all before any launch, so that a problem is reported the same
way whatever the device:

1. argument values: ``dropout_p`` in [0, 1), ``softcap`` >= 0, ``window_size``;
2. types (TypeError naming the argument for None, a numpy array, a list... where a tensor
   goes), ranks, dtypes, then shapes (head dim, batch, key/value shapes, ``h % h_k``, then
   ``alibi_slopes``: float32 of shape ``(nheads,)`` or ``(batch, nheads)``);
3. devices: CUDA tensors, one device (``alibi_slopes`` included), a GPU this build has code
   for (cached per device).

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

Autograd (``_FlashAttnFunc``) saves the kernel-ready q, k, v, out and lse; the backward
makes ``dout`` kernel-ready the same way, and slices padded gradients back. Eager calls
launch the kernels directly; while torch.compile / torch.export trace, or a dispatch mode
(FakeTensorMode, FlopCounterMode, ...) is active, they go through the ``flashattn2::fwd`` /
``flashattn2::bwd`` operators of ``_ops.py`` instead (see there for why and what it costs).
"""
import math
import operator

import torch
import torch.nn.functional as F

from . import _ext, _reference

_C = _ext._C  # module attribute, so tests can intercept launches

_HALF = torch.float16
_BF16 = torch.bfloat16
_FP32 = torch.float32
_CONTIGUOUS = torch.contiguous_format
_MAX_HEADDIM = 256
_FP32_MAX_HEADDIM = 128  # the float32 kernels (cpp/fp32)
_FP32_BUILD = "FLASHATTN2_EXPERIMENTAL=bias;fp32"


class Float32NotBuilt(NotImplementedError, ValueError):
    """float32 inputs in a build without the float32 kernels (FLASHATTN2_EXPERIMENTAL=fp32).
    A ValueError too, as the refusal of other dtypes is."""


def _dtype_code(dtype):
    """The kernels' dtype code (cpp/common/flash.h DType): float16 0, bfloat16 1, float32 2."""
    return 2 if dtype is _FP32 else 1 if dtype is _BF16 else 0


def _check_fp32_backward():
    """NotImplementedError for a float32 backward this build cannot run."""
    if not _ext.FP32_BWD:
        raise NotImplementedError(f"flashattn2: the float32 backward is not in this build (build "
                                  f"with {_FP32_BUILD}; the float32 forward runs)")


def _check_fp32(q, softcap=0.0, alibi_slopes=None, dropout_p=0.0, attn_bias=None):
    """NotImplementedError for what the float32 kernels do not run (a no-op for other
    dtypes): dropout and attention biases / masks (softcap and ALiBi run)."""
    if q.dtype is not _FP32:
        return
    unsupported = [name for name, on in (("dropout_p > 0", dropout_p > 0),
                                         ("attn_bias / attn_mask", attn_bias is not None)) if on]
    if unsupported:
        raise NotImplementedError(f"flashattn2: float32 inputs do not support "
                                  f"{', '.join(unsupported)} (float16 / bfloat16 do)")


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
# name, one dictionary look-up per parameter, which for these 27 cost ~6 us a call
# (scripts/host_profile.py --mock). tests/test_decode_kernel.py checks the order against the
# binding's signature.
_FWD_LAYOUT = dict(cu_seqlens_q=0, cu_seqlens_k=0, seqused_k=0, leftpad_k=0, kv_batch_idx=0,
                   block_table=0, block_table_batch_stride=0, page_size=0, num_pages=0)
_FWD_VARLEN = dict(total_q=0, total_k=0, seqlen_k_new=0)
_FWD_MODS = dict(softcap=0.0, alibi_slopes=0, alibi_batch_stride=0, rng_state=0, dropout_p=0.0)
_FWD_BIAS = dict(attn_bias=0, bias_strides=(), bias_dtype=-1)
_FWD_OPTIONAL = (tuple(_FWD_LAYOUT) + ("num_splits", "o_accum", "lse_accum") + tuple(_FWD_VARLEN)
                 + tuple(_FWD_MODS) + ("q_pack", "allow_sm90", "tile_counter") + tuple(_FWD_BIAS)
                 + ("allow_decode", "kv_l2_prefetch", "kv_issue_early"))
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
    # work) from a shared counter that starts at 0 where that pays (short tiles), else it
    # runs one CTA per tile; FLASHATTN2_SM90_TILE_WALK=counter / blocks forces either.
    tile_counter = None
    if sm90 and (window_left >= 0 or window_right >= 0 or varlen_q):
        walk = _ext.SM90_TILE_WALK
        if walk == "counter" or (walk == "auto" and _C.sm90_fwd_tile_counter(headdim, seqlen_k)):
            tile_counter = torch.zeros(1, dtype=torch.int32, device=q.device)
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
        q_pack, not _ext.FORCE_SM80, 0 if tile_counter is None else tile_counter.data_ptr(),
        *map(mods.get, _FWD_BIAS, _FWD_BIAS.values()),
        _ext.DECODE_KERNEL, _ext.DECODE_L2_PREFETCH, _ext.DECODE_ISSUE_EARLY,
    )  # fmt: skip
    _ext.last_fwd_arch, _ext.last_fwd_kernel = _ext.FWD_KERNELS[code]


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
    allocated contiguous when not given; with GQA the kernel sums dk/dv over each group.
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
    dq_accum = torch.empty(dq_accum_floats, dtype=_FP32, device=q.device)
    dsum = torch.empty(dsum_floats, dtype=_FP32, device=q.device)
    bias_args = {} if dbias is None else _dbias_args(dbias, dbias_add)
    if mods and "attn_bias" in mods:
        bias_args["bias_staged"] = _ext.BWD_BIAS_STAGED
    _ext.last_bwd_arch = _C.bwd(
        dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
        lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
        dq_accum.data_ptr(), dsum.data_ptr(), *strides, lse_strides,
        batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
        softmax_scale, window_left, window_right,
        _dtype_code(q.dtype),
        device, _ext.current_stream(device), deterministic, **varlen, **(mods or {}), **bias_args,
        dq_chains=dq_chains, allow_sm90=_allow_sm90_bwd(headdim),
    )  # fmt: skip


def _allow_sm90_bwd(headdim):
    """Whether the backward of this head dim may run the Hopper backward (_ext switches)."""
    return (_ext.SM90_BWD and not _ext.FORCE_SM80 and
            (_ext.SM90_BWD_D64 or _ext.KERNEL_HEAD_DIM[headdim] != 64))


_is_compiling = torch.compiler.is_compiling
_dispatch_mode_count = torch._C._len_torch_dispatch_stack


def _tracing():
    """True while torch.compile / torch.export trace, or under a dispatch mode (FakeTensorMode,
    FlopCounterMode, ...): the kernels must then run as the ``flashattn2::*`` operators."""
    return _is_compiling() or _dispatch_mode_count() > 0


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


def _check_backward(headdim, device):
    """NotImplementedError for a backward this build or this GPU cannot run (raised when it
    is asked for, so the forward of such inputs still works): a head dim above the build's
    backward kernels, or a d > 128 kernel on a GPU with too little shared memory per block
    (sm_86 / sm_89)."""
    padded = headdim + (-headdim % 8)
    if padded > _ext.BWD_MAX_HEAD_DIM:
        supported = (
            f"head dims up to {_ext.BWD_MAX_HEAD_DIM}" if _ext.BWD_MAX_HEAD_DIM else "no head dim"
        )
        raise NotImplementedError(
            f"flashattn2: the backward pass for head dim {headdim} is not built; this build "
            f"supports {supported} (the forward supports head dims up to {_MAX_HEADDIM})"
        )
    # Kernels up to d128 fit every sm_80+ GPU: no device query on their path.
    shortfall = (_ext.backward_smem_shortfall(device.index, padded)
                 if _ext.KERNEL_HEAD_DIM[padded] > 128 else None)  # fmt: skip
    if shortfall is not None:
        need, limit = shortfall
        raise NotImplementedError(
            f"flashattn2: the backward pass for head dim {headdim} needs {need} bytes "
            f"({need / 1024:.1f} KiB) of shared memory per block; GPU {device.index} allows "
            f"{limit} ({limit / 1024:.1f} KiB). Head dims above 128 need an sm_80 or sm_90 "
            f"class GPU (e.g. A100, H100); the forward runs on this GPU"
        )


class _FlashAttnFunc(torch.autograd.Function):
    """Autograd node of the flash_attn_* functions, used only when an input requires grad.

    Takes the checked q, k, v as given and saves their kernel-ready versions (head dim padded
    to a multiple of 8). Returns the padded out, which the caller slices: returning a view
    would make out a view created in a custom Function, which autograd forbids to modify
    in place. The gradients are sliced back to the input head dim.
    """

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, window_left, window_right, deterministic, softcap,
                alibi_slopes, dropout_p, rng_state):
        headdim = q.shape[3]
        pad = -headdim % 8
        mods = (softcap, alibi_slopes, dropout_p, rng_state)
        if _tracing():
            if pad:
                q, k, v = F.pad(q, (0, pad)), F.pad(k, (0, pad)), F.pad(v, (0, pad))
            out, lse = torch.ops.flashattn2.fwd(q, k, v, softmax_scale, window_left, window_right,
                                                *mods)  # fmt: skip
        else:
            q, k, v = _kernel_ready(q, pad), _kernel_ready(k, pad), _kernel_ready(v, pad)
            alibi_slopes = _alibi_ready(alibi_slopes)
            out, lse = _flash_attn_forward(q, k, v, softmax_scale, window_left, window_right,
                                           softcap=softcap, alibi_slopes=alibi_slopes,
                                           dropout_p=dropout_p, rng_state=rng_state)  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
        ctx.mark_non_differentiable(lse)
        ctx.softmax_scale = softmax_scale
        ctx.window_left = window_left
        ctx.window_right = window_right
        ctx.deterministic = deterministic
        ctx.softcap = softcap
        ctx.dropout_p = dropout_p
        ctx.headdim = headdim
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        headdim = ctx.headdim
        q, k, v, out, lse, alibi_slopes, rng_state = ctx.saved_tensors
        if q.dtype is not _FP32:  # (float32: _flash_attn_backward checks its own kernels)
            _check_backward(headdim, q.device)
        args = (dout, q, k, v, out, lse, ctx.softmax_scale, ctx.window_left, ctx.window_right,
                ctx.deterministic)
        mods = dict(softcap=ctx.softcap, alibi_slopes=alibi_slopes, dropout_p=ctx.dropout_p,
                    rng_state=rng_state)
        if _tracing():
            dq, dk, dv = torch.ops.flashattn2.bwd(*args, **mods)
        else:
            dq, dk, dv = _flash_attn_backward(*args, **mods)
        if q.shape[3] != headdim:
            dq, dk, dv = dq[..., :headdim], dk[..., :headdim], dv[..., :headdim]
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _real(name, value):
    """``value`` as a float; ValueError naming ``name`` for anything that is not a real number."""
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number; got {value!r}") from None


def _check_mod_values(dropout_p, softcap, softmax_scale=None):
    """``(dropout_p, softcap)`` as floats after the value checks (step 1 of the module doc);
    ``softmax_scale`` must be None or positive and finite."""
    if softmax_scale is not None:
        scale = _real("softmax_scale", softmax_scale)
        if not 0.0 < scale < math.inf:
            raise ValueError(f"softmax_scale must be positive and finite (or None); got "
                             f"{softmax_scale!r}")
    dropout_p = _real("dropout_p", dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p!r}")
    softcap = _real("softcap", softcap)
    if not 0.0 <= softcap < math.inf:
        raise ValueError(f"softcap must be >= 0 and finite (0 disables it); got {softcap!r}")
    return dropout_p, softcap


def _require_tensor(name, value, what="a torch.Tensor"):
    """TypeError naming the argument when ``value`` is not a tensor (None, a numpy array...)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be {what}; got {type(value).__name__}")


def _check_alibi_shape(alibi_slopes, batch, nheads):
    """dtype and shape of ``alibi_slopes`` (None passes): float32 ``(h,)`` or ``(b, h)``."""
    if alibi_slopes is None:
        return
    _require_tensor("alibi_slopes", alibi_slopes, "a float32 tensor or None")
    if alibi_slopes.dtype is not _FP32:
        raise ValueError(f"alibi_slopes must be float32; got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
            f"({batch}, {nheads}); got {tuple(alibi_slopes.shape)}"
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


def _scale(q, softmax_scale):
    """``softmax_scale`` (checked by ``_check_mod_values``) as a float; ``None`` means
    ``headdim ** -0.5``."""
    return q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)


def _shape_error(name, expected, tensor):
    return ValueError(f"{name} must have shape {expected}; got {tuple(tensor.shape)}")


def _check_qkv_shapes(q, k, v):
    """Type, rank, dtype and shape checks of q, k and v."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            what = "(batch, seqlen_q, nheads, headdim)" if name == "q" else (
                "(batch, seqlen_k, nheads_k, headdim)")
            raise _shape_error(name, what, t)
    dtype = _check_dtypes(q, k, v)
    batch, _, nheads, headdim = q.shape
    if headdim == 0 or headdim > _MAX_HEADDIM:
        raise ValueError(
            f"FlashAttention forward only supports head dimension at most {_MAX_HEADDIM} "
            f"(and at least 1); got {headdim}"
        )
    kernel_headdim = _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)]
    if kernel_headdim < 0 and dtype is not _FP32:
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


def _check_dtypes(q, k, v):
    """q's dtype, after the dtype checks of q, k and v (float32: built, and a head dim its
    kernels take); shared by the dense and the varlen functions."""
    dtype = q.dtype
    if dtype is _FP32:
        if "fp32" not in _ext.EXPERIMENTAL:
            raise Float32NotBuilt(
                f"FlashAttention only supports fp16 and bf16 data type; got q {dtype} (float32 "
                f"needs the float32 kernels: build with {_FP32_BUILD})")
    elif dtype is not _HALF and dtype is not _BF16:
        raise ValueError(f"FlashAttention only supports fp16 and bf16 data type; got q {dtype}")
    if k.dtype is not dtype:
        raise ValueError(f"query and key must have the same dtype; got q {dtype}, k {k.dtype}")
    if v.dtype is not dtype:
        raise ValueError(f"query and value must have the same dtype; got q {dtype}, v {v.dtype}")
    headdim = q.shape[-1]
    if dtype is _FP32 and (headdim % 8 or not 0 < headdim <= _FP32_MAX_HEADDIM):
        raise ValueError(f"flashattn2: float32 supports head dims that are multiples of 8 up to "
                         f"{_FP32_MAX_HEADDIM}; got {headdim}")
    return dtype


def _check_devices(*named, tracing=None):
    """``named``: (name, tensor) pairs, all on one CUDA device that this build can run on.
    ``tracing``: ``_tracing()``, if the caller has it already."""
    for name, t in named:
        if not t.is_cuda:
            raise ValueError(f"flashattn2 needs CUDA tensors; got {name} on {t.device}")
    device = named[0][1].get_device()
    for _, t in named:
        if t.get_device() != device:
            names = [name for name, _ in named]
            raise ValueError(
                f"{', '.join(names[:-1])} and {names[-1]} must be on the same device; got "
                + ", ".join(f"{name} on {t.device}" for name, t in named)
            )
    if not (_tracing() if tracing is None else tracing):
        _ext.check_device(device)  # (traced, maybe on a machine without GPU: the launch checks)


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


def _check_inputs(q, k, v, alibi_slopes, attn_bias=None, softcap=0.0, dropout_p=0.0):
    """Shapes (alibi_slopes and attn_bias included; float32: the features it lacks), then
    devices: steps 2 and 3 of the module doc."""
    _check_qkv_shapes(q, k, v)
    _check_fp32(q, softcap, alibi_slopes, dropout_p, attn_bias)
    _check_alibi_shape(alibi_slopes, q.shape[0], q.shape[2])
    named = [("q", q), ("k", k), ("v", v)]
    if alibi_slopes is not None:
        named.append(("alibi_slopes", alibi_slopes))
    if attn_bias is not None:
        from .bias import check_bias

        check_bias(attn_bias, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
        named.append(("attn_bias", attn_bias))
    _check_devices(*named)


def _attention(q, k, v, softmax_scale, window_left, window_right, deterministic,
               return_attn_probs, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
               attn_bias=None):  # fmt: skip
    """Checked inputs in, flash-attn style result out."""
    _check_fp32(q, softcap, alibi_slopes, dropout_p, attn_bias)
    softmax_scale = _scale(q, softmax_scale)
    # flash-attn treats a window bound >= seqlen_k as unbounded.
    seqlen_k = k.shape[1]
    if window_left >= seqlen_k:
        window_left = -1
    if window_right >= seqlen_k:
        window_right = -1
    if attn_bias is None:
        out, lse, rng_state = _run(q, k, v, softmax_scale, window_left, window_right,
                                   deterministic, softcap, alibi_slopes, dropout_p)  # fmt: skip
    else:
        from .bias import run_with_bias

        out, lse, rng_state = run_with_bias(q, k, v, attn_bias, softmax_scale, window_left,
                                            window_right, deterministic, softcap, alibi_slopes,
                                            dropout_p)  # fmt: skip
    if not return_attn_probs:
        return out
    probs = None
    if dropout_p > 0:
        probs = _dropped_probs(q, k, softmax_scale, window_left, window_right, softcap,
                               alibi_slopes, dropout_p, rng_state)  # fmt: skip
    return out, lse, probs


def _run(q, k, v, softmax_scale, window_left, window_right, deterministic, softcap=0.0,
         alibi_slopes=None, dropout_p=0.0):
    """``(out, lse, rng_state)`` for checked inputs and a float ``softmax_scale``, window bounds
    taken as they are (the kernels' convention, ``cpp/common/flash.h``); autograd when an
    input requires grad, the operators while tracing, else a direct launch."""
    rng_state = _rng_state(q.device) if dropout_p > 0 else None
    mods = (softcap, alibi_slopes, dropout_p, rng_state)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _FlashAttnFunc.apply(
            q, k, v, softmax_scale, window_left, window_right, deterministic, *mods
        )
        if out.shape[3] != q.shape[3]:
            out = out[..., : q.shape[3]]
    elif _tracing():
        out, lse = torch.ops.flashattn2.fwd(q, k, v, softmax_scale, window_left, window_right,
                                            *mods)  # fmt: skip
    else:
        out, lse = _forward_any(q, k, v, softmax_scale, window_left, window_right, *mods)
    return out, lse, rng_state


def _sdmask_block_n(headdim):
    """The key block of flash-attn v2's forward with dropout, by head dim (the same on every
    GPU; its ``flash_attn_interface._get_block_size_n(..., is_dropout=True, ...)``), which
    sets the running maxes its ``S_dmask`` values are relative to."""
    return 128 if headdim <= 32 else 32 if 96 < headdim <= 128 else 64


def _dropped_probs(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                   dropout_p, rng_state):  # fmt: skip
    """flash-attn's ``S_dmask`` for testing, in its convention: the unnormalised
    probabilities ``exp(logit - m)`` in q's dtype, ``(batch, nheads, seqlen_q, seqlen_k)``,
    with m the running row max of flash-attn's forward after the key block of the element
    (``_reference.blockwise_probs``, blocks of ``_sdmask_block_n(headdim)`` keys), negated
    where dropout dropped the element (so the sign bit is the mask, dropped zeros included:
    ``torch.signbit(probs)`` = dropped). Computed in float32 with plain torch from q and k
    (memory ``O(b h sq sk)``); the keep mask comes from the kernels' own Philox code."""
    batch, seqlen_q, nheads, headdim = q.shape
    probs = _reference.blockwise_probs(
        q.detach(), k.detach(), _sdmask_block_n(headdim), window_size=(window_left, window_right),
        softmax_scale=softmax_scale, softcap=softcap, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    keep = _dropout_keep_mask(rng_state, batch, nheads, seqlen_q, k.shape[1], dropout_p)
    return torch.where(keep, probs, -probs).to(q.dtype)


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
    *,
    attn_bias=None,
):
    """Scaled dot-product attention, flash-attn v2 interface.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k, v: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device; ``nheads``
            must be a multiple of ``nheads_k`` (GQA / MQA).
        dropout_p: dropout probability in [0, 1) applied to the attention probabilities
            (outputs scaled by ``1 / (1 - dropout_p)``); pass 0.0 in evaluation. The mask is
            drawn from torch's CUDA generator (reproducible under ``torch.manual_seed``).
        softmax_scale: multiplies ``q @ k^T``; default ``headdim ** -0.5``.
        causal: key j is visible to query i only if ``j <= i + seqlen_k - seqlen_q``
            (bottom-right aligned); overrides the right bound of ``window_size`` with 0.
        window_size: ``(left, right)``; key j is visible to query i only if
            ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``;
            -1 (or a bound >= seqlen_k) is unbounded.
        softcap: > 0 caps the logits: ``softcap * tanh(softmax_scale * q.k / softcap)``
            (the softmax then uses scale 1); 0.0 disables it.
        alibi_slopes: None, or float32 ``(nheads,)`` / ``(batch, nheads)`` on q's device:
            adds ``-slope * |i + seqlen_k - seqlen_q - j|`` to the (capped) logit of query i,
            key j (bottom-right aligned like causal). No gradient flows to the slopes.
        deterministic: make the backward's dq bitwise reproducible (ordered accumulation;
            a little slower; without a right window bound, i.e. not causal, it uses up to 4
            float32 dq accumulators instead of one). The forward is always deterministic.
        return_attn_probs: also return the log-sum-exp of each row and, with dropout, the
            probabilities (for testing).
        attn_bias: keyword only, None or a tensor broadcastable to ``(batch, nheads,
            seqlen_q, seqlen_k)`` (float16 / bfloat16 / float32, added to the logits after
            softcap and ALiBi; or bool, True = attend), differentiable. Needs the bias
            kernels (``FLASHATTN2_EXPERIMENTAL=bias``, the default; ``bias.py``): builds
            without them raise NotImplementedError; not with ``return_attn_probs`` and dropout.

    Returns:
        ``out`` like q, or ``(out, softmax_lse, S_dmask)`` when ``return_attn_probs``:
        ``softmax_lse`` float32 ``(batch, nheads, seqlen_q)`` (of the undropped softmax);
        ``S_dmask`` None without dropout, else, as flash-attn returns it, the unnormalised
        probabilities ``(batch, nheads, seqlen_q, seqlen_k)`` in q's dtype: ``exp(logit_ij -
        m_ij)`` with m_ij the max of row i's logits over the keys from j's block of N keys to
        the end (flash-attn's running max; N = 128 for head dims <= 32, 32 for 97-128, else
        64, as its ``_get_block_size_n`` with dropout), negated where dropout dropped the
        element (the sign bit is the mask; computed with plain torch, O(b·h·sq·sk) memory).
        Rows that see no key give out = 0 and lse = +inf.

    Autograd: differentiable in q, k and v (not through ``softmax_lse``), for every head
    dim up to 256 (``build_info()["bwd_head_dims"]``). The backward of head dims above 128
    needs an sm_80 / sm_90 class GPU (A100, H100: 144.5 KiB of shared memory per block at
    d256); on sm_86 / sm_89 it raises NotImplementedError (the forward works there).
    """
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    _check_inputs(q, k, v, alibi_slopes, attn_bias, softcap, dropout_p)
    if attn_bias is not None and return_attn_probs and dropout_p > 0:
        raise NotImplementedError("flashattn2: return_attn_probs with dropout and attn_bias")
    return _attention(q, k, v, softmax_scale, window_left, window_right, deterministic,
                      return_attn_probs, softcap, alibi_slopes, dropout_p, attn_bias)  # fmt: skip


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
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    _require_tensor("qkv", qkv)
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise _shape_error("qkv", "(batch, seqlen, 3, nheads, headdim)", qkv)
    q, k, v = qkv.unbind(2)
    _check_inputs(q, k, v, alibi_slopes, softcap=softcap, dropout_p=dropout_p)
    return _attention(q, k, v, softmax_scale, window_left, window_right, deterministic,
                      return_attn_probs, softcap, alibi_slopes, dropout_p)  # fmt: skip


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
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    window_left, window_right = _window(window_size, causal)
    _require_tensor("kv", kv)
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise _shape_error("kv", "(batch, seqlen_k, 2, nheads_k, headdim)", kv)
    k, v = kv.unbind(2)
    _check_inputs(q, k, v, alibi_slopes, softcap=softcap, dropout_p=dropout_p)
    return _attention(q, k, v, softmax_scale, window_left, window_right, deterministic,
                      return_attn_probs, softcap, alibi_slopes, dropout_p)  # fmt: skip


# ---- low-level entry points: no autograd, for code that drives forward and backward itself ----


def forward(q, k, v, causal=False, softmax_scale=None, softcap=0.0, alibi_slopes=None,
            dropout_p=0.0, rng_state=None):
    """Attention output ``softmax(q @ k^T * softmax_scale) @ v``; no autograd graph.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k, v: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device, ``nheads`` a
            multiple of ``nheads_k``.
        causal: bottom-right aligned causal mask, as in ``flash_attn_func``.
        softmax_scale: default ``headdim ** -0.5``.
        softcap, alibi_slopes, dropout_p: as in ``flash_attn_func``.
        rng_state: dropout's (seed, offset), int64 ``(2,)`` on q's device; drawn from torch's
            CUDA generator when None.

    Returns:
        ``out`` like q. Use ``flash_attn_func`` for autograd; use ``forward_with_stats`` and
        ``backward`` to run the backward pass yourself.
    """
    dropout_p, _ = _check_mod_values(dropout_p, softcap, softmax_scale)
    if dropout_p > 0 and rng_state is None:
        _check_inputs(q, k, v, alibi_slopes)
        rng_state = _rng_state(q.device)
    return forward_with_stats(q, k, v, causal, softmax_scale, softcap, alibi_slopes, dropout_p,
                              rng_state)[0]  # fmt: skip


def _check_rng_state(rng_state, dropout_p):
    """With dropout, ``rng_state`` must be an int64 ``(2,)`` tensor (the device is checked with
    the other tensors)."""
    if dropout_p == 0:
        return
    if rng_state is not None:
        _require_tensor("rng_state", rng_state, "an int64 tensor (seed, offset) or None")
    if rng_state is None:
        raise ValueError(
            "dropout_p > 0 needs rng_state, an int64 tensor (seed, offset) of shape (2,) on q's "
            "device; pass the same one to forward_with_stats and backward"
        )
    if rng_state.dtype is not torch.int64 or tuple(rng_state.shape) != (2,):
        raise ValueError(
            f"rng_state must be int64 of shape (2,); got {rng_state.dtype} {tuple(rng_state.shape)}"
        )


def _low_level_mods(q, k, v, softcap, alibi_slopes, dropout_p, rng_state, softmax_scale):
    """Checks of the low-level functions (module doc order); returns ``(dropout_p, softcap,
    rng_state)``, rng_state None without dropout."""
    dropout_p, softcap = _check_mod_values(dropout_p, softcap, softmax_scale)
    _check_qkv_shapes(q, k, v)
    _check_fp32(q, softcap, alibi_slopes, dropout_p)
    _check_alibi_shape(alibi_slopes, q.shape[0], q.shape[2])
    _check_rng_state(rng_state, dropout_p)
    return dropout_p, softcap, (rng_state if dropout_p > 0 else None)


def _devices(q, k, v, alibi_slopes, rng_state, others=()):
    named = [("q", q), ("k", k), ("v", v), *others]
    if alibi_slopes is not None:
        named.append(("alibi_slopes", alibi_slopes))
    if rng_state is not None:
        named.append(("rng_state", rng_state))
    _check_devices(*named)


def forward_with_stats(q, k, v, causal=False, softmax_scale=None, softcap=0.0, alibi_slopes=None,
                       dropout_p=0.0, rng_state=None):
    """``forward`` that also returns the softmax statistics the backward needs.

    With ``dropout_p > 0``, ``rng_state`` (int64 ``(2,)`` on q's device, e.g.
    ``torch.randint(2**62, (2,), dtype=torch.int64, device=q.device)``) is required: pass the
    same tensor to ``backward``.

    Returns:
        ``(out, lse)``: out like q, lse float32 ``(batch, nheads, seqlen_q)``, the natural
        log of each row's softmax denominator ``log(sum_j exp(logit_ij))`` (logit =
        ``q_i . k_j * softmax_scale`` unless softcap / ALiBi change it; undropped) (+inf for
        rows that see no key, whose out is 0).
    """
    dropout_p, softcap, rng_state = _low_level_mods(q, k, v, softcap, alibi_slopes, dropout_p,
                                                    rng_state, softmax_scale)  # fmt: skip
    _devices(q, k, v, alibi_slopes, rng_state)
    args = (q, k, v, _scale(q, softmax_scale), -1, 0 if causal else -1, softcap, alibi_slopes,
            dropout_p, rng_state)
    return torch.ops.flashattn2.fwd(*args) if _tracing() else _forward_any(*args)


def backward(q, k, v, o, lse, dout, causal=False, softmax_scale=None, deterministic=False,
             softcap=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Gradients of attention with respect to q, k and v; no autograd graph.

    Args:
        q, k, v, causal, softmax_scale, softcap, alibi_slopes, dropout_p, rng_state: as given
            to ``forward_with_stats``.
        o, lse: what ``forward_with_stats`` returned for them (o like q; lse float32
            ``(batch, nheads, seqlen_q)``).
        dout: the gradient of the loss with respect to o, like q.
        deterministic: bitwise-reproducible dq (ordered accumulation; a little slower).

    Returns:
        ``(dq, dk, dv)`` like q, k, v (with GQA, dk and dv summed over the query heads that
        share each key/value head).

    Raises:
        ValueError for inconsistent inputs; NotImplementedError for head dims above the
        largest backward head dim of this build (``build_info()["bwd_head_dims"]``), or
        above 128 on a GPU with too little shared memory per block (sm_86 / sm_89).
    """
    dropout_p, softcap, rng_state = _low_level_mods(q, k, v, softcap, alibi_slopes, dropout_p,
                                                    rng_state, softmax_scale)  # fmt: skip
    for name, t in (("o", o), ("lse", lse), ("dout", dout)):
        _require_tensor(name, t)
    for name, t in (("o", o), ("dout", dout)):
        if t.dtype is not q.dtype:
            raise ValueError(f"{name} must have the dtype of q ({q.dtype}); got {t.dtype}")
        if t.shape != q.shape:
            raise _shape_error(name, f"{tuple(q.shape)} (the shape of q)", t)
    batch, seqlen_q, nheads, headdim = q.shape
    if lse.dtype is not _FP32:
        raise ValueError(f"lse must be float32 (the lse of forward_with_stats); got {lse.dtype}")
    if lse.shape != (batch, nheads, seqlen_q):
        raise _shape_error("lse", f"(batch, nheads, seqlen_q) = {(batch, nheads, seqlen_q)}", lse)
    _devices(q, k, v, alibi_slopes, rng_state, (("o", o), ("lse", lse), ("dout", dout)))
    if q.dtype is _FP32:
        _check_fp32_backward()
    else:
        _check_backward(headdim, q.device)
    args = (dout, q, k, v, o, lse, _scale(q, softmax_scale), -1, 0 if causal else -1,
            bool(deterministic), softcap, alibi_slopes, dropout_p, rng_state)
    return torch.ops.flashattn2.bwd(*args) if _tracing() else _backward_any(*args)
