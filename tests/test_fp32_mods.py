"""float32 softcap and ALiBi (issue 21; cpp/fp32/mods.cuh in the kGeneral instances of the
float32 kernels, FLASHATTN2_EXPERIMENTAL=fp32 builds).

GPU: out, lse, dq, dk, dv against float64 (the logits, ALiBi's bias included, computed in
float64) with the 2x rule of test_fp32.py, outputs NaN-poisoned first; PyTorch's float32
error is that of the float32 reference (its bias rounded to float32, as torch users get).
Varlen with both: test_fp32_varlen.py.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _launch
from reference import attention_ref
from test_fp32 import _check, _grads, needs_fp32, needs_fp32_bwd
from test_fp32_varlen import lse_ref

gpu = pytest.mark.gpu

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window, softcap, slopes):
# slopes None, "h" (nheads,) or "bh" (batch, nheads). sq 2048 > sk 128 with ALiBi: the first
# rows see only keys at distance > 1900, logits near -500 (the row max too).
SHAPES = [
    (1, 257, 300, 4, 2, 64, True, (-1, -1), 0.0, "h"),
    (2, 130, 90, 2, 2, 128, False, (-1, -1), 0.0, "bh"),
    (1, 200, 200, 2, 1, 32, False, (40, 8), 2.0, None),
    (2, 97, 160, 4, 4, 40, True, (-1, -1), 5.0, "bh"),
    (1, 2048, 128, 2, 1, 64, False, (-1, -1), 0.0, "h"),
    (1, 1024, 1024, 4, 2, 128, True, (-1, -1), 10.0, "h"),
]


def _ids(shape):
    b, sq, sk, h, hk, d, causal, window, softcap, slopes = shape
    return (f"b{b}-{sq}x{sk}-h{h}:{hk}-d{d}" + ("-causal" if causal else "")
            + (f"-w{window[0]},{window[1]}" if window != (-1, -1) else "")
            + (f"-cap{softcap:g}" if softcap else "") + (f"-alibi_{slopes}" if slopes else ""))


def _inputs(shape):
    b, sq, sk, h, hk, d, causal, window, softcap, slopes = shape
    q = torch.randn(b, sq, h, d, device="cuda")
    k = torch.randn(b, sk, hk, d, device="cuda")
    v = torch.randn(b, sk, hk, d, device="cuda")
    if slopes is not None:
        slopes = torch.rand(*((b, h) if slopes == "bh" else (h,)), device="cuda") * 0.5
    return q, k, v, softcap, slopes


@gpu
@needs_fp32
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32_mods_forward_against_float64(shape):
    causal, window = shape[6], shape[7]
    q, k, v, softcap, slopes = _inputs(shape)
    d = q.shape[-1]
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:1] + q.shape[2:3] + q.shape[1:2], float("nan"), device="cuda")
    _launch._flash_attn_forward(q, k, v, d**-0.5, window[0], 0 if causal else window[1],
                                out=out, lse=lse, softcap=softcap, alibi_slopes=slopes)
    assert not out.isnan().any() and not lse.isnan().any(), "part of out / lse left unwritten"
    ref = {}
    for dtype in (torch.float32, torch.float64):
        t = [x.to(dtype) for x in (q, k, v)]
        s = None if slopes is None else slopes.to(dtype)
        ref[dtype] = (attention_ref(*t, causal, window, upcast=False, softcap=softcap,
                                    alibi_slopes=s)[0],
                      lse_ref(t[0], t[1], causal, window, softcap, s))
    _check("out", out, ref[torch.float32][0], ref[torch.float64][0])
    _check("lse", lse, ref[torch.float32][1], ref[torch.float64][1])
    public = flashattn2.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                        softcap=softcap, alibi_slopes=slopes)
    assert torch.equal(public, out)


@gpu
@needs_fp32
@needs_fp32_bwd
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_fp32_mods_backward_against_float64(shape, deterministic):
    causal, window = shape[6], shape[7]
    q, k, v, softcap, slopes = _inputs(shape)
    dout = torch.randn_like(q)
    ours_fn = lambda *t: flashattn2.flash_attn_func(*t, causal=causal, window_size=window,
                                                    softcap=softcap, alibi_slopes=slopes,
                                                    deterministic=deterministic)
    g = {}
    for dtype in (torch.float32, torch.float64):
        s = None if slopes is None else slopes.to(dtype)
        ref = lambda *t: attention_ref(*t, causal=causal, window_size=window, upcast=False,
                                       softcap=softcap, alibi_slopes=s)[0]
        _, g[dtype] = _grads(ref, [t.to(dtype) for t in (q, k, v)], dout.to(dtype))
    _, ours = _grads(ours_fn, [q, k, v], dout)
    for name, a, b, c in zip(("dq", "dk", "dv"), ours, g[torch.float32], g[torch.float64]):
        _check(name, a, b, c)
    if deterministic:
        _, again = _grads(ours_fn, [q, k, v], dout)
        for name, a, b in zip(("dq", "dk", "dv"), ours, again):
            assert torch.equal(a, b), f"deterministic {name} differs between runs"
