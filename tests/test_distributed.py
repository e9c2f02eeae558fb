"""Context parallelism (flashattn2.distributed) on the CPU: the sequence layouts, the block
plans, the reference backward, and the ring / all-gather / Ulysses code on gloo process
groups of 2, 3 and 4 ranks (tests/distributed_cases.py), whose block attention is then the
float32 reference: forward, LSE and gradients must equal single-process reference attention
within float32 rounding. The 2-GPU run is tests/test_distributed_gpu.py.
"""
import itertools
import random

import pytest
import torch
import torch.distributed as dist
from flashattn2._reference import attention_bwd_ref, attention_ref, visible_mask
from flashattn2.distributed import _common, _layout, ring_attn_func, shard_sequence
from flashattn2.distributed import unshard_sequence

from distributed_cases import case_name, run_world

# ---- layouts and block plans (no process group) ------------------------------------------


def _global_mask(total, left, right):
    return visible_mask(total, total, left, right)


@pytest.mark.parametrize("trial", range(4))
def test_block_plan_matches_the_global_mask(trial):
    """Random query / key ranges and windows: the plan's sub-block, under the kernels'
    bottom-right window, is exactly the global visibility, and nothing outside it is seen."""
    rng = random.Random(trial)
    total = 40
    full = {}
    for _ in range(400):
        q_start, k_start = rng.randrange(total), rng.randrange(total)
        q_len, k_len = rng.randint(1, total - q_start), rng.randint(1, total - k_start)
        left, right = rng.choice([-1, 0, 1, 3, 9, 50]), rng.choice([-1, 0, 2, 7])
        if (left, right) not in full:
            full[left, right] = _global_mask(total, left, right)
        mask = full[left, right][q_start:q_start + q_len, k_start:k_start + k_len]
        plan = _layout.block_plan(q_start, q_len, k_start, k_len, left, right)
        if plan is None:
            assert not mask.any()
            continue
        q0, q1, k0, k1, wl, wr = plan
        inside = torch.zeros_like(mask)
        inside[q0:q1, k0:k1] = True
        assert not mask[~inside].any(), "a visible pair outside the planned sub-block"
        assert mask[q0:q1, k0:k1].any(dim=1).all(), "a planned row that sees nothing"
        assert mask[q0:q1, k0:k1].any(dim=0).all(), "a planned key that nobody sees"
        assert wl >= -1 and wr >= -1
        expected = visible_mask(q1 - q0, k1 - k0, wl, wr)
        assert torch.equal(mask[q0:q1, k0:k1], expected), (plan, left, right)


@pytest.mark.parametrize("layout", _layout.LAYOUTS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (5, 0), (3, 4), (0, 0)], ids=str)
def test_local_blocks_cover_each_visible_pair_once(layout, world_size, window):
    seqlen_local = 6
    total = world_size * seqlen_local
    mask = _global_mask(total, *window)
    positions = [torch.tensor([start + i for _, start, length in
                               _layout.segments(layout, r, world_size, seqlen_local)
                               for i in range(length)]) for r in range(world_size)]  # fmt: skip
    for rank, src in itertools.product(range(world_size), repeat=2):
        count = torch.zeros(seqlen_local, seqlen_local, dtype=torch.int64)
        blocks = _layout.local_blocks(_layout.segments(layout, rank, world_size, seqlen_local),
                                      _layout.segments(layout, src, world_size, seqlen_local),
                                      *window)  # fmt: skip
        for q0, q1, k0, k1, wl, wr in blocks:
            count[q0:q1, k0:k1] += visible_mask(q1 - q0, k1 - k0, wl, wr).long()
        expected = mask[positions[rank]][:, positions[src]].long()
        assert torch.equal(count, expected), (rank, src, blocks)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_zigzag_balances_causal_work(world_size):
    """Every rank attends to the same number of (query, key) pairs and makes the same
    number of kernel calls per ring step after the first (one full block)."""
    seqlen_local = 8
    work = []
    for rank in range(world_size):
        pairs = 0
        for src in range(world_size):
            blocks = _layout.local_blocks(_layout.segments("zigzag", rank, world_size, 8),
                                          _layout.segments("zigzag", src, world_size, 8), -1, 0)
            pairs += sum(int(visible_mask(q1 - q0, k1 - k0, wl, wr).sum())
                         for q0, q1, k0, k1, wl, wr in blocks)  # fmt: skip
            if src != rank:
                assert len(blocks) == 1 and blocks[0][4:] == (-1, -1), blocks
                q0, q1, k0, k1 = blocks[0][:4]
                assert (q1 - q0) * (k1 - k0) == seqlen_local**2 // 2
        work.append(pairs)
    assert len(set(work)) == 1, work


@pytest.mark.parametrize("layout", _layout.LAYOUTS)
def test_shard_unshard_round_trip(layout):
    x = torch.randn(2, 24, 3, 5)
    shards = [shard_sequence(x, r, 3, layout) for r in range(3)]
    assert all(s.shape == (2, 8, 3, 5) for s in shards)
    assert torch.equal(unshard_sequence(shards, layout), x)
    lse = torch.randn(2, 3, 24)
    shards = [shard_sequence(lse, r, 3, layout, dim=2) for r in range(3)]
    assert torch.equal(unshard_sequence(shards, layout, dim=2), lse)


def test_zigzag_chunks():
    x = torch.arange(16).view(1, 16)
    assert shard_sequence(x, 0, 4).tolist() == [[0, 1, 14, 15]]
    assert shard_sequence(x, 3, 4).tolist() == [[6, 7, 8, 9]]


def test_layout_errors():
    with pytest.raises(ValueError, match="divisible by 8"):
        shard_sequence(torch.zeros(1, 12), 0, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        shard_sequence(torch.zeros(1, 12), 0, 4, layout="striped")
    with pytest.raises(ValueError, match="rank must be in"):
        shard_sequence(torch.zeros(1, 12), 4, 4, layout="contiguous")
    with pytest.raises(ValueError, match="one shape"):
        unshard_sequence([torch.zeros(1, 4), torch.zeros(1, 6)])


# ---- the float32 reference backward --------------------------------------------------------


@pytest.mark.parametrize("causal,window,softcap,heads", [
    (False, (-1, -1), 0.0, (4, 4)), (True, (-1, -1), 0.0, (6, 2)), (False, (3, 2), 0.0, (4, 1)),
    (True, (5, -1), 4.0, (4, 2)), (False, (-1, -1), 2.5, (2, 2)),
])  # fmt: skip
@pytest.mark.parametrize("seqlens", [(9, 9), (7, 12), (12, 5)], ids=str)
def test_reference_backward_matches_autograd(causal, window, softcap, heads, seqlens):
    (nheads, nheads_k), (seqlen_q, seqlen_k) = heads, seqlens
    q = torch.randn(2, seqlen_q, nheads, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, seqlen_k, nheads_k, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, seqlen_k, nheads_k, 8, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, seqlen_q, nheads, 8, dtype=torch.float64)
    kwargs = dict(causal=causal, window_size=window, softcap=softcap, softmax_scale=0.4)
    out, lse = attention_ref(q, k, v, upcast=False, **kwargs)
    out.backward(dout)
    grads = attention_bwd_ref(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse,
                              **kwargs)  # fmt: skip
    for name, ours, ref in zip("qkv", grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5, msg=name)


# ---- checks that need no process group -------------------------------------------------------


@pytest.mark.parametrize("upcast", [True, False])
@pytest.mark.parametrize("case", [dict(causal=True), dict(causal=False),
                                  dict(causal=True, window=(40, 0)),
                                  dict(causal=True, softcap=5.0)])  # fmt: skip
def test_chunked_references_match_the_dense_ones(case, upcast):
    """The long-sequence GPU cases' references (by query chunks) equal the dense ones: the
    chunk's rows against keys up to its last row reproduce the causal / window mask, and
    dK / dV sum over the chunks."""
    from distributed_cases import _reference

    case = dict(case, world_size=2, seqlen_local=80, nheads=4, nheads_k=2, headdim=16)
    gen = torch.Generator().manual_seed(7)
    dtype = torch.float32 if upcast else torch.bfloat16
    q, k, v, dout = (torch.randn(s, generator=gen).to(dtype)
                     for s in ((2, 160, 4, 16), (2, 160, 2, 16), (2, 160, 2, 16), (2, 160, 4, 16)))
    dense = _reference(q, k, v, dout, case, upcast)
    chunked = _reference(q, k, v, dout, case, upcast, chunk=48)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), chunked, dense):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        tol = dict(atol=1e-5, rtol=1e-5) if upcast else dict(atol=3e-2, rtol=2e-2)
        torch.testing.assert_close(a.float(), b.float(), msg=name, **tol)


def test_packed_varlen_is_not_implemented():
    q = torch.randn(10, 4, 16)
    with pytest.raises(NotImplementedError, match="variable-length"):
        ring_attn_func(q, q, q)


def test_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q = torch.randn(1, 8, 4, 16)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attn_func(q, q, q)


def test_local_shape_errors():
    q = torch.randn(1, 8, 4, 16)
    with pytest.raises(ValueError, match="local length"):
        ring_attn_func(q, q[:, :6], q[:, :6])
    with pytest.raises(ValueError, match="must divide"):
        ring_attn_func(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="one dtype"):
        ring_attn_func(q, q.double(), q)
    with pytest.raises(ValueError, match="window_size"):
        ring_attn_func(q, q, q, window_size=(-2, 0))


def test_cpu_tensors_on_nccl_are_refused():
    with pytest.raises(ValueError, match="NCCL, which needs CUDA tensors"):
        _common.check_backend("nccl", torch.randn(1, 8, 4, 16))
    _common.check_backend("gloo", torch.randn(1, 8, 4, 16))


# ---- gloo process groups of 2, 3 and 4 ranks -------------------------------------------------


def _cases(world_size):
    """The matrix for one world size: every scheme and layout, causal and not, MHA and GQA,
    then windows, softcap, scale, deterministic, MQA and the error checks."""
    cases = []
    base = dict(world_size=world_size, seqlen_local=6, nheads=12)
    schemes = [("ring", "zigzag"), ("ring", "contiguous"), ("gather", "zigzag"),
               ("gather", "contiguous"), ("ulysses", "zigzag"), ("ulysses", "contiguous")]
    for (variant, layout), causal, nheads_k in itertools.product(schemes, [False, True],
                                                                 [12, world_size]):
        cases.append(dict(base, variant=variant, layout=layout, causal=causal, nheads_k=nheads_k))
    extras = [dict(window=(5, 0), causal=True), dict(window=(4, 7)), dict(window=(0, 0)),
              dict(softcap=3.0, causal=True), dict(softmax_scale=0.7),
              dict(deterministic=True, causal=True)]
    for (variant, layout), extra in itertools.product(schemes, extras):
        cases.append(dict(base, variant=variant, layout=layout, nheads_k=world_size, **extra))
    cases.append(dict(base, variant="ring", layout="zigzag", causal=True, nheads_k=1))
    cases.append(dict(base, variant="gather", layout="zigzag", causal=True, nheads_k=1))
    if world_size == 2:
        cases += [
            dict(base, error="mismatched", match="differ across ranks"),
            dict(base, error="ulysses_heads", nheads=3, nheads_k=3, match="divisible"),
            dict(base, error="odd_zigzag", seqlen_local=5, match="even local sequence"),
        ]
    return cases


_RESULTS = {}


def _results(world_size):
    if world_size not in _RESULTS:
        _RESULTS[world_size] = run_world(world_size, "gloo", _cases(world_size))
    return _RESULTS[world_size]


@pytest.mark.parametrize(
    "world_size,name",
    [(w, case_name(c)) for w in (2, 3, 4) for c in _cases(w)],
)
def test_gloo(world_size, name):
    error = _results(world_size)[name]
    assert not error, error


def test_one_rank_cpu_group_runs_the_reference():
    """A one-rank gloo group: the ring code runs with no communication."""
    results = run_world(1, "gloo", [dict(world_size=1, seqlen_local=8, nheads=4, nheads_k=2,
                                         variant="ring", causal=True)])  # fmt: skip
    assert not any(results.values()), results
