"""Head dims 1-16 on the d16 mma.sync kernels (builds whose FLASHATTN2_HEAD_DIMS has 16).

Forward and backward of head dims 4, 8, 12 and 16 run the d16 kernel (``_ext.native_d16``,
on by default) against the float32 reference with the 2x-PyTorch rule of test_fwd /
test_bwd, outputs and gradients NaN-poisoned before the kernels write: causal and full,
ragged lengths, GQA / MQA, windows, varlen, softcap / ALiBi, dropout, deterministic mode,
the KV-cache kernel with split-KV. The same calls with ``native_d16(False)`` run the d32
kernel (the A/B switch) and must agree with the native results to rounding.
"""
import pytest
import torch
import test_bwd
import test_fwd
import test_variants
import test_varlen as varlen_tests
from flashattn2 import _ext, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from test_kvcache import check_against_reference, kvcache_kernel, paged_kv

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16]
HEAD_DIMS = [4, 8, 12, 16]  # 4 and 12: zero-padded to 8 / 16 by a copy, as every head dim % 8
dtype_id = test_fwd.dtype_id


@pytest.fixture(autouse=True)
def native():
    """Every test runs the d16 kernel (and skips in builds without it)."""
    if 16 not in _ext.build_info()["head_dims"]:
        pytest.skip("this build has no d16 kernel (FLASHATTN2_HEAD_DIMS without 16)")
    with _ext.native_d16(True):
        assert _ext.KERNEL_HEAD_DIM[8] == _ext.KERNEL_HEAD_DIM[16] == 16
        yield


@pytest.mark.parametrize("seqlens", [(17, 113), (113, 17), (255, 257), (1025, 1023)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(6, 2), (4, 1)], ids=["gqa", "mqa"])
@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_forward_and_backward(dtype, headdim, heads, causal, seqlens):
    q, k, v, dout = test_bwd.make_inputs(2, *seqlens, *heads, headdim, dtype)
    test_fwd.check_kernel(q, k, v, causal=causal)
    test_bwd.check_kernel(q, k, v, dout, causal=causal)


@pytest.mark.parametrize("window_size", [(16, 0), (32, 8), (-1, 0), (40, -1)], ids=str)
@pytest.mark.parametrize("seqlens", [(113, 203), (203, 113)], ids=str)
@pytest.mark.parametrize("headdim", [8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_window(dtype, headdim, seqlens, window_size):
    q, k, v, dout = test_bwd.make_inputs(2, *seqlens, 4, 2, headdim, dtype)
    test_fwd.check_kernel(q, k, v, window_size=window_size)
    test_bwd.check_kernel(q, k, v, dout, window_size=window_size)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [12, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_deterministic_is_bitwise_and_within_rule(dtype, headdim, causal):
    q, k, v, dout = test_bwd.make_inputs(2, 1025, 1023, 6, 2, headdim, dtype)
    first = test_bwd.run_backward(q, k, v, dout, causal, deterministic=True)
    test_bwd.check_grads(first, q, k, v, dout, causal)
    again = test_bwd.run_backward(q, k, v, dout, causal, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", list(varlen_tests.LENGTHS), ids=str)
@pytest.mark.parametrize("headdim", [8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_varlen(dtype, headdim, lengths, causal):
    for window_size in ((-1, -1), (50, 10)):
        varlen_tests.test_varlen_forward(dtype, headdim, lengths, (6, 2), causal, window_size)
    for deterministic in (False, True):
        varlen_tests.check_varlen_backward(dtype, headdim, lengths, (6, 2), causal, deterministic)


@pytest.mark.parametrize("case", ["softcap2", "softcap30-causal", "softcap50-gqa",
                                  "alibi-batch-causal", "softcap-alibi-causal-window-mqa"])
@pytest.mark.parametrize("headdim", [8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_score_mods(dtype, headdim, case):
    q, k, v, dout, mods, causal, window = test_variants.case_inputs(case, headdim, dtype)
    out, lse, grads = test_variants.run_kernels(q, k, v, dout, causal, window, None, mods)
    kwargs = test_variants.ref_kwargs(causal, window, None, mods)
    test_variants.check_forward(out, lse, q, k, v, kwargs)
    test_variants.check_grads(grads, q, k, v, dout, kwargs)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 16))],
                         ids=["full", "causal", "window"])
@pytest.mark.parametrize("headdim", [8, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_dropout(dtype, headdim, causal, window):
    batch, nheads, nheads_k, seqlen_q, seqlen_k = 2, 4, 2, 203, 255
    q, k, v, dout = test_variants.make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k,
                                              headdim, dtype)  # fmt: skip
    mods = dict(dropout_p=0.17, rng_state=test_variants.rng_state())
    out, lse, grads = test_variants.run_kernels(q, k, v, dout, causal, window, None, mods)
    keep = test_variants.twin_mask(mods["rng_state"], batch, nheads, seqlen_q, seqlen_k,
                                   mods["dropout_p"])  # fmt: skip
    kwargs = test_variants.ref_kwargs(causal, window, None, mods, dropout_mask=keep)
    test_variants.check_forward(out, lse, q, k, v, kwargs)
    test_variants.check_grads(grads, q, k, v, dout, kwargs)


@pytest.mark.parametrize("paged", [0, 16], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("seqlen_q", [1, 4, 33])
@pytest.mark.parametrize("headdim", [8, 16])
def test_kv_cache_and_split_kv(headdim, seqlen_q, num_splits, paged):
    """The KV kernel at d16 (64-row tile, 2 lanes per copied row: the pages of its row
    slots, GQA packing) and its split-KV partials + combine."""
    dtype, batch, cache_len, nheads, nheads_k = torch.bfloat16, 3, 512, 8, 2
    q = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, cache_len, nheads_k, headdim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([cache_len, 5, 300], dtype=torch.int32, device="cuda")
    kc, vc, table = k_cache, v_cache, None
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, torch.Generator().manual_seed(paged))
    out, lse = kvcache_kernel(q, kc, vc, seqlens, table, True, (-1, -1), num_splits)
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, True, (-1, -1))
    public, public_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                 block_table=table, causal=True,
                                                 num_splits=num_splits,
                                                 return_softmax_lse=True)  # fmt: skip
    assert torch.equal(public, out) and torch.equal(public_lse, lse)


@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_native_matches_d32_kernel(dtype, headdim):
    """The A/B switch: the same public calls on the d32 kernel (native_d16(False)) give the
    same results to rounding (fp32 accumulation of the same products, another order)."""
    q, k, v, dout = test_bwd.make_inputs(2, 300, 300, 6, 2, headdim, dtype)
    results = []
    for enabled in (True, False):
        with _ext.native_d16(enabled):
            assert (_ext.KERNEL_HEAD_DIM[16] == 16) is enabled
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = flash_attn_func(*leaves, causal=True)
            results.append([out.detach()] + list(torch.autograd.grad(out, leaves, dout)))
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(a, b, atol=test_bwd.ATOL[dtype], rtol=1e-2, msg=name)


def test_varlen_public_call_runs_native():
    """flash_attn_varlen_func at d16 with ragged lengths: NaN-free, within the rule."""
    lengths_q, lengths_k = varlen_tests.LENGTHS["ragged"]
    q, k, v = varlen_tests.make_varlen(lengths_q, lengths_k, 4, 4, 16, torch.bfloat16)
    cu_q, cu_k = varlen_tests.cu(lengths_q), varlen_tests.cu(lengths_k)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                 causal=True)  # fmt: skip
    ref, _ = varlen_tests.reference(q, k, v, lengths_q, lengths_k, True, (-1, -1))
    ref_pt, _ = varlen_tests.reference(q, k, v, lengths_q, lengths_k, True, (-1, -1),
                                      upcast=False)  # fmt: skip
    assert not out.isnan().any()
    varlen_tests.assert_rule("out", out, ref, ref_pt, torch.bfloat16)
