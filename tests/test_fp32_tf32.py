"""float32 attention under PyTorch's TF32 setting (issue 21: "a faster single-TF32 mode that
follows torch.backends.cuda.matmul.fp32_precision / allow_tf32, ... off when PyTorch's setting
says full precision"). float32 runs 3xTF32 (float32-accurate) by default; where PyTorch lets
float32 matmuls run in TF32 (_ext.fp32_tf32()), the Hopper float32 kernels (fp32wg: kernel
head dims 64 / 128, dense full / causal, sm_90) run one tf32 product per multiply instead
(last_fwd_kernel "fp32wg_tf32", last_bwd_kernel "fp32wg_tf32" / "fp32wg128_tf32"); every
other float32 call stays 3xTF32.

CPU, every build: _ext.fp32_tf32() follows torch.backends.cuda.matmul.fp32_precision (torch
>= 2.9, "none" deferring to torch.backends.fp32_precision), torch.set_float32_matmul_precision
and, on older torch, allow_tf32, without a warning; the setting reaches the binding (_C.fwd's
last positional argument, _C.bwd's fp32_tf32 keyword; float32 calls only); kernel codes 93 /
94 are reported.

GPU (sm_90, fp32wg builds), with TF32 on (the ``tf32`` fixture): out (not the LSE) and dq /
dk / dv against float64 into NaN-filled outputs, by the 2x rule of fp32_checks.py where
PyTorch's own error is the larger of (a) its float32 attention under the same TF32 setting and
(b) the same attention with every matmul operand rounded to TF32 (tf32_attention: cuBLAS
runs some shapes, e.g. one query row, as float32 GEMVs whatever the setting, which would
leave (a) at float32 accuracy); the kernels that ran asserted. With TF32 off, the 3xTF32
kernels run (float32 rule); the two modes give different results, each passing its own rule;
the calls the single-TF32 kernels do not take stay at float32 accuracy under TF32.
"""
import contextlib
import math
import warnings

import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from fp32_checks import ATOL, GRADS, check_2x, grads, ref_attention
from reference import attention_ref, visible_mask
from test_fp32 import _ids, _qkv, kernel_forward
from test_fp32wg import _record as _record_fwd
from test_fp32wg import gpu, needs_fp32wg
from test_fp32wg import hopper  # noqa: F401 (the fixture)
from test_fp32wg_bwd import _record as _record_bwd
from test_fp32wg_bwd import kernel_backward, shape_case

# torch >= 2.9's TF32 setting; older torch has only torch.backends.cuda.matmul.allow_tf32.
NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch < 2.9: no fp32_precision")


@contextlib.contextmanager
def matmul_precision(precision):
    """PyTorch's float32 matmul precision ("tf32" or "ieee") inside the block, the previous
    setting after. fp32_precision where it exists (torch >= 2.9 refuses to read allow_tf32
    once fp32_precision set it otherwise), else allow_tf32."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if NEW_API else "allow_tf32"
    saved = getattr(matmul, name)
    setattr(matmul, name, precision if NEW_API else precision == "tf32")
    try:
        yield
    finally:
        setattr(matmul, name, saved)


@pytest.fixture
def tf32():
    """TF32 on for float32 matmuls (ours and PyTorch's) during the test."""
    with matmul_precision("tf32"):
        yield


def _fp32_precision_settings():
    """The objects of torch >= 2.9 with an fp32_precision setting, the generic one first."""
    if not NEW_API:
        return []
    backends = torch.backends
    objects = [backends]
    for parent, names in ((backends.cuda, ("matmul",)), (backends.cudnn, ("conv", "rnn")),
                          (getattr(backends, "mkldnn", None), ("matmul", "conv", "rnn"))):
        objects += [getattr(parent, name, None) for name in names]
    return [obj for obj in objects if obj is not None and hasattr(obj, "fp32_precision")]


@pytest.fixture
def restore_tf32_settings():
    """The test may change torch.set_float32_matmul_precision and the fp32_precision settings;
    they are restored after: the older one first (it sets some newer ones too), then every
    fp32_precision (the generic one first)."""
    legacy = torch.get_float32_matmul_precision()
    saved = [(obj, obj.fp32_precision) for obj in _fp32_precision_settings()]
    yield
    torch.set_float32_matmul_precision(legacy)
    for obj, value in saved:
        obj.fp32_precision = value


def _read():
    """_ext.fp32_tf32(), failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return _ext.fp32_tf32()


def _recorded(record, monkeypatch, dtype, **kw):
    """One launch through test_fp32wg's / test_fp32wg_bwd's recording _C: the binding's
    arguments by name. (Each recording wraps _launch._C, so it is the real binding again
    first: a second recording in a test would wrap the first.)"""
    monkeypatch.setattr(_launch, "_C", _ext._C)
    return record(monkeypatch, dtype, **kw)


# ---- CPU: the setting, in every build -------------------------------------------------------


@needs_new_api
def test_fp32_tf32_follows_fp32_precision(restore_tf32_settings):
    matmul = torch.backends.cuda.matmul
    matmul.fp32_precision = "tf32"
    assert _read() is True
    matmul.fp32_precision = "ieee"
    assert _read() is False
    matmul.fp32_precision = "tf32"
    assert _read() is True


@needs_new_api
def test_fp32_tf32_none_defers_to_the_generic_setting(restore_tf32_settings):
    """cuda.matmul's "none" inherits torch.backends.fp32_precision; "none" there too: off."""
    if not hasattr(torch.backends, "fp32_precision"):
        pytest.skip("this torch has no torch.backends.fp32_precision")
    torch.backends.cuda.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"
    assert _read() is True
    torch.backends.fp32_precision = "ieee"
    assert _read() is False
    torch.backends.fp32_precision = "none"
    assert _read() is False


@pytest.mark.parametrize("precision, expected", [("high", True), ("medium", True),
                                                 ("highest", False)])
def test_fp32_tf32_follows_set_float32_matmul_precision(restore_tf32_settings, precision,
                                                        expected):
    torch.set_float32_matmul_precision("highest" if expected else "high")  # (the other one)
    assert _read() is not expected
    torch.set_float32_matmul_precision(precision)
    assert _read() is expected


def test_fp32_tf32_reads_allow_tf32_without_fp32_precision(monkeypatch, restore_tf32_settings):
    """torch < 2.9 (simulated on newer torch): the answer is allow_tf32."""
    monkeypatch.setattr(_ext, "_HAS_FP32_PRECISION", False)
    torch.set_float32_matmul_precision("high")
    assert _ext.fp32_tf32() is True
    torch.set_float32_matmul_precision("highest")
    assert _ext.fp32_tf32() is False


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_fp32_tf32_reaches_the_forward_binding(monkeypatch, precision):
    """_C.fwd's last argument: the setting for float32 calls, False for 16-bit ones."""
    monkeypatch.setattr(_ext, "FP32WG", True)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    with matmul_precision(precision):
        fp32 = _recorded(_record_fwd, monkeypatch, torch.float32)
        bf16 = _recorded(_record_fwd, monkeypatch, torch.bfloat16)
    assert fp32["fp32_tf32"] is (precision == "tf32")
    assert bf16["fp32_tf32"] is False


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_fp32_tf32_reaches_the_backward_binding(monkeypatch, precision):
    """_C.bwd's fp32_tf32: the setting for float32 calls; 16-bit calls do not pass it."""
    with matmul_precision(precision):
        fp32 = _recorded(_record_bwd, monkeypatch, torch.float32)
        fp16 = _recorded(_record_bwd, monkeypatch, torch.float16)
    assert fp32["fp32_tf32"] is (precision == "tf32")
    assert "fp32_tf32" not in fp16


def test_binding_takes_fp32_tf32_last():
    """fwd: the last parameter (passed by position, after sm90_fa3_order); bwd: a keyword."""
    from test_decode_kernel import binding_args
    assert binding_args(_ext._C.fwd)[-2:] == ["sm90_fa3_order", "fp32_tf32"]
    assert binding_args(_ext._C.bwd)[-1] == "fp32_tf32"
    assert "fp32_tf32: bool = False" in _ext._C.fwd.__doc__.splitlines()[0]
    assert "fp32_tf32: bool = False" in _ext._C.bwd.__doc__.splitlines()[0]


def test_single_tf32_kernel_codes(monkeypatch):
    monkeypatch.setattr(_ext, "FP32WG", True)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    _recorded(_record_fwd, monkeypatch, torch.float32, code=93)
    assert (_ext.last_fwd_arch, _ext.last_fwd_kernel) == (90, "fp32wg_tf32")
    for code, name in ((93, "fp32wg_tf32"), (94, "fp32wg128_tf32")):
        _recorded(_record_bwd, monkeypatch, torch.float32, code=code)
        assert (_ext.last_bwd_arch, _ext.last_bwd_kernel) == (90, name)


# ---- GPU: sm_90, fp32wg builds ------------------------------------------------------------


def _to_tf32(x):
    """float32 x rounded to TF32's 10 mantissa bits, to nearest with ties to even (as the
    kernels' cvt.rn.tf32, cpp/fp32/tf32.cuh, and as cuBLAS's TF32 GEMMs do: on an H200,
    torch 2.11, the max errors of PyTorch's TF32 attention and of tf32_attention agreed to
    the digit wherever cuBLAS ran TF32; truncated operands gave 5-10x larger ones). Finite
    x: the carry of the rounding may go on into the exponent, as it should."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0xFFF + ((bits >> 13) & 1)) & -0x2000).view(torch.float32)


def tf32_attention(q, k, v, causal, dout=None):
    """float32 attention whose every matmul takes TF32-rounded operands (float32 sums and
    softmax): ``(out,)``, or with ``dout`` ``(dq, dk, dv)`` by FA2's backward formulas
    (dS = P (dP - rowsum(dO * O))); GQA by repeating k / v, dk / dv summed over each group.
    The error of a single-TF32 computation, whatever kernels cuBLAS picks."""
    t = _to_tf32
    batch, sq, nheads, d = q.shape
    sk, group = k.shape[1], nheads // k.shape[2]
    scale = d**-0.5
    k_rep, v_rep = (x.repeat_interleave(group, dim=2) for x in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", t(q), t(k_rep)) * scale
    mask = visible_mask(sq, sk, -1, 0 if causal else -1, q.device)
    probs = torch.softmax(scores.masked_fill(~mask, -math.inf), -1).nan_to_num(0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", t(probs), t(v_rep))
    if dout is None:
        return (out,)
    dv = torch.einsum("bhqk,bqhd->bkhd", t(probs), t(dout))
    dprobs = torch.einsum("bqhd,bkhd->bhqk", t(dout), t(v_rep))
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    dscores = probs * (dprobs - delta)
    dq = torch.einsum("bhqk,bkhd->bqhd", t(dscores), t(k_rep)) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", t(dscores), t(q)) * scale
    dk, dv = (x.view(batch, sk, nheads // group, group, d).sum(3) for x in (dk, dv))
    return dq, dk, dv


def _torch_attention(q, k, v, causal, dtype, dout=None):
    """PyTorch's attention in ``dtype`` (its matmuls under the current TF32 setting): (out,),
    or the gradients for dout."""
    fn = lambda *t: attention_ref(*t, causal=causal, upcast=False)[0]  # noqa: E731
    inputs = [t.to(dtype) for t in (q, k, v)]
    if dout is None:
        return (fn(*inputs).detach(),)
    return grads(fn, inputs, dout.to(dtype))


def _max_error(a, ref64):
    finite = torch.isfinite(ref64)
    return (a.double() - ref64).abs()[finite].max().item() if finite.any() else 0.0


def check_tf32(names, ours, q, k, v, causal, dout=None):
    """The 2x rule for the single-TF32 kernels: max |ours - float64| <= 2 x PyTorch's error +
    ATOL, PyTorch's error the larger of its float32 attention's under the current (TF32)
    setting and tf32_attention's. ours: out (no dout) or dq, dk, dv."""
    refs64 = _torch_attention(q, k, v, causal, torch.float64, dout)
    refs32 = _torch_attention(q, k, v, causal, torch.float32, dout)
    emulated = tf32_attention(q, k, v, causal, dout)
    for name, a, ref64, ref32, emu in zip(names, ours, refs64, refs32, emulated):
        assert not a.isnan().any(), f"{name}: NaN entries (left unwritten?)"
        assert torch.equal(torch.isfinite(ref64), torch.isfinite(a)), (
            f"{name}: non-finite entries differ")
        err, err_torch, err_emu = (_max_error(x, ref64) for x in (a, ref32, emu))
        assert err <= 2 * max(err_torch, err_emu) + ATOL, (
            f"{name}: error {err:.3g} > 2 x max(torch float32 under TF32 {err_torch:.3g}, "
            f"TF32-rounded reference {err_emu:.3g}) + {ATOL}")


def _single_tf32_bwd(d):
    """The single-TF32 backward's last_bwd_kernel at head dim d (kernel head dim 64 or 128)."""
    return "fp32wg_tf32" if d <= 64 else "fp32wg128_tf32"


def _threextf32_bwd(d):
    return "fp32wg" if d <= 64 else "fp32wg128"


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): kernel head dims 64
# (d64, d40) and 128 (d128, d96), full and causal, GQA 8 / 2 (and 4 / 1, 4 / 4), batch 2,
# seqlen_q != seqlen_k with ragged lengths: one query row over 77 / 300 keys, 257 x 513,
# causal 513 x 257 and 300 x 77 (rows that see no key), 1000 x 1000.
SHAPES = [
    (2, 128, 128, 8, 2, 64, False, (-1, -1)),
    (2, 128, 128, 8, 2, 64, True, (-1, -1)),
    (2, 1, 77, 8, 2, 64, False, (-1, -1)),
    (2, 257, 513, 8, 2, 64, True, (-1, -1)),
    (1, 513, 257, 4, 4, 40, True, (-1, -1)),
    (2, 200, 300, 8, 2, 40, False, (-1, -1)),
    (2, 256, 256, 8, 2, 128, False, (-1, -1)),
    (2, 256, 256, 8, 2, 128, True, (-1, -1)),
    (2, 1, 300, 8, 2, 128, False, (-1, -1)),
    (1, 257, 513, 8, 2, 128, False, (-1, -1)),
    (2, 300, 77, 4, 1, 96, True, (-1, -1)),
    (1, 1000, 1000, 8, 2, 96, False, (-1, -1)),
]


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_tf32_forward_against_float64(hopper, tf32, shape):
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    with _ext.fp32wg(True):
        out, lse = kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg_tf32"
        public = flashattn2.flash_attn_func(q, k, v, causal=causal)
        assert _ext.last_fwd_kernel == "fp32wg_tf32"
    assert not lse.isnan().any(), "lse left unwritten"
    check_tf32(("out",), (out,), q, k, v, causal)
    assert torch.equal(public, out)


@gpu
@needs_fp32wg
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_tf32_backward_against_float64(hopper, tf32, shape):
    q, k, v, dout, causal, window, _ = shape_case(shape)
    with _ext.fp32wg(True), _ext.fp32wg_bwd(True), _ext.fp32wg_bwd128(True):
        ours = kernel_backward(q, k, v, dout, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg_tf32"
        assert _ext.last_bwd_kernel == _single_tf32_bwd(shape[5])
    check_tf32(GRADS, ours, q, k, v, causal, dout)


def _both_modes(d, causal):
    """One problem at head dim d (GQA 8 / 2, ragged lengths) run under "tf32" and "ieee":
    {precision: (inputs, out, (dq, dk, dv))}, each mode's kernels asserted and each result
    checked by its own rule."""
    shape = (2, 200, 333, 8, 2, d, causal, (-1, -1))
    q, k, v, dout, causal, window, ref = shape_case(shape)
    results = {}
    with _ext.fp32wg(True), _ext.fp32wg_bwd(True), _ext.fp32wg_bwd128(True):
        for precision in ("tf32", "ieee"):
            with matmul_precision(precision):
                out, _ = kernel_forward(q, k, v, causal, window)
                fwd_kernel = _ext.last_fwd_kernel
                ours = kernel_backward(q, k, v, dout, causal, window)
                bwd_kernel = _ext.last_bwd_kernel
                if precision == "tf32":
                    assert (fwd_kernel, bwd_kernel) == ("fp32wg_tf32", _single_tf32_bwd(d))
                    check_tf32(("out",), (out,), q, k, v, causal)
                    check_tf32(GRADS, ours, q, k, v, causal, dout)
                else:
                    assert (fwd_kernel, bwd_kernel) == ("fp32wg", _threextf32_bwd(d))
                    check_2x(("out",), (out,), ref, (q, k, v))
                    check_2x(GRADS, ours, ref, (q, k, v), dout)
            results[precision] = out, ours
    return (q, k, v, dout, causal), results


@gpu
@needs_fp32wg
@pytest.mark.parametrize("d", [64, 128])
def test_ieee_runs_the_3xtf32_kernels(hopper, d):
    """fp32_precision "ieee" (what conftest.py sets): the 3xTF32 kernels fp32wg / fp32wg
    (fp32wg128 at d128), the float32 rule."""
    with matmul_precision("ieee"), _ext.fp32wg(True), _ext.fp32wg_bwd(True), \
            _ext.fp32wg_bwd128(True):
        assert not _ext.fp32_tf32()
        q, k, v = _qkv(1, 150, 170, 8, 2, d, device="cuda")
        out, _ = kernel_forward(q, k, v, True, (-1, -1))
        assert _ext.last_fwd_kernel == "fp32wg"
        check_2x(("out",), (out,), ref_attention(True), (q, k, v))
        dout = torch.randn_like(q)
        grads_ = kernel_backward(q, k, v, dout, True, (-1, -1))
        assert _ext.last_bwd_kernel == _threextf32_bwd(d)
        check_2x(GRADS, grads_, ref_attention(True), (q, k, v), dout)


@gpu
@needs_fp32wg
@pytest.mark.parametrize("d, causal", [(64, False), (128, True)])
def test_tf32_changes_the_result(hopper, d, causal):
    """The same inputs under "tf32" and "ieee": the results differ, each passes its own rule,
    and the single-TF32 error against float64 is well above the 3xTF32 one (TF32's 10-bit
    mantissa against float32's 23: ~1e-4 against ~1e-6 here)."""
    (q, k, v, dout, causal), results = _both_modes(d, causal)
    refs64 = _torch_attention(q, k, v, causal, torch.float64)
    grads64 = _torch_attention(q, k, v, causal, torch.float64, dout)
    (out_tf32, grads_tf32), (out_ieee, grads_ieee) = results["tf32"], results["ieee"]
    for name, a, b, ref64 in zip(("out",) + GRADS, (out_tf32,) + tuple(grads_tf32),
                                 (out_ieee,) + tuple(grads_ieee), refs64 + tuple(grads64)):
        assert not torch.equal(a, b), f"{name}: the same under tf32 and ieee"
        err_tf32, err_ieee = _max_error(a, ref64), _max_error(b, ref64)
        assert err_tf32 > 8 * err_ieee, (
            f"{name}: single-TF32 error {err_tf32:.3g}, 3xTF32 {err_ieee:.3g}")


@gpu
@needs_fp32wg
def test_set_float32_matmul_precision_high_runs_single_tf32(hopper, restore_tf32_settings):
    """The older switch, torch.set_float32_matmul_precision("high"), turns it on as well."""
    torch.set_float32_matmul_precision("high")
    q, k, v, dout, causal, window, _ = shape_case((1, 129, 67, 4, 2, 64, False, (-1, -1)))
    with _ext.fp32wg(True), _ext.fp32wg_bwd(True):
        ours = kernel_backward(q, k, v, dout, causal, window)
        assert (_ext.last_fwd_kernel, _ext.last_bwd_kernel) == ("fp32wg_tf32", "fp32wg_tf32")
    check_tf32(GRADS, ours, q, k, v, causal, dout)
    torch.set_float32_matmul_precision("highest")
    with _ext.fp32wg(True):
        kernel_forward(q, k, v, causal, window)
        assert _ext.last_fwd_kernel == "fp32wg"


@gpu
@needs_fp32wg
@pytest.mark.parametrize("d", [64, 128])
def test_tf32_leaves_other_float32_kernels_full_precision(hopper, tf32, d):
    """Under TF32, what the single-TF32 kernels do not take runs the mma.sync float32
    kernels at float32 accuracy (the float32 rule, PyTorch's error taken with TF32 off): a
    left window (forward) and deterministic=True (backward, from a 3xTF32 forward)."""
    q, k, v = _qkv(1, 150, 170, 8, 2, d, device="cuda")
    dout = torch.randn_like(q)
    with _ext.fp32wg(True), _ext.fp32wg_bwd(True), _ext.fp32wg_bwd128(True):
        out, lse = kernel_forward(q, k, v, False, (16, 0))
        assert _ext.last_fwd_kernel == "sm80"
        with matmul_precision("ieee"):
            check_2x(("out", "lse"), (out, lse), ref_attention(False, (16, 0)), (q, k, v))
            out, lse = kernel_forward(q, k, v, True, (-1, -1))
            assert _ext.last_fwd_kernel == "fp32wg"
        ours = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        _launch._flash_attn_backward(dout, q, k, v, out, lse, d**-0.5, -1, 0,
                                     deterministic=True, dq=ours[0], dk=ours[1], dv=ours[2])
        assert _ext.last_bwd_kernel == "sm80"
    with matmul_precision("ieee"):
        check_2x(GRADS, ours, ref_attention(True), (q, k, v), dout)
