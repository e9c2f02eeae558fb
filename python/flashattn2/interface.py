"""The flash-attn (v2) style functions: ``flash_attn_func``, its packed forms, and the
low-level ``forward`` / ``forward_with_stats`` / ``backward``. Their argument checks, and the
order they run in, are in ``_checks.py``; kernel launches and tensor preparation in
``_launch.py``.

Autograd (``_FlashAttnFunc``) saves the kernel-ready q, k, v, out and lse; the backward
makes ``dout`` kernel-ready the same way, and slices padded gradients back. Eager calls
launch the kernels directly; while torch.compile / torch.export trace, or a dispatch mode
(FakeTensorMode, FlopCounterMode, ...) is active, they go through the ``flashattn2::fwd`` /
``flashattn2::bwd`` operators of ``_ops.py`` instead (see there for why and what it costs).
"""
import torch
import torch.nn.functional as F

from . import _reference
from ._checks import (
    _FP32,
    _check_backward,
    _check_fp32,
    _check_fp32_backward,
    _check_inputs,
    _check_mod_values,
    _devices,
    _low_level_mods,
    _require_tensor,
    _scale,
    _shape_error,
    _tracing,
    _window,
)
from ._launch import (
    _alibi_ready,
    _backward_any,
    _dropout_keep_mask,
    _flash_attn_backward,
    _flash_attn_forward,
    _forward_any,
    _kernel_ready,
    _rng_state,
)


class _FlashAttnFunc(torch.autograd.Function):
    """Autograd node of the flash_attn_* functions, used only when an input requires grad.

    Takes the checked q, k, v as given and saves their kernel-ready versions (head dim padded
    to a multiple of 8). Returns the padded out, which the caller slices: returning a view
    would make out a view created in a custom Function, which autograd forbids to modify
    in place. The gradients are sliced back to the input head dim.

    Eager calls do not materialise gradients (``ctx.set_materialize_grads(False)``): else
    autograd builds a zero tensor for lse's gradient (lse is not differentiable) before every
    backward, on its device thread (benchmarks/NOTES.md, thirty-eighth session). ``dout`` is
    then None only where out got no gradient, and so are the input gradients. (Traced calls
    keep the default: Dynamo's autograd.Function context has no case for the setter.)
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
            ctx.set_materialize_grads(False)
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
        if dout is None:
            return (None,) * 11
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
