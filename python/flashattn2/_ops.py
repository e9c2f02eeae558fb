"""The kernels as torch.library operators, for torch.compile, torch.export and dispatch modes.

    flashattn2::fwd(q, k, v, softmax_scale, window_left, window_right, softcap=0.0,
                    alibi_slopes=None, dropout_p=0.0, rng_state=None) -> (out, lse)
    flashattn2::bwd(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
                    deterministic=False, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                    rng_state=None)
        -> (dq, dk, dv)
    flashattn2::varlen_fwd / ::varlen_bwd: the same for packed variable-length sequences
        (varlen.py; lse (nheads, total_q)); varlen_fwd also takes a block_table (paged k/v)
    flashattn2::fwd_kvcache(q, k_cache!, v_cache!, k?, v?, ...) -> (out, lse)
        (kvcache.py); writes k_cache and v_cache in place, declared in the schema so
        functionalization orders it correctly (no graph break)
    flashattn2::dropout_mask(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p)
        -> keep (bool, (batch, nheads, seqlen_q, seqlen_k))
    flashattn2::fwd_bias(q, k, v, attn_bias, softmax_scale, window_left, window_right, ...mods)
        -> (out, lse)
    flashattn2::bwd_bias(dout, q, k, v, out, lse, attn_bias, softmax_scale, window_left,
                         window_right, deterministic, bias_grad, ...mods, bias_shape=None,
                         bias_dtype=None)
        -> (dq, dk, dv, dbias)
        with an attention bias (bias.py; builds with FLASHATTN2_EXPERIMENTAL=bias):
        ``attn_bias`` is the (batch, nheads, seqlen_q, seqlen_k) view (any strides, 0 for
        broadcast dims) in fp16 / bf16 / fp32; when ``bias_grad``, dbias is the gradient of
        a bias of ``bias_shape`` and ``bias_dtype`` (the autograd node's; bias.dbias_target),
        or without them float32 (batch, nheads, seqlen_q, seqlen_k); else an empty (0,) tensor

Dropout's randomness is an input (``rng_state``, drawn by the caller), so every operator is
a pure function of its arguments.

Inputs are q, k, v (and dout, out, lse) as the checked public functions have them, any head
dim up to 256 and any strides: the CUDA implementations pad and copy what the kernels cannot
read (``_launch._forward_any`` / ``_backward_any``). Outputs are new contiguous tensors:
out like q, lse float32 ``(batch, nheads, seqlen_q)``, dq/dk/dv like q/k/v. The fake
implementations say exactly that, so traced graphs know every output's shape and strides.

The operators have no autograd formula: autograd is ``interface._FlashAttnFunc``, which
calls them only while tracing (``_checks._tracing()``); eager calls skip the dispatcher.
Per-call host time, CPU tensors and a no-op ``_C`` (torch 2.13, a shared 2-core machine,
best of 7-9 runs of 1000-2000 calls, +-10%); q, k, v (1, 16, 2, 64) fp16:

    flash_attn_func (checks included, device check skipped)  no grad | grad: fwd | fwd + bwd
      eager: launches directly (chosen)                         8.4 us |   16.4 us |  ~65 us
      eager through torch.ops.flashattn2.fwd / .bwd            11.8 us |   21.0 us |  ~85 us
    the options alone (no checks), same inputs:
      autograd.Function -> direct launch                        4.3 us |   13.6 us |   61 us
      autograd.Function -> define + impl + register_fake op     7.7 us |   17.1 us |   78 us
      define + impl + register_fake + register_autograd op     13.2 us |   38.9 us |  104 us
      torch.library.custom_op + register_autograd              15.3 us |   36.5 us |  120 us

"fwd + bwd" is the forward plus ``torch.autograd.grad``; ``_tracing()`` costs ~0.13 us.
Calling the operators directly with inputs that require grad gives no gradients (PyTorch
warns); use the flash_attn_* functions for autograd.
"""
import torch

from . import bias as bias_mod
from ._launch import _backward_any, _dropout_keep_mask, _forward_any
from .bias import bias_view
from .kvcache import _kvcache_forward
from .varlen import _varlen_backward_any, _varlen_forward_any

_MODS = "float softcap=0.0, Tensor? alibi_slopes=None, float dropout_p=0.0, Tensor? rng_state=None"
torch.library.define(
    "flashattn2::fwd",
    "(Tensor q, Tensor k, Tensor v, float softmax_scale, int window_left, int window_right, "
    + _MODS + ") -> (Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::bwd",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale,"
    " int window_left, int window_right, bool deterministic=False, " + _MODS + ")"
    " -> (Tensor, Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::fwd_bias",
    "(Tensor q, Tensor k, Tensor v, Tensor attn_bias, float softmax_scale, int window_left, "
    "int window_right, " + _MODS + ") -> (Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::bwd_bias",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor attn_bias,"
    " float softmax_scale, int window_left, int window_right, bool deterministic, bool bias_grad,"
    " " + _MODS + ", int[]? bias_shape=None, ScalarType? bias_dtype=None)"
    " -> (Tensor, Tensor, Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::dropout_mask",
    "(Tensor rng_state, int batch, int nheads, int seqlen_q, int seqlen_k, float dropout_p)"
    " -> Tensor",
)


torch.library.define(
    "flashattn2::varlen_fwd",
    "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q,"
    " int max_seqlen_k, float softmax_scale, int window_left, int window_right, " + _MODS +
    ", Tensor? block_table=None) -> (Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::varlen_bwd",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q,"
    " Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale,"
    " int window_left, int window_right, bool deterministic=False, " + _MODS + ")"
    " -> (Tensor, Tensor, Tensor)",
)
torch.library.define(
    "flashattn2::fwd_kvcache",
    "(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v,"
    " Tensor? rotary_cos, Tensor? rotary_sin, Tensor? cache_seqlens, Tensor? cache_batch_idx,"
    " Tensor? cache_leftpad, Tensor? block_table, float softmax_scale, int window_left,"
    " int window_right, bool rotary_interleaved, int num_splits, float softcap=0.0,"
    " Tensor? alibi_slopes=None) -> (Tensor, Tensor)",
)


def _fwd_cuda(q, k, v, softmax_scale, window_left, window_right, softcap=0.0, alibi_slopes=None,
              dropout_p=0.0, rng_state=None):
    out, lse = _forward_any(q, k, v, softmax_scale, window_left, window_right, softcap,
                            alibi_slopes, dropout_p, rng_state)
    return out.contiguous(), lse  # a copy only when the head dim was padded


def _bwd_cuda(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
              deterministic=False, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
              rng_state=None):
    grads = _backward_any(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
                          deterministic, softcap, alibi_slopes, dropout_p, rng_state)
    return tuple(g.contiguous() for g in grads)


def _fwd_bias_cuda(q, k, v, attn_bias, softmax_scale, window_left, window_right, softcap=0.0,
                   alibi_slopes=None, dropout_p=0.0, rng_state=None):
    attn_bias = bias_view(attn_bias, attn_bias.shape, q.dtype)  # the kernels read q's dtype
    out, lse = _forward_any(q, k, v, softmax_scale, window_left, window_right, softcap,
                            alibi_slopes, dropout_p, rng_state, attn_bias)
    return out.contiguous(), lse


def _bwd_bias_cuda(dout, q, k, v, out, lse, attn_bias, softmax_scale, window_left, window_right,
                   deterministic, bias_grad, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                   rng_state=None, bias_shape=None, bias_dtype=None):
    if bias_shape is None:
        bias_shape, bias_dtype = tuple(attn_bias.shape), torch.float32
    target, add = None, False
    if bias_grad:
        target, add = bias_mod.dbias_target(tuple(bias_shape), bias_dtype, attn_bias.shape,
                                            q.device, window_left, window_right, deterministic)
    attn_bias = bias_view(attn_bias, attn_bias.shape, q.dtype)
    grads = _backward_any(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
                          deterministic, softcap, alibi_slopes, dropout_p, rng_state, attn_bias,
                          target, dbias_add=add)  # fmt: skip
    if bias_grad:
        dbias = bias_mod.reduce_to(target, tuple(bias_shape)).to(bias_dtype).contiguous()
    else:
        dbias = q.new_empty((0,), dtype=torch.float32)
    return (*(g.contiguous() for g in grads), dbias)


def _fwd_bias_fake(q, k, v, attn_bias, *args):
    return _fwd_fake(q, k, v, *args)


def _bwd_bias_fake(dout, q, k, v, out, lse, attn_bias, softmax_scale, window_left, window_right,
                   deterministic, bias_grad, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
                   rng_state=None, bias_shape=None, bias_dtype=None):
    if bias_shape is None:
        bias_shape, bias_dtype = attn_bias.shape, torch.float32
    dbias = (attn_bias.new_empty(tuple(bias_shape), dtype=bias_dtype) if bias_grad
             else q.new_empty((0,), dtype=torch.float32))  # fmt: skip
    return (*_bwd_fake(dout, q, k, v, out, lse, softmax_scale, window_left, window_right), dbias)


def _dropout_mask_cuda(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    return _dropout_keep_mask(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p)


def _fwd_fake(q, k, v, softmax_scale, window_left, window_right, softcap=0.0, alibi_slopes=None,
              dropout_p=0.0, rng_state=None):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, window_left, window_right,
              deterministic=False, softcap=0.0, alibi_slopes=None, dropout_p=0.0,
              rng_state=None):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _varlen_fwd_cuda(q, k, v, *args):
    out, lse = _varlen_forward_any(q, k, v, *args)
    return out.contiguous(), lse


def _varlen_bwd_cuda(*args):
    return tuple(g.contiguous() for g in _varlen_backward_any(*args))


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, *args):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_bwd_fake(dout, q, k, v, *args):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _fwd_kvcache_fake(q, *args):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


def _dropout_mask_fake(rng_state, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    return rng_state.new_empty((batch, nheads, seqlen_q, seqlen_k), dtype=torch.bool)


# (torch.library.impl used as a decorator returns None, so register the named functions.)
torch.library.impl("flashattn2::fwd", "cuda")(_fwd_cuda)
torch.library.impl("flashattn2::bwd", "cuda")(_bwd_cuda)
torch.library.impl("flashattn2::dropout_mask", "cuda")(_dropout_mask_cuda)
torch.library.register_fake("flashattn2::fwd")(_fwd_fake)
torch.library.register_fake("flashattn2::bwd")(_bwd_fake)
torch.library.impl("flashattn2::varlen_fwd", "cuda")(_varlen_fwd_cuda)
torch.library.impl("flashattn2::varlen_bwd", "cuda")(_varlen_bwd_cuda)
torch.library.impl("flashattn2::fwd_kvcache", "cuda")(_kvcache_forward)
torch.library.register_fake("flashattn2::varlen_fwd")(_varlen_fwd_fake)
torch.library.register_fake("flashattn2::varlen_bwd")(_varlen_bwd_fake)
torch.library.register_fake("flashattn2::fwd_kvcache")(_fwd_kvcache_fake)
torch.library.register_fake("flashattn2::dropout_mask")(_dropout_mask_fake)
torch.library.impl("flashattn2::fwd_bias", "cuda")(_fwd_bias_cuda)
torch.library.impl("flashattn2::bwd_bias", "cuda")(_bwd_bias_cuda)
torch.library.register_fake("flashattn2::fwd_bias")(_fwd_bias_fake)
torch.library.register_fake("flashattn2::bwd_bias")(_bwd_bias_fake)
