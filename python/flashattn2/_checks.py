"""Argument checks of the flash-attn style functions (interface.py), shared with varlen.py,
kvcache.py, sdpa.py, bias.py and distributed/.

Checks run in a fixed order, all before any launch, so that a problem is reported the same
way whatever the device:

1. argument values: ``dropout_p`` in [0, 1), ``softcap`` >= 0, ``window_size``;
2. types (TypeError naming the argument for None, a numpy array, a list... where a tensor
   goes), ranks, dtypes, then shapes (head dim, batch, key/value shapes, ``h % h_k``, then
   ``alibi_slopes``: float32 of shape ``(nheads,)`` or ``(batch, nheads)``);
3. devices: CUDA tensors, one device (``alibi_slopes`` included), a GPU this build has code
   for (cached per device).
"""
import math
import operator

import torch

from . import _ext

_HALF = torch.float16
_BF16 = torch.bfloat16
_FP32 = torch.float32
_CONTIGUOUS = torch.contiguous_format
_MAX_HEADDIM = 256
_FP32_MAX_HEADDIM = 128  # the float32 kernels (cpp/fp32)
_FP32_BUILD = "FLASHATTN2_EXPERIMENTAL including fp32 (default: bias;decode;fp32;fp32wg)"


class Float32NotBuilt(NotImplementedError, ValueError):
    """float32 inputs in a build without the float32 kernels (FLASHATTN2_EXPERIMENTAL=fp32).
    A ValueError too, as the refusal of other dtypes is."""


def _check_fp32_backward():
    """NotImplementedError for a float32 backward this build cannot run."""
    if not _ext.FP32_BWD:
        raise NotImplementedError(f"flashattn2: the float32 backward is not in this build (build "
                                  f"with {_FP32_BUILD}; the float32 forward runs)")


def _check_fp32_built(name="q"):
    """Float32NotBuilt, naming the build option, in a build without the float32 kernels
    (``name``: the argument that is float32)."""
    if "fp32" not in _ext.EXPERIMENTAL:
        raise Float32NotBuilt(
            f"FlashAttention only supports fp16 and bf16 data type; got {name} {_FP32} (float32 "
            f"needs the float32 kernels: build with {_FP32_BUILD})")


def _check_fp32(q, softcap=0.0, alibi_slopes=None, dropout_p=0.0, attn_bias=None, also=""):
    """NotImplementedError for what the float32 kernels do not run (a no-op for other
    dtypes): dropout and attention biases / masks (softcap and ALiBi run). ``also``: what
    else runs them, added to the message after float16 / bfloat16."""
    if q.dtype is not _FP32:
        return
    unsupported = [name for name, on in (("dropout_p > 0", dropout_p > 0),
                                         ("attn_bias / attn_mask", attn_bias is not None)) if on]
    if unsupported:
        raise NotImplementedError(f"flashattn2: float32 inputs do not support "
                                  f"{', '.join(unsupported)} (float16 / bfloat16 do{also})")


_is_compiling = torch.compiler.is_compiling
_dispatch_mode_count = torch._C._len_torch_dispatch_stack


def _tracing():
    """True while torch.compile / torch.export trace, or under a dispatch mode (FakeTensorMode,
    FlopCounterMode, ...): the kernels must then run as the ``flashattn2::*`` operators."""
    return _is_compiling() or _dispatch_mode_count() > 0


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
    kernels take once padded to a multiple of 8, as every dtype's is); shared by the dense and
    the varlen functions."""
    dtype = q.dtype
    if dtype is _FP32:
        _check_fp32_built()
    elif dtype is not _HALF and dtype is not _BF16:
        raise ValueError(f"FlashAttention only supports fp16 and bf16 data type; got q {dtype}")
    if k.dtype is not dtype:
        raise ValueError(f"query and key must have the same dtype; got q {dtype}, k {k.dtype}")
    if v.dtype is not dtype:
        raise ValueError(f"query and value must have the same dtype; got q {dtype}, v {v.dtype}")
    headdim = q.shape[-1]
    if dtype is _FP32 and not 0 < headdim <= _FP32_MAX_HEADDIM:
        raise ValueError(f"flashattn2: float32 supports head dims up to {_FP32_MAX_HEADDIM}; "
                         f"got {headdim}")
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
