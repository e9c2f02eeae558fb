"""Plain-PyTorch attention used as the reference by the tests and by ``python -m flashattn2``.

Same conventions as the kernels: BSHD layout, GQA by sharing each key/value head among
``nheads // nheads_k`` consecutive query heads, bottom-right aligned causal / local masks,
and rows that see no key give out = 0 and lse = +inf.
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


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None, upcast=True):
    """Returns ``(out, lse)``: out like q, lse float32 ``(batch, nheads, seqlen_q)``.

    q ``(b, sq, h, d)``, k/v ``(b, sk, h_k, d)``. ``causal`` sets the right window bound to 0
    (as flash-attn does, the left bound of ``window_size`` is kept). ``upcast=True``
    computes in float32; ``upcast=False`` computes in the input dtype, which measures
    PyTorch's own error at that precision. ``softmax_scale`` defaults to ``d ** -0.5``.
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    window_left, window_right = window_size
    if causal:
        window_right = 0
    group = nheads // nheads_k
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("bqhd,bkhd->bhqk", q * softmax_scale, k)
    mask = visible_mask(seqlen_q, seqlen_k, window_left, window_right, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores.float(), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    seen = mask.any(dim=-1)  # (sq,): rows that see at least one key
    probs = probs.masked_fill(~seen.unsqueeze(-1), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
    lse = lse.masked_fill(~seen, float("inf"))
    return out.to(dtype), lse
