"""Context parallelism: one exact attention over a sequence sharded across ranks.

    import flashattn2.distributed as cp
    q_local = cp.shard_sequence(q, rank, world_size)          # (b, S / W, h, d), zigzag
    out_local = cp.ring_attn_func(q_local, k_local, v_local, causal=True)
    out = cp.gather_sequence(out_local)                       # (b, S, h, d) on every rank

Each rank passes its shard ``(batch, seqlen_local, heads, headdim)`` of q, k and v (same
``seqlen_local`` on every rank; k/v with ``nheads_k`` heads, GQA as in flash_attn_func) and
gets its shard of the output. Gradients flow to the local shards. The functions only use
torch.distributed collectives and point-to-point calls of ``group`` (default: the world),
so they run over NCCL within and across nodes; on CPU tensors with gloo they run the same
code with the float32 reference attention (for testing).

Three schemes, one signature:

- ``ring_attn_func``: K/V shards travel around the ring (``batch_isend_irecv`` on a side
  stream, overlapped with the attention on the shard in hand); partial results merge by
  their LSE (``flashattn2.merge``); the backward sends dK/dV around with K/V. Memory per
  rank stays O(local shard): the choice for long sequences.
- ``gather_attn_func``: all-gathers K/V, attends locally, reduce-scatters dK/dV. Moves
  (W - 1) / W of K/V once, not overlapped: good for short-to-medium sequences and GQA
  (few K/V heads).
- ``ulysses_attn_func``: all-to-all from sequence shards to head shards, single-device
  attention on ``heads / W`` heads over the whole sequence, all-to-all back. Needs
  ``nheads`` and ``nheads_k`` divisible by the world size.
Which one is fastest depends on sequence length, heads and links: see the README (measured
by benchmarks/bench_cp.py).

Sequence layout (``layout``): the sequence of length ``S = W * seqlen_local`` is sharded by
``shard_sequence`` (and put back by ``unshard_sequence`` / ``gather_sequence``) either
``"zigzag"`` (default: 2W chunks, rank r holds chunks r and 2W - 1 - r, so that with a
causal mask every rank does the same work) or ``"contiguous"``. Pass the same layout to the
attention function; it matters for causal and windowed attention.

Supported: ``causal``, ``softmax_scale``, ``window_size`` (blocks outside the window are
skipped), ``softcap``, ``deterministic`` (the kernels' deterministic backward; the merge
order is fixed by the ring, so results are reproducible run to run). Not supported:
dropout, ALiBi, packed variable-length sequences (3-D q raises NotImplementedError).

Checks: the local checks of flash_attn_func; CPU tensors on an NCCL group; and, with
``check_shards=True`` (default), one small all_gather comparing every rank's shapes, dtype,
layout and arguments (ValueError on all ranks if they differ; it waits for the GPU, so
pass ``check_shards=False`` in a training loop once the shapes are known to agree). A group
of one rank runs ``flash_attn_func`` (CUDA) directly.
"""
import torch
import torch.distributed as dist

from .. import _reference
from ..interface import flash_attn_func
from . import _common
from ._common import SchemeFunc
from ._gather import (AllToAll, gather_backward, gather_forward, heads_to_seq,
                      seq_to_heads)  # fmt: skip
from ._layout import shard_sequence, unshard_sequence
from ._ring import ring_backward, ring_forward

__all__ = [
    "gather_attn_func",
    "gather_sequence",
    "ring_attn_func",
    "shard_sequence",
    "ulysses_attn_func",
    "unshard_sequence",
]


def _single(q, k, v, causal, softmax_scale, window_size, softcap, deterministic, return_lse):
    result = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, softcap=softcap,
                             deterministic=deterministic, return_attn_probs=return_lse)
    return result[:2] if return_lse else result


def _ring(q, k, v, setup):
    return SchemeFunc.apply(q, k, v, setup, ring_forward, ring_backward)


def _gather(q, k, v, setup):
    return SchemeFunc.apply(q, k, v, setup, gather_forward, gather_backward)


def _run(func, q, k, v, group, causal, softmax_scale, window_size, softcap, deterministic,
         layout, return_lse, check_shards):
    setup, qp, kp, vp, headdim = _common.prepare(q, k, v, group, causal, softmax_scale,
                                                 window_size, softcap, deterministic, layout,
                                                 check_shards)  # fmt: skip
    if setup is None:
        return _single(q, k, v, causal, softmax_scale, window_size, softcap, deterministic,
                       return_lse)  # fmt: skip
    out, lse = func(qp, kp, vp, setup)
    if out.shape[3] != headdim:
        out = out[..., :headdim]
    return (out, lse) if return_lse else out


_DOC_ARGS = """
    Args:
        q: ``(batch, seqlen_local, nheads, headdim)``, this rank's shard of the queries
            (fp16 / bf16 on CUDA; any float dtype on the CPU with gloo).
        k, v: ``(batch, seqlen_local, nheads_k, headdim)``, this rank's shards of keys and
            values (``nheads`` a multiple of ``nheads_k``).
        group: the process group over which the sequence is sharded (default: world).
        causal, softmax_scale, window_size, softcap, deterministic: as in
            ``flash_attn_func``, for the whole sequence (positions are global).
        layout: ``"zigzag"`` or ``"contiguous"``, how the sequence was sharded
            (``shard_sequence``).
        return_lse: also return the float32 LSE ``(batch, nheads, seqlen_local)``.
        check_shards: compare every rank's shapes and arguments first (one small
            all_gather and a wait for the GPU).

    Returns:
        ``out`` ``(batch, seqlen_local, nheads, headdim)`` like q, or ``(out, lse)``.
"""


def ring_attn_func(q, k, v, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                   softcap=0.0, deterministic=False, layout="zigzag", return_lse=False,
                   check_shards=True):
    return _run(_ring, q, k, v, group, causal, softmax_scale, window_size, softcap,
                deterministic, layout, return_lse, check_shards)  # fmt: skip


def gather_attn_func(q, k, v, group=None, causal=False, softmax_scale=None,
                     window_size=(-1, -1), softcap=0.0, deterministic=False, layout="zigzag",
                     return_lse=False, check_shards=True):
    return _run(_gather, q, k, v, group, causal, softmax_scale, window_size,
                softcap, deterministic, layout, return_lse, check_shards)  # fmt: skip


def _ulysses(q, k, v, setup):
    world_size = setup.world_size
    nheads, nheads_k = q.shape[2], k.shape[2]
    if nheads % world_size or nheads_k % world_size:
        raise ValueError(
            f"ulysses_attn_func needs nheads ({nheads}) and nheads_k ({nheads_k}) divisible by "
            f"the world size ({world_size}); use ring_attn_func or gather_attn_func"
        )
    qh, kh, vh = (AllToAll.apply(t, setup, seq_to_heads, heads_to_seq) for t in (q, k, v))
    window = (setup.window_left, setup.window_right)
    if q.is_cuda:
        out_h, lse_h, _ = flash_attn_func(qh, kh, vh, softmax_scale=setup.softmax_scale,
                                          window_size=window, softcap=setup.softcap,
                                          deterministic=setup.deterministic,
                                          return_attn_probs=True)  # fmt: skip
    else:
        out_h, lse_h = _reference.attention_ref(qh, kh, vh, window_size=window,
                                                softmax_scale=setup.softmax_scale,
                                                softcap=setup.softcap)  # fmt: skip
    out = AllToAll.apply(out_h, setup, heads_to_seq, seq_to_heads)
    lse = heads_to_seq(lse_h.detach().transpose(1, 2).unsqueeze(-1).contiguous(), setup)
    return out, lse.squeeze(-1).transpose(1, 2)


def ulysses_attn_func(q, k, v, group=None, causal=False, softmax_scale=None,
                      window_size=(-1, -1), softcap=0.0, deterministic=False, layout="zigzag",
                      return_lse=False, check_shards=True):
    return _run(_ulysses, q, k, v, group, causal, softmax_scale, window_size, softcap,
                deterministic, layout, return_lse, check_shards)  # fmt: skip


ring_attn_func.__doc__ = """Ring attention on sequence shards (see the module doc).
""" + _DOC_ARGS
gather_attn_func.__doc__ = """Attention on sequence shards by all-gathering K/V and
    reduce-scattering dK/dV (see the module doc).
""" + _DOC_ARGS
ulysses_attn_func.__doc__ = """Attention on sequence shards by all-to-all between sequence and
    head shards (Ulysses; nheads and nheads_k divisible by the world size).
""" + _DOC_ARGS


def gather_sequence(x, group=None, layout="zigzag", dim=1):
    """The full sequence on every rank from the local shards ``x`` (an all_gather, then
    ``unshard_sequence``); not differentiable."""
    world_size = dist.get_world_size(group)
    x = x.contiguous()
    shards = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(shards, x, group=group)
    return unshard_sequence(shards, layout, dim)
