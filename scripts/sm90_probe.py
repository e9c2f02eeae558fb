#!/usr/bin/env python3
"""Quick look at the Hopper forward on a few shapes, for a first run after a kernel change:
max error against the float32 reference and against the mma.sync kernels, which kernel
ran, and where the errors sit (query row mod 64, key block, head-dim chunk) when a case
fails. Exits 1 if any case is off by more than 2x PyTorch's own error + atol.

    python scripts/sm90_probe.py
"""
import sys

import torch

import flashattn2
from flashattn2 import _ext
from flashattn2._reference import attention_ref

ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}
# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, dtype, extra kwargs)
CASES = [
    (1, 128, 128, 1, 1, 128, False, torch.bfloat16, {}),
    (1, 128, 256, 1, 1, 128, False, torch.bfloat16, {}),
    (2, 300, 300, 4, 2, 128, True, torch.bfloat16, {}),
    (1, 192, 128, 2, 2, 64, False, torch.float16, {}),
    (2, 500, 700, 4, 1, 64, True, torch.bfloat16, {}),
    (1, 256, 333, 2, 2, 192, False, torch.bfloat16, {}),
    (1, 256, 333, 2, 2, 256, True, torch.float16, {}),
    (2, 400, 400, 4, 2, 100, True, torch.bfloat16, {}),
    (2, 400, 400, 4, 2, 128, True, torch.bfloat16, {"softcap": 20.0}),
    (2, 400, 400, 4, 2, 128, False, torch.bfloat16, {"window_size": (60, 10)}),
]


def run(case):
    b, sq, sk, h, hk, d, causal, dtype, extra = case
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dtype)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True,
                                             **extra)  # fmt: skip
    arch = _ext.last_fwd_arch
    with flashattn2.force_sm80():
        out80 = flashattn2.flash_attn_func(q, k, v, causal=causal, **extra)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, **extra)
    ref_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False, **extra)
    err = (out.float() - ref.float()).abs()
    bound = 2 * (ref_pt.float() - ref.float()).abs().max().item() + ATOL[dtype]
    lse_err = (lse - lse_ref).abs().nan_to_num(0.0).max().item()
    ok = err.max().item() <= bound and lse_err < 1e-3 and not out.isnan().any()
    print(f"{'ok ' if ok else 'BAD'} sm{arch} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} causal={causal} "
          f"{str(dtype)[6:]} {extra}: err {err.max().item():.2e} (bound {bound:.2e}) "
          f"vs sm80 {(out.float() - out80.float()).abs().max().item():.2e} lse {lse_err:.2e} "
          f"nan {out.isnan().sum().item()}")
    if not ok:
        e = err.amax(dim=(0, 2))  # (sq, d)
        rows = torch.arange(sq, device="cuda")
        by_row64 = [e[rows % 64 == r].max().item() for r in range(min(64, sq))]
        print("   max err by row % 64:", " ".join(f"{x:.1e}" for x in by_row64[:16]), "...")
        print("   max err by 64-row block:", " ".join(f"{e[i:i + 64].max().item():.1e}"
                                                   for i in range(0, sq, 64)))
        print("   max err by 8-col group:", " ".join(f"{e[:, j:j + 8].max().item():.1e}"
                                                  for j in range(0, d, 8)))
    return ok


def main():
    torch.manual_seed(0)
    results = [run(c) for c in CASES]
    print(f"{sum(results)} / {len(results)} ok")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
