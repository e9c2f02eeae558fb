"""The accuracy rule of the float32 tests (test_fp32*.py): each result of ours, against the same
attention computed in float64, has max |ours - float64| <= 2 * max |torch float32 - float64|
+ ATOL over the finite float64 entries (which must be ours' finite ones), PyTorch's float32
attention computed with TF32 off (conftest.py; the single-TF32 kernels' rule, with TF32 on:
test_fp32_tf32.py check_tf32).

check_2x(names, ours, ref, inputs, dout) runs ref in float64 and in float32 and applies it
to out / lse (no dout) or to the gradients of inputs; ref_attention(...) is the usual ref.
"""
import math

import torch
from reference import attention_ref, attention_scores

ATOL = 1e-5
GRADS = ("dq", "dk", "dv")


def lse_ref(q, k, causal, window, softcap=0.0, slopes=None):
    """(b, h, sq) log-sum-exp of the logits in q's dtype (+inf for a row that sees no key)."""
    scores, mask = attention_scores(q, k, causal, window, softcap=softcap, alibi_slopes=slopes)
    return torch.logsumexp(scores, dim=-1).masked_fill(~mask.any(-1), math.inf)


def ref_attention(causal, window=(-1, -1), softcap=0.0, slopes=None):
    """A ref for check_2x: (b, s, h, d) q, k, v -> out (differentiable), lse, in q's dtype
    (slopes cast to it)."""
    def ref(q, k, v):
        s = None if slopes is None else slopes.to(q.dtype)
        out = attention_ref(q, k, v, causal, window, upcast=False, softcap=softcap,
                            alibi_slopes=s)[0]
        return out, lse_ref(q.detach(), k.detach(), causal, window, softcap, s)
    return ref


def grads(fn, inputs, dout):
    """The gradients of inputs when fn(*inputs) backpropagates dout."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    return torch.autograd.grad(fn(*inputs), inputs, dout)


def _ref_results(ref, inputs, dout, dtype):
    inputs = [t.detach().to(dtype).requires_grad_(dout is not None) for t in inputs]
    results = ref(*inputs)
    results = results if isinstance(results, tuple) else (results,)
    if dout is None:
        return [t.detach() for t in results]
    return torch.autograd.grad(results[0], inputs, dout.to(dtype))


def check_2x(names, ours, ref, inputs, dout=None):
    """The 2x rule for each float32 tensor of ours, named by names in the messages; ref(*inputs)
    (a tensor or a tuple, out first) runs with inputs cast to float64 and to float32. Without
    dout, ours are ref's results (out, lse, or the first of them); with dout, ours are the
    gradients of inputs (or a function of inputs, run as ref, to take them of) when the out
    backpropagates dout. Returns ours."""
    if callable(ours):
        ours = grads(ours, inputs, dout)
    refs = [_ref_results(ref, inputs, dout, dtype) for dtype in (torch.float32, torch.float64)]
    assert isinstance(ours, (tuple, list)) and len(names) == len(ours) <= len(refs[0])
    for name, a, ref32, ref64 in zip(names, ours, *refs):
        assert not a.isnan().any(), f"{name}: NaN entries (left unwritten?)"
        finite = torch.isfinite(ref64)
        assert torch.equal(finite, torch.isfinite(a)), f"{name}: non-finite entries differ"
        diff = lambda t: (t.double() - ref64).abs()[finite].max().item() if finite.any() else 0.0
        err, err_torch = diff(a), diff(ref32)
        assert err <= 2 * err_torch + ATOL, (
            f"{name}: error {err:.3g} > 2 x torch float32's {err_torch:.3g} + {ATOL}")
    return ours
