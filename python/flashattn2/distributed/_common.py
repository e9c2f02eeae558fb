"""What the three context-parallel schemes share: input checks, the per-block attention
(kernels on CUDA, the float32 reference on the CPU), and the ring exchange.

The block functions take kernel-ready slices and a window in the kernels' bottom-right
aligned convention (``_layout.block_plan`` computes it), and return float32-mergeable
``(out, lse)`` (lse +inf for rows that see no key) or the block's share of the gradients.
On CUDA they are ``_launch._flash_attn_forward`` / ``_flash_attn_backward``: the
backward takes the final out and LSE, so nothing is recomputed beyond what FA2's backward
does. On the CPU (gloo) they are ``_reference.attention_ref`` / ``attention_bwd_ref``: the
same ring and gather code then runs in the CI without a GPU.
"""
import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import _checks, _launch, _reference
from ..merge import merge, merge_reference
from . import _layout

_FP32 = torch.float32


class CudaBlocks:
    """The flashattn2 kernels on kernel-ready CUDA slices."""

    @staticmethod
    def fwd(q, k, v, scale, left, right, softcap):
        return _launch._flash_attn_forward(q, k, v, scale, left, right, softcap=softcap)

    @staticmethod
    def bwd(dout, q, k, v, out, lse, scale, left, right, softcap, deterministic):
        _checks._check_backward(q.shape[3], q.device)
        return _launch._flash_attn_backward(dout, q, k, v, out, _launch._lse_ready(lse),
                                            scale, left, right, deterministic,
                                            softcap=softcap)  # fmt: skip

    @staticmethod
    def merge_into(acc_out, acc_lse, out, lse):
        merge(acc_out, acc_lse, out, lse, out=acc_out, lse=acc_lse)


class ReferenceBlocks:
    """The float32 reference of ``flashattn2._reference`` (CPU tensors)."""

    @staticmethod
    def fwd(q, k, v, scale, left, right, softcap):
        return _reference.attention_ref(q, k, v, window_size=(left, right), softmax_scale=scale,
                                        softcap=softcap)  # fmt: skip

    @staticmethod
    def bwd(dout, q, k, v, out, lse, scale, left, right, softcap, deterministic):
        return _reference.attention_bwd_ref(dout, q, k, v, out, lse, window_size=(left, right),
                                            softmax_scale=scale, softcap=softcap)

    @staticmethod
    def merge_into(acc_out, acc_lse, out, lse):
        merged, merged_lse = merge_reference(acc_out, acc_lse, out, lse)
        acc_out.copy_(merged)
        acc_lse.copy_(merged_lse)


def blocks_for(t):
    return CudaBlocks if t.is_cuda else ReferenceBlocks


@dataclasses.dataclass
class Setup:
    """One call's checked arguments and its process group."""

    group: object
    world_size: int
    rank: int
    layout: str
    softmax_scale: float
    window_left: int
    window_right: int
    softcap: float
    deterministic: bool
    blocks: type

    def segments(self, rank, seqlen_local):
        return _layout.segments(self.layout, rank, self.world_size, seqlen_local)


def _check_local_shapes(q, k, v):
    """Ranks, dtypes and shapes of the local shards (CUDA: the kernels' rules)."""
    if q.dim() == 3:
        raise NotImplementedError(
            "flashattn2.distributed: packed variable-length sequences (q of shape (total, "
            "nheads, headdim) with cu_seqlens) across ranks are not supported; pass padded "
            "shards of shape (batch, seqlen_local, nheads, headdim)"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have shape (batch, seqlen_local, heads, headdim); got "
                f"{tuple(t.shape)}"
            )
    if q.is_cuda:
        _checks._check_qkv_shapes(q, k, v)
        _checks._check_devices(("q", q), ("k", k), ("v", v))
    else:
        for name, t in (("k", k), ("v", v)):
            if t.dtype is not q.dtype:
                raise ValueError(f"q and {name} must have one dtype; got {q.dtype}, {t.dtype}")
            if t.device != q.device:
                raise ValueError(f"q and {name} must be on one device; got {q.device}, {t.device}")
        if not q.is_floating_point():
            raise ValueError(f"q must be a floating-point tensor; got {q.dtype}")
        if v.shape != k.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
            raise ValueError(
                f"k and v must have shape (batch, seqlen_local, nheads_k, headdim) with q's "
                f"batch and headdim; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                f"v {tuple(v.shape)}"
            )
        if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
            raise ValueError(
                "Number of heads in key/value must divide number of heads in query; "
                f"got {q.shape[2]} query heads and {k.shape[2]} key/value heads"
            )
    if k.shape[1] != q.shape[1]:
        raise ValueError(
            "context parallelism shards one sequence: k and v must have q's local length; got "
            f"q {q.shape[1]} rows, k {k.shape[1]} rows"
        )
    if q.shape[1] == 0:
        raise ValueError("the local sequence shard is empty (seqlen_local = 0)")


def check_backend(backend, q):
    """ValueError for CPU tensors on an NCCL group."""
    if str(backend).lower() == "nccl" and not q.is_cuda:
        raise ValueError(
            f"the process group uses NCCL, which needs CUDA tensors; got q on {q.device} "
            "(use a gloo group for CPU tensors)"
        )


def _signature(q, k, layout, args):
    layout_code = _layout.LAYOUTS.index(layout)
    dtype_code = [torch.float16, torch.bfloat16, torch.float32, torch.float64].index(q.dtype) \
        if q.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else -1
    return [*q.shape, k.shape[2], dtype_code, layout_code, *args]


def check_shards(q, k, layout, group, world_size, rank, args):
    """One all_gather of a few ints per rank: ValueError on every rank (no hang) unless all
    ranks pass the same shapes, dtype, layout and attention arguments."""
    mine = _signature(q, k, layout, args)
    local = torch.tensor(mine, dtype=torch.int64, device=q.device)
    if q.is_cuda:
        gathered = torch.empty(world_size, len(mine), dtype=torch.int64, device=q.device)
        dist.all_gather_into_tensor(gathered, local, group=group)
        rows = gathered.tolist()
    else:
        parts = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(parts, local, group=group)
        rows = [p.tolist() for p in parts]
    if any(row != rows[0] for row in rows):
        names = "(batch, seqlen_local, nheads, headdim, nheads_k, dtype, layout, " \
                "causal/window/softcap/scale...)"
        detail = "; ".join(f"rank {r}: {row}" for r, row in enumerate(rows))
        raise ValueError(
            f"the local shards differ across ranks (rank {rank} sees {names}): {detail}"
        )


def prepare(q, k, v, group, causal, softmax_scale, window_size, softcap, deterministic,
            layout, check):
    """Checks (local ones first, then the group), returns ``(setup, q, k, v, headdim)``
    with q, k, v contiguous and, on CUDA, the head dim zero-padded to a multiple of 8
    (differentiably); ``setup`` is None for a one-rank group on CUDA (the caller then runs
    ``flash_attn_func``)."""
    _check_local_shapes(q, k, v)
    _, softcap = _checks._check_mod_values(0.0, softcap)
    window_left, window_right = _checks._window(window_size, causal)
    softmax_scale = _checks._scale(q, softmax_scale)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "flashattn2.distributed needs an initialized default process group "
            "(torch.distributed.init_process_group)"
        )
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    world_size = dist.get_world_size(group)
    check_backend(dist.get_backend(group), q)
    _layout.check_layout(layout, q.shape[1], world_size)
    if check and world_size > 1:
        args = [int(causal), window_left, window_right, int(softcap * 1e6),
                int(softmax_scale * 1e6), int(bool(deterministic))]
        check_shards(q, k, layout, group, world_size, rank, args)
    headdim = q.shape[3]
    if q.is_cuda and world_size == 1:
        return None, q, k, v, headdim
    if q.is_cuda and headdim % 8:
        pad = -headdim % 8
        q, k, v = F.pad(q, (0, pad)), F.pad(k, (0, pad)), F.pad(v, (0, pad))
    setup = Setup(group, world_size, rank, layout, softmax_scale, window_left, window_right,
                  softcap, bool(deterministic), blocks_for(q))
    return setup, q.contiguous(), k.contiguous(), v.contiguous(), headdim


class Ring:
    """Point-to-point exchange with the ring neighbours (send to rank + 1, receive from
    rank - 1) by ``batch_isend_irecv``. On CUDA the operations are issued from a side stream
    that first waits for the current stream (the tensors to send are ready), and ``wait``
    makes the current stream wait for their completion: the host never blocks, and the
    kernels queued between ``start`` and ``wait`` overlap the transfer."""

    _streams = {}  # device index -> side stream
    # Benchmark hook (benchmarks/bench_cp.py; the results are then wrong): "skip" skips every
    # transfer, so a run times the compute of the ring alone; "sync" sends one element of
    # each tensor instead, so a run keeps the ring's step-by-step waits on the neighbours
    # without its bytes.
    bench_mode = None

    def __init__(self, setup, cuda):
        group, rank, world_size = setup.group, setup.rank, setup.world_size
        self.group = group
        self.next = dist.get_global_rank(group, (rank + 1) % world_size)
        self.prev = dist.get_global_rank(group, (rank - 1) % world_size)
        self.cuda = cuda
        if cuda:
            device = torch.cuda.current_device()
            if device not in Ring._streams:
                Ring._streams[device] = torch.cuda.Stream(device)
            self.stream = Ring._streams[device]

    def start(self, sends, recvs):
        if Ring.bench_mode == "skip":
            return []
        if Ring.bench_mode == "sync":
            sends = [t.reshape(-1)[:1] for t in sends]
            recvs = [t.reshape(-1)[:1] for t in recvs]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sends]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recvs]
        if not self.cuda:
            return dist.batch_isend_irecv(ops)
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            return dist.batch_isend_irecv(ops)

    def wait(self, reqs):
        for req in reqs:
            req.wait()
        if self.cuda:
            torch.cuda.current_stream().wait_stream(self.stream)


class SchemeFunc(torch.autograd.Function):
    """Autograd of a scheme on the local shards: ``forward(q, k, v, setup) -> (out, lse)``
    and ``backward(dout, q, k, v, out, lse, setup) -> (dq, dk, dv)`` (ring or all-gather)."""

    @staticmethod
    def forward(ctx, q, k, v, setup, forward, backward):
        out, lse = forward(q, k, v, setup)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.setup, ctx.scheme_backward = setup, backward
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.scheme_backward(dout.contiguous(), q, k, v, out, lse, ctx.setup)
        return dq, dk, dv, None, None, None
