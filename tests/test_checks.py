"""The flash_attn_* functions' argument checks and their order, and the tensor preparation
rules (CPU tensors; the rules do not depend on the device).

Checks run in the order the interface documents: unimplemented arguments and window_size,
then rank, dtype and shape, then device. So every rank/dtype/shape error is tested here
with CPU tensors, which also proves that the CPU-tensor check does not mask them.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _checks, _launch

# ---- argument checks (CPU tensors) ------------------------------------------------------------


def qkv_cpu(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_k=2, headdim=16, dtype=None):
    dtype = dtype or torch.bfloat16
    return (
        torch.randn(batch, seqlen_q, nheads, headdim).to(dtype),
        torch.randn(batch, seqlen_k, nheads_k, headdim).to(dtype),
        torch.randn(batch, seqlen_k, nheads_k, headdim).to(dtype),
    )


def test_cpu_tensors_are_rejected_by_name():
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_func(q, k, v)
    meta = [t.to("meta") for t in (q, k, v)]
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on meta"):
        flashattn2.flash_attn_func(*meta)


def _dtype(q, k, v, dtype):
    return q.to(dtype), k.to(dtype), v.to(dtype)


# name -> (transform of (q, k, v), error message pattern); all are ValueError.
BAD_INPUTS = {
    # (float32 runs in builds with FLASHATTN2_EXPERIMENTAL=fp32; its refusal: test_fp32.py)
    "float64": (lambda q, k, v: _dtype(q, k, v, torch.float64),
                "FlashAttention only supports fp16 and bf16 data type; got q torch.float64"),
    "int8": (lambda q, k, v: _dtype(q, k, v, torch.int8), "only supports fp16 and bf16"),
    "k dtype": (lambda q, k, v: (q, k.half(), v), "query and key must have the same dtype"),
    "v dtype": (lambda q, k, v: (q, k, v.half()), "query and value must have the same dtype"),
    "q rank 3": (lambda q, k, v: (q[0], k, v), r"q must have shape \(batch, seqlen_q, nheads"),
    "k rank 5": (lambda q, k, v: (q, k[None], v), r"k must have shape \(batch, seqlen_k"),
    "v rank 3": (lambda q, k, v: (q, k, v[0]), r"v must have shape \(batch, seqlen_k"),
    "headdim 0": (lambda q, k, v: (q[..., :0], k[..., :0], v[..., :0]), "head dimension"),
    "headdim 264": (lambda q, k, v: tuple(t.new_zeros(*t.shape[:3], 264) for t in (q, k, v)),
                    "only supports head dimension at most 256"),
    "k batch": (lambda q, k, v: (q, k[:1], v[:1]), r"k must have shape \(batch=2, seqlen_k"),
    "k headdim": (lambda q, k, v: (q, k[..., :8], v[..., :8]), r"headdim=16\); got \(2, 7, 2, 8\)"),
    "v seqlen": (lambda q, k, v: (q, k, v[:, :6]), r"v must have the shape of k \(2, 7, 2, 16\)"),
    "v heads": (lambda q, k, v: (q, k, v[:, :, :1]), "v must have the shape of k"),
    "v headdim": (lambda q, k, v: (q, k, v[..., :8]), "v must have the shape of k"),
    "h % h_k": (lambda q, k, v: (q[:, :, :3], k, v),
                "Number of heads in key/value must divide number of heads in query"),
    "h_k > h": (lambda q, k, v: (q[:, :, :1], k, v), "must divide number of heads in query"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_are_named_before_the_device_check(case):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(*transform(*qkv_cpu()))


def test_dtype_is_checked_before_shapes():
    q, k, v = qkv_cpu(dtype=torch.float64)
    with pytest.raises(ValueError, match="only supports fp16 and bf16"):
        flashattn2.flash_attn_func(q, k[:1], v[:, :, :1])


def test_unbuilt_head_dim_is_named():
    head_dims = flashattn2.build_info()["head_dims"]
    missing = [d for d in (32, 64, 96, 128, 192, 256) if d > head_dims[-1]]
    if not missing:
        pytest.skip("this build has every head dim up to 256")
    q, k, v = qkv_cpu(headdim=missing[0])
    with pytest.raises(ValueError, match=f"head dim {missing[0]} needs a kernel head dim"):
        flashattn2.flash_attn_func(q, k, v)


# ---- score modifiers: softcap, alibi_slopes, dropout_p (CPU tensors) ---------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\); got 1.0"),
        (dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\); got -0.1"),
        (dict(dropout_p=float("nan")), r"dropout_p must be in \[0, 1\)"),
        (dict(dropout_p="0.1"), "dropout_p must be a real number; got '0.1'"),
        (dict(dropout_p=None), "dropout_p must be a real number; got None"),
        (dict(dropout_p=True), "dropout_p must be a real number; got True"),
        (dict(softcap=-1.0), r"softcap must be >= 0 and finite \(0 disables it\); got -1.0"),
        (dict(softcap=float("inf")), "softcap must be >= 0 and finite"),
        (dict(softcap=None), "softcap must be a real number; got None"),
    ],
)
def test_bad_modifier_values_raise_first(kwargs, message):
    q, k, v = qkv_cpu(dtype=torch.float32)  # not checked: the value is reported first
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.forward(q, k, v, **kwargs)


# name -> (alibi_slopes for q (2, 5, 4, 16), error message pattern); all are ValueError.
BAD_ALIBI = {
    "float16": (torch.ones(4).half(), "alibi_slopes must be float32; got torch.float16"),
    "float64": (torch.ones(4).double(), "alibi_slopes must be float32; got torch.float64"),
    "kv heads": (torch.ones(2), r"alibi_slopes must have shape \(nheads,\) = \(4,\) or "
                                r"\(batch, nheads\) = \(2, 4\); got \(2,\)"),
    "transposed": (torch.ones(4, 2), r"must have shape .*; got \(4, 2\)"),
    "rank 3": (torch.ones(1, 2, 4), r"must have shape .*; got \(1, 2, 4\)"),
    "scalar": (torch.tensor(1.0), r"must have shape .*; got \(\)"),
}  # fmt: skip  (a list: TypeError, tests/test_bad_input.py)


@pytest.mark.parametrize("case", list(BAD_ALIBI))
def test_bad_alibi_slopes_are_named_before_the_device_check(case):
    slopes, message = BAD_ALIBI[case]
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        flashattn2.forward_with_stats(q, k, v, alibi_slopes=slopes)


def test_alibi_shape_is_checked_after_qkv_shapes():
    q, k, v = qkv_cpu(dtype=torch.float64)
    with pytest.raises(ValueError, match="only supports fp16 and bf16"):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3).half())


@pytest.mark.parametrize(
    "kwargs",
    [dict(softcap=30.0), dict(softcap=5), dict(alibi_slopes=torch.ones(4)),
     dict(alibi_slopes=torch.ones(2, 4)), dict(alibi_slopes=torch.ones(4, 2).t()),
     dict(dropout_p=0.1), dict(dropout_p=0),
     dict(softcap=10.0, alibi_slopes=torch.ones(4), dropout_p=0.5, causal=True,
          window_size=(3, 0))],
)  # fmt: skip
def test_good_modifiers_reach_the_device_check(kwargs):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kwargs)


def test_low_level_dropout_needs_an_rng_state():
    inputs = backward_inputs_cpu()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    with pytest.raises(ValueError, match="dropout_p > 0 needs rng_state"):
        flashattn2.forward_with_stats(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="dropout_p > 0 needs rng_state"):
        flashattn2.backward(**inputs, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"rng_state must be int64 of shape \(2,\)"):
        flashattn2.backward(**inputs, dropout_p=0.1, rng_state=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"rng_state must be int64 of shape \(2,\)"):
        flashattn2.forward_with_stats(q, k, v, dropout_p=0.1,
                                      rng_state=torch.zeros(3, dtype=torch.int64))
    rng_state = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.backward(**inputs, dropout_p=0.1, rng_state=rng_state)
    # forward draws its own rng_state (after the checks: a CPU q is still reported).
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.forward(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize(
    "window_size",
    [(1,), (1, 2, 3), "ab", None, 5, (1.5, 0), (0, "1"), (True, 0), (-2, 0), (0, -3)],
)
def test_bad_window_size(window_size):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="window_size"):
        flashattn2.flash_attn_func(q, k, v, window_size=window_size)


@pytest.mark.parametrize("window_size", [(-1, -1), [4, 0], (0, 0), (3, -1), (100, 100)])
def test_good_window_size_reaches_the_device_check(window_size):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        flashattn2.flash_attn_func(q, k, v, window_size=window_size, deterministic=True)


def test_window_and_causal():
    assert _checks._window((-1, -1), False) == (-1, -1)
    assert _checks._window((-1, -1), True) == (-1, 0)
    assert _checks._window((16, 4), True) == (16, 0)  # flash-attn: causal keeps the left bound
    assert _checks._window([3, 5], False) == (3, 5)


def test_packed_shapes_are_checked():
    q, k, v = qkv_cpu(nheads=2)
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch, seqlen, 3, nheads"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q], 2))
    with pytest.raises(ValueError, match="qkv must have shape"):
        flashattn2.flash_attn_qkvpacked_func(q)
    with pytest.raises(ValueError, match=r"kv must have shape \(batch, seqlen_k, 2, nheads_k"):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v, v], 2))
    with pytest.raises(ValueError, match="kv must have shape"):
        flashattn2.flash_attn_kvpacked_func(q, k)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2))
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2))


@pytest.mark.parametrize(
    "case,message",
    [
        ("qkv float64", "only supports fp16 and bf16 data type; got q torch.float64"),
        ("qkv headdim 264", "only supports head dimension at most 256"),
        ("kv float16", "query and key must have the same dtype"),
        ("kv heads 3", "Number of heads in key/value must divide number of heads in query"),
        ("kv batch 1", r"k must have shape \(batch=2, seqlen_k"),
    ],
)
def test_packed_inputs_are_checked_like_unpacked(case, message):
    q, k, v = qkv_cpu()
    packed = {
        "qkv float64": lambda: flashattn2.flash_attn_qkvpacked_func(
            torch.stack([q, q, q], 2).double()),
        "qkv headdim 264": lambda: flashattn2.flash_attn_qkvpacked_func(
            q.new_zeros(2, 5, 3, 4, 264)),
        "kv float16": lambda: flashattn2.flash_attn_kvpacked_func(
            q, torch.stack([k, v], 2).half()),
        "kv heads 3": lambda: flashattn2.flash_attn_kvpacked_func(
            q, torch.randn(2, 7, 2, 3, 16).bfloat16()),
        "kv batch 1": lambda: flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2)[:1]),
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        packed[case]()


# ---- the low-level entry points (CPU tensors: every check comes before the device check) -----


def backward_inputs_cpu():
    """Consistent (q, k, v, o, lse, dout) for flashattn2.backward: q (2, 5, 4, 16)."""
    q, k, v = qkv_cpu()
    return dict(q=q, k=k, v=v, o=torch.randn_like(q), lse=torch.randn(2, 4, 5),
                dout=torch.randn_like(q))  # fmt: skip


# name -> (changes to backward_inputs_cpu(), error message pattern); all are ValueError.
BAD_BACKWARD_INPUTS = {
    "o shape": (dict(o=lambda t: t[:, :4]),
                r"o must have shape \(2, 5, 4, 16\) \(the shape of q\); got \(2, 4, 4, 16\)"),
    "o rank 3": (dict(o=lambda t: t[0]), r"o must have shape \(2, 5, 4, 16\)"),
    "o dtype": (dict(o=lambda t: t.half()),
                r"o must have the dtype of q \(torch.bfloat16\); got torch.float16"),
    "dout shape": (dict(dout=lambda t: t[..., :8]), r"dout must have shape \(2, 5, 4, 16\)"),
    "dout dtype": (dict(dout=lambda t: t.float()), "dout must have the dtype of q"),
    "lse dtype": (dict(lse=lambda t: t.bfloat16()),
                  r"lse must be float32 \(the lse of forward_with_stats\); got torch.bfloat16"),
    "lse transposed": (dict(lse=lambda t: t.transpose(1, 2)),
                       r"lse must have shape \(batch, nheads, seqlen_q\) = \(2, 4, 5\); "
                       r"got \(2, 5, 4\)"),
    "lse rank 2": (dict(lse=lambda t: t[0]), "lse must have shape"),
    "lse of kv heads": (dict(lse=lambda t: t[:, :2]), "lse must have shape"),
    "q float64": (dict(q=lambda t: t.double()), "only supports fp16 and bf16"),
    "h % h_k": (dict(q=lambda t: t[:, :, :3]), "must divide number of heads in query"),
    "v seqlen": (dict(v=lambda t: t[:, :6]), "v must have the shape of k"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_BACKWARD_INPUTS))
def test_bad_backward_inputs_are_named_before_the_device_check(case):
    changes, message = BAD_BACKWARD_INPUTS[case]
    inputs = backward_inputs_cpu()
    for name, change in changes.items():
        inputs[name] = change(inputs[name])
    with pytest.raises(ValueError, match=message):
        flashattn2.backward(**inputs, causal=True)


def test_good_backward_inputs_reach_the_device_check():
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.backward(**backward_inputs_cpu())


@pytest.mark.parametrize("func", [flashattn2.forward, flashattn2.forward_with_stats])
@pytest.mark.parametrize("case", ["float64", "k rank 5", "headdim 264", "v heads", "h % h_k"])
def test_low_level_forward_checks_like_flash_attn_func(func, case):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        func(*transform(*qkv_cpu()), causal=True)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        func(*qkv_cpu())


# ---- tensor preparation (CPU tensors; the rules do not depend on the device) -----------------


def test_kernel_ready_passes_views_through():
    qkv = torch.randn(2, 9, 3, 4, 64).bfloat16()
    for t in qkv.unbind(2):
        assert _launch._kernel_ready(t, 0) is t
    x = torch.randn(2, 4, 9, 64).half()
    transposed = x.transpose(1, 2)  # (b, s, h, d) view of a (b, h, s, d) tensor
    assert _launch._kernel_ready(transposed, 0) is transposed
    wide = torch.randn(2, 9, 4, 96).half()
    for t in (wide[..., :64], wide[..., 32:]):  # row stride 384, head stride 96, 64 B offset
        assert _launch._kernel_ready(t, 0) is t


@pytest.mark.parametrize(
    "name,make",
    [
        ("last dim strided", lambda x: x[..., ::2]),
        ("misaligned pointer", lambda x: x.flatten()[4 : 4 + 2 * 9 * 4 * 16].view(2, 9, 4, 16)),
        ("row stride 68", lambda x: torch.randn(2, 9, 1, 68).bfloat16()[..., :64]),
        ("head stride 20", lambda x: x.flatten().as_strided((2, 9, 4, 16), (9 * 80, 80, 20, 1))),
    ],
)
def test_kernel_ready_copies_what_the_kernel_cannot_read(name, make):
    t = make(torch.randn(2, 9, 4, 32).bfloat16())
    ready = _launch._kernel_ready(t, 0)
    assert ready.data_ptr() != t.data_ptr()
    assert torch.equal(ready, t)
    assert ready.is_contiguous() and ready.data_ptr() % 16 == 0
    assert all(s % 8 == 0 for s in ready.stride()[:3]) and ready.stride(3) == 1


def test_kernel_ready_pads_head_dim_with_zeros():
    t = torch.randn(2, 5, 3, 100).half()
    ready = _launch._kernel_ready(t, -100 % 8)
    assert ready.shape == (2, 5, 3, 104) and ready.is_contiguous()
    assert torch.equal(ready[..., :100], t) and (ready[..., 100:] == 0).all()
