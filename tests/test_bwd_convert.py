"""The lean dQ convert (BwdParams::convert_lean; off by default, on with
FLASHATTN2_BWD_CONVERT_LEAN=1 or ``_ext.bwd_convert_lean()``): bwd_convert_dq_lean_kernel
(cpp/sm80/bwd_kernel.cuh) turns the float32 dQ accumulator into dq with all of a tile's loads
in flight. It computes the same bits as the default convert, so deterministic backwards
are compared bitwise with the switch on and off (every chain count, d64 / d128 / d256, padded
head dims, varlen, the mma.sync backward too); default backwards are checked under the 2x
rule of test_bwd.py (tails of the 16-row blocks and 64-row tiles, sq != sk, GQA, causal /
full / window) with NaN-poisoned outputs (run_backward), so a row or column the kernel does
not store is caught.
"""
import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_varlen_func
from test_bwd import check_grads, make_inputs
from test_sm90_bwd import EXPERIMENTAL, HEADS, arch_of_backward, require_sm90_bwd
from test_sm90_bwd import require_sm90_deterministic
from test_sm90_bwd import sm90_bwd  # noqa: F401 (the fixture)
from test_varlen import LENGTHS, check_varlen_backward, cu, make_varlen

pytestmark = pytest.mark.gpu


class _LeanRecorder:
    """Stands in for _launch._C: records the convert_lean argument of each _C.bwd."""

    def __init__(self, real):
        self.real, self.lean = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def bwd(self, *args, **kwargs):
        self.lean.append(kwargs["convert_lean"])
        return self.real.bwd(*args, **kwargs)


@pytest.fixture
def recorder(monkeypatch):
    recorder = _LeanRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    return recorder


def require_window(window_size):
    if window_size != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("this window runs the mma.sync backward without the window extension")


# Around the convert's blocks: one row, one past a 16-row block, one short of a 64-row tile,
# several tiles with a partial last block; sq != sk both ways (causal sq > sk: rows that see
# no key, dq 0); a band whose first key blocks see no query.
CASES = pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1, 1), False, (-1, -1)), ((17, 40), True, (-1, -1)), ((63, 63), False, (-1, -1)),
     ((1000, 1000), False, (-1, -1)), ((1000, 1000), True, (-1, -1)),
     ((300, 129), True, (-1, -1)), ((129, 500), False, (0, 0)), ((257, 255), False, (30, 5))],
    ids=["1", "17x40-causal", "63", "full", "causal", "causal-sq>sk", "band-empty-blocks",
         "window"],
)  # fmt: skip


@CASES
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_bwd_convert_lean_right(sm90_bwd, recorder, headdim, nheads, nheads_k, seqlens, causal,
                                window_size):
    """Right with the switch on, twice in a row (the second run reuses the first's cached
    workspaces, whose dQ sums are stale for it), and off once more."""
    require_sm90_bwd(headdim)
    require_window(window_size)
    torch.manual_seed(0)
    q, k, v, _ = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    for lean in (True, True, False):
        dout = torch.randn_like(q)
        with _ext.bwd_convert_lean(lean):
            grads, arch = arch_of_backward(q, k, v, dout, causal=causal, window_size=window_size)
        assert arch == 90
        check_grads(grads, q, k, v, dout, causal=causal, window_size=window_size)
    assert recorder.lean == [True, True, False]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("chains", [1, 2, 4], ids=["chains-1", "chains-2", "chains-4"])
@pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1025, 1025), True, (-1, -1)), ((1025, 1025), False, (-1, -1)),
     ((300, 1025), False, (-1, -1)), ((65, 129), False, (32, 8))],
    ids=["causal", "full-rotated", "full-ascending", "window"],
)  # fmt: skip
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_bwd_convert_lean_bitwise(sm90_bwd, recorder, headdim, nheads, nheads_k, seqlens,
                                  causal, window_size, chains, dtype):
    """Deterministic mode: lean, default, lean give the same bits (the chains summed in the
    same order, the same rounding), and right."""
    require_sm90_deterministic(headdim)
    require_window(window_size)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, dtype)
    runs = []
    with _ext.dq_chains(chains):
        for lean in (True, False, True):
            with _ext.bwd_convert_lean(lean):
                grads, arch = arch_of_backward(q, k, v, dout, causal=causal,
                                               window_size=window_size, deterministic=True)
            assert arch == 90
            runs.append(grads)
    assert recorder.lean == [True, False, True]
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


# Head dims padded to the kernel's (columns past p.headdim neither read nor stored), on the
# Hopper backward and, under force_sm80, on the mma.sync one (which shares the convert).
@pytest.mark.parametrize("force_sm80", [False, True], ids=["sm90", "sm80"])
@pytest.mark.parametrize("chains", [1, 4], ids=["chains-1", "chains-4"])
@pytest.mark.parametrize("headdim", [36, 56, 100, 120, 200, 248])
def test_bwd_convert_lean_padded_head_dims(sm90_bwd, headdim, chains, force_sm80):
    kernel_head_dim = _ext.KERNEL_HEAD_DIM[headdim]
    if force_sm80:
        if kernel_head_dim not in _ext.build_info()["bwd_head_dims"]:
            pytest.skip(f"this build has no backward for kernel head dim {kernel_head_dim}")
    else:
        require_sm90_deterministic(kernel_head_dim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 257, 255, 8, 2, headdim, torch.bfloat16)
    runs = []
    with _ext.dq_chains(chains), _ext.force_sm80(force_sm80):
        for lean in (True, False):
            with _ext.bwd_convert_lean(lean):
                grads, arch = arch_of_backward(q, k, v, dout, causal=True, deterministic=True)
            assert arch == (80 if force_sm80 else 90)
            runs.append(grads)
    check_grads(runs[0], q, k, v, dout, causal=True)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", ["ragged", "same"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_bwd_convert_lean_varlen(sm90_bwd, headdim, lengths, causal, deterministic):
    """Packed sequences (empty and one-token ones, ragged tails): each sequence's gradients
    against its own reference with the switch on (deterministic: a second run bitwise equal),
    then deterministic dq bitwise equal to the default convert's."""
    if "varlen" not in EXPERIMENTAL:
        pytest.skip("varlen is an experimental extension of the Hopper backward")
    require_sm90_bwd(headdim)
    if deterministic:
        require_sm90_deterministic(headdim)
    torch.manual_seed(0)
    _ext.last_bwd_arch = None
    with _ext.bwd_convert_lean(True):
        check_varlen_backward(torch.bfloat16, headdim, lengths, (6, 2), causal, deterministic)
    assert _ext.last_bwd_arch == 90
    if deterministic:
        lengths_q, lengths_k = LENGTHS[lengths]
        q, k, v = make_varlen(lengths_q, lengths_k, 6, 2, headdim, torch.bfloat16, True)
        dout = torch.randn_like(q)
        runs = []
        for lean in (True, False):
            with _ext.bwd_convert_lean(lean):
                out = flash_attn_varlen_func(q, k, v, cu(lengths_q), cu(lengths_k),
                                             max(lengths_q), max(lengths_k), causal=causal,
                                             deterministic=True)
                runs.append(torch.autograd.grad(out, (q, k, v), dout))
        for a, b in zip(*runs):
            assert torch.equal(a, b)
