"""The d128 Hopper float32 backward (cpp/fp32/wg_bwd128_kernel.cuh; builds with
FLASHATTN2_EXPERIMENTAL including fp32wg): 3xTF32 on tf32 wgmma for dense full / causal
float32 backwards at kernel head dim 128 (head dims 65-128) on sm_90 GPUs, behind
FLASHATTN2_FP32WG_BWD128 (on by default; =0 at import or _ext.fp32wg_bwd128(False) turns it
off); everything else runs the mma.sync float32 backward (or, at d64, the d64
wgmma one of test_fp32wg_bwd.py).

CPU, every build: the switch reaches the binding (fp32wg_bwd128, only for float32, off with
FLASHATTN2_FP32WG=0 or force_sm80(); its import-time default, on: test_api.py), code 92 is
reported as last_bwd_kernel "fp32wg128"; the host model of the kernel's index arithmetic
(scripts/fp32wg_bwd128_model.py) on small cases. GPU (sm_90, fp32wg builds): dq, dk, dv against
float64 with the 2x rule of fp32_checks.py into NaN-filled gradients (lengths that are not
multiples of the 16-query / 64-key tiles, several key blocks per head, causal with seqlen_q
!= seqlen_k, a right window, GQA / MQA, d96), the kernel that ran asserted, and the calls it
does not take fall back.
"""
import functools

import flashattn2
import pytest
import torch
from flashattn2 import _ext
from fp32_checks import GRADS, check_2x
from test_fp32 import _ids, _qkv
from test_fp32wg import gpu, needs_fp32wg
from test_fp32wg import hopper  # noqa: F401 (the fixture)
import test_fp32wg_bwd
from test_fp32wg_bwd import kernel_backward, shape_case, single_step_backward, single_step_expected

_record = functools.partial(test_fp32wg_bwd._record, d=128)


@pytest.mark.parametrize("switch", ["on", "off", "fp32wg_off", "force_sm80"])
def test_fp32wg_bwd128_switch_reaches_the_binding(monkeypatch, switch):
    monkeypatch.setattr(_ext, "FP32WG_BWD128", switch != "off")
    monkeypatch.setattr(_ext, "FP32WG_BWD", False)
    monkeypatch.setattr(_ext, "FP32WG", switch != "fp32wg_off")
    monkeypatch.setattr(_ext, "FORCE_SM80", switch == "force_sm80")
    call = _record(monkeypatch, torch.float32)
    assert call["fp32wg_bwd128"] is (switch == "on")
    assert call["fp32wg_bwd"] is False  # (each switch its own argument)
    assert call["allow_sm90"] is (switch != "force_sm80")


def test_fp32wg_bwd128_switch_leaves_16_bit_calls_alone(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG_BWD128", True)
    assert "fp32wg_bwd128" not in _record(monkeypatch, torch.bfloat16)


def test_fp32wg_bwd128_context_manager_restores(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG_BWD128", False)
    with _ext.fp32wg_bwd128():
        assert _ext.FP32WG_BWD128 is True
        with _ext.fp32wg_bwd128(False):
            assert _ext.FP32WG_BWD128 is False
        assert _ext.FP32WG_BWD128 is True
    assert _ext.FP32WG_BWD128 is False


def test_fp32wg_bwd128_kernel_code(monkeypatch):
    _record(monkeypatch, torch.float32, code=92)
    assert (_ext.last_bwd_arch, _ext.last_bwd_kernel) == (90, "fp32wg128")


# The host model of the kernel's index arithmetic (scripts/fp32wg_bwd128_model.py: every word
# of each shared-memory tile written once, every wgmma operand element checked against the
# split it should hold, sPT read back where written, dq / dk / dv against float64), on small
# cases: several key blocks with a key tail, causal with sq > sk, GQA, d96.
@pytest.mark.parametrize("case", [(1, 33, 70, 1, 1, 128, -1), (1, 70, 33, 2, 1, 96, 0)])
def test_fp32wg_bwd128_host_model(case):
    import pathlib
    import sys
    pytest.importorskip("numpy")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import fp32wg_bwd128_model
    finally:
        sys.path.pop(0)
    errors = fp32wg_bwd128_model.check(*case)
    assert max(errors) < 1e-6, errors


# ---- GPU: sm_90, fp32wg builds ------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): lengths that are not
# multiples of the 16-query / 64-key tiles (1, 33, 127, 257, 1000), several key blocks per
# head (CTAs), causal with seqlen_q < seqlen_k and seqlen_q > seqlen_k (query rows that see no
# key, key blocks no query sees), a right window, GQA / MQA, d96 (kernel d128), 1k-2k (dK /
# dV summed over 64-128 query tiles).
SHAPES = [
    (1, 1, 1, 1, 1, 128, False, (-1, -1)),
    (1, 33, 33, 2, 2, 128, True, (-1, -1)),
    (1, 33, 33, 1, 1, 128, False, (-1, -1)),
    (2, 127, 257, 4, 2, 128, False, (-1, -1)),
    (1, 257, 127, 4, 1, 128, True, (-1, -1)),
    (1, 127, 257, 2, 1, 128, True, (-1, -1)),
    (1, 1000, 1000, 2, 2, 96, True, (-1, -1)),
    (1, 200, 333, 2, 1, 128, False, (-1, 16)),
    (2, 1, 129, 4, 4, 128, False, (-1, -1)),
    (1, 1024, 1024, 4, 2, 128, False, (-1, -1)),
    (1, 2048, 2048, 2, 1, 128, True, (-1, -1)),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32wg_bwd128_against_float64(hopper, shape):
    q, k, v, dout, causal, window, ref = shape_case(shape)
    with _ext.fp32wg_bwd128(True):
        ours = kernel_backward(q, k, v, dout, causal, window)
        assert _ext.last_bwd_kernel == "fp32wg128"
        check_2x(GRADS, ours, ref, (q, k, v), dout)
        # The public function runs it too (dq's atomic adds: not bit for bit).
        public = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window)
        check_2x(GRADS, public, ref, (q, k, v), dout)
        assert _ext.last_bwd_kernel == "fp32wg128"
    with _ext.fp32wg_bwd128(False):
        kernel_backward(q, k, v, dout, causal, window)
        assert _ext.last_bwd_kernel == "sm80"


# What the kernel does not take runs the mma.sync backward (and passes the rule there).
FALLBACKS = [
    ("d64", (1, 70, 90, 2, 1, 64, False, (-1, -1)), {}),
    ("left window", (1, 70, 90, 2, 1, 128, False, (16, 0)), {}),
    ("deterministic", (1, 70, 90, 2, 1, 128, True, (-1, -1)), {"deterministic": True}),
    ("softcap", (1, 70, 90, 2, 1, 128, False, (-1, -1)), {"softcap": 5.0}),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("name, shape, kw", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_fp32wg_bwd128_falls_back(hopper, name, shape, kw):
    q, k, v, dout, causal, window, ref = shape_case(shape, kw.get("softcap", 0.0))
    # (d64: the d64 kernel's switch off, so that the mma.sync one is what runs)
    with _ext.fp32wg_bwd128(True), _ext.fp32wg_bwd(False):
        fn = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window, **kw)
        check_2x(GRADS, fn, ref, (q, k, v), dout)
        assert _ext.last_bwd_kernel == "sm80", name


@gpu
@needs_fp32wg
def test_fp32wg_bwd128_varlen_falls_back(hopper):
    cu = torch.tensor([0, 33, 103], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(103, 2, 128, device="cuda") for _ in range(3))
    with _ext.fp32wg_bwd128(True):
        out = flashattn2.flash_attn_varlen_func(q.requires_grad_(), k, v, cu, cu, 70, 70,
                                                causal=True)
        out.backward(torch.randn_like(out))
        assert _ext.last_bwd_kernel == "sm80"
    assert q.grad.isfinite().all()


# One CTA, one step (64 keys, 16 query rows, one head): a failure names the wrong rows /
# columns of each gradient, to tell the pieces apart (dv: warpgroup 0's P^T fragments, dO^T;
# dk: warpgroup 1's P^T from sPT, dS^T, Q^T; dq: the sdS stores, K^T hi fragments / K^T lo,
# the reds, columns 0-63 from warpgroup 0 and 64-127 from warpgroup 1). "uniform": softmax
# scale 1e-6 (P nearly uniform whatever S^T's layout: dv is dO's column means, the dO^T /
# P^T path alone). "two_steps": 32 queries (the hand-off barriers' second phase).
@gpu
@needs_fp32wg
@pytest.mark.parametrize("piece", ["full", "uniform", "two_steps"])
def test_fp32wg_bwd128_single_step(hopper, piece):
    from test_fp32wg import _worst
    sq = 32 if piece == "two_steps" else 16
    q, k, v = _qkv(1, sq, 64, 1, 1, 128, device="cuda")
    dout = torch.randn_like(q)
    scale = 1e-6 if piece == "uniform" else 128**-0.5
    expected = single_step_expected(q, k, v, dout, scale)
    with _ext.fp32wg_bwd128(True):
        ours = single_step_backward(q, k, v, dout, scale)
        assert _ext.last_bwd_kernel == "fp32wg128"
    for name, a, e in zip(GRADS, ours, expected):
        err = (a.double() - e).abs()[0, :, 0]
        tol = 1e-5 + 1e-5 * e.abs().max().item()
        assert (err <= tol).all(), f"{name}: {_worst(err, tol)}"
