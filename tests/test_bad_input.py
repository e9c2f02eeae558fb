"""Bad input to every public function (CPU): each raises a TypeError / ValueError that names
the argument, before any kernel runs, in the order of _checks.py's module doc (values,
types, ranks, dtypes, shapes, then devices). What passes every check reaches the device check
("needs CUDA tensors"), so a wrong order shows up here too.
"""
import numpy as np
import pytest
import torch
from flashattn2 import (
    backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    forward,
    forward_with_stats,
)


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def i32(*values):
    return torch.tensor(values, dtype=torch.int32)


NOT_TENSORS = {"None": None, "numpy": np.zeros((1, 4, 2, 16), dtype=np.float16),
               "list": [[1.0]], "float": 1.0}  # fmt: skip


def dense_calls(x):
    """Calls with ``x`` in the place of one tensor argument each."""
    q, k, v = t(1, 4, 2, 16), t(1, 4, 2, 16), t(1, 4, 2, 16)
    cu = i32(0, 4)
    return {
        "func q": ("q", lambda: flash_attn_func(x, k, v)),
        "func k": ("k", lambda: flash_attn_func(q, x, v)),
        "func v": ("v", lambda: flash_attn_func(q, k, x)),
        "func alibi_slopes": ("alibi_slopes", lambda: flash_attn_func(q, k, v, alibi_slopes=x)),
        "qkvpacked qkv": ("qkv", lambda: flash_attn_qkvpacked_func(x)),
        "kvpacked kv": ("kv", lambda: flash_attn_kvpacked_func(q, x)),
        "kvpacked q": ("q", lambda: flash_attn_kvpacked_func(x, torch.stack([k, v], 2))),
        "varlen q": ("q", lambda: flash_attn_varlen_func(x, k[0], v[0], cu, cu, 4, 4)),
        "varlen k": ("k", lambda: flash_attn_varlen_func(q[0], x, v[0], cu, cu, 4, 4)),
        "varlen cu_seqlens_q": ("cu_seqlens_q",
                                lambda: flash_attn_varlen_func(q[0], k[0], v[0], x, cu, 4, 4)),
        "varlen cu_seqlens_k": ("cu_seqlens_k",
                                lambda: flash_attn_varlen_func(q[0], k[0], v[0], cu, x, 4, 4)),
        "varlen block_table": ("block_table", lambda: flash_attn_varlen_func(
            q[0], t(2, 16, 2, 16), t(2, 16, 2, 16), cu, cu, 4, 4, block_table=x)),
        "varlen_qkvpacked qkv": ("qkv", lambda: flash_attn_varlen_qkvpacked_func(x, cu, 4)),
        "varlen_kvpacked kv": ("kv",
                               lambda: flash_attn_varlen_kvpacked_func(q[0], x, cu, cu, 4, 4)),
        "forward q": ("q", lambda: forward(x, k, v)),
        "forward_with_stats v": ("v", lambda: forward_with_stats(q, k, x)),
        "backward o": ("o", lambda: backward(q, k, v, x, t(1, 2, 4, dtype=torch.float32), q)),
        "backward lse": ("lse", lambda: backward(q, k, v, q, x, q)),
        "backward dout": ("dout",
                          lambda: backward(q, k, v, q, t(1, 2, 4, dtype=torch.float32), x)),
    }  # fmt: skip


def kvcache_calls(x):
    q, cache, new = t(1, 1, 2, 16), t(1, 32, 2, 16), t(1, 1, 2, 16)
    run = (lambda **kw: flash_attn_with_kvcache(q, cache, cache.clone(), **kw))  # fmt: skip
    return {
        "kvcache q": ("q", lambda: flash_attn_with_kvcache(x, cache, cache)),
        "kvcache k_cache": ("k_cache", lambda: flash_attn_with_kvcache(q, x, cache)),
        "kvcache v_cache": ("v_cache", lambda: flash_attn_with_kvcache(q, cache, x)),
        "kvcache k": ("k", lambda: run(k=x, v=new, cache_seqlens=1)),
        "kvcache v": ("v", lambda: run(k=new, v=x, cache_seqlens=1)),
        "kvcache rotary_cos": ("rotary_cos", lambda: run(k=new, v=new, cache_seqlens=1,
                                                         rotary_cos=x, rotary_sin=t(32, 4))),
        "kvcache cache_batch_idx": ("cache_batch_idx", lambda: run(cache_batch_idx=x)),
        "kvcache cache_leftpad": ("cache_leftpad", lambda: run(cache_leftpad=x)),
        "kvcache block_table": ("block_table", lambda: run(block_table=x)),
        "kvcache alibi_slopes": ("alibi_slopes", lambda: run(alibi_slopes=x)),
    }  # fmt: skip


def _calls(x):
    return dict(dense_calls(x), **kvcache_calls(x))


# Arguments for which None is valid (they are optional).
OPTIONAL = {"func alibi_slopes", "varlen block_table", "kvcache k", "kvcache v",
            "kvcache rotary_cos", "kvcache cache_batch_idx", "kvcache cache_leftpad",
            "kvcache block_table", "kvcache alibi_slopes"}  # fmt: skip
CASES = [(call, kind) for call in sorted(_calls(None)) for kind in NOT_TENSORS
         if not (kind == "None" and call in OPTIONAL)]


@pytest.mark.parametrize("call, kind", CASES)
def test_a_non_tensor_is_a_type_error_naming_the_argument(call, kind):
    arg, run = _calls(NOT_TENSORS[kind])[call]
    with pytest.raises(TypeError, match=f"^{arg} must be "):
        run()


def test_cache_seqlens_of_another_type():
    with pytest.raises(TypeError, match="cache_seqlens must be an int, an int32 tensor or None"):
        flash_attn_with_kvcache(t(1, 1, 2, 16), t(1, 32, 2, 16), t(1, 32, 2, 16),
                                cache_seqlens=[3])


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), "x"])
def test_bad_softmax_scale_before_the_device_check(scale):
    q, k, v = t(1, 4, 2, 16), t(1, 4, 2, 16), t(1, 4, 2, 16)
    cu = i32(0, 4)
    for run in (lambda: flash_attn_func(q, k, v, softmax_scale=scale),
                lambda: flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 4, 4,
                                               softmax_scale=scale),
                lambda: flash_attn_with_kvcache(q, k, v, softmax_scale=scale),
                lambda: forward_with_stats(q, k, v, softmax_scale=scale)):
        with pytest.raises(ValueError, match="softmax_scale must be"):
            run()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: flash_attn_func(t(1, 4, 2, 264), t(1, 4, 2, 264), t(1, 4, 2, 264)),
         "head dimension at most 256"),
        (lambda: flash_attn_varlen_func(t(4, 2, 264), t(4, 2, 264), t(4, 2, 264), i32(0, 4),
                                        i32(0, 4), 4, 4), "head dimension at most 256"),
        (lambda: flash_attn_with_kvcache(t(1, 1, 2, 264), t(1, 8, 2, 264), t(1, 8, 2, 264)),
         "head dimension at most 256"),
        (lambda: flash_attn_func(t(1, 4, 2, 16, dtype=torch.float64), t(1, 4, 2, 16),
                                 t(1, 4, 2, 16)), "fp16 and bf16"),
        (lambda: flash_attn_func(t(1, 4, 2, 16), t(1, 4, 2, 16, dtype=torch.bfloat16),
                                 t(1, 4, 2, 16)), "same dtype"),
        (lambda: flash_attn_func(t(1, 4, 2, 16), t(2, 4, 2, 16), t(2, 4, 2, 16)), "batch=1"),
        (lambda: flash_attn_func(t(1, 4, 2, 16), t(1, 4, 2, 8), t(1, 4, 2, 8)), "headdim=16"),
        (lambda: flash_attn_varlen_func(t(4, 2, 16), t(4, 2, 16), t(4, 2, 16),
                                        i32(0, 4).long(), i32(0, 4), 4, 4), "int32"),
        (lambda: flash_attn_varlen_func(t(4, 2, 16), t(4, 2, 16), t(4, 2, 16), i32(0, 2, 4),
                                        i32(0, 4), 4, 4), "batch \\+ 1 entries"),
        (lambda: flash_attn_varlen_func(t(4, 2, 16), t(2, 16, 2, 16), t(2, 16, 2, 16),
                                        i32(0, 4), i32(0, 4), 4, 4,
                                        block_table=i32(0, 1).long()[None]), "int32"),
        (lambda: flash_attn_varlen_func(t(4, 2, 16), t(2, 16, 2, 16), t(2, 16, 2, 16),
                                        i32(0, 4), i32(0, 4), 4, 4, block_table=i32(0, 1)),
         "block_table must have shape"),
        (lambda: flash_attn_with_kvcache(t(1, 1, 2, 16), t(2, 16, 2, 16), t(2, 16, 2, 16),
                                         block_table=i32(0, 1).long()[None]), "int32"),
    ],
    ids=["d264", "varlen-d264", "kvcache-d264", "fp64", "mixed-dtypes", "batch", "k-headdim",
         "cu-int64", "cu-lengths", "varlen-table-int64", "varlen-table-1d", "kvcache-table-int64"],
)  # fmt: skip
def test_bad_values_are_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
