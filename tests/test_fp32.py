"""float32 inputs (issue 21; the 3xTF32 kernels of cpp/fp32, FLASHATTN2_EXPERIMENTAL=fp32).

CPU, every build: the refusals (a build without the kernels names the option; head dims and
features the float32 kernels lack) and the plumbing to the binding (dtype code 2, no split-KV,
no GQA packing) through a recording _C. GPU, builds with fp32: out, lse and dq / dk / dv
against a float64 reference with the 2x rule of fp32_checks.py: max |ours - f64| <= 2 *
max |torch f32 - f64| + atol. CPU also: the emulated kernels (fp32_emulation.py), same rule.
"""
import fp32_emulation as emu
import flashattn2
import pytest
import torch
from flashattn2 import _checks, _ext, _launch
from fp32_checks import GRADS, check_2x, ref_attention
from test_decode_kernel import binding_args

gpu = pytest.mark.gpu
BUILT = "fp32" in _ext.EXPERIMENTAL
needs_fp32 = pytest.mark.skipif(not BUILT, reason="build without FLASHATTN2_EXPERIMENTAL=fp32")
needs_fp32_bwd = pytest.mark.skipif(not _ext.FP32_BWD, reason="build without the float32 backward")


def _qkv(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_k=2, headdim=16, **kw):
    q = torch.randn(batch, seqlen_q, nheads, headdim, **kw)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, **kw)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, **kw)
    return q, k, v


# ---- CPU: checks, in every build -----------------------------------------------------------


def test_unbuilt_fp32_says_how_to_build(monkeypatch):
    """A build without the float32 kernels (simulated in builds that have them)."""
    monkeypatch.setattr(_ext, "EXPERIMENTAL", _ext.EXPERIMENTAL - {"fp32"})
    q, k, v = _qkv()
    for call in (lambda: flashattn2.flash_attn_func(q, k, v),
                 lambda: flashattn2.flash_attn_qkvpacked_func(torch.stack((q, q, q), 2))):
        with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL including fp32") as info:
            call()
        assert isinstance(info.value, ValueError)  # as the refusal of other dtypes
    if not BUILT:
        assert _ext.FP32_HEAD_DIMS == ()


@needs_fp32
def test_build_info_lists_the_fp32_head_dims():
    assert tuple(_ext.build_info()["fp32_head_dims"]) == (32, 64, 128) == _ext.FP32_HEAD_DIMS


@needs_fp32
@pytest.mark.parametrize("headdim", [129, 136, 256])
def test_fp32_head_dims_beyond_the_kernels_raise(headdim):
    q, k, v = _qkv(headdim=headdim)
    with pytest.raises(ValueError, match=f"float32 supports head dims up to 128; got {headdim}"):
        flashattn2.flash_attn_func(q, k, v)


@needs_fp32
@pytest.mark.parametrize("kwargs,name", [
    (dict(dropout_p=0.1), "dropout_p"),
    (dict(dropout_p=0.1, softcap=5.0), "dropout_p"),
    (dict(attn_bias=torch.zeros(2, 4, 5, 7)), "attn_bias"),
])
def test_fp32_unsupported_features_are_named(kwargs, name):
    """(softcap and ALiBi run: test_fp32_mods.py)"""
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=f"float32 inputs do not support {name}"):
        flashattn2.flash_attn_func(q, k, v, **kwargs)


@needs_fp32
def test_fp32_kvcache_refuses():
    """(varlen: test_fp32_varlen.py)"""
    q, k, v = _qkv(batch=1)
    with pytest.raises(ValueError, match="only supports fp16 and bf16"):
        flashattn2.flash_attn_with_kvcache(q, k, v)


def test_fp32_backward_refusal():
    """A build without the float32 backward names the option (deterministic mode runs:
    test_fp32_varlen.py)."""
    if _ext.FP32_BWD:
        _checks._check_fp32_backward()
    else:
        with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL including fp32"):
            _checks._check_fp32_backward()


class _FakeC:
    """Records the dtype code and arguments (by name) of _C.fwd (no GPU)."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def fwd(self, *args, **kwargs):
        names = binding_args(self.real.fwd)  # (positional ones by the signature)
        assert not [key for key in kwargs if key not in names[len(args):]]
        self.calls.append((args[19], {**dict(zip(names, args)), **kwargs}))  # (dtype: 20th)
        return 80

    def sm90_fwd_applies(self, *args):
        raise AssertionError("float32 never asks for the Hopper forward")

    def num_splits_heuristic(self, *args, **kwargs):
        raise AssertionError("float32 never splits")


def test_fp32_reaches_the_binding_as_dtype_2(monkeypatch):
    fake = _FakeC(_launch._C)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    q, k, v = _qkv(2, 70, 90, 4, 2, 64)
    out, lse = _launch._flash_attn_forward(q, k, v, 0.125, -1, 0, num_splits=0)
    (code, kwargs), = fake.calls
    assert code == 2 and kwargs["num_splits"] == 1 and kwargs["q_pack"] == 1
    assert out.dtype == torch.float32 and lse.dtype == torch.float32


def test_fp32_kernel_ready_keeps_16_byte_strides():
    """A float32 view with strides of multiples of 4 elements is read in place."""
    qkv = torch.randn(2, 9, 3, 4, 20)[..., :16]  # row stride 240, head stride 20
    q = qkv[:, :, 0]
    assert _launch._kernel_ready(q, 0) is q
    odd = torch.randn(2, 9, 4, 18)[..., :16]
    assert _launch._kernel_ready(odd, 0).is_contiguous()


def test_fp32_operators_fake_implementations():
    """flashattn2::fwd on meta tensors gives float32 outputs for float32 inputs."""
    q, k, v = (t.to("meta") for t in _qkv(headdim=64))
    out, lse = torch.ops.flashattn2.fwd(q, k, v, 0.125, -1, -1, 0.0, None, 0.0, None)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 5)
    grads = torch.ops.flashattn2.bwd(out, q, k, v, out, lse, 0.125, -1, -1, False, 0.0, None,
                                     0.0, None)  # fmt: skip
    assert [g.dtype for g in grads] == [torch.float32] * 3
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


# ---- CPU: the kernels' index math, emulated lane by lane (fp32_emulation.py) ----------------


@pytest.mark.parametrize("shape", [(70, 90, 40, 64, False, (16, 8)),
                                   (33, 100, 128, 128, True, (-1, -1)),
                                   (20, 70, 16, 32, False, (-1, -1))],
                         ids=["d40-window", "d128-causal", "d16"])
def test_fp32_forward_emulation(shape):
    """fwd_kernel.cuh's fragment and index math (emulated) meets the 2x rule."""
    sq, sk, d, kernel_d, causal, window = shape
    q, k, v = _qkv(1, sq, sk, 1, 1, d)
    wl, wr = window[0], 0 if causal else window[1]
    out, lse = emu.forward(q[0, :, 0].numpy(), k[0, :, 0].numpy(), v[0, :, 0].numpy(), d**-0.5,
                           wl, wr, kernel_d)
    ours = torch.from_numpy(out)[None, :, None], torch.from_numpy(lse)[None, None]
    check_2x(("out", "lse"), ours, ref_attention(causal, window), (q, k, v))


@pytest.mark.parametrize("shape", [(2, 1, 40, 70, 64, 64, True, (-1, -1)),
                                   (1, 1, 20, 50, 32, 32, False, (20, 5)),
                                   (2, 2, 17, 33, 128, 128, False, (-1, -1)),
                                   (2, 1, 30, 20, 24, 32, True, (-1, -1)),
                                   (1, 1, 1024, 64, 32, 32, False, (-1, -1))],
                         ids=["d64-gqa-causal", "d32-window", "d128", "d24-sq>sk", "d32-1k-queries"])
def test_fp32_backward_emulation(shape):
    """bwd_kernel.cuh's fragment and index math (emulated; out and lse from torch float32)
    meets the 2x rule. 1k queries: dV's sum over 32 query tiles, were it chained in one MMA
    accumulator, would not (12x PyTorch's error with the emulated tensor-core rounding)."""
    h, hk, sq, sk, d, kernel_d, causal, window = shape
    q, k, v = _qkv(1, sq, sk, h, hk, d)
    dout = torch.randn(1, sq, h, d)
    ref = ref_attention(causal, window)
    out32, lse32 = ref(q, k, v)
    heads = lambda t: t[0].transpose(0, 1).contiguous().numpy()  # (s, h, d) -> (h, s, d)
    wl, wr = window[0], 0 if causal else window[1]
    ours = emu.backward(heads(q), heads(k), heads(v), heads(out32), lse32[0].numpy(), heads(dout),
                        d**-0.5, wl, wr, kernel_d, h // hk)
    ours = [torch.from_numpy(g).transpose(0, 1)[None] for g in ours]
    check_2x(GRADS, ours, ref, (q, k, v), dout)


# ---- GPU: accuracy against float64 ---------------------------------------------------------


def kernel_forward(q, k, v, causal, window, **mods):
    """The kernel alone, into NaN-poisoned out / lse (the head dim is a multiple of 8)."""
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    _launch._flash_attn_forward(q, k, v, q.shape[-1]**-0.5, window[0],
                                  0 if causal else window[1], out=out, lse=lse, **mods)
    return out, lse


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window)
SHAPES = [
    (1, 113, 203, 4, 2, 64, False, (-1, -1)),
    (1, 113, 203, 4, 2, 64, True, (-1, -1)),
    (2, 1, 97, 2, 2, 128, False, (-1, -1)),
    (1, 257, 257, 2, 1, 32, True, (-1, -1)),
    (1, 257, 257, 3, 3, 40, False, (32, 16)),
    (2, 203, 113, 4, 4, 96, True, (-1, -1)),
    (1, 128, 300, 4, 2, 16, False, (64, 0)),
    (1, 300, 128, 2, 1, 128, False, (-1, -1)),
    (2, 64, 64, 4, 1, 128, True, (8, -1)),
]


def _ids(shape):
    b, sq, sk, h, hk, d, causal, window = shape
    return f"b{b}-{sq}x{sk}-h{h}:{hk}-d{d}" + ("-causal" if causal else "") + (
        f"-w{window[0]},{window[1]}" if window != (-1, -1) else "")


@gpu
@needs_fp32
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32_forward_against_float64(shape):
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    out, lse = kernel_forward(q, k, v, causal, window)
    check_2x(("out", "lse"), (out, lse), ref_attention(causal, window), (q, k, v))
    # The public function gives the same out.
    public = flashattn2.flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert torch.equal(public, out)


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32_backward_against_float64(shape):
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    dout = torch.randn(batch, sq, h, d, device="cuda")
    ours = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window)
    check_2x(GRADS, ours, ref_attention(causal, window), (q, k, v), dout)


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("headdim", [4, 12, 36, 100, 124])
def test_fp32_head_dims_not_multiples_of_8(headdim):
    """Zero-padded to the next multiple of 8 on the way to the kernels, as fp16 / bf16 are
    (causal, GQA): out and lse, then dq / dk / dv sliced back to the head dim, under the 2x
    rule."""
    q, k, v = _qkv(2, 70, 90, 4, 2, headdim, device="cuda")
    out, lse = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[:2]
    assert out.shape == q.shape
    check_2x(("out", "lse"), (out, lse), ref_attention(True), (q, k, v))
    dout = torch.randn_like(q)
    ours = lambda *t: flashattn2.flash_attn_func(*t, causal=True)
    dq, dk, dv = check_2x(GRADS, ours, ref_attention(True), (q, k, v), dout)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


@gpu
@needs_fp32
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_packed_views(causal):
    """q / k / v as strided views of packed qkv / kv (read in place: 16-byte strides)."""
    qkv = torch.randn(2, 150, 3, 4, 64, device="cuda")
    out = flashattn2.flash_attn_qkvpacked_func(qkv, causal=causal)
    ref = ref_attention(causal)
    check_2x(("qkvpacked out",), (out,), ref, qkv.unbind(2))
    q = qkv[:, :, 0]
    kv = torch.randn(2, 190, 2, 2, 64, device="cuda")
    out = flashattn2.flash_attn_kvpacked_func(q, kv, causal=causal)
    check_2x(("kvpacked out",), (out,), ref, (q, *kv.unbind(2)))
    if _ext.FP32_BWD:
        ours = lambda t: flashattn2.flash_attn_kvpacked_func(q, t, causal=causal)
        check_2x(("kvpacked dkv",), ours, lambda t: ref(q.to(t.dtype), *t.unbind(2)), (kv,),
                 torch.randn_like(out))


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window): long enough that a
# float32 sum chained through the tensor core's (truncating) MMA accumulation over every
# key / query tile fails the 2x rule (dK / dV 20-45x PyTorch's error at 2k-4k before the
# two-level accumulation of tf32.cuh; scripts/fp32_probe.py). Full attention with few keys:
# dK / dV large enough for the error to exceed the atol (with 4k keys each p is ~1 / 4k),
# summed over 4 heads x 256 query tiles (the emulation of 2k x 128, 2:1: 18-23x).
LONG_SHAPES = [
    (1, 4096, 4096, 4, 2, 64, True, (-1, -1)),
    (1, 4096, 256, 4, 1, 64, False, (-1, -1)),
]


@gpu
@needs_fp32
@pytest.mark.parametrize("shape", LONG_SHAPES, ids=_ids)
def test_fp32_long_sequences(shape):
    """out, lse, dq, dk, dv at 2k-4k tokens, GQA: the accumulation error must not grow with
    the length faster than PyTorch's."""
    batch, sq, sk, h, hk, d, causal, window = shape
    q, k, v = _qkv(batch, sq, sk, h, hk, d, device="cuda")
    ref = ref_attention(causal, window)
    check_2x(("out", "lse"), kernel_forward(q, k, v, causal, window), ref, (q, k, v))
    if _ext.FP32_BWD:
        ours = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window)
        check_2x(GRADS, ours, ref, (q, k, v), torch.randn(batch, sq, h, d, device="cuda"))
