"""The Hopper backward (cpp/sm90/bwd_kernel.cuh; on by default, off with FLASHATTN2_SM90_BWD=0,
``_ext.SM90_BWD = False`` or force_sm80(); head dims 33-64 also off with
FLASHATTN2_SM90_BWD_D64=0 or ``_ext.sm90_bwd_d64(False)``): its gradients at its own tile
boundaries (128 keys per CTA, 64 keys per consumer warpgroup, 64 query rows per step at
d128, 128 at d64; d256, built with FLASHATTN2_SM90_BWD_EXPERIMENTAL item d256: 64 keys
per CTA, the warpgroups splitting the columns, 64 query rows per step) against the float32
reference under the 2x rule of test_bwd.py, and which backwards stay on the mma.sync kernels.
"""
import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func
from test_bwd import check_grads, check_kernel, make_inputs, run_backward
from test_variants import CASES as MOD_CASES
from test_variants import case_inputs, ref_kwargs, run_kernels
from test_variants import check_grads as check_mod_grads
from test_varlen import check_varlen_backward

pytestmark = pytest.mark.gpu

SM90_BWD_HEAD_DIMS = tuple(_ext.build_info().get("sm90_bwd_head_dims", ()))
# Extensions built in for testing before they are on by default (FLASHATTN2_SM90_BWD_EXPERIMENTAL).
EXPERIMENTAL = set(_ext.build_info().get("sm90_bwd_experimental", ()))

# Around the tiles: 1, a partial step, exactly one d128 step / one warpgroup's keys, one
# past, one CTA's keys / one d64 step, one past, several CTAs; and sq != sk both ways (causal:
# bottom-right aligned, so the first query rows see no key when sq > sk).
SEQLENS = [(1, 1), (63, 63), (64, 64), (65, 65), (127, 127), (128, 128), (129, 129),
           (300, 300), (500, 500), (1000, 1000), (1, 300), (300, 1), (100, 500), (500, 100),
           (255, 257), (1023, 1025), (129, 300), (300, 129)]
HEADS = [(4, 4), (8, 2)]


@pytest.fixture
def sm90_bwd(monkeypatch):
    """Turns the Hopper backward on for the test (skips where it cannot run)."""
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)):
        pytest.skip("needs an sm_90 GPU")
    if not SM90_BWD_HEAD_DIMS:
        pytest.skip("this build has no sm90 backward (needs 90a-real)")
    monkeypatch.setattr(_ext, "SM90_BWD", True)
    monkeypatch.setattr(_ext, "SM90_BWD_D64", True)


def require_sm90_bwd(kernel_head_dim):
    if kernel_head_dim not in SM90_BWD_HEAD_DIMS:
        pytest.skip(f"this build has no sm90 backward for kernel head dim {kernel_head_dim} "
                    f"(FLASHATTN2_SM90_BWD_EXPERIMENTAL=d64 builds 64, d256 256)")


# The extensions deterministic mode on the Hopper backward needs (d256: its producer warp 2
# runs the dQ order; there is no consumer-warp variant).
DET_NEEDS = {64: {"dq_bulk"}, 128: {"dq_bulk"}, 256: {"dq_bulk", "dq_warp"}}


def require_sm90_deterministic(headdim):
    require_sm90_bwd(headdim)
    if not DET_NEEDS[headdim] <= EXPERIMENTAL:
        pytest.skip(f"deterministic mode on the d{headdim} Hopper backward needs "
                    f"{sorted(DET_NEEDS[headdim])} in FLASHATTN2_SM90_BWD_EXPERIMENTAL")


def arch_of_backward(*args, **kwargs):
    """run_backward (NaN-poisoned outputs) and the generation of the backward that ran."""
    _ext.last_bwd_arch = None
    grads = run_backward(*args, **kwargs)
    torch.cuda.synchronize()
    return grads, _ext.last_bwd_arch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SEQLENS)
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward(sm90_bwd, headdim, seqlen_q, seqlen_k, causal, nheads, nheads_k, dtype):
    require_sm90_bwd(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    grads, arch = arch_of_backward(q, k, v, dout, causal=causal)
    assert arch == 90
    check_grads(grads, q, k, v, dout, causal=causal)


# Head dims that run on kernel head dims 64 / 128 / 256 with columns past d (zero-filled by
# TMA, not written back): 36, 100 and 202 are padded to 40, 104 and 208 by the Python layer;
# 56, 120 and 248 are multiples of 8 (200: d256's first column half only partly used).
@pytest.mark.parametrize("headdim", [36, 56, 100, 120, 200, 202, 248])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(65, 129), (257, 255)])
def test_sm90_backward_padded_head_dims(sm90_bwd, seqlen_q, seqlen_k, causal, headdim):
    require_sm90_bwd(_ext.KERNEL_HEAD_DIM[headdim])
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, 8, 2, headdim, torch.bfloat16)
    _ext.last_bwd_arch = None
    check_kernel(q, k, v, dout, causal=causal)
    assert _ext.last_bwd_arch == 90


# Sliding windows (experimental "window"): both bounds, one side only, a window narrower than
# a warpgroup's 64 keys, one wider than the CTA's 128, sq != sk both ways.
WINDOWS = [(32, 8), (0, 0), (100, -1), (-1, 50), (200, 200), (63, 0)]


@pytest.mark.parametrize("window_size", WINDOWS, ids=str)
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(65, 129), (300, 300), (500, 100), (100, 500)])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_window(sm90_bwd, headdim, seqlen_q, seqlen_k, window_size):
    if "window" not in EXPERIMENTAL:
        pytest.skip("sliding windows are an experimental extension of the Hopper backward "
                    "(FLASHATTN2_SM90_BWD_EXPERIMENTAL=window)")
    require_sm90_bwd(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, 8, 2, headdim, torch.bfloat16)
    _ext.last_bwd_arch = None
    check_kernel(q, k, v, dout, window_size=window_size)
    assert _ext.last_bwd_arch == 90


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", ["ragged", "same"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_varlen(sm90_bwd, headdim, lengths, causal):
    """Packed sequences (experimental "varlen"): empty and one-token sequences, ragged tails,
    sq != sk, GQA; each sequence's gradients against its own reference (test_varlen.py)."""
    if "varlen" not in EXPERIMENTAL:
        pytest.skip("varlen is an experimental extension of the Hopper backward "
                    "(FLASHATTN2_SM90_BWD_EXPERIMENTAL=varlen)")
    require_sm90_bwd(headdim)
    torch.manual_seed(0)
    _ext.last_bwd_arch = None
    check_varlen_backward(torch.bfloat16, headdim, lengths, (6, 2), causal, False)
    assert _ext.last_bwd_arch == 90


@pytest.mark.parametrize("case", list(MOD_CASES))
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_score_mods(sm90_bwd, headdim, case):
    """softcap and ALiBi (experimental "mods"; the windowed cases also need "window"), the
    cases of test_variants.py."""
    if "mods" not in EXPERIMENTAL:
        pytest.skip("softcap / ALiBi are an experimental extension of the Hopper backward "
                    "(FLASHATTN2_SM90_BWD_EXPERIMENTAL=mods)")
    require_sm90_bwd(headdim)
    torch.manual_seed(0)
    q, k, v, dout, mods, causal, window = case_inputs(case, headdim, torch.bfloat16)
    if window != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("a sliding window: needs the experimental window extension too")
    _ext.last_bwd_arch = None
    _, _, grads = run_kernels(q, k, v, dout, causal, window, None, mods)
    check_mod_grads(grads, q, k, v, dout, ref_kwargs(causal, window, None, mods))
    assert _ext.last_bwd_arch == 90


def test_sm90_backward_strided_inputs(sm90_bwd):
    """q, k, v, dout as column slices of wider tensors (row strides > d): TMA maps and the dk /
    dv stores take BwdParams' strides."""
    require_sm90_bwd(128)
    torch.manual_seed(0)
    wide = [torch.randn(2, 200, 4, 256, device="cuda", dtype=torch.float16) for _ in range(4)]
    q, k, v, dout = (t[..., 64:192] for t in wide)
    _ext.last_bwd_arch = None
    check_kernel(q, k, v, dout, causal=True)
    assert _ext.last_bwd_arch == 90


@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_strided_grad_outputs(sm90_bwd, headdim):
    """dk / dv given as column slices of wider tensors (the epilogue stages each warp's key
    rows in shared memory, then writes 16-byte row segments at dk / dv's own strides): the
    values written into contiguous tensors, every element written, nothing around them."""
    require_sm90_bwd(headdim)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, 150, 200, 8, 2, headdim, torch.bfloat16)
    scale = headdim**-0.5
    out, lse = _launch._flash_attn_forward(q, k, v, scale, -1, 0)
    _, dk, dv = _launch._flash_attn_backward(dout, q, k, v, out, lse, scale, -1, 0)
    wide = [torch.full((*k.shape[:3], headdim + 16), 7.0, device="cuda", dtype=k.dtype)
            for _ in range(2)]
    dk_s, dv_s = (w[..., 8:8 + headdim].fill_(float("nan")) for w in wide)
    _ext.last_bwd_arch = None
    _launch._flash_attn_backward(dout, q, k, v, out, lse, scale, -1, 0, dk=dk_s, dv=dv_s)
    assert _ext.last_bwd_arch == 90
    assert torch.equal(dk_s, dk) and torch.equal(dv_s, dv)
    for w in wide:
        assert (w[..., :8] == 7).all() and (w[..., 8 + headdim:] == 7).all()


def test_sm90_backward_falls_back_out_of_scope_and_when_off(sm90_bwd, monkeypatch):
    require_sm90_bwd(128)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(1, 200, 200, 4, 2, 128, torch.bfloat16)
    # Out of scope: windows (unless built in), softcap (through the public API) and
    # deterministic mode unless built in, other dims.
    _, arch = arch_of_backward(q, k, v, dout, window_size=(32, 8))
    assert arch == (90 if "window" in EXPERIMENTAL else 80)
    for d in (32, 64, 256):  # kernel head dims of the build without a Hopper backward
        if d in _ext.build_info()["bwd_head_dims"] and d not in SM90_BWD_HEAD_DIMS:
            qd, kd, vd, doutd = make_inputs(1, 200, 200, 4, 2, d, torch.bfloat16)
            _, arch = arch_of_backward(qd, kd, vd, doutd, causal=True)
            assert arch == 80, d
    for kwargs in (dict(deterministic=True), dict(softcap=20.0)):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        _ext.last_bwd_arch = None
        flash_attn_func(qg, kg, vg, causal=True, **kwargs).backward(dout)
        torch.cuda.synchronize()
        in_scope = EXPERIMENTAL >= ({"mods"} if "softcap" in kwargs else {"dq_bulk"})
        assert _ext.last_bwd_arch == (90 if in_scope else 80), kwargs
    # Forced to sm80, or switched off: the mma.sync backward even in scope.
    with _ext.force_sm80():
        _, arch = arch_of_backward(q, k, v, dout, causal=True)
    assert arch == 80
    _, arch = arch_of_backward(q, k, v, dout, causal=True)
    assert arch == 90
    monkeypatch.setattr(_ext, "SM90_BWD", False)
    _, arch = arch_of_backward(q, k, v, dout, causal=True)
    assert arch == 80


def test_sm90_backward_d256_falls_back_out_of_scope(sm90_bwd):
    """The d256 kernel (FLASHATTN2_SM90_BWD_EXPERIMENTAL item d256) serves dense backwards
    without softcap / ALiBi / bias, deterministic mode too in builds with dq_bulk and dq_warp;
    the rest runs the mma.sync backward."""
    require_sm90_bwd(256)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(1, 200, 200, 4, 2, 256, torch.bfloat16)
    _, arch = arch_of_backward(q, k, v, dout, causal=True)
    assert arch == 90
    for kwargs in (dict(deterministic=True), dict(softcap=20.0)):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        _ext.last_bwd_arch = None
        flash_attn_func(qg, kg, vg, causal=True, **kwargs).backward(dout)
        torch.cuda.synchronize()
        in_scope = "deterministic" in kwargs and DET_NEEDS[256] <= EXPERIMENTAL
        assert _ext.last_bwd_arch == (90 if in_scope else 80), kwargs
        assert all(torch.isfinite(t.grad).all() for t in (qg, kg, vg)), kwargs


# Deterministic mode on the Hopper backward (dq_bulk builds; d256: with dq_warp, whose
# producer warp 2 runs the order there), in every order of common/dq_order.cuh and with 1, 2
# or 4 dQ chains (None: bwd_dq_chains's choice, one chain at these lengths but for the
# ascending cases from 1024 keys, which take 4). In builds with dq_warp these run its kernel
# instances (_ext.SM90_DQ_WARP, on by default). d256 (64 x 64 tiles): (1025, 1025) full has
# 17 key blocks and 17 query tiles, (1500, 700) 11 and 24, (1024, 1024) 16 and 16.
DET_CASES = pytest.mark.parametrize(
    "seqlens,causal,window_size",
    [((1025, 1025), True, (-1, -1)),  # descending, key blocks launched last first
     ((700, 1500), True, (-1, -1)),  # sq < sk
     ((1500, 700), True, (-1, -1)),  # sq > sk: the first query blocks see no key
     ((1025, 1025), False, (256, 64)),  # band: descending
     ((1025, 1025), False, (-1, -1)),  # rotated walk
     ((1500, 700), False, (-1, -1)),  # rotated, fewer key blocks than query blocks
     ((1024, 1024), False, (-1, -1)),  # rotated, 8 key blocks: whole rings of 2 / 4 chains
     ((300, 1025), False, (-1, -1)),  # more key blocks than query blocks: ascending
     ((1025, 1025), False, (256, -1))],  # left bound only: ascending
    ids=["causal", "causal-sq<sk", "causal-sq>sk", "band", "full", "full-sq>sk", "full-8",
         "full-sq<sk", "left"],
)  # fmt: skip


@DET_CASES
@pytest.mark.parametrize("chains", [None, 2, 4], ids=["chains-auto", "chains-2", "chains-4"])
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_deterministic(sm90_bwd, headdim, seqlens, causal, window_size, chains,
                                     nheads, nheads_k):
    """Three runs bitwise equal and right, on the Hopper backward. The rotated walk with
    chains: at d64 (128-row query tiles), (1025, 1025) full has 9 key blocks and 9 query tiles,
    so a key block's chain-mates wrap around unevenly (dq_order.cuh turn); (1500, 700) 6 and 12;
    d128 (64-row tiles) 9 and 17, 6 and 24."""
    require_sm90_deterministic(headdim)
    arch = 90 if window_size == (-1, -1) or "window" in EXPERIMENTAL else 80
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    runs = []
    with _ext.dq_chains(chains):
        for _ in range(3):
            grads, ran = arch_of_backward(q, k, v, dout, causal=causal, window_size=window_size,
                                          deterministic=True)
            assert ran == arch
            runs.append(grads)
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("chains", [1, 4], ids=["chains-1", "chains-4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(65, 129), (257, 255)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("headdim", [200, 248, 256])
def test_sm90_backward_d256_deterministic_dtypes_and_padded_dims(sm90_bwd, headdim, dtype,
                                                                 seqlens, causal, chains):
    """The d256 kernel's deterministic instance in both dtypes, with the column chunks past a
    padded head dim (200: one n8 tile of the last chunk, 248: seven) left out of the staged
    bulk reduces, query and key tails, GQA 4:1, one and four chains: three runs bitwise equal
    and right."""
    require_sm90_deterministic(256)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, 8, 2, headdim, dtype)
    runs = []
    with _ext.dq_chains(chains):
        for _ in range(3):
            grads, ran = arch_of_backward(q, k, v, dout, causal=causal, deterministic=True)
            assert ran == 90
            runs.append(grads)
    check_grads(runs[0], q, k, v, dout, causal=causal)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


class _ChainsRecorder:
    """Stands in for _launch._C: records the dq_chains and dq_warp of each _C.bwd, runs the
    real one."""

    def __init__(self, real):
        self.real, self.chains, self.dq_warp = real, [], []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def bwd(self, *args, **kwargs):
        self.chains.append(kwargs["dq_chains"])
        self.dq_warp.append(kwargs["dq_warp"])
        return self.real.bwd(*args, **kwargs)


def require_dq_warp(headdim):
    require_sm90_bwd(headdim)
    if "dq_warp" not in EXPERIMENTAL:
        pytest.skip("needs a build with dq_warp in FLASHATTN2_SM90_BWD_EXPERIMENTAL")


@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("seqlens,causal", [((1025, 1025), True), ((300, 1025), False),
                                            ((1500, 700), False)], ids=["causal", "sq<sk", "sq>sk"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_dq_warp_default(sm90_bwd, monkeypatch, headdim, seqlens, causal, chains):
    """dq_warp builds: the default (not deterministic) backward runs the dq_warp instances too
    (producer warp 2 issues the reduces, no turns) and is right with the switch on and off,
    also with dQ chains forced (ignored without deterministic mode: one accumulator)."""
    require_dq_warp(headdim)
    recorder = _ChainsRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, 8, 2, headdim, torch.bfloat16)
    with _ext.dq_chains(chains):
        for warp in (True, False):
            with _ext.sm90_dq_warp(warp):
                grads, ran = arch_of_backward(q, k, v, dout, causal=causal)
            assert ran == 90
            check_grads(grads, q, k, v, dout, causal=causal)
    assert recorder.dq_warp == [True, False]


@DET_CASES
@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("nheads,nheads_k", HEADS, ids=["mha", "gqa8-2"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_dq_warp_bitwise(sm90_bwd, monkeypatch, headdim, seqlens, causal,
                                       window_size, chains, nheads, nheads_k):
    """dq_warp builds: the deterministic backward with producer warp 2 running the dQ order
    (_ext.sm90_dq_warp(True)) gives the same bits as with the consumer warps running it
    (False): the same visitors add the same float32 tiles in the same order; and is right."""
    require_dq_warp(headdim)
    if window_size != (-1, -1) and "window" not in EXPERIMENTAL:
        pytest.skip("this window runs the mma.sync backward without the window extension")
    recorder = _ChainsRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(2, *seqlens, nheads, nheads_k, headdim, torch.bfloat16)
    runs = []
    with _ext.dq_chains(chains):
        for warp in (True, False, True):
            with _ext.sm90_dq_warp(warp):
                grads, ran = arch_of_backward(q, k, v, dout, causal=causal,
                                              window_size=window_size, deterministic=True)
            assert ran == 90
            runs.append(grads)
    assert recorder.dq_warp == [True, False, True]
    check_grads(runs[0], q, k, v, dout, causal=causal, window_size=window_size)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("seqlen,chains", [(8192, 2), (16384, 4)], ids=["8k", "16k"])
@pytest.mark.parametrize("headdim", [64, 128, 256], ids=["d64", "d128", "d256"])
def test_sm90_backward_deterministic_long(sm90_bwd, monkeypatch, headdim, seqlen, chains):
    """Long full attention (GQA 2:1): the rotated walk with the chains bwd_dq_chains gives it
    (2 from 8k keys, 4 from 16k: 64 / 128 key blocks, within the 132 SMs of an H100 SXM; on
    fewer SMs 16k takes the ascending order, also in 4 chains; d256's 64-key blocks: 128 at
    8k, rotated, 256 at 16k, ascending), on the Hopper backward; three runs bitwise equal and
    right."""
    require_sm90_deterministic(headdim)
    recorder = _ChainsRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    torch.manual_seed(0)
    q, k, v, dout = make_inputs(1, seqlen, seqlen, 2, 1, headdim, torch.bfloat16)
    runs = []
    for _ in range(3):
        grads, ran = arch_of_backward(q, k, v, dout, deterministic=True)
        assert ran == 90
        runs.append(grads)
    assert recorder.chains == [chains] * 3
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    check_grads(runs[0], q, k, v, dout)


@pytest.mark.parametrize("chains", [None, 4], ids=["chains-auto", "chains-4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128], ids=["d64", "d128"])
def test_sm90_backward_deterministic_varlen(sm90_bwd, headdim, causal, chains):
    """Packed sequences: each sequence's CTAs keep their own order (a sequence whose key
    blocks outnumber its query blocks takes the ascending order, still bitwise), in each
    chain's counters of the varlen layout (seqlen.cuh ws_tile0); in dq_warp builds the same
    bits from its instance and, in the second run, from the consumer warps' order."""
    require_sm90_bwd(headdim)
    if not {"dq_bulk", "varlen"} <= EXPERIMENTAL:
        pytest.skip("needs the dq_bulk and varlen extensions")
    from flashattn2 import flash_attn_varlen_func

    torch.manual_seed(0)
    lengths_q, lengths_k = [300, 1, 640, 129], [300, 77, 640, 400]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0)], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), 8, headdim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lengths_k), 2, headdim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    dout = torch.randn_like(q)
    runs = []
    # dq_warp builds: the second run keeps the dQ order on the consumer warps (the same bits).
    for warp in (True, False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        _ext.last_bwd_arch = None
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                     causal=causal, deterministic=True)
        with _ext.dq_chains(chains), _ext.sm90_dq_warp(warp):
            out.backward(dout)
        torch.cuda.synchronize()
        assert _ext.last_bwd_arch == 90
        runs.append([t.grad for t in leaves])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    # Each sequence's gradients against the float32 reference (the 2x rule).
    for i in range(len(lengths_q)):
        qs, ks, vs = (t[c[i]:c[i + 1]].unsqueeze(0) for t, c in ((q, cu_q), (k, cu_k), (v, cu_k)))
        grads = [g[c[i]:c[i + 1]].unsqueeze(0) for g, c in zip(runs[0], (cu_q, cu_k, cu_k))]
        check_grads(grads, qs, ks, vs, dout[cu_q[i]:cu_q[i + 1]].unsqueeze(0), causal=causal)


def test_sm90_backward_d64_switch(sm90_bwd):
    """Head dims 33-64 run the Hopper backward (kernel head dim 64) where built, unless
    switched off (FLASHATTN2_SM90_BWD_D64=0 / _ext.sm90_bwd_d64(False)): then the mma.sync
    backward, with the same gradients under the 2x rule; d128 stays on the Hopper kernel."""
    require_sm90_bwd(64)
    torch.manual_seed(0)
    for headdim in (64, 48):
        q, k, v, dout = make_inputs(2, 300, 129, 8, 2, headdim, torch.bfloat16)
        grads, arch = arch_of_backward(q, k, v, dout, causal=True)
        assert arch == 90, headdim
        check_grads(grads, q, k, v, dout, causal=True)
        with _ext.sm90_bwd_d64(False):
            grads_off, arch = arch_of_backward(q, k, v, dout, causal=True)
        assert arch == 80, headdim
        check_grads(grads_off, q, k, v, dout, causal=True)
    if 128 in SM90_BWD_HEAD_DIMS:
        q, k, v, dout = make_inputs(1, 200, 200, 4, 2, 128, torch.bfloat16)
        with _ext.sm90_bwd_d64(False):
            _, arch = arch_of_backward(q, k, v, dout, causal=True)
        assert arch == 90


@pytest.mark.parametrize("kind", ["full", "keys"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(300, 264), (129, 128), (1, 96), (257, 136)])
def test_sm90_backward_d64_bias_without_grad(sm90_bwd, seqlens, causal, kind):
    """An attention bias without its gradient (a mask) at d64, 16-byte aligned rows: the
    staged-bias instance with one sdS buffer (128-row steps leave no room for two), tiles of
    128 query rows with tails in both halves; gradients under the 2x rule of test_bias.py.
    With dbias, the mma.sync backward (the Hopper one with _ext.SM90_DBIAS)."""
    require_sm90_bwd(64)
    from test_bias import BUILT, _run_case

    if not BUILT:
        pytest.skip("build without FLASHATTN2_EXPERIMENTAL=bias")
    if "mods" not in EXPERIMENTAL:
        pytest.skip("the staged bias runs in the mods instances (FLASHATTN2_SM90_BWD_EXPERIMENTAL)")
    torch.manual_seed(0)
    _ext.last_bwd_arch = None
    _run_case(2, *seqlens, 4, 2, 64, torch.bfloat16, torch.bfloat16, kind, causal=causal,
              bias_grad=False)
    assert _ext.last_bwd_arch == 90
    _run_case(1, *seqlens, 2, 2, 64, torch.bfloat16, torch.bfloat16, kind, causal=causal)
    assert _ext.last_bwd_arch == (90 if _ext.SM90_DBIAS else 80)  # (test_sm90_dbias.py)
