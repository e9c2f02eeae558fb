"""Backward kernel check through flashattn2._C.bwd directly (no autograd wiring needed):
gradients of a few small problems against autograd through a float32 reference, with the
2x-PyTorch-error rule, NaN-poisoned outputs, and deterministic=True bitwise reproducible.
Small enough for compute-sanitizer (--quick skips the larger deterministic case, for
racecheck). Exit 1 on a mismatch."""
import sys

import torch

from flashattn2 import _C
from flashattn2._reference import attention_ref


def run(b, sq, sk, h, hk, d, causal, dtype, window=(-1, -1), deterministic=False):
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    dout = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    scale = d ** -0.5
    wl, wr = window[0], (0 if causal else window[1])
    out, lse = attention_ref(q, k, v, causal=causal, window_size=window, softmax_scale=scale)
    out = out.to(dtype)

    dq = torch.full_like(q, float("nan"))
    dk_h = torch.full((b, sk, hk, d), float("nan"), device=dev, dtype=dtype)
    dv_h = torch.full_like(dk_h, float("nan"))
    n_acc, n_sum = _C.bwd_workspace_floats(b, h, sq, d)
    dq_accum = torch.empty(n_acc, device=dev, dtype=torch.float32)
    dsum = torch.empty(n_sum, device=dev, dtype=torch.float32)
    lse = lse.float().contiguous()
    _C.bwd(dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
           lse.data_ptr(), dq.data_ptr(), dk_h.data_ptr(), dv_h.data_ptr(),
           dq_accum.data_ptr(), dsum.data_ptr(),
           dout.stride()[:3], q.stride()[:3], k.stride()[:3], v.stride()[:3], out.stride()[:3],
           dq.stride()[:3], dk_h.stride()[:3], dv_h.stride()[:3], lse.stride()[:2],
           b, sq, sk, h, hk, d, scale, wl, wr, 1 if dtype == torch.bfloat16 else 0,
           q.get_device(), torch.cuda.current_stream().cuda_stream, deterministic)
    torch.cuda.synchronize()
    dk, dv = dk_h, dv_h

    def grads(upcast):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o, _ = attention_ref(qq, kk, vv, causal=causal, window_size=window,
                             softmax_scale=scale, upcast=upcast)
        o.backward(dout.float() if upcast else dout)
        return qq.grad, kk.grad, vv.grad

    ref = grads(True)
    pt = grads(False)
    ok = True
    for name, got, r, p in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, pt):
        if torch.isnan(got).any():
            print(f"  {name}: NaN left (unwritten or NaN)"); ok = False; continue
        err = (got.float() - r.float()).abs().max().item()
        pt_err = (p.float() - r.float()).abs().max().item()
        good = err <= 2 * pt_err + 1e-3
        ok &= good
        print(f"  {name}: err {err:.2e} (PyTorch {pt_err:.2e}) {'ok' if good else 'FAIL'}")
    return ok, (dq, dk_h, dv_h)


CASES = [
    (1, 64, 64, 1, 1, 64, False, torch.float16),
    (2, 128, 128, 4, 4, 64, True, torch.bfloat16),
    (2, 113, 203, 6, 2, 128, False, torch.float16),
    (2, 203, 113, 4, 1, 96, True, torch.bfloat16),
    (1, 77, 77, 2, 2, 32, True, torch.float16),
    (1, 300, 257, 2, 1, 128, False, torch.bfloat16, (32, 8)),
]

if __name__ == "__main__":
    fails = 0
    for case in CASES:
        print(case[:7], case[7], case[8:] if len(case) > 8 else "")
        if not run(*case)[0]:
            fails += 1
    if "--quick" in sys.argv:
        print(f"{len(CASES) - fails} passed, {fails} failed")
        sys.exit(1 if fails else 0)
    # deterministic=True: three runs must be bitwise equal (and still correct).
    runs = [run(2, 1000, 1000, 4, 2, 128, True, torch.bfloat16, (-1, -1), True) for _ in range(3)]
    same = all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0][1], r[1]))
    det_ok = all(r[0] for r in runs) and same
    print(f"deterministic: correct={all(r[0] for r in runs)} bitwise-equal={same}")
    fails += 0 if det_ok else 1
    print(f"{len(CASES) + 1 - fails} passed, {fails} failed")
    sys.exit(1 if fails else 0)
