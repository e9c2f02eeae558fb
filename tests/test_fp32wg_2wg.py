"""The two-warpgroup d128 instance of the Hopper float32 forward (cpp/fp32/wg_config.h two_wg:
128 query rows in two consumer warpgroups, Q hi in registers, Q lo in shared memory, P V in
64-column halves), run instead of the 64-row one where FLASHATTN2_FP32WG_D128_2WG=1 at import
or inside _ext.fp32wg_d128_2wg() (off by default: an A/B switch until measured).

CPU, every build: the switch reaches the binding (fp32wg_d128_2wg; its import-time default,
off: test_api.py's test_switch_is_read_at_import); the host model of the index arithmetic
(scripts/fp32wg_model.py) on two small cases. GPU (sm_90, fp32wg builds):
out and lse against float64 with the 2x rule of fp32_checks.py into NaN-filled outputs (full,
causal, right window, ragged tails, GQA / MQA, lengths 1..4096, head dims 72 / 96 / 128), the
pieces of one tile apart, and the instance that ran (its kernel name, by the profiler).
"""
import pytest
import torch
from flashattn2 import _ext, _launch
from fp32_checks import check_2x, ref_attention
from reference import attention_ref, attention_scores
from test_fp32 import _ids, _qkv, kernel_forward
from test_fp32wg import _record, _worst, needs_fp32wg
from test_fp32wg import hopper  # noqa: F401 (the fixture)

gpu = pytest.mark.gpu


@pytest.mark.parametrize("enabled", [False, True])
def test_d128_2wg_switch_reaches_the_binding(monkeypatch, enabled):
    monkeypatch.setattr(_ext, "FP32WG", True)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    monkeypatch.setattr(_ext, "FP32WG_D128_2WG", not enabled)
    with _ext.fp32wg_d128_2wg(enabled):
        assert _record(monkeypatch, torch.float32)["fp32wg_d128_2wg"] is enabled
    assert _ext.FP32WG_D128_2WG is (not enabled)


# The host model of the kernel's index arithmetic (scripts/fp32wg_model.py: every wgmma
# operand element of every tile checked against the split it should hold, then out / lse
# against float64), on two small two_wg cases: keeps the model running with the kernel.
@pytest.mark.parametrize("case", [("128-2wg", 1, 64, 33, 2, 1, 128, True, -1, 0),
                                  ("128-2wg", 1, 129, 67, 4, 1, 96, False, -1, 1)])
def test_d128_2wg_host_model(case):
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



# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): kernel head dim 128
# (d72 / d96 zero-filled past d); 128-row tiles: seqlen_q 1, 64 (the second warpgroup's rows
# all past the end), 127 / 129 / 200 (ragged in one warpgroup or the other), 128; key tails
# (32-key tiles: 1, 33, 67, 97, 1000); causal with seqlen_q > seqlen_k (rows that see no key:
# lse +inf, out 0) and < seqlen_k; a right window; GQA 4:2, MQA 4:1; up to 4096 keys (the
# two-level accumulation over 128 key tiles, and the LSE drift of scripts/fp32wg_lse.py).
SHAPES = [
    (1, 1, 1, 1, 1, 128, False, (-1, -1)),
    (2, 1, 97, 2, 2, 128, False, (-1, -1)),
    (1, 64, 33, 2, 1, 128, True, (-1, -1)),
    (1, 127, 129, 4, 2, 128, False, (-1, -1)),
    (1, 129, 67, 4, 1, 96, False, (-1, -1)),
    (2, 203, 113, 4, 4, 128, True, (-1, -1)),
    (1, 200, 333, 2, 1, 72, False, (-1, 40)),
    (1, 128, 32, 1, 1, 128, False, (-1, -1)),
    (1, 300, 1000, 2, 1, 128, True, (-1, -1)),
    (1, 1024, 1024, 2, 1, 128, True, (-1, -1)),
    (1, 1024, 1024, 2, 2, 96, False, (-1, -1)),
    (1, 2048, 4096, 2, 1, 128, False, (-1, -1)),
    (1, 4096, 4096, 2, 1, 128, True, (-1, -1)),
    (1, 1, 4096, 4, 2, 128, False, (-1, -1)),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_d128_2wg_against_float64(hopper, shape):
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    ref = ref_attention(causal, window)
    with _ext.fp32wg(True), _ext.fp32wg_d128_2wg(True):
        out, lse = kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg"
    check_2x(("out", "lse"), (out, lse), ref, (q, k, v))
    # The 64-row instance on the same inputs: the same rule, and the two agree to rounding.
    with _ext.fp32wg(True), _ext.fp32wg_d128_2wg(False):
        out1, lse1 = kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg"
    check_2x(("out (64 rows)", "lse (64 rows)"), (out1, lse1), ref, (q, k, v))
    assert (out - out1).abs().max().item() <= 1e-4
    finite = torch.isfinite(lse1)
    assert torch.equal(finite, torch.isfinite(lse))
    assert not finite.any() or (lse - lse1)[finite].abs().max().item() <= 1e-4


# One CTA and one head (128 rows, one 32-key tile), the pieces apart as test_fp32wg's
# single-tile test: "full" random; "pv" softmax scale 1e-6 (P nearly uniform: the V^T stores
# and both 64-column halves of P V alone); "p" v the identity (seqlen_k = 128 = d: out is P,
# the S layout with Q hi from registers and Q lo from shared memory, softmax, P fragments).
PIECES = ["full", "pv", "p"]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("piece", PIECES)
def test_d128_2wg_single_tile(hopper, piece):
    d, sq = 128, 128
    sk = d if piece == "p" else 32
    q, k, v = _qkv(1, sq, sk, 1, 1, d, device="cuda")
    if piece == "p":
        v = torch.eye(sk, d, device="cuda")[None, :, None, :].contiguous()
    scale = 1e-6 if piece == "pv" else d**-0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 1, sq), float("nan"), device="cuda")
    with _ext.fp32wg(True), _ext.fp32wg_d128_2wg(True):
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


def _instance(name):
    """(head dim, two_wg) of a profiler kernel name, demangled or not."""
    for d in (64, 128):
        for two_wg in (False, True):
            if (f"Fp32WgTraits<{d}, {str(two_wg).lower()}>" in name
                    or f"Fp32WgTraitsILi{d}ELb{int(two_wg)}E" in name):
                return d, two_wg
    raise AssertionError(f"not an fp32wg instance: {name}")


def _kernel_names(fn):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if "fwd_fp32wg_kernel" in e.key]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("enabled", [False, True])
def test_d128_2wg_switch_picks_the_instance(hopper, enabled):
    """Fp32WgTraits<128, true> runs with the switch on, <128, false> without; d64 keeps its one
    instance either way."""
    q, k, v = _qkv(1, 256, 256, 2, 2, 128, device="cuda")
    with _ext.fp32wg(True), _ext.fp32wg_d128_2wg(enabled):
        names = _kernel_names(lambda: kernel_forward(q, k, v, True, (-1, -1)))
        names64 = _kernel_names(lambda: kernel_forward(q[..., :64].contiguous(),
                                                       k[..., :64].contiguous(),
                                                       v[..., :64].contiguous(), True, (-1, -1)))
    if not names and not names64:
        pytest.skip("the profiler recorded no kernels (CUPTI unavailable?)")
    assert [_instance(n) for n in names] == [(128, enabled)], names
    assert [_instance(n) for n in names64] == [(64, False)], names64
