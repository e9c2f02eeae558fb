"""Ring attention: K/V blocks travel around the ring of ranks while each rank attends its
queries to the block in hand.

Forward, on rank r of W: at step t it holds the K/V shard of rank (r - t) mod W. It starts
sending that shard to rank r + 1 (and receiving the next from rank r - 1), then attends its
query segments to the key segments it holds (``_layout.local_blocks``: skipped where no
query sees a key, e.g. above the causal diagonal or outside the window) and merges each
partial (out, lse) into float32 accumulators by LSE, then waits for the transfer. After W
steps out is cast to the input dtype. The merge order is fixed (ring order, then block
order), so the forward is deterministic.

Backward: the same walk, with dK/dV accumulators for each K/V shard travelling one step
behind it: at step t a rank adds its share of the gradients of the shard in hand (FA2
backward with the final out and LSE, so exactly the forward's probabilities) to the
accumulator that rank r - 1 finished at step t - 1. After the last step one more hop
returns each accumulator to the shard's owner. dQ stays local. dK/dV travel in float32.
"""
import torch

from . import _layout
from ._common import Ring

_FP32 = torch.float32


def _block_list(setup, seqlen_local, src):
    """This rank's queries against rank ``src``'s keys: local (q0, q1, k0, k1, left, right)."""
    return _layout.local_blocks(setup.segments(setup.rank, seqlen_local),
                                setup.segments(src, seqlen_local),
                                setup.window_left, setup.window_right)  # fmt: skip


def ring_forward(q, k, v, setup):
    """``(out, lse)`` of the local queries against the whole sequence (no autograd)."""
    batch, seqlen, nheads, headdim = q.shape
    world_size, rank, blocks = setup.world_size, setup.rank, setup.blocks
    acc_out = torch.zeros(q.shape, dtype=_FP32, device=q.device)
    acc_lse = torch.full((batch, nheads, seqlen), float("-inf"), dtype=_FP32, device=q.device)
    ring = Ring(setup, q.is_cuda) if world_size > 1 else None
    k_cur, v_cur = k, v
    for step in range(world_size):
        src = (rank - step) % world_size
        reqs = None
        if step + 1 < world_size:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            reqs = ring.start([k_cur, v_cur], [k_next, v_next])
        for q0, q1, k0, k1, left, right in _block_list(setup, seqlen, src):
            out, lse = blocks.fwd(q[:, q0:q1], k_cur[:, k0:k1], v_cur[:, k0:k1],
                                  setup.softmax_scale, left, right, setup.softcap)
            blocks.merge_into(acc_out[:, q0:q1], acc_lse[:, :, q0:q1], out, lse)
        if reqs is not None:
            ring.wait(reqs)
            k_cur, v_cur = k_next, v_next
    return acc_out.to(q.dtype), acc_lse


def ring_backward(dout, q, k, v, out, lse, setup):
    """``(dq, dk, dv)`` of the local shards (no autograd)."""
    seqlen = q.shape[1]
    world_size, rank, blocks = setup.world_size, setup.rank, setup.blocks
    dq = torch.zeros(q.shape, dtype=_FP32, device=q.device)
    ring = Ring(setup, q.is_cuda) if world_size > 1 else None
    k_cur, v_cur = k, v
    dk_acc = dv_acc = None  # the finished accumulators of the previous step's shard
    for step in range(world_size):
        src = (rank - step) % world_size
        sends, recvs = [], []
        if step + 1 < world_size:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            sends += [k_cur, v_cur]
            recvs += [k_next, v_next]
        if step > 0:  # pass on the previous shard's dK/dV, take this shard's from rank - 1
            dk_in = torch.empty(k.shape, dtype=_FP32, device=k.device)
            dv_in = torch.empty(v.shape, dtype=_FP32, device=v.device)
            sends += [dk_acc, dv_acc]
            recvs += [dk_in, dv_in]
        reqs = ring.start(sends, recvs) if sends else None
        dk_mine = torch.zeros(k.shape, dtype=_FP32, device=k.device)
        dv_mine = torch.zeros(v.shape, dtype=_FP32, device=v.device)
        for q0, q1, k0, k1, left, right in _block_list(setup, seqlen, src):
            dq_b, dk_b, dv_b = blocks.bwd(dout[:, q0:q1], q[:, q0:q1], k_cur[:, k0:k1],
                                          v_cur[:, k0:k1], out[:, q0:q1], lse[:, :, q0:q1],
                                          setup.softmax_scale, left, right, setup.softcap,
                                          setup.deterministic)  # fmt: skip
            dq[:, q0:q1] += dq_b
            dk_mine[:, k0:k1] += dk_b
            dv_mine[:, k0:k1] += dv_b
        if reqs is not None:
            ring.wait(reqs)
        if step > 0:
            dk_mine += dk_in
            dv_mine += dv_in
        dk_acc, dv_acc = dk_mine, dv_mine
        if step + 1 < world_size:
            k_cur, v_cur = k_next, v_next
    if world_size > 1:  # the last hop: each accumulator back to its shard's owner
        dk_own = torch.empty(k.shape, dtype=_FP32, device=k.device)
        dv_own = torch.empty(v.shape, dtype=_FP32, device=v.device)
        ring.wait(ring.start([dk_acc, dv_acc], [dk_own, dv_own]))
        dk_acc, dv_acc = dk_own, dv_own
    return dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)

