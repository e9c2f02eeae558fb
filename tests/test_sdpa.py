"""``flashattn2.scaled_dot_product_attention`` against ``torch.nn.functional``'s.

CPU: every argument error, raised before the device check (so CPU tensors prove the
order); output shapes against torch's own SDPA; what reaches the ``flashattn2::fwd``
operator (traced with fake CUDA tensors): the top-left causal mapping and the default scale
of the query's head dim.

GPU: the output and dq, dk, dv against torch's SDPA. The truth is torch's SDPA math backend
in float32 on the upcast inputs (TF32 off, see conftest). Error rule for out and each
gradient: ``max|x - truth| <= 2 * err_pt + ATOL``, where ``err_pt`` is PyTorch's own error
in the input dtype: the larger of its SDPA math backend's run in that dtype (``torch_sdpa``)
and plain PyTorch attention's (``plain_attention``, what the rest of the suite calls
PyTorch's error). ATOL as in test_fwd.py / test_bwd.py. References for GQA expand the key /
value heads with ``repeat_interleave`` (SDPA's ``enable_gqa`` needs torch >= 2.5).

float32 (the float32 kernels, build item fp32): CPU, its refusals (attn_mask, dropout, head
dims above 128, builds without the kernels) before the device check, its head dims on the
way to the operator (padded where E != Ev, as float16's), and the semantics test with float32 inputs. GPU:
out, dq, dk, dv against torch's SDPA math backend in float64 with the 2x rule of
fp32_checks.py (at most twice the error of the same backend in float32, + 1e-5).
"""
import inspect
import math
import re

import flashattn2
import pytest
import torch
import torch.nn.functional as F
from flashattn2 import _checks, _ext, _launch, interface
from flashattn2 import bias as bias_mod
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from fp32_checks import GRADS, check_2x
from reference import attention_ref
from torch.nn.attention import SDPBackend, sdpa_kernel

gpu = pytest.mark.gpu
needs_fp32 = pytest.mark.skipif("fp32" not in _ext.EXPERIMENTAL,
                                reason="build without FLASHATTN2_EXPERIMENTAL=fp32")
needs_fp32_bwd = pytest.mark.skipif(not _ext.FP32_BWD, reason="build without the float32 backward")
sdpa = flashattn2.scaled_dot_product_attention

DTYPES = [torch.float16, torch.bfloat16]
ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def cpu_qkv(q_shape=(2, 4, 5, 16), k_shape=(2, 4, 7, 16), v_shape=None, dtype=torch.float16):
    v_shape = v_shape or k_shape
    return tuple(torch.randn(s).to(dtype) for s in (q_shape, k_shape, v_shape))


# ---- CPU: signature and argument errors --------------------------------------------------------


def test_signature_is_torchs():
    params = inspect.signature(sdpa).parameters
    expected = [("query", None), ("key", None), ("value", None), ("attn_mask", None),
                ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False)]
    defaults = [(p.name, None if p.default is p.empty else p.default) for p in params.values()]
    assert defaults == expected
    keyword_only = [p.name for p in params.values() if p.kind is p.KEYWORD_ONLY]
    assert keyword_only == ["scale", "enable_gqa"]
    assert "scaled_dot_product_attention" in flashattn2.__all__


@pytest.mark.parametrize(
    "mask",
    [torch.ones(5, 7, dtype=torch.bool), torch.zeros(5, 7),
     torch.ones(2, 4, 5, 7, dtype=torch.bool)],  # fmt: skip
    ids=["bool all-True", "float zeros", "bool 4-D"],
)
def test_any_attn_mask_raises_without_the_bias_kernels(mask):
    """Builds without FLASHATTN2_EXPERIMENTAL=bias; with it, test_bias.py tests masks."""
    if "bias" in _ext.build_info().get("experimental", ()):
        pytest.skip("this build has the bias kernels (tests/test_bias.py)")
    message = "attn_mask needs a build with FLASHATTN2_EXPERIMENTAL=bias"
    with pytest.raises(NotImplementedError, match=message):
        sdpa(*cpu_qkv(), attn_mask=mask)
    message = "or torch.nn.functional.scaled_dot_product_attention for other masks"
    with pytest.raises(NotImplementedError, match=message):
        sdpa(*cpu_qkv(), mask, is_causal=True)


def test_float64_raises_not_implemented():
    message = (r"supports float16, bfloat16 and float32; got torch.float64. Cast the inputs "
               r"\(e.g. .to\(torch.float32\)\) or use torch.nn.functional")
    with pytest.raises(NotImplementedError, match=message):
        sdpa(*cpu_qkv(dtype=torch.float64))


# case: (q, k, v shapes, keyword arguments, message): what the float32 kernels do not run.
FP32_FEATURE = (r"float32 inputs do not support {} \(float16 / bfloat16 do; "
                r"torch.nn.functional.scaled_dot_product_attention does in float32\)")
FP32_HEADDIM = (r"supports float32 head dims up to 128 \(the float32 kernels'\); got {}. Cast the "
                r"inputs to float16 / bfloat16 \(head dims up to 256\) or use "
                r"torch.nn.functional.scaled_dot_product_attention")
FP32_REFUSALS = {
    "bool attn_mask": (((2, 4, 5, 16), (2, 4, 7, 16), None),
                       dict(attn_mask=torch.ones(5, 7, dtype=torch.bool)),
                       FP32_FEATURE.format("attn_bias / attn_mask")),
    "float attn_mask": (((2, 4, 5, 16), (2, 4, 7, 16), None), dict(attn_mask=torch.zeros(5, 7)),
                        FP32_FEATURE.format("attn_bias / attn_mask")),
    "dropout": (((2, 4, 5, 16), (2, 4, 7, 16), None), dict(dropout_p=0.1),
                FP32_FEATURE.format("dropout_p > 0")),
    "E 136": (((2, 4, 5, 136), (2, 4, 7, 136), None), {},
              FP32_HEADDIM.format("E = 136, Ev = 136")),
    "Ev 132": (((2, 4, 5, 64), (2, 4, 7, 64), (2, 4, 7, 132)), {},
               FP32_HEADDIM.format("E = 64, Ev = 132")),
}


@needs_fp32
@pytest.mark.parametrize("case", FP32_REFUSALS)
def test_float32_refusals_are_named_before_the_device_check(case):
    """NotImplementedError naming what float32 lacks and what runs it instead (CPU tensors:
    before the device check)."""
    shapes, kwargs, message = FP32_REFUSALS[case]
    if "attn_mask" in kwargs and not bias_mod.bias_built():
        pytest.skip("build without the bias kernels: test_any_attn_mask_raises_...")
    with pytest.raises(NotImplementedError, match=message):
        sdpa(*cpu_qkv(*shapes, dtype=torch.float32), **kwargs)


def test_float32_without_the_float32_kernels_names_the_build(monkeypatch):
    """A build without them (simulated in builds that have them): before the device check,
    a NotImplementedError that is a ValueError too (as flash_attn_func's)."""
    monkeypatch.setattr(_ext, "EXPERIMENTAL", _ext.EXPERIMENTAL - {"fp32"})
    with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL including fp32") as info:
        sdpa(*cpu_qkv(dtype=torch.float32))
    assert isinstance(info.value, ValueError) and "got query torch.float32" in str(info.value)


def same(q, k, v):
    return q, k, v


# case: (transform of (q (2, 4, 5, 16), k / v (2, 4, 7, 16)), keyword arguments, message)
BAD_INPUTS = {
    "int dtype": (lambda q, k, v: (q.long(), k.long(), v.long()), {},
                  "supports float16, bfloat16 and float32; got torch.int64"),
    "mixed dtypes": (lambda q, k, v: (q, k.bfloat16(), v), {},
                     "same dtype; got query torch.float16, key torch.bfloat16"),
    "not a tensor": (lambda q, k, v: (q, k.tolist(), v), {}, "key must be a tensor; got list"),
    "1-D": (lambda q, k, v: (q[0, 0, 0], k, v), {},
            r"query must have shape \(..., seqlen, headdim\)"),
    "key head dim": (lambda q, k, v: (q, k[..., :8], v), {}, "key must have the head dim of query"),
    "value length": (lambda q, k, v: (q, k, v[:, :, :6]), {}, "same sequence length"),
    "head dim 0": (lambda q, k, v: (q[..., :0], k[..., :0], v), {}, "head dims must be at least 1"),
    "key/value heads": (lambda q, k, v: (q, k, v[:, :2]), {},
                        "key and value must have the same number of heads"),
    "heads without gqa": (lambda q, k, v: (q, k[:, :2], v[:, :2]), {}, "pass enable_gqa=True"),
    "heads with gqa": (lambda q, k, v: (q, k[:, :3], v[:, :3]), dict(enable_gqa=True),
                       "must divide"),
    "batch": (lambda q, k, v: (q, k[:1].expand(3, -1, -1, -1), v[:1].expand(3, -1, -1, -1)), {},
              "must broadcast"),
    "dropout_p 1": (same, dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
    "dropout_p < 0": (same, dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\)"),
    "scale str": (same, dict(scale="0.1"), "scale must be a real number"),
    "is_causal int": (same, dict(is_causal=1), "is_causal must be a bool"),
    "enable_gqa None": (same, dict(enable_gqa=None), "enable_gqa must be a bool"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_are_named_before_the_device_check(case):
    transform, kwargs, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        sdpa(*transform(*cpu_qkv()), **kwargs)


@pytest.mark.parametrize("scale", [0.0, -0.5, math.inf, math.nan])
def test_scale_that_is_not_positive_and_finite_raises_not_implemented(scale):
    with pytest.raises(NotImplementedError, match="needs a positive, finite scale"):
        sdpa(*cpu_qkv(), scale=scale)


@pytest.mark.parametrize(
    "shapes", [((1, 1, 3, 264),) * 3, ((1, 1, 3, 64), (1, 1, 4, 64), (1, 1, 4, 272))],
    ids=["E 264", "Ev 272"],
)
def test_head_dims_above_256_raise_not_implemented(shapes):
    with pytest.raises(NotImplementedError, match="head dims up to 256"):
        sdpa(*cpu_qkv(*shapes))


GOOD_SHAPES = {
    "4-D": ((2, 4, 5, 16), (2, 4, 7, 16), None, {}),
    "gqa": ((2, 6, 5, 16), (2, 2, 7, 16), None, dict(enable_gqa=True)),
    "mqa broadcast": ((2, 4, 5, 16), (2, 1, 7, 16), None, {}),
    "query heads broadcast": ((2, 1, 5, 16), (2, 3, 7, 16), None, {}),
    "batch broadcast": ((1, 4, 5, 16), (3, 4, 7, 16), None, {}),
    "3-D": ((4, 5, 16), (4, 7, 16), None, {}),
    "2-D": ((5, 16), (7, 16), None, {}),
    "5-D gqa": ((2, 3, 4, 5, 16), (1, 3, 2, 7, 16), (2, 1, 2, 7, 16), dict(enable_gqa=True)),
    "rank mix": ((5, 16), (2, 4, 7, 16), (4, 7, 16), {}),
    "E != Ev": ((2, 4, 5, 20), (2, 4, 7, 20), (2, 4, 7, 40), {}),
    "d4": ((2, 4, 5, 4), (2, 4, 7, 4), None, dict(is_causal=True)),
}


FLOAT_DTYPES = [torch.float16, pytest.param(torch.float32, marks=needs_fp32)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", GOOD_SHAPES)
def test_good_inputs_reach_the_device_check(case, dtype):
    q_shape, k_shape, v_shape, kwargs = GOOD_SHAPES[case]
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors; got query on cpu"):
        sdpa(*cpu_qkv(q_shape, k_shape, v_shape, dtype=dtype), **kwargs)


# ---- CPU: shapes and operator arguments, traced with fake CUDA tensors -------------------------


def fake_cuda(*shapes, dtype=torch.float16):
    return tuple(torch.empty(s, device="cuda", dtype=dtype) for s in shapes)


@pytest.mark.parametrize("case", GOOD_SHAPES)
def test_output_shape_is_torchs(case):
    q_shape, k_shape, v_shape, kwargs = GOOD_SHAPES[case]
    v_shape = v_shape or k_shape
    q, k, v = (torch.randn(s) for s in (q_shape, k_shape, v_shape))
    if kwargs.get("enable_gqa"):
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=kwargs.get("is_causal", False))
    with FakeTensorMode():
        out = sdpa(*fake_cuda(q_shape, k_shape, v_shape), **kwargs)
    assert out.shape == expected.shape and out.dtype == torch.float16 and out.device.type == "cuda"


def operator_call(q_shape, k_shape, v_shape=None, dtype=torch.float16, **kwargs):
    """The make_fx graph of one call on fake CUDA tensors of ``dtype`` and the arguments of
    its one ``flashattn2.fwd`` call (as a string)."""
    with FakeTensorMode():
        graph = make_fx(lambda q, k, v: sdpa(q, k, v, **kwargs))(
            *fake_cuda(q_shape, k_shape, v_shape or k_shape, dtype=dtype)).code
    calls = [line for line in graph.splitlines() if "torch.ops.flashattn2.fwd.default(" in line]
    assert len(calls) == 1, graph
    return graph, calls[0].split("fwd.default(")[1].split(")")[0]


@pytest.mark.parametrize("seqlens", [(9, 3), (9, 4), (9, 8), (5, 5), (3, 9), (1, 9)], ids=str)
def test_top_left_causal_reaches_the_kernels_as_bottom_right(seqlens):
    """Lq > Lk: the window (-1, Lq - Lk) (no normalisation of a right bound >= Lk, which
    would drop the mask for Lq >= 2 Lk); Lq <= Lk: keys sliced to the first Lq, causal."""
    seqlen_q, seqlen_k = seqlens
    graph, call = operator_call((2, 4, seqlen_q, 64), (2, 4, seqlen_k, 64), is_causal=True)
    if seqlen_q > seqlen_k:
        assert call.endswith(f", 0.125, -1, {seqlen_q - seqlen_k}"), call
    else:
        assert call.endswith(", 0.125, -1, 0"), call
        if seqlen_q < seqlen_k:
            assert graph.count("torch.ops.aten.slice.Tensor(") == 2  # k and v: first Lq keys
    _, call = operator_call((2, 4, seqlen_q, 64), (2, 4, seqlen_k, 64))
    assert call.endswith(", 0.125, -1, -1"), call


def test_default_scale_is_that_of_the_query_head_dim():
    graph, call = operator_call((2, 4, 5, 20), (2, 4, 7, 20), (2, 4, 7, 40))
    assert graph.count(", [0, 20], 0.0)") == 2, graph  # q and k zero-padded to Ev = 40
    assert call.endswith(f", {20 ** -0.5}, -1, -1"), call
    _, call = operator_call((2, 4, 5, 20), (2, 4, 7, 20), scale=0.3)
    assert call.endswith(", 0.3, -1, -1"), call


@needs_fp32
@pytest.mark.parametrize(
    "headdims,pads", [((20, 20), []), ((12, 20), [12, 12, 4]), ((4, 4), []),
                      ((64, 64), []), ((16, 40), [24, 24])],
    ids=str,
)  # fmt: skip
def test_float32_head_dims_reach_the_operator_as_float16s_do(headdims, pads):
    """float32 q, k and v are padded here only where E != Ev (to one head dim, a multiple of
    8, at once); other head dims reach the operator as they are, whose implementation pads
    them for the kernels, as for float16 (on a GPU: d60 below, test_fp32.py d4 to d124).
    The scale stays that of E and the output is sliced back to Ev."""
    headdim, headdim_v = headdims
    shapes = (2, 4, 5, headdim), (2, 4, 7, headdim), (2, 4, 7, headdim_v)
    graph, call = operator_call(*shapes, dtype=torch.float32, is_causal=True)
    assert sorted(map(int, re.findall(r", \[0, (\d+)\], 0\.0\)", graph))) == sorted(pads), graph
    assert call.endswith(f", {headdim ** -0.5}, -1, 0"), call
    with FakeTensorMode():
        out = sdpa(*fake_cuda(*shapes, dtype=torch.float32), is_causal=True)
    assert out.shape == (2, 4, 5, headdim_v) and out.dtype == torch.float32


def test_dropout_reaches_the_operator_with_an_rng_state():
    graph, call = operator_call((2, 4, 5, 64), (2, 4, 7, 64), dropout_p=0.25)
    assert call.endswith(", 0.0, None, 0.25, randint"), call
    assert "torch.ops.aten.randint" in graph


def test_unbuilt_head_dim_is_named(monkeypatch):
    monkeypatch.setattr(_ext, "KERNEL_HEAD_DIM", (-1,) * 257)
    with FakeTensorMode(), pytest.raises(ValueError, match="head dim 24 needs a kernel head dim"):
        sdpa(*fake_cuda((2, 4, 5, 24), (2, 4, 7, 24), (2, 4, 7, 24)))


# ---- CPU: the semantics, with the reference standing in for the kernels ------------------------


@pytest.fixture
def reference_kernels(monkeypatch):
    """``interface._run`` computed by the float32 reference (the kernels' conventions: BSHD,
    bottom-right windows taken as given, GQA), and no device check: runs on the CPU."""

    def run(q, k, v, softmax_scale, window_left, window_right, deterministic, softcap=0.0,
            alibi_slopes=None, dropout_p=0.0):  # fmt: skip
        assert softcap == 0.0 and alibi_slopes is None and dropout_p == 0.0
        out, lse = attention_ref(q, k, v, window_size=(window_left, window_right),
                                 softmax_scale=softmax_scale)  # fmt: skip
        return out, lse, None

    monkeypatch.setattr(interface, "_run", run)
    monkeypatch.setattr(_checks, "_check_devices", lambda *named: None)


SEMANTICS_TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-5}


@pytest.mark.parametrize("case", GOOD_SHAPES)
@pytest.mark.parametrize("seqlens", [(6, 6), (4, 9), (9, 4), (13, 3), (1, 5), (5, 1)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=needs_fp32)],
                         ids=dtype_id)  # fmt: skip
def test_semantics_are_torchs(reference_kernels, dtype, case, seqlens, is_causal):
    """Layouts, broadcasting, GQA, top-left causal (Lq >= 2 Lk included), E != Ev, the
    default scale, and gradients back to the inputs' shapes: torch's SDPA in float32 against
    this function with the kernels replaced by the float32 reference (bf16 rounding of out
    and of the inputs' gradients only). float32 inputs also take the padding of head dims
    that are not multiples of 8 (d4, E != Ev 20 / 40) and its checks."""
    q_shape, k_shape, v_shape, kwargs = GOOD_SHAPES[case]
    seqlen_q, seqlen_k = seqlens
    q_shape = (*q_shape[:-2], seqlen_q, q_shape[-1])
    k_shape, v_shape = ((*s[:-2], seqlen_k, s[-1]) for s in (k_shape, v_shape or k_shape))
    kwargs = dict(kwargs, is_causal=is_causal)
    tensors = [torch.randn(s).to(dtype).requires_grad_() for s in (q_shape, k_shape, v_shape)]
    out = sdpa(*tensors, **kwargs)
    dout = torch.randn(out.shape).to(dtype)
    grads = torch.autograd.grad(out, tensors, dout)
    upcast = [t.detach().float().requires_grad_() for t in tensors]
    key, value = upcast[1:]
    if kwargs.get("enable_gqa"):
        group = upcast[0].shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
    expected = F.scaled_dot_product_attention(upcast[0], key, value, is_causal=is_causal)
    expected_grads = torch.autograd.grad(expected, upcast, dout.float())
    tolerance = SEMANTICS_TOLERANCE[dtype]
    for x, t in zip((out, *grads), (expected, *expected_grads)):
        assert x.shape == t.shape and x.dtype == dtype
        torch.testing.assert_close(x.float(), t, atol=tolerance, rtol=tolerance)


# ---- GPU: against torch's SDPA -----------------------------------------------------------------


def expand_gqa(query, key, value, enable_gqa):
    """key and value with their heads repeated as torch's ``enable_gqa`` does."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
    return key, value


def torch_sdpa(query, key, value, enable_gqa=False, **kwargs):
    """torch's SDPA math backend: in float32 the truth; in fp16 / bf16 with fp16 / bf16
    reductions where torch has that switch (>= 2.5; else the math backend computes in the
    input dtype anyway), i.e. torch's own low-precision SDPA error, of the reference that
    implements its semantics (the fused backends may decline shapes or broadcasting)."""
    key, value = expand_gqa(query, key, value, enable_gqa)
    switch = getattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp", None)
    saved = switch and torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    if switch:
        switch(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(query, key, value, **kwargs)
    finally:
        if switch:
            switch(saved)


def plain_attention(query, key, value, enable_gqa=False, is_causal=False, scale=None, keep=None,
                    dropout_p=0.0, attn_mask=None):
    """softmax(q k^T * scale) v with plain PyTorch ops in the inputs' dtype: top-left causal,
    matmul broadcasting; ``keep`` (bool, broadcastable to the weights) drops the other
    weights and scales the kept ones by ``1 / (1 - dropout_p)``; ``attn_mask`` as torch's
    (bool: True attends; float: added)."""
    key, value = expand_gqa(query, key, value, enable_gqa)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query * scale, key.transpose(-2, -1))
    if attn_mask is not None and attn_mask.dtype is torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask
    if is_causal:
        seqlen_q, seqlen_k = scores.shape[-2:]
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if keep is not None:
        probs = probs.masked_fill(~keep, 0.0) / (1.0 - dropout_p)
    return torch.matmul(probs, value)


def results(fn, tensors, dout, upcast):
    """[out, dq, dk, dv] of ``fn(*tensors)`` (just [out] without ``dout``), on copies of the
    tensors (upcast to float32 with ``upcast``)."""
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    tensors = [cast(t).requires_grad_(dout is not None) for t in tensors]
    out = fn(*tensors)
    if dout is None:
        return [out.detach()]
    return [out.detach(), *torch.autograd.grad(out, tensors, cast(dout))]


def max_error(x, truth):
    return (x.float() - truth).abs().max().item() if x.numel() else 0.0


def check(query, key, value, dout=None, enable_gqa=False, **kwargs):
    """Ours against torch under the error rule of the module docstring; returns ours
    ([out] or [out, dq, dk, dv])."""
    tensors = (query, key, value)
    ours = results(lambda *t: sdpa(*t, enable_gqa=enable_gqa, **kwargs), tensors, dout, False)
    truth = results(lambda *t: torch_sdpa(*t, enable_gqa, **kwargs), tensors, dout, True)
    pt_sdpa = results(lambda *t: torch_sdpa(*t, enable_gqa, **kwargs), tensors, dout, False)
    pt_plain = results(lambda *t: plain_attention(*t, enable_gqa, **kwargs), tensors, dout, False)
    for name, x, t, a, b in zip(("out", "dq", "dk", "dv"), ours, truth, pt_sdpa, pt_plain):
        assert x.shape == t.shape and x.dtype == query.dtype and x.device == query.device, name
        err, err_pt = max_error(x, t), max(max_error(a, t), max_error(b, t))
        bound = 2 * err_pt + ATOL[query.dtype]
        assert err <= bound, (
            f"max |{name} - torch| = {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})")
    return ours


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


# (Lq, Lk): equal, Lq < Lk, Lq > Lk, one query or key, Lq >= 2 Lk (a right window bound >= Lk),
# Lq <= 64 > Lk (the kernel that packs GQA groups into its query tiles, with a right window).
SEQLENS = [(128, 128), (77, 191), (191, 77), (1, 300), (300, 1), (520, 100), (50, 20)]


@gpu
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 20])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_matches_torch(dtype, headdim, is_causal, seqlens):
    seqlen_q, seqlen_k = seqlens
    query = randn(2, 6, seqlen_q, headdim, dtype=dtype)
    key, value = randn(2, 2, 2, seqlen_k, headdim, dtype=dtype)
    dout = randn(2, 6, seqlen_q, headdim, dtype=dtype)
    check(query, key, value, dout, enable_gqa=True, is_causal=is_causal)


@gpu
@pytest.mark.parametrize("case", GOOD_SHAPES)
@pytest.mark.parametrize("seqlens", [(100, 150), (150, 61)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_shapes_heads_and_broadcasting(case, seqlens, is_causal):
    """Every accepted layout of the CPU tests (ranks, broadcast batch and heads, GQA, E != Ev,
    d4), with longer sequences."""
    q_shape, k_shape, v_shape, kwargs = GOOD_SHAPES[case]
    seqlen_q, seqlen_k = seqlens
    q_shape = (*q_shape[:-2], seqlen_q, q_shape[-1])
    k_shape, v_shape = ((*s[:-2], seqlen_k, s[-1]) for s in (k_shape, v_shape or k_shape))
    query, key, value = randn(*q_shape), randn(*k_shape), randn(*v_shape)
    out = sdpa(query, key, value, **kwargs)
    dout = torch.randn_like(out)
    kwargs = dict(kwargs, is_causal=is_causal)
    check(query, key, value, dout, **kwargs)


@gpu
@pytest.mark.parametrize("seqlens", [(97, 130), (130, 97)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [4, 8, 16, 20])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_small_head_dims(dtype, headdim, is_causal, seqlens):
    """Head dims below the smallest kernel's run without a copy on the caller's side; the
    default scale is that of the real head dim."""
    seqlen_q, seqlen_k = seqlens
    query = randn(2, 4, seqlen_q, headdim, dtype=dtype)
    key, value = randn(2, 2, 4, seqlen_k, headdim, dtype=dtype)
    dout = randn(2, 4, seqlen_q, headdim, dtype=dtype)
    check(query, key, value, dout, is_causal=is_causal)


@gpu
@pytest.mark.parametrize("headdims", [(20, 40), (64, 32), (8, 64), (60, 4)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_value_head_dim_differs(headdims, is_causal):
    headdim, headdim_v = headdims
    query, key = randn(2, 4, 113, headdim), randn(2, 4, 71, headdim)
    value, dout = randn(2, 4, 71, headdim_v), randn(2, 4, 113, headdim_v)
    check(query, key, value, dout, is_causal=is_causal)


# float32 layouts (the sequence dims are set per case): GQA, 3-D, E != Ev, a head dim that
# is not a multiple of 8, the float32 kernels' largest head dim with MQA.
FP32_CASES = {
    "4-D gqa d64": ((2, 6, 0, 64), (2, 2, 0, 64), None, dict(enable_gqa=True)),
    "3-D d32": ((4, 0, 32), (4, 0, 32), None, {}),
    "E != Ev": ((2, 4, 0, 20), (2, 4, 0, 20), (2, 4, 0, 40), {}),
    "d60": ((2, 4, 0, 60), (2, 4, 0, 60), None, {}),
    "d128 mqa": ((1, 4, 0, 128), (1, 1, 0, 128), None, {}),
}


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("case", FP32_CASES)
@pytest.mark.parametrize("seqlens", [(128, 128), (77, 191), (191, 77)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_float32_against_float64(case, seqlens, is_causal):
    """float32 out, dq, dk, dv: max |ours - float64| <= 2 * max |torch float32 - float64| +
    1e-5 (fp32_checks.py), float64 and float32 both torch's SDPA math backend (TF32 off)."""
    q_shape, k_shape, v_shape, kwargs = FP32_CASES[case]
    seqlen_q, seqlen_k = seqlens
    q_shape = (*q_shape[:-2], seqlen_q, q_shape[-1])
    k_shape, v_shape = ((*s[:-2], seqlen_k, s[-1]) for s in (k_shape, v_shape or k_shape))
    inputs = tuple(randn(*s, dtype=torch.float32) for s in (q_shape, k_shape, v_shape))
    kwargs = dict(kwargs, is_causal=is_causal)
    ours = lambda *t: sdpa(*t, **kwargs)
    ref = lambda *t: torch_sdpa(*t, **kwargs)
    out = ours(*inputs)
    expected = ref(*(t.double() for t in inputs))
    assert out.shape == expected.shape and out.dtype == torch.float32
    check_2x(("out",), (out,), ref, inputs)
    check_2x(GRADS, ours, ref, inputs, torch.randn_like(out))


@gpu
@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_scale(dtype, scale):
    query, key, value = randn(2, 4, 191, 64, dtype=dtype), *randn(2, 2, 4, 77, 64, dtype=dtype)
    check(query, key, value, torch.randn_like(query), is_causal=True, scale=scale)


@gpu
@pytest.mark.parametrize("seqlens", [(33, 0), (0, 47), (0, 0)], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_empty_sequences(seqlens, is_causal):
    """No keys: out = 0 and dq = 0, as torch gives; no queries: empty out, dk = dv = 0."""
    seqlen_q, seqlen_k = seqlens
    query, dout = randn(2, 4, seqlen_q, 64), randn(2, 4, seqlen_q, 64)
    key, value = randn(2, 2, 4, seqlen_k, 64)
    tensors = (query, key, value)
    ours = results(lambda *t: sdpa(*t, is_causal=is_causal), tensors, dout, False)
    truth = results(lambda *t: torch_sdpa(*t, is_causal=is_causal), tensors, dout, True)
    for name, x, t in zip(("out", "dq", "dk", "dv"), ours, truth):
        assert x.shape == t.shape and x.dtype == query.dtype, name
        assert (x == 0).all() and (t == 0).all(), name


@gpu
@pytest.mark.parametrize("dropout_p", [0.17, 0.5])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dropout(dtype, is_causal, dropout_p):
    """value = identity (S = Ev keys, key j's value the basis vector e_j), so out[..., i, j] is
    the weight of key j for query i after dropout: exactly 0 where dropped (and where masked),
    else the weight / (1 - p). Checks the drop rate, that torch.manual_seed reproduces the
    mask and another seed does not, and out, dq, dk, dv against the reference with the keep
    mask read from out (dropout changes the gradients of all three)."""
    batch, heads, seqlen_q, seqlen_k = 4, 8, 256, 64
    query = randn(batch, heads, seqlen_q, seqlen_k, dtype=dtype)
    key = randn(batch, heads, seqlen_k, seqlen_k, dtype=dtype)
    value = torch.eye(seqlen_k, device=query.device, dtype=dtype)
    value = value.expand(batch, heads, -1, -1).clone()
    dout = randn(batch, heads, seqlen_q, seqlen_k, dtype=dtype)
    kwargs = dict(is_causal=is_causal, dropout_p=dropout_p)
    torch.manual_seed(1)
    out = sdpa(query, key, value, **kwargs)
    torch.manual_seed(1)
    assert torch.equal(sdpa(query, key, value, **kwargs), out)
    assert not torch.equal(sdpa(query, key, value, **kwargs), out)

    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device)
    if is_causal:
        visible = visible.tril()
    assert (out[..., ~visible] == 0).all(), "masked weights must be 0"
    keep = out != 0
    dropped = 1.0 - keep[..., visible].float().mean().item()
    count = batch * heads * visible.sum().item()
    sigma = (dropout_p * (1 - dropout_p) / count) ** 0.5
    assert abs(dropped - dropout_p) < 6 * sigma, f"drop rate {dropped:.4f}, p = {dropout_p}"

    tensors = (query, key, value)
    torch.manual_seed(1)
    ours = results(lambda *t: sdpa(*t, **kwargs), tensors, dout, False)
    assert torch.equal(ours[0], out)
    ref_kwargs = dict(is_causal=is_causal, keep=keep, dropout_p=dropout_p)
    truth = results(lambda *t: plain_attention(*t, **ref_kwargs), tensors, dout, True)
    pt = results(lambda *t: plain_attention(*t, **ref_kwargs), tensors, dout, False)
    for name, x, t, p in zip(("out", "dq", "dk", "dv"), ours, truth, pt):
        err, err_pt = max_error(x, t), max_error(p, t)
        bound = 2 * err_pt + ATOL[dtype]
        assert err <= bound, (
            f"max |{name} - ref| = {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})")


@gpu
def test_output_is_a_transposed_view_connected_to_autograd():
    query, key, value = (randn(2, 4, s, 64).requires_grad_() for s in (77, 191, 191))
    out = sdpa(query, key, value, is_causal=True)
    assert out.shape == (2, 4, 77, 64) and out.dtype == torch.bfloat16
    assert out.transpose(1, 2).is_contiguous() and not out.is_contiguous()
    out.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (query, key, value))
    assert (key.grad[:, :, 77:] == 0).all(), "keys after the last query's position get no gradient"


class PointerRecorder:
    """Stands in for ``_launch._C``: records the q, k, v pointers of each forward launch."""

    def __init__(self, module):
        self._module = module
        self.pointers = []

    def fwd(self, *args, **kwargs):
        self.pointers.append(args[:3])
        return self._module.fwd(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


@gpu
@pytest.mark.parametrize("seqlens", [(128, 128), (77, 191), (191, 77)], ids=str)
def test_bhsd_inputs_are_read_in_place_and_run_flash_attn_funcs_kernels(monkeypatch, seqlens):
    """Contiguous BHSD inputs reach the kernel without a copy (a causal Lq < Lk slices keys
    from the first one) and give flash_attn_func's result bit for bit on the same problem
    (its causal is bottom-right: equal where Lq == Lk, else compared without causal)."""
    seqlen_q, seqlen_k = seqlens
    query, key, value = randn(2, 8, seqlen_q, 64), *randn(2, 2, 2, seqlen_k, 64)
    recorder = PointerRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    is_causal = seqlen_q == seqlen_k
    out = sdpa(query, key, value, is_causal=True, enable_gqa=True)
    out_full = sdpa(query, key, value, is_causal=is_causal, enable_gqa=True)
    expected = [t.data_ptr() for t in (query, key, value)]
    assert [list(p) for p in recorder.pointers] == [expected, expected]
    bshd = [t.transpose(1, 2).contiguous() for t in (query, key, value)]
    reference = flashattn2.flash_attn_func(*bshd, causal=is_causal).transpose(1, 2)
    assert torch.equal(out_full, reference)
    assert out.shape == out_full.shape


@gpu
def test_inputs_on_different_devices():
    query, key, value = randn(2, 4, 33, 64), randn(2, 4, 47, 64).cpu(), randn(2, 4, 47, 64)
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors; got key on cpu"):
        sdpa(query, key, value)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="must be on the same device"):
            sdpa(query, key.to("cuda:1"), value)


@gpu
def test_deterministic_algorithms_give_bitwise_gradients():
    query, key, value = randn(2, 8, 300, 64), *randn(2, 2, 2, 1100, 64)
    dout = randn(2, 8, 300, 64)
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        runs = [results(lambda *t: sdpa(*t, enable_gqa=True), (query, key, value), dout, False)
                for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


def loss_fn(query, key, value, dout, **kwargs):
    out = sdpa(query, key, value, **kwargs)
    return (out.float() * dout.float()).sum(), out


@gpu
@pytest.mark.parametrize(
    "kwargs", [dict(is_causal=True), dict(is_causal=True, enable_gqa=True), dict(scale=0.3)],
    ids=["causal Lq > Lk", "gqa causal", "scale"],
)
def test_compile_fullgraph_matches_eager(kwargs):
    torch._dynamo.reset()
    heads_k = 2 if kwargs.get("enable_gqa") else 6
    query, dout = randn(2, 6, 300, 20), randn(2, 6, 300, 40)
    key, value = randn(2, heads_k, 129, 20), randn(2, heads_k, 129, 40)
    outputs = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        tensors = [t.detach().clone().requires_grad_() for t in (query, key, value)]
        loss, out = fn(*tensors, dout, **kwargs)
        loss.backward()
        outputs.append([out] + [t.grad for t in tensors])
    (out, *grads), (out_c, *grads_c) = outputs
    assert torch.equal(out, out_c)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g, g_c)
    torch._dynamo.reset()
