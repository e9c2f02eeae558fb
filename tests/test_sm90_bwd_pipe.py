"""The pipelined twins of the Hopper backward's dq_warp instances (cpp/sm90/bwd_kernel.cuh
kPipe; FLASHATTN2_SM90_BWD_PIPE=1 at import or ``_ext.sm90_bwd_pipe()``): each step's S^T GEMM
is issued in the step before, behind its dQ GEMM, and the last step issues one on a stage no
step loaded (its result unused). Same GEMMs on the same operands, so dk and dv are bitwise
those of the plain dq_warp instances, and in deterministic mode dq too; gradients against
the float32 reference under the 2x rule of test_bwd.py.
"""
import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_varlen_func
from test_bwd import check_grads, check_kernel, make_inputs
from test_sm90_bwd import DET_CASES, EXPERIMENTAL, arch_of_backward, require_dq_warp
from test_sm90_bwd import sm90_bwd  # noqa: F401 (the fixture, used by pytestmark)
from test_varlen import check_varlen_backward

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("sm90_bwd")]


class _PipeRecorder:
    """Stands in for _launch._C: records the bwd_pipe of each _C.bwd, runs the real one."""

    def __init__(self, real):
        self.real, self.pipe = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def bwd(self, *args, **kwargs):
        self.pipe.append(kwargs["bwd_pipe"])
        return self.real.bwd(*args, **kwargs)


def pipe_and_plain(monkeypatch, q, k, v, dout, **kwargs):
    """The gradients with the switch on, off, on (NaN-poisoned outputs), each on the Hopper
    backward, and that _C.bwd got the switch."""
    recorder = _PipeRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    runs = []
    for pipe in (True, False, True):
        with _ext.sm90_bwd_pipe(pipe):
            grads, arch = arch_of_backward(q, k, v, dout, **kwargs)
        assert arch == 90
        runs.append(grads)
    assert recorder.pipe == [True, False, True]
    return runs


# One step per CTA (MHA, sq <= the step's rows: the last step is the first, and stage 1 is
# never loaded), a few steps, a partial last step, GQA (the group's heads walked in turn),
# sq != sk both ways.
SEQLENS = [(1, 1), (64, 64), (100, 100), (129, 300), (300, 129), (1000, 1000), (255, 1025)]


@pytest.mark.parametrize("nheads,nheads_k", [(4, 4), (8, 2)], ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_pipe(monkeypatch, headdim, seqlen_q, seqlen_k, causal, nheads,
                            nheads_k):
    """Right (the 2x rule), dk / dv bitwise those of the plain dq_warp instance (dq: float32
    reduces from CTAs in any order), and the same bits twice."""
    require_dq_warp(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim,
                                torch.bfloat16)
    runs = pipe_and_plain(monkeypatch, q, k, v, dout, causal=causal)
    check_grads(runs[0], q, k, v, dout, causal=causal)
    for other in runs[1:]:
        for a, b in zip(runs[0][1:], other[1:]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("window_size", [(32, 8), (100, -1), (-1, 50), (200, 200)], ids=str)
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_pipe_window(monkeypatch, headdim, window_size):
    """Sliding windows (fewer query blocks per key block, a window narrower than a step)."""
    require_dq_warp(headdim)
    if "window" not in EXPERIMENTAL:
        pytest.skip("needs the window extension")
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 500, 300, 8, 2, headdim, torch.float16)
    with _ext.sm90_bwd_pipe(True):
        _ext.last_bwd_arch = None
        check_kernel(q, k, v, dout, window_size=window_size)
        assert _ext.last_bwd_arch == 90
    runs = pipe_and_plain(monkeypatch, q, k, v, dout, window_size=window_size)
    for a, b in zip(runs[0][1:], runs[1][1:]):
        assert torch.equal(a, b)


@DET_CASES
@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_pipe_deterministic_bitwise(monkeypatch, headdim, seqlens,
                                                  causal, window_size, chains):
    """Deterministic mode: dq, dk, dv bitwise those of the plain dq_warp instance (the same
    dQ tiles reduced in the same order by producer warp 2), and right."""
    require_dq_warp(headdim)
    if window_size != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("this window runs the mma.sync backward without the window extension")
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, 8, 2, headdim, torch.bfloat16)
    with _ext.dq_chains(chains):
        runs = pipe_and_plain(monkeypatch, q, k, v, dout, causal=causal,
                              window_size=window_size, deterministic=True)
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_pipe_varlen(headdim, causal):
    """Packed sequences (the varlen twin): empty and one-token sequences, ragged tails, each
    against its own reference; deterministic: bitwise the plain instance's."""
    require_dq_warp(headdim)
    if "varlen" not in EXPERIMENTAL:
        pytest.skip("needs the varlen extension")
    torch.manual_seed(0)
    with _ext.sm90_bwd_pipe(True):
        _ext.last_bwd_arch = None
        check_varlen_backward(torch.bfloat16, headdim, "ragged", (6, 2), causal, False)
        assert _ext.last_bwd_arch == 90
    lengths_q, lengths_k = [300, 1, 640, 129, 0], [300, 77, 640, 400, 5]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0)], dtype=torch.int32,
                               device="cuda") for n in (lengths_q, lengths_k))
    q = torch.randn(sum(lengths_q), 8, headdim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, headdim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    dout = torch.randn_like(q)
    runs = []
    for pipe in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                     causal=causal, deterministic=True)
        _ext.last_bwd_arch = None
        with _ext.sm90_bwd_pipe(pipe):
            out.backward(dout)
        torch.cuda.synchronize()
        assert _ext.last_bwd_arch == 90
        assert all(torch.isfinite(t.grad).all() for t in leaves)
        runs.append([t.grad for t in leaves])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
