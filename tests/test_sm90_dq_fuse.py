"""The fused dQ convert of the Hopper backward (a prototype, off by default:
FLASHATTN2_SM90_DQ_FUSE=1 or ``_ext.sm90_dq_fuse()``; cpp/sm90/bwd_kernel.cuh dq_fuse_warp): in
dq_warp builds, dense d128 backwards without softcap / ALiBi / a bias and with one dQ chain
convert each query tile's dQ in the main kernel (its last visiting key block) instead of in the
convert kernel; the preprocess writes the rows that no key block visits. Everything else keeps
the convert kernel (d64, varlen, several chains, mods), and must be just as right with the
switch on. Gradients against the float32 reference under the 2x rule of test_bwd.py, dq
NaN-poisoned before the kernels write it; deterministic mode bitwise equal with the switch off.
"""
import pytest
import torch
from flashattn2 import _ext, _launch
from test_bwd import check_grads, make_inputs
import test_sm90_bwd
from test_sm90_bwd import EXPERIMENTAL, HEADS, arch_of_backward, require_sm90_bwd
from test_varlen import check_varlen_backward

pytestmark = pytest.mark.gpu
sm90_bwd = test_sm90_bwd.sm90_bwd  # the fixture: the Hopper backward on (skips without one)


def require_dq_fuse(headdim):
    require_sm90_bwd(headdim)
    if "dq_warp" not in EXPERIMENTAL:
        pytest.skip("the fused dQ convert needs the dq_warp instances (build item dq_warp)")


class _FuseRecorder:
    """Stands in for _launch._C: records the dq_fuse of each _C.bwd, runs the real one."""

    def __init__(self, real):
        self.real, self.dq_fuse = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def bwd(self, *args, **kwargs):
        self.dq_fuse.append(kwargs["dq_fuse"])
        return self.real.bwd(*args, **kwargs)


# Tiles of 64 query rows, key blocks of 128: one tile and one block; tails; several visitors;
# sq != sk both ways (causal sq > sk: the first rows see no key, so no key block visits their
# tiles and the preprocess writes their zeros); windows (band, left only, right only) where the
# window extension is built.
FUSE_CASES = [((1, 1), False, (-1, -1)), ((65, 65), True, (-1, -1)),
              ((129, 129), False, (-1, -1)), ((1000, 1000), True, (-1, -1)),
              ((1023, 1025), False, (-1, -1)), ((129, 300), True, (-1, -1)),
              ((300, 129), True, (-1, -1)), ((1500, 700), False, (-1, -1)),
              ((1, 300), True, (-1, -1)), ((300, 1), False, (-1, -1)),
              ((700, 700), False, (48, 16)), ((1025, 1025), False, (256, 64)),
              ((1025, 1025), False, (256, -1)), ((500, 900), False, (-1, 100)),
              ((900, 300), False, (0, 0))]
FUSE_IDS = [f"{sq}x{sk}-{'causal' if c else 'full'}{'' if w == (-1, -1) else f'-w{w[0]}_{w[1]}'}"
            for (sq, sk), c, w in FUSE_CASES]


def needs_window(window_size):
    if window_size != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("this window runs the mma.sync backward without the window extension")


@pytest.mark.parametrize("seqlens,causal,window_size", FUSE_CASES, ids=FUSE_IDS)
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim", [64, 128, 120], ids=["d64", "d128", "d120"])
def test_dq_fuse_gradients(sm90_bwd, monkeypatch, headdim, dtype, nheads, nheads_k, seqlens,
                           causal, window_size):
    """Right with the switch on (d128 and the padded d120 fused; d64 not, as a control), and
    the switch reaches the binding."""
    require_dq_fuse(_ext.KERNEL_HEAD_DIM[headdim])
    needs_window(window_size)
    recorder = _FuseRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, dtype)
    with _ext.sm90_dq_fuse():
        grads, ran = arch_of_backward(q, k, v, dout, causal=causal, window_size=window_size)
    assert ran == 90
    assert recorder.dq_fuse == [True]
    check_grads(grads, q, k, v, dout, causal=causal, window_size=window_size)


@pytest.mark.parametrize("seqlens,causal,window_size", FUSE_CASES, ids=FUSE_IDS)
@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_dq_fuse_deterministic_bitwise(sm90_bwd, headdim, nheads, nheads_k, chains, seqlens,
                                       causal, window_size):
    """Deterministic mode: the same bits with the switch on, off, on (one chain: the same
    visitors add in the same order, and the last one converts with the convert kernel's
    arithmetic; 4 chains: not fused), and right."""
    require_dq_fuse(headdim)
    needs_window(window_size)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    runs = []
    with _ext.dq_chains(chains):
        for fuse in (True, False, True):
            with _ext.sm90_dq_fuse(fuse):
                grads, ran = arch_of_backward(q, k, v, dout, causal=causal,
                                              window_size=window_size, deterministic=True)
            assert ran == 90
            runs.append(grads)
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def _kernel_names(fn):
    """The CUDA kernels `fn` launches (torch.profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("headdim,fused", [(128, True), (64, False)], ids=["d128", "d64"])
def test_dq_fuse_skips_the_convert_kernel(sm90_bwd, headdim, fused, deterministic):
    """With the switch on, a dense d128 backward launches no convert kernel (d64 still does);
    off, every backward does."""
    require_dq_fuse(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 700, 700, 8, 2, headdim, torch.bfloat16)
    for fuse in (True, False):
        with _ext.sm90_dq_fuse(fuse):
            names = _kernel_names(lambda: arch_of_backward(q, k, v, dout, causal=True,
                                                           deterministic=deterministic))
        assert any("bwd_kernel" in n for n in names), names
        converts = [n for n in names if "bwd_convert_dq_kernel" in n]
        assert len(converts) == (0 if fuse and fused else 1), names


# Varlen ("ragged" has empty and one-token sequences) keeps the convert kernel: right with the
# switch on, and deterministic runs bitwise equal.
@pytest.mark.parametrize("lengths", ["ragged", "same"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_dq_fuse_varlen(sm90_bwd, lengths, causal, deterministic):
    require_dq_fuse(128)
    if "varlen" not in EXPERIMENTAL:
        pytest.skip("varlen runs the mma.sync backward without the varlen extension")
    torch.manual_seed(0)
    with _ext.sm90_dq_fuse():
        check_varlen_backward(torch.bfloat16, 128, lengths, (4, 2), causal, deterministic)
