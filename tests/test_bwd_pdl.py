"""The Hopper backward's kernels chained by programmatic dependent launch (BwdParams::pdl; on
by default, off with FLASHATTN2_BWD_PDL=0 or ``_ext.bwd_pdl(False)``): the main kernel and
the dQ convert start while the kernel before each still runs and wait for it on the SMs
(cpp/sm90/bwd_launch.cuh). With the switch on and off: gradients under the 2x rule of
test_bwd.py (d64 / d128 / d256, full / causal, MHA / GQA, key blocks that see no query),
deterministic mode bitwise equal either way, and the backward captured in a CUDA graph with
the switch on (the launches become programmatic edges of the graph).
"""
import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func
from test_bwd import check_grads, make_inputs
from test_sm90_bwd import EXPERIMENTAL, HEADS, arch_of_backward, require_sm90_bwd
from test_sm90_bwd import sm90_bwd  # noqa: F401 (the fixture)

pytestmark = pytest.mark.gpu


class BwdRecorder:
    """Stands in for _launch._C: records the keyword arguments of each _C.bwd (``args``) and
    runs the real one; ``recorder["pdl"]`` lists one argument over the calls."""

    def __init__(self, real):
        self.real, self.args = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __getitem__(self, key):
        return [kwargs[key] for kwargs in self.args]

    def bwd(self, *args, **kwargs):
        self.args.append(kwargs)
        return self.real.bwd(*args, **kwargs)


@pytest.fixture
def recorder(monkeypatch):
    recorder = BwdRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    return recorder


def require_window(window_size):
    if window_size != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("this window runs the mma.sync backward without the window extension")


# (seqlens, causal, window_size): tails in every tile; sq > sk (causal: query rows that see
# no key); a diagonal band over sk > sq, whose first key blocks see no query (CTAs without
# steps, which still wait for the preprocess).
CASES = pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1000, 1000), False, (-1, -1)), ((1000, 1000), True, (-1, -1)),
     ((300, 129), True, (-1, -1)), ((129, 500), False, (0, 0))],
    ids=["full", "causal", "causal-sq>sk", "band-empty-blocks"],
)  # fmt: skip


@CASES
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_pdl_on_off(sm90_bwd, recorder, headdim, nheads, nheads_k, seqlens, causal,
                                  window_size):
    """Right with the kernels chained by PDL and launched plainly, each twice in a row, with a
    new dout each time: the caching allocator hands a run the workspaces of the one before,
    whose dsum and dQ sums are then wrong for it, so a kernel that read them before the
    preprocess rewrote them would be caught."""
    require_sm90_bwd(headdim)
    require_window(window_size)
    torch.manual_seed(0)
    q, k, v, _ = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    for pdl in (True, True, False, False):
        dout = torch.randn_like(q)
        with _ext.bwd_pdl(pdl):
            grads, arch = arch_of_backward(q, k, v, dout, causal=causal, window_size=window_size)
        assert arch == 90
        check_grads(grads, q, k, v, dout, causal=causal, window_size=window_size)
    assert recorder["pdl"] == [True, True, False, False]


@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1025, 1025), True, (-1, -1)), ((1025, 1025), False, (-1, -1)),
     ((300, 1025), False, (-1, -1))],
    ids=["causal", "full-rotated", "full-ascending"],
)  # fmt: skip
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_pdl_deterministic_bitwise(sm90_bwd, recorder, headdim, nheads, nheads_k,
                                                 seqlens, causal, window_size, chains):
    """Deterministic mode: the same bits with PDL on and off (the counters the preprocess
    zeroes and the ordered dQ adds are waited for either way), and right; in dq_warp builds
    this runs the instances whose producer warp 2 waits for the counters."""
    require_sm90_bwd(headdim)
    if "dq_bulk" not in EXPERIMENTAL:
        pytest.skip("deterministic mode on the Hopper backward needs dq_bulk")
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    check_switch_bitwise(_ext.bwd_pdl, q, k, v, dout, causal, window_size, chains)
    assert recorder["pdl"] == [True, False, True]


def check_switch_bitwise(switch, q, k, v, dout, causal, window_size, chains):
    """Deterministic backwards with `switch` (an _ext context manager) on, off and on again,
    `chains` dQ chains: the Hopper backward each time, right under the 2x rule, and the same
    bits."""
    runs = []
    with _ext.dq_chains(chains):
        for on in (True, False, True):
            with switch(on):
                grads, arch = arch_of_backward(q, k, v, dout, causal=causal,
                                               window_size=window_size, deterministic=True)
            assert arch == 90
            runs.append(grads)
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_pdl_cuda_graph(sm90_bwd, headdim, deterministic):
    """Forward + backward captured in a CUDA graph with PDL on, replayed on new inputs: the
    gradients are right and equal eager ones with PDL off (bitwise in deterministic mode;
    else within the rounding of the unordered dQ adds)."""
    require_sm90_bwd(headdim)
    if deterministic and headdim == 256:
        pytest.skip("deterministic d256 backwards run the mma.sync backward")
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 1000, 1000, 8, 2, headdim, torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def step():
        out = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        return torch.autograd.grad(out, (q, k, v), dout)

    with _ext.bwd_pdl(True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        _ext.last_bwd_arch = None
        with torch.cuda.graph(graph):
            static = step()
        assert _ext.last_bwd_arch == 90
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        with _ext.bwd_pdl(False):
            expected = step()
        torch.cuda.synchronize()
        check_grads(static, q.detach(), k.detach(), v.detach(), dout, causal=True)
        for e, s in zip(expected, static):
            if deterministic:
                assert torch.equal(e, s)
            else:
                torch.testing.assert_close(e, s)
