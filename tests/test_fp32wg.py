"""The Hopper float32 forward (cpp/fp32/wg_kernel.cuh; builds with FLASHATTN2_EXPERIMENTAL
including fp32wg): 3xTF32 on tf32 wgmma for dense full / causal attention at kernel head dims
64 and 128 on sm_90 GPUs; every other float32 forward runs the mma.sync float32 kernels.

CPU, every build: the switch reaches the binding (allow_sm90 for float32 calls: on by default,
off with FLASHATTN2_FP32WG=0 / fp32wg(False) / force_sm80()) and the kernel code 91 is
reported as "fp32wg"; the host model of the index arithmetic (scripts/fp32wg_model.py) on two
small d128 cases. GPU (sm_90, fp32wg builds): out and lse against float64 with the 2x rule of
fp32_checks.py into NaN-filled outputs, the kernel that ran asserted (its instance too, by the
profiler); the calls it does not take fall back.
"""
import re

import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from fp32_checks import check_2x, ref_attention
from reference import attention_ref, attention_scores
from test_decode_kernel import binding_args
from test_fp32 import _ids, _qkv, kernel_forward

gpu = pytest.mark.gpu
BUILT = "fp32wg" in _ext.EXPERIMENTAL
needs_fp32wg = pytest.mark.skipif(not BUILT, reason="build without FLASHATTN2_EXPERIMENTAL=fp32wg")


class _FakeC:
    """Records the arguments of _C.fwd / _C.bwd by name (no GPU; an argument the binding does
    not have fails) and answers `code`."""

    def __init__(self, real, code):
        self.real, self.code, self.calls = real, code, []

    def _record(self, name, args, kwargs):
        names = binding_args(getattr(self.real, name))
        unknown = [key for key in kwargs if key not in names[len(args):]]
        assert not unknown, f"_C.{name} has no argument(s) {unknown}"
        self.calls.append({**dict(zip(names, args)), **kwargs})
        return self.code

    def fwd(self, *args, **kwargs):
        return self._record("fwd", args, kwargs)

    def bwd(self, *args, **kwargs):
        return self._record("bwd", args, kwargs)

    def bwd_dq_chains(self, *args):
        return 1

    def bwd_workspace_floats(self, *args):
        return 16, 16


def _record(monkeypatch, dtype, code=80):
    fake = _FakeC(_launch._C, code)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(_launch._C, "sm90_fwd_applies", lambda *a: False, raising=False)
    q, k, v = _qkv(1, 70, 90, 4, 2, 64, dtype=dtype)
    _launch._flash_attn_forward(q, k, v, 0.125, -1, 0, num_splits=1)
    (call,) = fake.calls
    return call


def test_build_item_needs_fp32():
    if BUILT:
        assert "fp32" in _ext.EXPERIMENTAL and _ext.FP32_HEAD_DIMS


@pytest.mark.parametrize("switch", ["default", "fp32wg_off", "force_sm80"])
def test_fp32_forward_switch_reaches_the_binding(monkeypatch, switch):
    """float32 calls pass allow_sm90 = the fp32wg switch (and not force_sm80)."""
    monkeypatch.setattr(_ext, "FP32WG", switch != "fp32wg_off")
    monkeypatch.setattr(_ext, "FORCE_SM80", switch == "force_sm80")
    assert _record(monkeypatch, torch.float32)["allow_sm90"] is (switch == "default")


def test_fp32wg_switch_leaves_16_bit_calls_alone(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG", False)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    assert _record(monkeypatch, torch.float16)["allow_sm90"] is True


def test_fp32wg_context_manager_restores(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG", True)
    with _ext.fp32wg(False):
        assert _ext.FP32WG is False
    assert _ext.FP32WG is True


def test_kernel_code_91_is_fp32wg(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG", True)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    _record(monkeypatch, torch.float32, code=91)
    assert (_ext.last_fwd_arch, _ext.last_fwd_kernel) == (90, "fp32wg")


# The host model of the kernel's index arithmetic (scripts/fp32wg_model.py: every wgmma
# operand element of every tile checked against the split it should hold, then out / lse
# against float64), on two small d128 cases: keeps the model running with the kernel.
@pytest.mark.parametrize("case", [(128, 1, 64, 33, 2, 1, 128, True, -1, 0),
                                  (128, 1, 129, 67, 4, 1, 96, False, -1, 1)])
def test_fp32wg_host_model(case):
    import pathlib
    import re
    import sys
    pytest.importorskip("numpy")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import fp32wg_model
    finally:
        sys.path.pop(0)
    result = fp32wg_model.check(*case, fixed=True)
    errors = re.fullmatch(r"out err (\S+) lse err (\S+)", result)
    assert errors and max(map(float, errors.groups())) < 1e-6, result


# ---- GPU: sm_90, fp32wg builds ------------------------------------------------------------


@pytest.fixture
def hopper():
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the fp32wg kernels run on sm_90 GPUs only")


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): d64 / d128 kernels
# (d40 -> 64, d72 / d96 -> 128, zero-filled past d), GQA / MQA, ragged tails in both lengths
# (128-row tiles: seqlen_q 1, 64 (the second warpgroup's rows all past the end), 127 / 129 /
# 200 (ragged in one warpgroup or the other), 128; d128's 32-key tiles: 1, 33, 67, 97, 1000),
# causal with seqlen_q > seqlen_k (rows that see no key: lse +inf, out 0) and < seqlen_k,
# 1k-4k (the two-level accumulation over many key tiles, and the LSE drift of
# scripts/fp32wg_lse.py); a right window without a left one (the kernel's mask takes any
# window_right; window_left >= 0 falls back); causal grids tile-major (d128, batch 2, 32 heads
# of GQA 4) and head-major past 32 heads (fp32wg_tile_major).
SHAPES = [
    (1, 113, 203, 4, 2, 64, False, (-1, -1)),
    (1, 113, 203, 4, 2, 64, True, (-1, -1)),
    (1, 200, 333, 2, 1, 64, False, (-1, 16)),
    (2, 150, 97, 2, 2, 128, False, (-1, 40)),
    (1, 257, 257, 3, 3, 40, True, (-1, -1)),
    (1, 1, 1, 1, 1, 128, False, (-1, -1)),
    (2, 1, 97, 2, 2, 128, False, (-1, -1)),
    (1, 64, 33, 2, 1, 128, True, (-1, -1)),
    (1, 127, 129, 4, 2, 128, False, (-1, -1)),
    (2, 203, 113, 4, 4, 128, True, (-1, -1)),
    (1, 200, 333, 2, 1, 72, False, (-1, 40)),
    (1, 128, 32, 1, 1, 128, False, (-1, -1)),
    (1, 300, 128, 2, 1, 128, False, (-1, -1)),
    (1, 300, 1000, 2, 1, 128, True, (-1, -1)),
    (1, 129, 67, 4, 1, 96, False, (-1, -1)),
    (1, 1024, 1024, 4, 2, 64, False, (-1, -1)),
    (1, 1024, 1024, 2, 1, 128, True, (-1, -1)),
    (1, 1024, 1024, 2, 2, 96, False, (-1, -1)),
    (1, 4096, 4096, 4, 2, 64, True, (-1, -1)),
    (1, 2048, 4096, 2, 1, 128, False, (-1, -1)),
    (1, 4096, 4096, 2, 1, 128, True, (-1, -1)),
    (1, 1, 4096, 4, 2, 128, False, (-1, -1)),
    (2, 300, 257, 32, 8, 128, True, (-1, -1)),
    (2, 257, 300, 34, 34, 128, True, (-1, -1)),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32wg_forward_against_float64(hopper, shape):
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    with _ext.fp32wg(True):
        out, lse = kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg"
        check_2x(("out", "lse"), (out, lse), ref_attention(causal, window), (q, k, v))
        public = flashattn2.flash_attn_func(q, k, v, causal=causal, window_size=window)
        assert _ext.last_fwd_kernel == "fp32wg"
    assert torch.equal(public, out)
    # The switch: the mma.sync float32 kernel, the same rule (its LSE too: both kernels' online
    # softmax once drifted ~1.2e-5 at 4k keys; scripts/fp32wg_lse.py).
    with _ext.fp32wg(False):
        out_sm80, lse_sm80 = kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "sm80"
    check_2x(("out (mma.sync)", "lse (mma.sync)"), (out_sm80, lse_sm80),
             ref_attention(causal, window), (q, k, v))


# One CTA and one head, the pieces apart (128-row tiles; d64: 64-key tiles, d128: 32-key
# tiles; d128 with 64 rows too: the second warpgroup's rows past the end): "full" random q, k,
# v over one key tile; "pv" softmax scale 1e-6 (P nearly uniform whatever S's layout: out is
# V's column means, the V^T store / P V path alone: both 64-column halves at d128); "p" v the
# identity (seqlen_k = head dim: out is P itself, the S = Q K^T layout with Q hi from
# registers and, d128, Q lo from shared memory, softmax and the P fragments alone). A failure
# names the worst rows and columns.
PIECES = [(d, sq, piece) for d, sq in ((64, 128), (128, 64), (128, 128))
          for piece in ("full", "pv", "p")]


def _worst(err, tol):
    bad = (~(err <= tol)).nonzero().tolist()  # (NaN counts as bad)
    rows = sorted({r for r, _ in bad})
    cols = sorted({c for _, c in bad})
    return f"{len(bad)} bad of {err.numel()}: rows {rows[:16]}..., cols {cols[:16]}..."


@gpu
@needs_fp32wg
@pytest.mark.parametrize("d, sq, piece", PIECES, ids=[f"d{d}-{sq}-{p}" for d, sq, p in PIECES])
def test_fp32wg_single_tile(hopper, d, sq, piece):
    sk = d if piece == "p" else {64: 64, 128: 32}[d]
    q, k, v = _qkv(1, sq, sk, 1, 1, d, device="cuda")
    if piece == "p":
        v = torch.eye(sk, d, device="cuda")[None, :, None, :].contiguous()
    scale = 1e-6 if piece == "pv" else d**-0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 1, sq), float("nan"), device="cuda")
    with _ext.fp32wg(True):
        _launch._flash_attn_forward(q, k, v, scale, -1, -1, out=out, lse=lse)
        assert _ext.last_fwd_kernel == "fp32wg"

    def ref(q, k, v):
        scores = attention_scores(q, k, softmax_scale=scale)[0]
        return (attention_ref(q, k, v, softmax_scale=scale, upcast=False)[0],
                torch.logsumexp(scores, dim=-1))

    try:
        check_2x(("out", "lse"), (out, lse), ref, (q, k, v))
    except AssertionError as e:
        o64 = ref(q.double(), k.double(), v.double())[0]
        raise AssertionError(f"{e}; out: {_worst((out.double() - o64).abs()[0, :, 0], 1e-4)}")


# (label, headdim, window, modifiers): calls the fp32wg kernel does not take.
FALLBACKS = [
    ("window", 64, (32, 16), {}),
    ("softcap", 128, (-1, -1), {"softcap": 5.0}),
    ("d32", 32, (-1, -1), {}),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("label, d, window, mods", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_fp32wg_fallbacks_run_the_mma_sync_kernel(hopper, label, d, window, mods):
    q, k, v = _qkv(1, 150, 170, 4, 2, d, device="cuda")
    out, lse = kernel_forward(q, k, v, False, window, **mods)
    assert _ext.last_fwd_kernel == "sm80", label
    check_2x(("out", "lse"), (out, lse), ref_attention(False, window, **mods), (q, k, v))


@gpu
@needs_fp32wg
def test_fp32wg_varlen_falls_back(hopper):
    lens = [37, 120]
    cu = torch.tensor([0, 37, 157], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(157, 4, 64, device="cuda") for _ in range(3))
    out = flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert _ext.last_fwd_kernel == "sm80"
    for i, n in enumerate(lens):
        rows = slice(int(cu[i]), int(cu[i]) + n)
        check_2x((f"seq {i}",), (out[rows][None],), ref_attention(True),
                 (q[rows][None], k[rows][None], v[rows][None]))


def _instance(name):
    """The head dim of an Fp32WgTraits profiler kernel name, demangled or not (the traits'
    second argument, kSingle, follows it: "Fp32WgTraits<128, false>", "...ILi128ELb0EE")."""
    m = re.search(r"Fp32WgTraits(?:<(\d+)[,>]|ILi(\d+)E)", name)
    if m and int(m.group(1) or m.group(2)) in (64, 128):
        return int(m.group(1) or m.group(2))
    raise AssertionError(f"not an fp32wg instance: {name}")


def _kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if "fwd_fp32wg_kernel" in e.key]


@gpu
@needs_fp32wg
def test_fp32wg_runs_the_instance_of_its_head_dim(hopper):
    """Fp32WgTraits<128> runs at d128 and d96, <64> at d64."""
    q, k, v = _qkv(1, 256, 256, 2, 2, 128, device="cuda")
    with _ext.fp32wg(True):
        names = {d: _kernel_names(lambda: kernel_forward(*(t[..., :d].contiguous()
                                                           for t in (q, k, v)), True, (-1, -1)))
                 for d in (128, 96, 64)}
    if not any(names.values()):
        pytest.skip("the profiler recorded no kernels (CUPTI unavailable?)")
    assert {d: [_instance(n) for n in ns] for d, ns in names.items()} == \
        {128: [128], 96: [128], 64: [64]}, names
