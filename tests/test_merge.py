"""flashattn2.merge: two attention results over disjoint key sets joined by their LSE.

CPU: the argument checks, and that merging the float32 reference attention over two key
sets gives the reference attention over both (the CPU path is float32 torch math). GPU:
the fused kernel against the same float32 merge (``merge_reference``) for every dtype
combination, head dims on the 4-wide and the scalar path, strided views, in-place
accumulation, empty rows (LSE -inf or +inf), and end to end against flash_attn_func over
the union of the keys (the 2x rule of test_fwd.py). Outputs are NaN-filled before the
kernel writes them.
"""
import pytest
import torch
from flashattn2 import flash_attn_func, merge
from flashattn2.merge import merge_reference

from reference import attention_ref

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


def _partials(batch=2, seqlen=37, nheads=3, headdim=64, dtype=torch.float32, device="cpu"):
    out_a = torch.randn(batch, seqlen, nheads, headdim, device=device).to(dtype)
    out_b = torch.randn(batch, seqlen, nheads, headdim, device=device).to(dtype)
    lse_a = torch.randn(batch, nheads, seqlen, device=device) * 3
    lse_b = torch.randn(batch, nheads, seqlen, device=device) * 3
    return out_a, lse_a, out_b, lse_b


# ---- CPU ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_merge_of_two_key_sets_is_attention_over_both_cpu(causal):
    q = torch.randn(2, 20, 4, 16)
    k = torch.randn(2, 50, 2, 16)
    v = torch.randn(2, 50, 2, 16)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    # Keys [0, 30) and [30, 50): bottom-right causal over all keys is the window
    # j <= i + 30 of the first set, and j <= i for the second (rows seeing none: lse +inf).
    out_a, lse_a = attention_ref(q, k[:, :30], v[:, :30], window_size=(-1, 30 if causal else -1))
    out_b, lse_b = attention_ref(q, k[:, 30:], v[:, 30:], causal=causal)
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_empty_rows_cpu():
    out_a, lse_a, out_b, lse_b = _partials()
    lse_a[:, :, :5] = float("-inf")
    lse_a[:, :, 5:10] = float("inf")
    lse_b[:, :, 3:7] = float("-inf")
    out_a[:, :10] = float("nan")  # an empty partial's output is ignored
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out[:, 7:10], out_b[:, 7:10])
    assert (out[:, 3:7] == 0).all() and lse[:, :, 3:7].isneginf().all()
    torch.testing.assert_close(lse[:, :, :3], lse_b[:, :, :3])
    assert not out.isnan().any()


def test_in_place_cpu():
    out_a, lse_a, out_b, lse_b = _partials()
    expected, expected_lse = merge_reference(out_a, lse_a, out_b, lse_b)
    out, lse = merge(out_a, lse_a, out_b, lse_b, out=out_a, lse=lse_a)
    assert out is out_a and lse is lse_a
    torch.testing.assert_close(out_a, expected)
    torch.testing.assert_close(lse_a, expected_lse)


def test_output_dtype_is_the_wider_input():
    out_a, lse_a, out_b, lse_b = _partials()
    assert merge(out_a.bfloat16(), lse_a, out_b, lse_b)[0].dtype is torch.float32
    assert merge(out_a.half(), lse_a, out_b.half(), lse_b)[0].dtype is torch.float16


def test_argument_errors():
    out_a, lse_a, out_b, lse_b = _partials()
    with pytest.raises(ValueError, match="out_a must be a tensor"):
        merge(None, lse_a, out_b, lse_b)
    with pytest.raises(ValueError, match="lse_b must be float32"):
        merge(out_a, lse_a, out_b, lse_b.double())
    with pytest.raises(ValueError, match="out_b must be float16, bfloat16 or float32"):
        merge(out_a, lse_a, out_b.double(), lse_b)
    with pytest.raises(ValueError, match=r"out_a must have shape \(batch, seqlen"):
        merge(out_a[0], lse_a, out_b, lse_b)
    with pytest.raises(ValueError, match="out_b must have shape"):
        merge(out_a, lse_a, out_b[:, :5], lse_b)
    with pytest.raises(ValueError, match="lse_a must have shape"):
        merge(out_a, lse_a.transpose(1, 2), out_b, lse_b)
    with pytest.raises(ValueError, match="lse must have shape"):
        merge(out_a, lse_a, out_b, lse_b, lse=lse_a[:, :, :3])
    with pytest.raises(ValueError, match="out must be float16"):
        merge(out_a, lse_a, out_b, lse_b, out=out_a.long())
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="one device"):
            merge(out_a, lse_a, out_b.cuda(), lse_b)


# ---- GPU ---------------------------------------------------------------------------------------


def _check_against_reference(out_a, lse_a, out_b, lse_b, out_dtype=None, **views):
    """Kernel into NaN-filled outputs vs the float32 merge: within one rounding of out."""
    dtype = out_dtype or torch.promote_types(out_a.dtype, out_b.dtype)
    out = views.get("out")
    if out is None:
        out = torch.full(out_a.shape, float("nan"), dtype=dtype, device=out_a.device)
    else:
        out.fill_(float("nan"))
    lse = torch.full(lse_a.shape, float("nan"), device=out_a.device)
    expected, expected_lse = merge_reference(out_a, lse_a, out_b, lse_b)
    result = merge(out_a, lse_a, out_b, lse_b, out=out, lse=lse)
    assert result[0] is out and result[1] is lse
    assert not out.isnan().any() and not lse.isnan().any(), "the kernel left NaN"
    # One rounding to out's dtype (an ulp: fp32 math in a different order may round the
    # other way); 1e-6 for float32.
    rtol = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 1e-6}[out.dtype]
    torch.testing.assert_close(out.float(), expected, atol=1e-6, rtol=rtol)
    torch.testing.assert_close(lse, expected_lse, atol=1e-6, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_out", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("dtype_b", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("dtype_a", DTYPES, ids=_dtype_id)
def test_dtypes(dtype_a, dtype_b, dtype_out):
    out_a, lse_a, out_b, lse_b = _partials(device="cuda")
    _check_against_reference(out_a.to(dtype_a), lse_a, out_b.to(dtype_b), lse_b, dtype_out)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim", [4, 30, 64, 100, 128, 256, 260])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_dtype_id)
def test_head_dims(dtype, headdim):
    _check_against_reference(*_partials(headdim=headdim, dtype=dtype, device="cuda"))


@pytest.mark.gpu
def test_strided_views():
    """Slices of larger tensors, a transposed (seq, head) layout and a non-unit column
    stride: the scalar path reads and writes them in place."""
    big = torch.randn(2, 40, 6, 72, device="cuda", dtype=torch.bfloat16)
    out_a = big[:, 1:38, ::2, 4:68]  # row / head / col offsets: scalar path
    out_b = torch.randn(2, 3, 37, 64, device="cuda").transpose(1, 2)  # (b, s, h, d) view
    lse_a = torch.randn(2, 37, 3, device="cuda").transpose(1, 2)
    lse_b = torch.randn(2, 3, 50, device="cuda")[:, :, 5:42]
    out = torch.empty(2, 37, 3, 128, device="cuda", dtype=torch.float16)[..., ::2]
    _check_against_reference(out_a, lse_a, out_b, lse_b, out=out)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_dtype_id)
def test_empty_rows_and_far_apart_lses(dtype):
    out_a, lse_a, out_b, lse_b = _partials(dtype=dtype, device="cuda")
    lse_a[:, :, :5] = float("-inf")
    lse_a[:, :, 5:10] = float("inf")
    lse_b[:, :, 3:7] = float("-inf")
    lse_b[:, :, 20:] = float("inf")
    lse_a[:, :, 10:15] = 80.0  # exp(80) overflows float32: only differences may be exponentiated
    lse_b[:, :, 10:15] = -30.0
    out_a[:, :10] = float("nan")
    out_b[:, 3:7] = float("nan")
    out_b[:, 20:] = float("nan")
    _check_against_reference(out_a, lse_a, out_b, lse_b)
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    assert (out[:, 3:7] == 0).all() and lse[:, :, 3:7].isneginf().all()
    torch.testing.assert_close(out[:, 20:], out_a[:, 20:])


@pytest.mark.gpu
def test_in_place_accumulation():
    """out / lse aliasing out_a / lse_a, as ring attention accumulates (fp32 accumulator,
    bf16 partials), over several merges."""
    acc = torch.zeros(2, 64, 4, 128, device="cuda")
    acc_lse = torch.full((2, 4, 64), float("-inf"), device="cuda")
    ref, ref_lse = acc.clone(), acc_lse.clone()
    for _ in range(4):
        out_b, lse_b = _partials(seqlen=64, nheads=4, headdim=128, device="cuda")[2:]
        out_b = out_b.bfloat16()
        ref, ref_lse = merge_reference(ref, ref_lse, out_b, lse_b)
        merge(acc, acc_lse, out_b, lse_b, out=acc, lse=acc_lse)
    torch.testing.assert_close(acc, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acc_lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_dtype_id)
def test_flash_halves_merge_to_flash_over_all_keys(dtype):
    """flash_attn_func over two halves of the keys, merged, against the float32 reference
    over all of them: within 2x the error of flash_attn_func over all keys + atol."""
    q = torch.randn(2, 500, 8, 128, device="cuda", dtype=dtype)
    k = torch.randn(2, 1200, 2, 128, device="cuda", dtype=dtype)
    v = torch.randn(2, 1200, 2, 128, device="cuda", dtype=dtype)
    out_a, lse_a, _ = flash_attn_func(q, k[:, :700], v[:, :700], return_attn_probs=True)
    out_b, lse_b, _ = flash_attn_func(q, k[:, 700:], v[:, 700:], return_attn_probs=True)
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    full, full_lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    ref, ref_lse = attention_ref(q, k, v)
    err = (out.float() - ref.float()).abs().max().item()
    err_full = (full.float() - ref.float()).abs().max().item()
    atol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]
    assert err <= 2 * err_full + atol, (err, err_full)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-5)
