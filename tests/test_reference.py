"""The reference itself (CPU): against a float64 loop written from the masking rule, and
against PyTorch's scaled_dot_product_attention."""
import math

import pytest
import torch
import torch.nn.functional as F
from flashattn2 import interface
from reference import (
    attention_probs,
    attention_ref,
    attention_scores,
    blockwise_probs,
    dropout_keep_mask,
    philox4x32_10,
    visible_mask,
)


def naive_attention(q, k, v, causal, window_size, softmax_scale):
    """float64, one query row at a time, keys chosen by the rule in flash.h."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    window_left, window_right = window_size
    if causal:
        window_right = 0
    out = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            kh = h // (nheads // nheads_k)
            for i in range(seqlen_q):
                diag = i + seqlen_k - seqlen_q
                keys = [
                    j
                    for j in range(seqlen_k)
                    if (window_right < 0 or j <= diag + window_right)
                    and (window_left < 0 or j >= diag - window_left)
                ]
                if not keys:
                    continue
                scores = k[b, keys, kh] @ q[b, i, h] * softmax_scale
                top = scores.max()
                weights = torch.exp(scores - top)
                total = weights.sum()
                out[b, i, h] = weights @ v[b, keys, kh] / total
                lse[b, h, i] = top + torch.log(total)
    return out, lse


# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window_size)
CASES = [
    (2, 7, 7, 2, 2, 16, False, (-1, -1)),
    (2, 5, 13, 4, 2, 8, True, (-1, -1)),  # causal, seqlen_q < seqlen_k
    (1, 13, 5, 4, 1, 8, True, (-1, -1)),  # causal, seqlen_q > seqlen_k: rows with no key
    (1, 17, 29, 2, 1, 24, False, (3, 2)),  # local window
    (2, 29, 17, 2, 2, 8, False, (2, 0)),
    (1, 11, 23, 3, 1, 8, True, (4, -1)),  # causal keeps the left bound: window (4, 0)
    (1, 9, 9, 2, 2, 8, False, (0, 0)),  # each row sees exactly one key
    (1, 12, 20, 2, 2, 8, False, (-1, 5)),
    (1, 20, 12, 2, 1, 8, False, (1, -1)),
]


def _has_empty_rows(seqlen_q, seqlen_k, causal, window_size):
    left, right = window_size
    return not visible_mask(seqlen_q, seqlen_k, left, 0 if causal else right).any(1).all()


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,nheads,nheads_k,headdim,causal,window", CASES)
def test_reference_matches_float64_loop(
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window
):
    q = torch.randn(batch, seqlen_q, nheads, headdim)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim)
    scale = 0.7 / math.sqrt(headdim)
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, softmax_scale=scale)
    out64, lse64 = naive_attention(q, k, v, causal, window, scale)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert lse.shape == (batch, nheads, seqlen_q)
    torch.testing.assert_close(out.double(), out64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse64, atol=1e-5, rtol=1e-5)
    empty = lse64.isinf()
    assert empty.any() == _has_empty_rows(seqlen_q, seqlen_k, causal, window)
    assert torch.equal(lse.isposinf(), empty)
    assert (out.permute(0, 2, 1, 3)[empty] == 0).all()


@pytest.mark.parametrize("batch,seqlen_q,seqlen_k,nheads,nheads_k,headdim,causal,window", CASES)
def test_reference_matches_sdpa(
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window
):
    if _has_empty_rows(seqlen_q, seqlen_k, causal, window):
        pytest.skip("SDPA gives NaN for rows that see no key")
    q = torch.randn(batch, seqlen_q, nheads, headdim)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim)
    out, _ = attention_ref(q, k, v, causal=causal, window_size=window)
    left, right = window
    mask = visible_mask(seqlen_q, seqlen_k, left, 0 if causal else right)
    # Expand the K/V heads by hand: SDPA's enable_gqa is torch >= 2.5 and CI runs 2.4.
    group = nheads // nheads_k
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_visible_mask_is_bottom_right_aligned():
    # seqlen_q=2, seqlen_k=3, causal: the last query row sees every key.
    assert visible_mask(2, 3, -1, 0).tolist() == [[True, True, False], [True, True, True]]
    # seqlen_q=3, seqlen_k=2, causal: the first query row sees no key.
    assert visible_mask(3, 2, -1, 0).tolist() == [[False, False], [True, False], [True, True]]
    # window (1, 0) on a square: the diagonal and one key to its left.
    assert visible_mask(3, 3, 1, 0).tolist() == [
        [True, False, False],
        [True, True, False],
        [False, True, True],
    ]
    assert visible_mask(2, 4, -1, -1).all()


def test_default_scale_is_inverse_sqrt_headdim():
    q, k, v = torch.randn(1, 6, 2, 24), torch.randn(1, 9, 2, 24), torch.randn(1, 9, 2, 24)
    out, lse = attention_ref(q, k, v)
    out_explicit, lse_explicit = attention_ref(q, k, v, softmax_scale=24**-0.5)
    assert torch.equal(out, out_explicit) and torch.equal(lse, lse_explicit)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_upcast_computes_in_float32_and_plain_in_input_dtype(dtype):
    q = torch.randn(2, 33, 4, 32).to(dtype)
    k = torch.randn(2, 47, 2, 32).to(dtype)
    v = torch.randn(2, 47, 2, 32).to(dtype)
    out_up, lse_up = attention_ref(q, k, v, causal=True)
    out32, lse32 = attention_ref(q.float(), k.float(), v.float(), causal=True)
    assert out_up.dtype == dtype and lse_up.dtype == torch.float32
    assert torch.equal(out_up, out32.to(dtype)) and torch.equal(lse_up, lse32)

    out_low, _ = attention_ref(q, k, v, causal=True, upcast=False)
    assert out_low.dtype == dtype
    out64, _ = naive_attention(q, k, v, True, (-1, -1), 32**-0.5)
    err_up = (out_up.double() - out64).abs().max().item()
    err_low = (out_low.double() - out64).abs().max().item()
    # Computing in the low dtype is measurably less accurate than rounding a float32 result.
    assert err_low > err_up


def test_empty_key_sequence():
    q, k, v = torch.randn(2, 3, 2, 8), torch.randn(2, 0, 2, 8), torch.randn(2, 0, 2, 8)
    out, lse = attention_ref(q, k, v)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 2, 3) and lse.isposinf().all()


# ---- score modifiers: softcap, ALiBi, dropout ----------------------------------------------


def naive_modded_attention(q, k, v, causal, window_size, softmax_scale, softcap, slopes, keep,
                           dropout_p):  # fmt: skip
    """float64 loop of the flash-attn v2 definitions: logit = softcap * tanh(scale q.k /
    softcap) (or scale q.k), minus slope * |i + sk - sq - j|; out uses P * keep / (1 - p)."""
    q, k, v = q.double(), k.double(), v.double()
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    left, right = window_size
    right = 0 if causal else right
    out = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            kh = h // (nheads // nheads_k)
            slope = 0.0 if slopes is None else float(slopes[h] if slopes.dim() == 1 else slopes[b, h])
            for i in range(seqlen_q):
                diag = i + seqlen_k - seqlen_q
                keys = [j for j in range(seqlen_k) if (right < 0 or j <= diag + right)
                        and (left < 0 or j >= diag - left)]  # fmt: skip
                if not keys:
                    continue
                scores = k[b, keys, kh] @ q[b, i, h] * softmax_scale
                if softcap > 0:
                    scores = softcap * torch.tanh(scores / softcap)
                scores = scores - slope * torch.tensor([abs(diag - j) for j in keys],
                                                       dtype=torch.float64)  # fmt: skip
                top = scores.max()
                weights = torch.exp(scores - top)
                total = weights.sum()
                lse[b, h, i] = top + torch.log(total)
                if keep is not None:
                    weights = weights * keep[b, h, i, keys].double() / (1 - dropout_p)
                out[b, i, h] = weights @ v[b, keys, kh] / total
    return out, lse


MOD_CASES = [
    # (causal, window, softcap, slopes shape, dropout_p)
    (False, (-1, -1), 0.7, None, 0.0),
    (True, (-1, -1), 0.0, "h", 0.0),
    (False, (3, 2), 2.0, "bh", 0.0),
    (True, (4, -1), 1.5, "h", 0.3),
    (False, (-1, -1), 0.0, None, 0.5),
]


@pytest.mark.parametrize("causal,window,softcap,slopes,dropout_p", MOD_CASES)
def test_reference_modifiers_match_float64_loop(causal, window, softcap, slopes, dropout_p):
    batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim = 2, 11, 17, 4, 2, 8
    q = torch.randn(batch, seqlen_q, nheads, headdim) * 2
    k = torch.randn(batch, seqlen_k, nheads_k, headdim)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim)
    alibi = None if slopes is None else torch.rand(nheads if slopes == "h" else (batch, nheads))
    keep = None
    if dropout_p:
        keep = dropout_keep_mask(5, 7, batch, nheads, seqlen_q, seqlen_k, dropout_p)
    scale = 0.6 / math.sqrt(headdim)
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, softmax_scale=scale,
                             softcap=softcap, alibi_slopes=alibi, dropout_p=dropout_p,
                             dropout_mask=keep)  # fmt: skip
    out64, lse64 = naive_modded_attention(q, k, v, causal, window, scale, softcap, alibi, keep,
                                          dropout_p)  # fmt: skip
    torch.testing.assert_close(out.double(), out64, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse64, atol=1e-5, rtol=1e-5)
    probs = attention_probs(q, k, causal=causal, window_size=window, softmax_scale=scale,
                            softcap=softcap, alibi_slopes=alibi)  # fmt: skip
    assert probs.shape == (batch, nheads, seqlen_q, seqlen_k)
    assert torch.allclose(probs.sum(-1)[lse.isfinite()], torch.tensor(1.0), atol=1e-5)


@pytest.mark.parametrize("block_n", [16, 64])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (9, 5))])
def test_blockwise_probs_is_a_running_max_walk(causal, window, block_n):
    """flash-attn's S_dmask values: a walk over key blocks from the last to the first, keeping
    the row max m, writes exp(logit - m) for each block after updating m with it."""
    q, k = torch.randn(2, 37, 4, 16), torch.randn(2, 70, 2, 16)
    got = blockwise_probs(q, k, block_n, causal=causal, window_size=window, softcap=3.0)
    scores, _ = attention_scores(q, k, causal, window, None, 3.0)
    expected = torch.zeros_like(scores)
    m = torch.full(scores.shape[:-1], float("-inf"))
    for start in reversed(range(0, scores.shape[-1], block_n)):
        block = scores[..., start : start + block_n]
        m = torch.maximum(m, block.amax(-1))
        safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
        expected[..., start : start + block_n] = (block - safe.unsqueeze(-1)).exp()
    torch.testing.assert_close(got, expected)
    assert (got <= 1).all() and (got[scores == float("-inf")] == 0).all()


def test_sdmask_block_n_is_flash_attn_block_with_dropout():
    # flash-attn v2's _get_block_size_n(device, d, is_dropout=True, causal), any GPU.
    expected = {1: 128, 32: 128, 33: 64, 64: 64, 96: 64, 97: 32, 128: 32, 129: 64, 256: 64}
    assert {d: interface._sdmask_block_n(d) for d in expected} == expected


# Random123 kat_vectors, philox4x32 10.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]  # fmt: skip


@pytest.mark.parametrize("ctr,key,expected", PHILOX_KAT)
def test_philox_known_answers(ctr, key, expected):
    assert tuple(int(w) for w in philox4x32_10(ctr, key)) == expected


def scalar_philox(ctr, key):
    """Philox4x32-10 in Python ints, straight from the round definition."""
    x, (k0, k1) = list(ctr), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * x[0], 0xCD9E8D57 * x[2]
        x = [(p1 >> 32) ^ x[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ x[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return x


def test_dropout_keep_mask_follows_the_documented_layout():
    seed, offset = 0x1234_5678_9ABC_DEF0, 0x0FED_CBA9_8765_4321
    batch, nheads, seqlen_q, seqlen_k, p = 2, 3, 37, 45, 0.4
    keep = dropout_keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, p)
    threshold = int(p * 2**32)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        b, h, i, j = (int(torch.randint(n, (1,), generator=gen))
                      for n in (batch, nheads, seqlen_q, seqlen_k))  # fmt: skip
        ctr = ((j // 16) * 8 + j % 8, (i // 16) * 8 + i % 8,
               (b * nheads + h + offset) & 0xFFFFFFFF, offset >> 32)  # fmt: skip
        words = scalar_philox(ctr, (seed & 0xFFFFFFFF, seed >> 32))
        word = words[2 * ((i // 8) % 2) + (j // 8) % 2]
        assert bool(keep[b, h, i, j]) == (word >= threshold), (b, h, i, j)
    rate = keep.float().mean().item()
    assert abs(rate - (1 - p)) < 0.02
    assert not torch.equal(keep, dropout_keep_mask(seed + 1, offset, batch, nheads, seqlen_q,
                                                   seqlen_k, p))  # fmt: skip
    assert not torch.equal(keep, dropout_keep_mask(seed, offset + 1, batch, nheads, seqlen_q,
                                                   seqlen_k, p))  # fmt: skip
    assert dropout_keep_mask(seed, offset, 1, 1, 5, 5, 0.0).all()
