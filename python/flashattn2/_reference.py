"""Plain-PyTorch attention used as the reference by the tests and by ``python -m flashattn2``.

Same conventions as the kernels: BSHD layout, GQA by sharing each key/value head among
``nheads // nheads_k`` consecutive query heads, bottom-right aligned causal / local masks,
and rows that see no key give out = 0 and lse = +inf. Score modifiers as flash-attn v2 (and
``cpp/common/score_mod.cuh``): ``softcap`` caps ``scale * q.k`` at ``softcap * tanh(. / softcap)``,
ALiBi then adds ``-slope * |i + seqlen_k - seqlen_q - j|``; dropout takes an explicit keep
mask (``dropout_keep_mask`` regenerates the kernels' mask from their Philox function).
"""
import math

import torch


def visible_mask(seqlen_q, seqlen_k, window_left=-1, window_right=-1, device=None):
    """Bool ``(seqlen_q, seqlen_k)``: True where key j is visible to query i.

    ``j <= i + seqlen_k - seqlen_q + window_right`` (if window_right >= 0) and
    ``j >= i + seqlen_k - seqlen_q - window_left`` (if window_left >= 0).
    """
    row = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    col = torch.arange(seqlen_k, device=device).unsqueeze(0)
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if window_right >= 0:
        mask &= col <= row + window_right
    if window_left >= 0:
        mask &= col >= row - window_left
    return mask


def alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k, device=None):
    """float32 ``(batch, nheads, seqlen_q, seqlen_k)`` (float64 for float64 slopes, the
    float64 references of the float32 kernels' tests): ``-slope * |i + seqlen_k - seqlen_q - j|``
    for slopes of shape ``(nheads,)`` or ``(batch, nheads)``."""
    slopes = alibi_slopes.to(device, torch.promote_types(alibi_slopes.dtype, torch.float32))
    if slopes.dim() == 1:
        slopes = slopes.expand(batch, -1)
    row = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    col = torch.arange(seqlen_k, device=device).unsqueeze(0)
    dist = (row - col).abs().float()
    return -slopes[:, :, None, None] * dist


def attention_scores(q, k, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
                     alibi_slopes=None):
    """The logits ``(batch, nheads, seqlen_q, seqlen_k)`` in q's dtype (-inf where masked) and
    the visible mask: ``softcap`` and ALiBi applied, k repeated over GQA groups."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    window_left, window_right = window_size
    if causal:
        window_right = 0
    k = k.repeat_interleave(nheads // nheads_k, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q * softmax_scale, k)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        bias = alibi_bias(alibi_slopes, batch, seqlen_q, seqlen_k, q.device)
        scores = scores + bias.to(scores.dtype)
    mask = visible_mask(seqlen_q, seqlen_k, window_left, window_right, q.device)
    return scores.masked_fill(~mask, float("-inf")), mask


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, upcast=True,
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_mask=None):
    """Returns ``(out, lse)``: out like q, lse float32 ``(batch, nheads, seqlen_q)``.

    q ``(b, sq, h, d)``, k/v ``(b, sk, h_k, d)``. ``causal`` sets the right window bound to 0
    (as flash-attn does, the left bound of ``window_size`` is kept). ``upcast=True``
    computes in float32; ``upcast=False`` computes in the input dtype, which measures
    PyTorch's own error at that precision. ``softmax_scale`` defaults to ``d ** -0.5``.
    ``softcap`` / ``alibi_slopes`` (float32 ``(h,)`` or ``(b, h)``) modify the logits;
    ``dropout_mask`` (bool ``(b, h, sq, sk)``, True = kept) with ``dropout_p`` gives
    ``out = (P * mask / (1 - dropout_p)) @ v``; lse is always that of the undropped softmax.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    nheads, nheads_k = q.shape[2], k.shape[2]
    v = v.repeat_interleave(nheads // nheads_k, dim=2)
    scores, mask = attention_scores(q, k, causal, window_size, softmax_scale, softcap,
                                    alibi_slopes)
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    seen = mask.any(dim=-1)  # (sq,): rows that see at least one key
    probs = probs.masked_fill(~seen.unsqueeze(-1), 0.0)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    lse = lse.masked_fill(~seen, float("inf"))
    return out.to(dtype), lse


def attention_bwd_ref(dout, q, k, v, out, lse, causal=False, window_size=(-1, -1),
                      softmax_scale=None, softcap=0.0):
    """``(dq, dk, dv)`` in float32 from the forward's ``out`` and ``lse``, as the kernels'
    backward computes them (FA2 Algorithm 2): ``P = exp(logits - lse)``, ``dV = P^T dO``,
    ``dS = P (dO V^T - rowsum(dO * out))``, chained through ``softcap``; dk / dv summed over
    each GQA group.

    ``out`` and ``lse`` need not come from these keys alone: given the output and LSE of
    attention over a larger key set, the result is this key block's share of the gradients
    (what ring attention sums over blocks). Rows with lse = +inf (no key) give zeros.
    """
    dout, q, k, v, out = (t.float() for t in (dout, q, k, v, out))
    headdim = q.shape[-1]
    nheads, nheads_k = q.shape[2], k.shape[2]
    group = nheads // nheads_k
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    window_left, window_right = window_size
    if causal:
        window_right = 0
    k_rep = k.repeat_interleave(group, dim=2)
    v_rep = v.repeat_interleave(group, dim=2)
    raw = torch.einsum("bqhd,bkhd->bhqk", q * softmax_scale, k_rep)
    scores = torch.tanh(raw / softcap) * softcap if softcap > 0 else raw
    mask = visible_mask(q.shape[1], k.shape[1], window_left, window_right, q.device)
    probs = torch.exp(scores - lse.float().unsqueeze(-1)).masked_fill(~mask, 0.0)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dout)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dout, v_rep)
    delta = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    dscores = probs * (dprobs - delta)
    if softcap > 0:
        dscores = dscores * (1.0 - (scores / softcap) ** 2)
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, k_rep) * softmax_scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, q) * softmax_scale
    batch, seqlen_k = k.shape[:2]
    dk = dk.view(batch, seqlen_k, nheads_k, group, headdim).sum(3)
    dv = dv.view(batch, seqlen_k, nheads_k, group, headdim).sum(3)
    return dq, dk, dv


def attention_probs(q, k, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
                    alibi_slopes=None):
    """The undropped softmax probabilities, float32 ``(batch, nheads, seqlen_q, seqlen_k)``
    (rows that see no key are 0)."""
    scores, mask = attention_scores(q.float(), k.float(), causal, window_size, softmax_scale,
                                    softcap, alibi_slopes)
    probs = torch.softmax(scores, dim=-1)
    return probs.masked_fill(~mask.any(dim=-1).unsqueeze(-1), 0.0)


def blockwise_probs(q, k, block_n, causal=False, window_size=(-1, -1), softmax_scale=None,
                    softcap=0.0, alibi_slopes=None):
    """flash-attn v2's unnormalised probabilities (its ``S_dmask`` before the dropout signs),
    float32 ``(batch, nheads, seqlen_q, seqlen_k)``: ``exp(logit_ij - m_i(j))`` with
    ``m_i(j)`` the running row max of a kernel that walks the keys in blocks of ``block_n``
    (block b = keys ``[b * block_n, (b + 1) * block_n)``) from the last block to the first,
    just after it has seen j's block: the max of row i's logits over that block and all later
    ones. Values lie in [0, 1]; multiplying block b by ``exp(m_i(b) - lse_i)`` normalises
    them. 0 where masked."""
    scores, _ = attention_scores(q.float(), k.float(), causal, window_size, softmax_scale,
                                 softcap, alibi_slopes)
    seqlen_k = scores.shape[-1]
    if seqlen_k == 0 or scores.numel() == 0:
        return scores
    nblocks = -(-seqlen_k // block_n)
    padded = torch.nn.functional.pad(scores, (0, nblocks * block_n - seqlen_k),
                                     value=float("-inf"))
    block_max = padded.unflatten(-1, (nblocks, block_n)).amax(-1)
    running = block_max.flip(-1).cummax(-1).values.flip(-1)
    running = running.repeat_interleave(block_n, dim=-1)[..., :seqlen_k]
    # A max that is still -inf (nothing visible yet) counts as 0: exp(-inf - 0) = 0.
    running = running.masked_fill(running == float("-inf"), 0.0)
    return torch.exp(scores - running)


# ---- dropout: a torch twin of cpp/common/score_mod.cuh (Philox4x32-10 and the element layout) ----

_M32 = 0xFFFFFFFF


def _mulhilo32(a, x):
    """(hi, lo) 32-bit halves of the constant ``a`` times uint32 values ``x`` (int64 tensor),
    from 16-bit pieces so that nothing overflows int64."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    x_hi, x_lo = x >> 16, x & 0xFFFF
    ll = a_lo * x_lo
    mid = a_lo * x_hi + a_hi * x_lo + (ll >> 16)
    lo = ((mid & 0xFFFF) << 16) | (ll & 0xFFFF)
    hi = a_hi * x_hi + (mid >> 16)
    return hi, lo


def philox4x32_10(ctr, key):
    """Philox4x32-10 (Salmon et al., SC'11) on int64 tensors holding uint32 values.

    ``ctr``: 4 tensors (broadcastable), ``key``: 2 ints. Returns 4 int64 tensors.
    """
    x0, x1, x2, x3 = (torch.as_tensor(c, dtype=torch.int64) for c in ctr)
    k0, k1 = key[0] & _M32, key[1] & _M32
    for _ in range(10):
        hi0, lo0 = _mulhilo32(0xD2511F53, x0)
        hi1, lo1 = _mulhilo32(0xCD9E8D57, x2)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return x0, x1, x2, x3


def dropout_threshold(dropout_p):
    """Elements whose Philox word is below this are dropped: ``floor(p * 2^32)``."""
    return min(int(dropout_p * 2**32), 2**32 - 1)


def dropout_keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, dropout_p, device=None):
    """Bool ``(batch, nheads, seqlen_q, seqlen_k)``: True where the kernels keep the element
    for this (seed, offset) (the two int64 of their ``rng_state``) and ``dropout_p``.

    Element (b, h, i, j) takes word ``2 * ((i // 8) % 2) + (j // 8) % 2`` of the Philox call
    with key (seed lo, seed hi) and counter (group column, group row, b * nheads + h +
    offset lo, offset hi), group row ``(i // 16) * 8 + i % 8``, column likewise from j.
    """
    i = torch.arange(seqlen_q, device=device, dtype=torch.int64).view(1, 1, -1, 1)
    j = torch.arange(seqlen_k, device=device, dtype=torch.int64).view(1, 1, 1, -1)
    bh = torch.arange(batch * nheads, device=device, dtype=torch.int64).view(batch, nheads, 1, 1)
    group_row = (i >> 4) * 8 + (i & 7)
    group_col = (j >> 4) * 8 + (j & 7)
    ctr = (group_col, group_row, (bh + (offset & _M32)) & _M32,
           torch.tensor((offset >> 32) & _M32, device=device))
    words = torch.stack(torch.broadcast_tensors(*philox4x32_10(ctr, (seed, seed >> 32))))
    which = ((i >> 3) & 1) * 2 + ((j >> 3) & 1)
    word = words.gather(0, which.expand(batch, nheads, seqlen_q, seqlen_k)[None])[0]
    return word >= dropout_threshold(dropout_p)
