# Thirty-eighth session: A/B of the host time of flash_attn_func forward + backward with the
# autograd node's grads materialised (the old default: autograd builds a zero lse gradient
# before each backward) against not (ctx.set_materialize_grads(False), this tree), at issue
# 21's grid shapes (batch 1, causal, hidden 2048), SDPA in the same run; 4 alternating rounds
# of each, the median of 5 timings each (calls issued behind a GPU sleep: host work only).
# Also the engine alone: a Python Function with a second, non-differentiable output, with and
# without materialised grads.  Run on the device after a build is installed:
#   cd /tmp && python3 $SRC/jobs/s38_host_ab.py
import statistics
import sys
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s38_host_breakdown import host_us, profile  # noqa: E402

import flashattn2  # noqa: E402
from flashattn2 import interface  # noqa: E402

NEW = interface._FlashAttnFunc


class Old(NEW):
    @staticmethod
    def forward(ctx, *args):
        result = NEW.forward(ctx, *args)
        ctx.set_materialize_grads(True)
        return result


class Two(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, materialize):
        ctx.set_materialize_grads(materialize)
        lse = x.sum()
        ctx.mark_non_differentiable(lse)
        return x.clone(), lse

    @staticmethod
    def backward(ctx, g, _):
        return g.clone(), None


def engine():
    x = torch.randn(64, device="cuda", requires_grad=True)
    g = torch.randn(64, device="cuda")
    for m in (True, False, True, False):
        t = host_us(lambda: torch.autograd.grad(Two.apply(x, m)[0], x, g))
        print(f"engine: Python Function, 2 outputs, materialize_grads={m}: fwd+grad {t:.1f} us",
              flush=True)


def ab(dt, s, d):
    h = 2048 // d
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=dt, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    qt, kt, vt, gt = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, g))
    for x in (qt, kt, vt):
        x.requires_grad_()
    call = lambda: torch.autograd.grad(flashattn2.flash_attn_func(q, k, v, causal=True),  # noqa
                                       (q, k, v), g)
    res = {"old": [], "new": []}
    for _ in range(4):
        for name, fn in (("old", Old), ("new", NEW)):
            interface._FlashAttnFunc = fn
            res[name].append(host_us(call))
    interface._FlashAttnFunc = NEW
    for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                     ("sdpa_eff", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(be):
                res[name] = [host_us(lambda: torch.autograd.grad(F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True), (qt, kt, vt), gt)) for _ in range(2)]
        except RuntimeError:
            pass
    print(f"{dt} s{s} d{d} h{h} fwd+bwd (autograd.grad) us: " + "; ".join(
        f"{n} {statistics.median(t):.1f} ({', '.join(f'{x:.0f}' for x in t)})"
        for n, t in res.items()), flush=True)
    return q, k, v, g


if __name__ == "__main__":
    engine()
    for dt, s, d in ((torch.bfloat16, 128, 128), (torch.bfloat16, 1024, 64),
                     (torch.float32, 1024, 64)):
        t = ab(dt, s, d)
        if dt is torch.bfloat16 and s == 1024:
            keep = t
    q, k, v, g = keep
    profile("flashattn2 fwd+bwd (autograd.grad), grads not materialised, bf16 s1024 d64",
            lambda: torch.autograd.grad(flashattn2.flash_attn_func(q, k, v, causal=True),
                                        (q, k, v), g))
