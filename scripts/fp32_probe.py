#!/usr/bin/env python3
"""How the float32 backward's error grows (issue 21; builds with FLASHATTN2_EXPERIMENTAL=...;fp32).

    python3 scripts/fp32_probe.py

For head dims 32 / 64 / 128 and query lengths 64-4096 (keys as many, GQA 2:1, causal and
not): the max abs error of out, dq, dk, dv against float64 attention, next to PyTorch's own
float32 attention's (matmuls in full float32), and their ratio. An error that grows with the
length faster than PyTorch's points at the accumulation (many tensor-core adds into one
float32 accumulator), one that does not at a per-element step (split, exp2, LSE). A cell
marked ! is over the tests' bound (2 x PyTorch's error + 1e-5).
"""
import torch

import flashattn2
from flashattn2._reference import attention_ref


ATOL = 1e-5  # tests/test_fp32.py: a cell marked ! fails its 2x rule (2 x torch's + ATOL)


def grads(fn, leaves, dout):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    print(f"{'d':>4} {'sq':>5} {'causal':>6} | " + " | ".join(
        f"{n:>23}" for n in ("out ours/torch", "dq", "dk", "dv")))
    for d in (32, 64, 128):
        for s in (64, 257, 1024, 4096):
            for causal in (False, True):
                q = torch.randn(1, s, 4, d, device="cuda")
                k, v = (torch.randn(1, s, 2, d, device="cuda") for _ in range(2))
                dout = torch.randn(1, s, 4, d, device="cuda")
                ref = lambda *t: attention_ref(*t, causal=causal, upcast=False)[0]
                g64 = grads(ref, [t.double() for t in (q, k, v)], dout.double())
                g32 = grads(ref, [q, k, v], dout)
                ours = grads(lambda *t: flashattn2.flash_attn_func(*t, causal=causal),
                             [q, k, v], dout)
                cells = []
                for a, b, c in zip(ours, g32, g64):
                    e_ours = (a.double() - c).abs().max().item()
                    e_torch = (b.double() - c).abs().max().item()
                    over = "!" if e_ours > 2 * e_torch + ATOL else " "
                    cells.append(f"{e_ours:.1e}/{e_torch:.1e} {e_ours / e_torch:5.1f}x{over}")
                print(f"{d:>4} {s:>5} {str(causal):>6} | " + " | ".join(f"{c:>23}" for c in cells))


if __name__ == "__main__":
    main()
