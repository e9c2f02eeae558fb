"""``flashattn2.scaled_dot_product_attention`` against ``torch.nn.functional``'s.

CPU: every argument error, raised before the device check (so CPU tensors prove the
order); output shapes against torch's own SDPA; what reaches the ``flashattn2::fwd``
operator (traced with fake CUDA tensors): the top-left causal mapping and the default scale
of the query's head dim.

GPU: the output and dq, dk, dv against torch's SDPA. The truth is torch's SDPA math backend
in float32 on the upcast inputs (TF32 off, see conftest). Error rule for out and each
gradient: ``max|x - truth| <= 2 * err_pt + ATOL``, where ``err_pt`` is PyTorch's own error
in the input dtype: the larger of its SDPA's (whichever backend it picks: since torch 2.5
the math backend computes fp16 / bf16 in float32, so that error can be O's rounding alone)
and plain PyTorch attention's in the input dtype (``plain_attention``; the rest of the suite
calls that PyTorch's error). ATOL as in test_fwd.py / test_bwd.py. References for GQA expand
the key / value heads with ``repeat_interleave`` (SDPA's ``enable_gqa`` needs torch >= 2.5).
"""
import inspect
import math

import flashattn2
import pytest
import torch
import torch.nn.functional as F
from flashattn2 import _ext
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

gpu = pytest.mark.gpu
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
    assert [(p.name, None if p.default is p.empty else p.default) for p in params.values()] == expected
    assert [p.name for p in params.values() if p.kind is p.KEYWORD_ONLY] == ["scale", "enable_gqa"]
    assert "scaled_dot_product_attention" in flashattn2.__all__


@pytest.mark.parametrize(
    "mask",
    [torch.ones(5, 7, dtype=torch.bool), torch.zeros(5, 7), torch.ones(2, 4, 5, 7, dtype=torch.bool)],
    ids=["bool all-True", "float zeros", "bool 4-D"],
)
def test_any_attn_mask_raises(mask):
    with pytest.raises(NotImplementedError, match="does not support attn_mask yet; use is_causal=True"):
        sdpa(*cpu_qkv(), attn_mask=mask)
    with pytest.raises(NotImplementedError, match="torch.nn.functional.scaled_dot_product_attention"):
        sdpa(*cpu_qkv(), mask, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_raise_not_implemented(dtype):
    with pytest.raises(NotImplementedError, match=f"supports float16 and bfloat16; got {dtype}. "
                                                  r"Cast the inputs \(e.g. .to\(torch.bfloat16\)\)"):
        sdpa(*cpu_qkv(dtype=dtype))


BAD_INPUTS = {
    "int dtype": (lambda q, k, v: (q.long(), k.long(), v.long()), {},
                  "supports float16 and bfloat16; got torch.int64"),
    "mixed dtypes": (lambda q, k, v: (q, k.bfloat16(), v), {},
                     "same dtype; got query torch.float16, key torch.bfloat16"),
    "not a tensor": (lambda q, k, v: (q, k.tolist(), v), {}, "key must be a tensor; got list"),
    "1-D": (lambda q, k, v: (q[0, 0, 0], k, v), {}, r"query must have shape \(..., seqlen, headdim\)"),
    "key head dim": (lambda q, k, v: (q, k[..., :8], v), {}, "key must have the head dim of query"),
    "value length": (lambda q, k, v: (q, k, v[:, :, :6]), {}, "same sequence length"),
    "head dim 0": (lambda q, k, v: (q[..., :0], k[..., :0], v), {}, "head dims must be at least 1"),
    "key/value heads": (lambda q, k, v: (q, k, v[:, :2]), {}, "key and value must have the same number of heads"),
    "heads without gqa": (lambda q, k, v: (q, k[:, :2], v[:, :2]), {}, "pass enable_gqa=True"),
    "heads with gqa": (lambda q, k, v: (q, k[:, :3], v[:, :3]), dict(enable_gqa=True), "must divide"),
    "batch": (lambda q, k, v: (q, k[:1].expand(3, -1, -1, -1), v[:1].expand(3, -1, -1, -1)), {},
              "must broadcast"),
    "dropout_p 1": (lambda q, k, v: (q, k, v), dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
    "dropout_p < 0": (lambda q, k, v: (q, k, v), dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\)"),
    "scale str": (lambda q, k, v: (q, k, v), dict(scale="0.1"), "scale must be a real number"),
    "is_causal int": (lambda q, k, v: (q, k, v), dict(is_causal=1), "is_causal must be a bool"),
    "enable_gqa None": (lambda q, k, v: (q, k, v), dict(enable_gqa=None), "enable_gqa must be a bool"),
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


@pytest.mark.parametrize("shapes", [((1, 1, 3, 264),) * 3, ((1, 1, 3, 64), (1, 1, 4, 64), (1, 1, 4, 272))],
                         ids=["E 264", "Ev 272"])
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


@pytest.mark.parametrize("case", GOOD_SHAPES)
def test_good_inputs_reach_the_device_check(case):
    q_shape, k_shape, v_shape, kwargs = GOOD_SHAPES[case]
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors; got query on cpu"):
        sdpa(*cpu_qkv(q_shape, k_shape, v_shape), **kwargs)


# ---- CPU: shapes and operator arguments, traced with fake CUDA tensors -------------------------


def fake_cuda(*shapes):
    return tuple(torch.empty(s, device="cuda", dtype=torch.float16) for s in shapes)


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


def operator_call(q_shape, k_shape, v_shape=None, **kwargs):
    """The make_fx graph of one call on fake CUDA tensors and the arguments of its one
    ``flashattn2.fwd`` call (as a string)."""
    with FakeTensorMode():
        graph = make_fx(lambda q, k, v: sdpa(q, k, v, **kwargs))(
            *fake_cuda(q_shape, k_shape, v_shape or k_shape)).code
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


def test_dropout_reaches_the_operator_with_an_rng_state():
    graph, call = operator_call((2, 4, 5, 64), (2, 4, 7, 64), dropout_p=0.25)
    assert call.endswith(", 0.0, None, 0.25, randint"), call
    assert "torch.ops.aten.randint" in graph


def test_unbuilt_head_dim_is_named(monkeypatch):
    monkeypatch.setattr(_ext, "KERNEL_HEAD_DIM", (-1,) * 257)
    with FakeTensorMode(), pytest.raises(ValueError, match="head dim 24 needs a kernel head dim"):
        sdpa(*fake_cuda((2, 4, 5, 24), (2, 4, 7, 24), (2, 4, 7, 24)))
