"""The Hopper float32 backward (cpp/fp32/wg_bwd_kernel.cuh; builds with FLASHATTN2_EXPERIMENTAL
including fp32wg): 3xTF32 on tf32 wgmma for dense full / causal float32 backwards at kernel
head dim 64 on sm_90 GPUs, run by default (FLASHATTN2_FP32WG_BWD=0 at import or
_ext.fp32wg_bwd(False) turn it off: an A/B switch); every other float32 backward runs the
mma.sync float32 kernel.

CPU, every build: the switch reaches the binding (fp32wg_bwd, only for float32, off with
FLASHATTN2_FP32WG=0 or force_sm80(); its import-time default, on: test_api.py), code 91 is
reported as last_bwd_kernel "fp32wg"; the host model of the kernel's index arithmetic
(scripts/fp32wg_bwd_model.py) on small cases. GPU (sm_90, fp32wg builds): dq, dk, dv against
float64 with the 2x rule of fp32_checks.py into NaN-filled gradients (lengths 1..4096 that are
not multiples of the tiles, causal with seqlen_q != seqlen_k, a right window, GQA / MQA, d40 /
d64), the kernel that ran asserted, and the calls it does not take fall back.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from fp32_checks import GRADS, check_2x, ref_attention
from test_fp32 import _ids, _qkv, kernel_forward
from test_fp32wg import _FakeC, gpu, needs_fp32wg
from test_fp32wg import hopper  # noqa: F401 (the fixture)


def _record(monkeypatch, dtype, code=80, d=64):
    """The binding's arguments of a backward at head dim d (d128: test_fp32wg_bwd128.py)."""
    fake = _FakeC(_launch._C, code)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(_ext, "FP32_BWD", True)
    monkeypatch.setattr(_ext, "DQ_CHAINS", 1)  # (16-bit, deterministic: no device query)
    q, k, v = _qkv(1, 70, 90, 4, 2, d, dtype=dtype)
    out = torch.zeros_like(q)
    lse = torch.zeros(1, 4, 70)
    _launch._flash_attn_backward(torch.ones_like(q), q, k, v, out, lse, 0.125, -1, 0,
                                 deterministic=dtype is not torch.float32)
    (call,) = fake.calls
    return call


@pytest.mark.parametrize("switch", ["on", "off", "fp32wg_off", "force_sm80"])
def test_fp32wg_bwd_switch_reaches_the_binding(monkeypatch, switch):
    monkeypatch.setattr(_ext, "FP32WG_BWD", switch != "off")
    monkeypatch.setattr(_ext, "FP32WG", switch != "fp32wg_off")
    monkeypatch.setattr(_ext, "FORCE_SM80", switch == "force_sm80")
    call = _record(monkeypatch, torch.float32)
    assert call["fp32wg_bwd"] is (switch == "on")
    assert call["allow_sm90"] is (switch != "force_sm80")


def test_fp32wg_bwd_switch_leaves_16_bit_calls_alone(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG_BWD", True)
    assert "fp32wg_bwd" not in _record(monkeypatch, torch.float16)


def test_fp32wg_bwd_context_manager_restores(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG_BWD", False)
    with _ext.fp32wg_bwd():
        assert _ext.FP32WG_BWD is True
    assert _ext.FP32WG_BWD is False


@pytest.mark.parametrize("code, expected", [(91, (90, "fp32wg")), (80, (80, "sm80")),
                                            (90, (90, "sm90"))])
def test_bwd_kernel_codes(monkeypatch, code, expected):
    _record(monkeypatch, torch.float32, code=code)
    assert (_ext.last_bwd_arch, _ext.last_bwd_kernel) == expected


class _NeedsDqAccumC(_FakeC):
    """A _C whose bwd answers -1 (flash_api.h kBwdNeedsDqAccum) for a kernel that needs the
    dQ accumulator (code 80: the mma.sync ones) while dq_accum is 0, else `code`."""

    def bwd(self, *args, **kwargs):
        super().bwd(*args, **kwargs)
        return -1 if self.code == 80 and self.calls[-1]["dq_accum"] == 0 else self.code


# float32 backwards call _C.bwd without the dQ accumulator first (the Hopper float32 kernels
# add into dq itself) and allocate it only when the kernel asks (-1: nothing ran); 16-bit
# calls pass it at once.
@pytest.mark.parametrize("dtype, code, dq_accums", [(torch.float32, 91, [0]),
                                                    (torch.float32, 80, [0, "ptr"]),
                                                    (torch.float16, 80, ["ptr"])])
def test_bwd_dq_accum_only_where_needed(monkeypatch, dtype, code, dq_accums):
    fake = _NeedsDqAccumC(_launch._C, code)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(_ext, "FP32_BWD", True)
    monkeypatch.setattr(_ext, "DQ_CHAINS", 1)
    q, k, v = _qkv(1, 70, 90, 4, 2, 64, dtype=dtype)
    _launch._flash_attn_backward(torch.ones_like(q), q, k, v, torch.zeros_like(q),
                                 torch.zeros(1, 4, 70), 0.125, -1, 0,
                                 deterministic=dtype is not torch.float32)
    seen = [call["dq_accum"] for call in fake.calls]
    assert [0 if p == 0 else "ptr" for p in seen] == dq_accums
    assert _ext.last_bwd_kernel == _ext.BWD_KERNELS[code][1]


# The host model of the kernel's index arithmetic (scripts/fp32wg_bwd_model.py: every word of
# each shared-memory tile written once, every wgmma operand element checked against the split
# it should hold, dq / dk / dv against float64), on small cases: causal with sq > sk (tiles of
# no visible key), GQA, a key tail and d40.
@pytest.mark.parametrize("case", [(1, 33, 70, 1, 1, 64, -1), (1, 40, 20, 2, 1, 40, 0)])
def test_fp32wg_bwd_host_model(case):
    import pathlib
    import sys
    pytest.importorskip("numpy")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import fp32wg_bwd_model
    finally:
        sys.path.pop(0)
    errors = fp32wg_bwd_model.check(*case)
    assert max(errors) < 1e-6, errors


# ---- GPU: sm_90, fp32wg builds ------------------------------------------------------------


def kernel_backward(q, k, v, dout, causal, window, **kw):
    """The forward, then the backward kernels alone into NaN-poisoned dq / dk / dv."""
    out, lse = kernel_forward(q, k, v, causal, window)
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    _launch._flash_attn_backward(dout, q, k, v, out, lse, q.shape[-1]**-0.5, window[0],
                                 0 if causal else window[1], dq=dq, dk=dk, dv=dv, **kw)
    return dq, dk, dv


def shape_case(shape, softcap=0.0):
    """A SHAPES / FALLBACKS row's random inputs, dout and float64 reference."""
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    dout = torch.randn(batch, sq, h, d, device="cuda")
    return q, k, v, dout, causal, window, ref_attention(causal, window, softcap=softcap)


def single_step_expected(q, k, v, dout, scale):
    """dq, dk, dv of one head in float64 (autograd through einsum and softmax)."""
    grads64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = torch.einsum("bqhd,bkhd->bhqk", grads64[0], grads64[1]) * scale
    out64 = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), grads64[2])
    return torch.autograd.grad(out64, grads64, dout.double())


def single_step_backward(q, k, v, dout, scale):
    """The forward into NaN-filled out / lse, then the backward into NaN-filled dq, dk, dv."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 1, q.shape[1]), float("nan"), device="cuda")
    _launch._flash_attn_forward(q, k, v, scale, -1, -1, out=out, lse=lse)
    ours = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    _launch._flash_attn_backward(dout, q, k, v, out, lse, scale, -1, -1,
                                 dq=ours[0], dk=ours[1], dv=ours[2])
    return ours


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): lengths that are not
# multiples of the 32-query / 128-key tiles (1, 33, 127, 257, 1000), causal with seqlen_q <
# seqlen_k and seqlen_q > seqlen_k (query rows that see no key, key blocks no query sees), a
# right window, GQA / MQA, d40 (kernel d64), 1k-4k (dK / dV summed over many query tiles);
# causal grids tile-major (batch 2, GQA) and head-major past 32 KV heads (fp32wg_tile_major).
SHAPES = [
    (1, 1, 1, 1, 1, 64, False, (-1, -1)),
    (1, 33, 33, 2, 2, 64, True, (-1, -1)),
    (2, 127, 257, 4, 2, 64, False, (-1, -1)),
    (1, 257, 127, 4, 1, 64, True, (-1, -1)),
    (1, 127, 257, 2, 1, 64, True, (-1, -1)),
    (1, 1000, 1000, 2, 2, 40, True, (-1, -1)),
    (1, 200, 333, 2, 1, 64, False, (-1, 16)),
    (2, 1, 129, 4, 4, 64, False, (-1, -1)),
    (1, 1024, 1024, 4, 2, 64, False, (-1, -1)),
    (1, 4096, 4096, 2, 1, 64, True, (-1, -1)),
    (2, 257, 300, 6, 3, 64, True, (-1, -1)),
    (1, 150, 150, 34, 34, 64, True, (-1, -1)),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32wg_backward_against_float64(hopper, shape):
    q, k, v, dout, causal, window, ref = shape_case(shape)
    with _ext.fp32wg_bwd(True):
        ours = kernel_backward(q, k, v, dout, causal, window)
        assert _ext.last_bwd_kernel == "fp32wg"
        check_2x(GRADS, ours, ref, (q, k, v), dout)
        # The public function runs it too (dq's atomic adds: not bit for bit).
        public = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window)
        check_2x(GRADS, public, ref, (q, k, v), dout)
        assert _ext.last_bwd_kernel == "fp32wg"
    with _ext.fp32wg_bwd(False):
        kernel_backward(q, k, v, dout, causal, window)
        assert _ext.last_bwd_kernel == "sm80"


# What the kernel does not take runs the mma.sync backward (and passes the rule there).
FALLBACKS = [
    ("d128", (1, 70, 90, 2, 1, 128, False, (-1, -1)), {}),
    ("d32", (1, 70, 90, 2, 1, 32, False, (-1, -1)), {}),
    ("left window", (1, 70, 90, 2, 1, 64, False, (16, 0)), {}),
    ("deterministic", (1, 70, 90, 2, 1, 64, True, (-1, -1)), {"deterministic": True}),
    ("softcap", (1, 70, 90, 2, 1, 64, False, (-1, -1)), {"softcap": 5.0}),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("name, shape, kw", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_fp32wg_bwd_falls_back(hopper, name, shape, kw):
    q, k, v, dout, causal, window, ref = shape_case(shape, kw.get("softcap", 0.0))
    # (d128: the d128 kernel's switch off, whatever FLASHATTN2_FP32WG_BWD128 says)
    with _ext.fp32wg_bwd(True), _ext.fp32wg_bwd128(False):
        fn = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window, **kw)
        check_2x(GRADS, fn, ref, (q, k, v), dout)
        assert _ext.last_bwd_kernel == "sm80", name


@gpu
@needs_fp32wg
def test_fp32wg_bwd_varlen_falls_back(hopper):
    lens = [33, 70]
    cu = torch.tensor([0, 33, 103], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(103, 2, 64, device="cuda") for _ in range(3))
    with _ext.fp32wg_bwd(True):
        out = flashattn2.flash_attn_varlen_func(q.requires_grad_(), k, v, cu, cu, max(lens),
                                                max(lens), causal=True)
        out.backward(torch.randn_like(out))
        assert _ext.last_bwd_kernel == "sm80"
    assert q.grad.isfinite().all()


# One CTA, one step (128 keys, 32 query rows, one head): a failure names the wrong rows /
# columns of each gradient, to tell the pieces apart (dv: P^T fragments, dO^T; dk: dS^T, Q^T;
# dq: the sdS stores, K^T, the reds). "uniform": softmax scale 1e-6 (P nearly uniform whatever
# S^T's layout: dv is dO's column means, the dO^T / P^T path alone).
@gpu
@needs_fp32wg
@pytest.mark.parametrize("piece", ["full", "uniform"])
def test_fp32wg_bwd_single_step(hopper, piece):
    from test_fp32wg import _worst
    q, k, v = _qkv(1, 32, 128, 1, 1, 64, device="cuda")
    dout = torch.randn_like(q)
    scale = 1e-6 if piece == "uniform" else 64**-0.5
    expected = single_step_expected(q, k, v, dout, scale)
    with _ext.fp32wg_bwd(True):
        ours = single_step_backward(q, k, v, dout, scale)
        assert _ext.last_bwd_kernel == "fp32wg"
    for name, a, e in zip(GRADS, ours, expected):
        err = (a.double() - e).abs()[0, :, 0]
        tol = 1e-5 + 1e-5 * e.abs().max().item()
        assert (err <= tol).all(), f"{name}: {_worst(err, tol)}"


# dq, dk, dv as views of NaN-filled buffers with 8 spare columns a head: the kernels take the
# gradients' strides (dQ * scale is added straight into dq, zeroed by the preprocess:
# BwdParams::fp32_dq_direct), and the spare columns stay NaN (nothing written past headdim,
# d40 running the d64 kernel). Causal batch 2 GQA (tile-major grids) and full attention.
@gpu
@needs_fp32wg
@pytest.mark.parametrize("d, causal", [(40, True), (64, False), (128, True)])
def test_fp32wg_bwd_strided_gradients(hopper, d, causal):
    shape = (2, 200, 200, 4, 2, d, causal, (-1, -1))
    q, k, v, dout, causal, window, ref = shape_case(shape)
    out, lse = kernel_forward(q, k, v, causal, window)
    bufs = [torch.full(t.shape[:-1] + (d + 8,), float("nan"), device="cuda") for t in (q, k, v)]
    grads = [b[..., :d] for b in bufs]
    with _ext.fp32wg_bwd(True), _ext.fp32wg_bwd128(True):
        _launch._flash_attn_backward(dout, q, k, v, out, lse, d**-0.5, -1, 0 if causal else -1,
                                     dq=grads[0], dk=grads[1], dv=grads[2])
        assert _ext.last_bwd_kernel == ("fp32wg128" if d == 128 else "fp32wg")
    check_2x(GRADS, grads, ref, (q, k, v), dout)
    for name, b in zip(GRADS, bufs):
        assert b[..., d:].isnan().all(), f"{name}: written past headdim"


# The Hopper float32 backward allocates no dQ accumulator (it adds into dq itself): the
# backward's peak memory beyond its inputs and gradients stays below a quarter of dq's bytes
# (dsum alone: a float a row); the mma.sync one allocates it (dq's bytes at least).
@gpu
@needs_fp32wg
def test_fp32wg_bwd_allocates_no_dq_accum(hopper):
    q, k, v, dout, causal, window, _ = shape_case((2, 512, 512, 4, 2, 64, True, (-1, -1)))
    out, lse = kernel_forward(q, k, v, causal, window)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    peaks = {}
    for on in (True, False):
        with _ext.fp32wg_bwd(on):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            _launch._flash_attn_backward(dout, q, k, v, out, lse, 64**-0.5, -1, 0,
                                         dq=grads[0], dk=grads[1], dv=grads[2])
            peaks[_ext.last_bwd_kernel] = torch.cuda.max_memory_allocated() - before
    dq_bytes = q.numel() * 4
    assert peaks["fp32wg"] < dq_bytes // 4, peaks
    assert peaks["sm80"] >= dq_bytes, peaks
