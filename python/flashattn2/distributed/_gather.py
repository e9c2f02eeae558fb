"""The all-gather and Ulysses schemes.

All-gather K/V (as in Llama 3's context parallelism): every rank gathers the whole K and
V (only the K/V heads: cheap with GQA), puts them in sequence order, and attends each of
its query segments to the key range that segment can see (one kernel call per segment, no
merge). The backward gathers K/V again (nothing but the local shards is kept between the
passes), sums dK/dV over the segments in float32 and reduce-scatters them back to the
owners (in float32).

Ulysses (DeepSpeed-Ulysses): an all-to-all turns the sequence shards of all heads into the
whole sequence of ``heads / world_size`` heads; each rank runs single-device attention on
its heads; a second all-to-all turns the output back. The backward is the same with the
all-to-alls reversed. Needs query and K/V heads divisible by the world size.
"""
import torch
import torch.distributed as dist

from . import _layout

_FP32 = torch.float32


def _all_gather_seq(x, setup):
    """The whole sequence ``(b, S, ...)`` from every rank's shard ``x`` ``(b, s, ...)``."""
    world_size = setup.world_size
    if x.is_cuda:
        gathered = torch.empty((world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(gathered, x, group=setup.group)
        shards = list(gathered.unbind(0))
    else:
        shards = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(shards, x, group=setup.group)
    return _layout.unshard_sequence(shards, setup.layout)


def _reduce_scatter_seq(full, setup):
    """This rank's shard of the sum over ranks of ``full`` ``(b, S, ...)``."""
    world_size, layout = setup.world_size, setup.layout
    stacked = torch.stack([_layout.shard_sequence(full, r, world_size, layout)
                           for r in range(world_size)])  # fmt: skip
    if full.is_cuda:
        out = torch.empty(stacked.shape[1:], dtype=full.dtype, device=full.device)
        dist.reduce_scatter_tensor(out, stacked, group=setup.group)
        return out
    dist.all_reduce(stacked, group=setup.group)  # gloo has no reduce_scatter in torch 2.4
    return stacked[setup.rank]


def _segment_plans(setup, seqlen_local):
    """(local start, length, k0, k1, left, right) for each query segment against the whole
    sequence; every row sees at least itself."""
    total = setup.world_size * seqlen_local
    plans = []
    for local, start, length in setup.segments(setup.rank, seqlen_local):
        plan = _layout.block_plan(start, length, 0, total, setup.window_left, setup.window_right)
        q0, q1, k0, k1, left, right = plan
        assert (q0, q1) == (0, length), "every query row sees at least its own key"
        plans.append((local, length, k0, k1, left, right))
    return plans


def gather_forward(q, k, v, setup):
    k_full, v_full = _all_gather_seq(k, setup), _all_gather_seq(v, setup)
    batch, seqlen, nheads, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, nheads, seqlen, dtype=_FP32, device=q.device)
    for local, length, k0, k1, left, right in _segment_plans(setup, seqlen):
        rows = slice(local, local + length)
        out_s, lse_s = setup.blocks.fwd(q[:, rows], k_full[:, k0:k1], v_full[:, k0:k1],
                                        setup.softmax_scale, left, right, setup.softcap)
        out[:, rows] = out_s
        lse[:, :, rows] = lse_s
    return out, lse


def gather_backward(dout, q, k, v, out, lse, setup):
    k_full, v_full = _all_gather_seq(k, setup), _all_gather_seq(v, setup)
    dq = torch.empty_like(q)
    dk_full = torch.zeros(k_full.shape, dtype=_FP32, device=k.device)
    dv_full = torch.zeros(v_full.shape, dtype=_FP32, device=v.device)
    for local, length, k0, k1, left, right in _segment_plans(setup, q.shape[1]):
        rows = slice(local, local + length)
        dq_s, dk_s, dv_s = setup.blocks.bwd(dout[:, rows], q[:, rows], k_full[:, k0:k1],
                                            v_full[:, k0:k1], out[:, rows], lse[:, :, rows],
                                            setup.softmax_scale, left, right, setup.softcap,
                                            setup.deterministic)  # fmt: skip
        dq[:, rows] = dq_s
        dk_full[:, k0:k1] += dk_s
        dv_full[:, k0:k1] += dv_s
    dk = _reduce_scatter_seq(dk_full, setup)
    dv = _reduce_scatter_seq(dv_full, setup)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


# ---- Ulysses -----------------------------------------------------------------------------


def seq_to_heads(x, setup):
    """``(b, s, H, d)`` sequence shards -> ``(b, S, H / W, d)``: the whole sequence of this
    rank's group of heads (heads ``[rank * H / W, (rank + 1) * H / W)``)."""
    world_size = setup.world_size
    batch, seqlen, heads, headdim = x.shape
    send = x.reshape(batch, seqlen, world_size, heads // world_size, headdim)
    send = send.permute(2, 0, 1, 3, 4).contiguous()  # (W, b, s, H / W, d): [i] goes to rank i
    recv = torch.empty_like(send)  # [i]: rank i's sequence shard of this rank's heads
    dist.all_to_all_single(recv, send, group=setup.group)
    return _layout.unshard_sequence(list(recv.unbind(0)), setup.layout)


def heads_to_seq(y, setup):
    """Inverse of ``seq_to_heads``: ``(b, S, H / W, d)`` -> ``(b, s, H, d)``."""
    world_size, layout = setup.world_size, setup.layout
    send = torch.stack([_layout.shard_sequence(y, r, world_size, layout)
                        for r in range(world_size)])  # fmt: skip
    recv = torch.empty_like(send)  # [i]: this rank's sequence shard of rank i's heads
    dist.all_to_all_single(recv, send, group=setup.group)
    _, batch, seqlen, heads_local, headdim = recv.shape
    return recv.permute(1, 2, 0, 3, 4).reshape(batch, seqlen, world_size * heads_local, headdim)


class AllToAll(torch.autograd.Function):
    """``there(x, setup)``, one of seq_to_heads / heads_to_seq; its gradient goes ``back``
    through the other."""

    @staticmethod
    def forward(ctx, x, setup, there, back):
        ctx.setup, ctx.back = setup, back
        return there(x, setup)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad.contiguous(), ctx.setup), None, None, None
