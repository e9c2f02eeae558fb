"""The backward's passes around its main kernel, two switches (dQ first store on by default,
the lean convert alone off; for A/B):

- the lean dQ convert (BwdParams::convert_lean; FLASHATTN2_BWD_CONVERT_LEAN=1 or
  ``_ext.bwd_convert_lean()``): bwd_convert_dq_lean_kernel (cpp/sm80/bwd_kernel.cuh) turns
  the float32 dQ accumulator into dq with all of a tile's loads in flight. The same bits as
  the default convert, so deterministic backwards are compared bitwise with the switch on and
  off (every chain count, d64 / d128 / d256, padded head dims, varlen, the mma.sync backward);
  default backwards are checked under the 2x rule of test_bwd.py (tails of the 16-row blocks
  and 64-row tiles, sq != sk, GQA, causal / full / window) with NaN-poisoned outputs
  (run_backward), so a row or column the kernel does not store is caught.
- dQ first store (BwdParams::dq_first_store; the default, FLASHATTN2_BWD_DQ_FIRST_STORE=0 or
  ``_ext.bwd_dq_first_store(False)`` turns it off): the first visitor of a query tile stores
  its dQ and the preprocess does not zero the accumulator (cpp/sm90/bwd_producer.cuh
  dq_order_warp). Its tests NaN-fill every float workspace (nan_workspaces), so a tile added
  to before its first store, or one no key block visits read without its counter, gives NaN.
"""
import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_varlen_func
from test_bwd import check_grads, make_inputs
from test_bwd_pdl import check_switch_bitwise
from test_bwd_pdl import recorder  # noqa: F401 (the fixture)
from test_sm90_bwd import EXPERIMENTAL, HEADS, arch_of_backward, require_sm90_bwd
from test_sm90_bwd import require_sm90_deterministic
from test_sm90_bwd import sm90_bwd  # noqa: F401 (the fixture)
from test_variants import case_inputs, ref_kwargs, run_kernels
from test_variants import check_grads as check_mod_grads
from test_varlen import LENGTHS, check_varlen_backward, cu, make_varlen

pytestmark = pytest.mark.gpu


@pytest.fixture
def lean_alone(monkeypatch):
    """The lean convert's own tests: dQ first store (the default, which implies the lean
    convert) off, so that lean off runs the default convert."""
    monkeypatch.setattr(_ext, "BWD_DQ_FIRST_STORE", False)


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
def test_bwd_convert_lean_right(sm90_bwd, lean_alone, recorder, headdim, nheads, nheads_k,
                                seqlens, causal, window_size):
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
    assert recorder["convert_lean"] == [True, True, False]


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
def test_bwd_convert_lean_bitwise(sm90_bwd, lean_alone, recorder, headdim, nheads, nheads_k,
                                  seqlens, causal, window_size, chains, dtype):
    """Deterministic mode: lean, default, lean give the same bits (the chains summed in the
    same order, the same rounding), and right."""
    require_sm90_deterministic(headdim)
    require_window(window_size)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, dtype)
    check_switch_bitwise(_ext.bwd_convert_lean, q, k, v, dout, causal, window_size, chains)
    assert recorder["convert_lean"] == [True, False, True]


# Head dims padded to the kernel's (columns past p.headdim neither read nor stored), on the
# Hopper backward and, under force_sm80, on the mma.sync one (which shares the convert).
@pytest.mark.parametrize("force_sm80", [False, True], ids=["sm90", "sm80"])
@pytest.mark.parametrize("chains", [1, 4], ids=["chains-1", "chains-4"])
@pytest.mark.parametrize("headdim", [36, 56, 100, 120, 200, 248])
def test_bwd_convert_lean_padded_head_dims(sm90_bwd, lean_alone, headdim, chains,
                                           force_sm80):
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
def test_bwd_convert_lean_varlen(sm90_bwd, lean_alone, headdim, lengths, causal,
                                 deterministic):
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


class _NanTorch:
    """Stands in for torch in _launch: float tensors from torch.empty are NaN-filled (the
    backward's dq_accum and dsum workspaces), so nothing can rely on them being zero."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        t = torch.empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t


@pytest.fixture
def nan_workspaces(monkeypatch):
    monkeypatch.setattr(_launch, "torch", _NanTorch())


def require_first_store():
    if "dq_warp" not in EXPERIMENTAL:
        pytest.skip("dq first store runs on the dq_warp instances (FLASHATTN2_SM90_BWD_"
                    "EXPERIMENTAL item dq_warp)")


@CASES
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_dq_first_store_right(sm90_bwd, recorder, nan_workspaces, headdim, nheads, nheads_k,
                              deterministic, seqlens, causal, window_size):
    """Right with the switch on, twice (new dout each time), and off, on NaN workspaces:
    causal sq > sk and the band have query tiles no key block visits (dq 0 from the convert's
    counter check); several key blocks per query tile race for the first store."""
    require_sm90_bwd(headdim)
    require_first_store()
    require_window(window_size)
    if deterministic:
        require_sm90_deterministic(headdim)
    torch.manual_seed(0)
    q, k, v, _ = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    for first_store in (True, True, False):
        dout = torch.randn_like(q)
        with _ext.bwd_dq_first_store(first_store):
            grads, arch = arch_of_backward(q, k, v, dout, causal=causal, window_size=window_size,
                                           deterministic=deterministic)
        assert arch == 90
        check_grads(grads, q, k, v, dout, causal=causal, window_size=window_size)
    assert recorder["dq_first_store"] == [True, True, False]


@pytest.mark.parametrize("chains", [1, 2, 4], ids=["chains-1", "chains-2", "chains-4"])
@pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1025, 1025), True, (-1, -1)), ((1025, 1025), False, (-1, -1)),
     ((300, 1025), False, (-1, -1)), ((65, 129), False, (32, 8)), ((300, 129), True, (-1, -1))],
    ids=["causal", "full-rotated", "full-ascending", "window", "causal-sq>sk"],
)  # fmt: skip
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_dq_first_store_deterministic_bitwise(sm90_bwd, nan_workspaces, headdim, nheads,
                                              nheads_k, seqlens, causal, window_size, chains):
    """Deterministic mode: first store on, off, on give the same bits (turn 0 stores x where
    the default adds x to 0; chains without a visitor of a tile read as 0), and right."""
    require_sm90_deterministic(headdim)
    require_first_store()
    require_window(window_size)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    runs = []
    with _ext.dq_chains(chains):
        for first_store in (True, False, True):
            with _ext.bwd_dq_first_store(first_store):
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
def test_dq_first_store_where_it_does_not_apply(sm90_bwd, nan_workspaces, headdim,
                                                deterministic):
    """With the switch on, the backwards it does not apply to (d256, softcap, varlen) still
    zero the accumulator: right on NaN workspaces."""
    require_sm90_bwd(headdim)
    if deterministic:
        require_sm90_deterministic(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 300, 300, 8, 2, headdim, torch.bfloat16)
    with _ext.bwd_dq_first_store(True):
        grads, arch = arch_of_backward(q, k, v, dout, causal=True, deterministic=deterministic)
        assert arch == 90
        check_grads(grads, q, k, v, dout, causal=True)
        if headdim != 256 and "varlen" in EXPERIMENTAL:
            check_varlen_backward(torch.bfloat16, headdim, "ragged", (6, 2), True,
                                  deterministic)
        if headdim != 256 and "mods" in EXPERIMENTAL and not deterministic:
            q, k, v, dout, mods, causal, window = case_inputs("softcap30-causal", headdim,
                                                              torch.bfloat16)
            _ext.last_bwd_arch = None
            _, _, grads = run_kernels(q, k, v, dout, causal, window, None, mods)
            check_mod_grads(grads, q, k, v, dout, ref_kwargs(causal, window, None, mods))
            assert _ext.last_bwd_arch == 90


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("headdim", [36, 56, 100, 120])
def test_dq_first_store_padded_head_dims(sm90_bwd, nan_workspaces, headdim, deterministic):
    """Head dims padded to the kernel's: the first store covers the columns the adds do (the
    bulk copies are cut to the head dim's 8-column blocks), on NaN workspaces; deterministic:
    bitwise equal to the zeroed path."""
    kernel_head_dim = _ext.KERNEL_HEAD_DIM[headdim]
    require_sm90_bwd(kernel_head_dim)
    require_first_store()
    if deterministic:
        require_sm90_deterministic(kernel_head_dim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 257, 255, 8, 2, headdim, torch.bfloat16)
    runs = []
    for first_store in (True, False):
        with _ext.bwd_dq_first_store(first_store):
            grads, arch = arch_of_backward(q, k, v, dout, causal=True,
                                           deterministic=deterministic)
        assert arch == 90
        check_grads(grads, q, k, v, dout, causal=True)
        runs.append(grads)
    if deterministic:
        for a, b in zip(*runs):
            assert torch.equal(a, b)
