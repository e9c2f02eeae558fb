# Thirty-eighth session: where flash_attn_func's forward + backward host time goes (the
# thirty-seventh measured 389-625 us per eager call against SDPA's 196-278). Host time per call,
# issued behind a GPU sleep (median of 5 rounds), split into its parts, at issue 21's grid
# shapes (batch 1, causal, hidden 2048):
#   fwd / fwd(grad): the forward without / with an autograd node;
#   bwd direct: _flash_attn_backward on saved tensors, no autograd;
#   fwd+bwd grad / .backward: through the autograd engine;
#   engine: a Python autograd.Function that clones, against torch's own clone, on CUDA (the
#   engine runs a CUDA node on its device thread) and on CPU (the calling thread);
# then torch.profiler's CPU view (aten ops and CUDA runtime calls) of our fwd+bwd and SDPA's.
# Run on the device after a build is installed:  python3 jobs/s38_host_breakdown.py
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2
from flashattn2 import _launch


def host_us(fn, calls=60, rounds=5):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        torch.cuda._sleep(300_000_000)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(out)[rounds // 2]


def cpu_us(fn, calls=2000, rounds=5):
    for _ in range(50):
        fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return sorted(out)[rounds // 2]


class PyClone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.clone()


def engine():
    for dev in ("cuda", "cpu"):
        x = torch.randn(64, device=dev, requires_grad=True)
        g = torch.randn(64, device=dev)
        timer = host_us if dev == "cuda" else cpu_us
        py = timer(lambda: torch.autograd.grad(PyClone.apply(x), x, g))
        tc = timer(lambda: torch.autograd.grad(x.clone(), x, g))
        fwd = timer(lambda: PyClone.apply(x))
        print(f"engine {dev}: PyClone fwd {fwd:.1f} us, fwd+grad {py:.1f} us; "
              f"torch clone fwd+grad {tc:.1f} us", flush=True)


def shapes(dt, s, d):
    h = 2048 // d
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=dt, requires_grad=True)
               for _ in range(3))
    g = torch.randn(1, s, h, d, device="cuda", dtype=dt)
    return q, k, v, g


def breakdown(dt, s, d):
    q, k, v, g = shapes(dt, s, d)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    qt, kt, vt, gt = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, g))
    for x in (qt, kt, vt):
        x.requires_grad_()
    scale = d ** -0.5
    out, lse = _launch._flash_attn_forward(qd, kd, vd, scale, -1, 0)
    res = {
        "fwd": host_us(lambda: flashattn2.flash_attn_func(qd, kd, vd, causal=True), 150),
        "fwd(grad)": host_us(lambda: flashattn2.flash_attn_func(q, k, v, causal=True), 150),
        "bwd direct": host_us(lambda: _launch._flash_attn_backward(g, qd, kd, vd, out, lse,
                                                                   scale, -1, 0)),
        "fwd+bwd grad": host_us(lambda: torch.autograd.grad(
            flashattn2.flash_attn_func(q, k, v, causal=True), (q, k, v), g)),
    }

    def backward():
        q.grad = k.grad = v.grad = None
        flashattn2.flash_attn_func(q, k, v, causal=True).backward(g)
    res["fwd+bwd .backward"] = host_us(backward)
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                     ("eff", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel(be):
                res[f"sdpa_{name} fwd"] = host_us(lambda: F.scaled_dot_product_attention(
                    qt.detach(), kt.detach(), vt.detach(), is_causal=True), 150)
                res[f"sdpa_{name} fwd+bwd grad"] = host_us(lambda: torch.autograd.grad(
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), (qt, kt, vt),
                    gt))
        except RuntimeError:
            pass
    print(f"{dt} s{s} d{d} h{2048 // d}: " + ", ".join(f"{n} {t:.1f}" for n, t in res.items()),
          flush=True)
    return q, k, v, g, qt, kt, vt, gt


def profile(label, fn, calls=20):
    from torch.profiler import ProfilerActivity, profile as prof_
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(300_000_000)
    with prof_(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    print(f"\n=== profiler: {label}, {calls} calls (CPU times are totals over the calls)")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30,
                                 max_name_column_width=60))


if __name__ == "__main__":
    engine()
    keep = None
    for dt, s, d in ((torch.bfloat16, 128, 128), (torch.bfloat16, 1024, 128),
                     (torch.bfloat16, 1024, 64), (torch.float32, 128, 128),
                     (torch.float32, 1024, 64)):
        t = breakdown(dt, s, d)
        if dt is torch.bfloat16 and s == 1024 and d == 64:
            keep = t
    q, k, v, g, qt, kt, vt, gt = keep
    profile("flashattn2 fwd+bwd (autograd.grad), bf16 s1024 d64",
            lambda: torch.autograd.grad(flashattn2.flash_attn_func(q, k, v, causal=True),
                                        (q, k, v), g))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        profile("sdpa_efficient fwd+bwd (autograd.grad), bf16 s1024 d64",
                lambda: torch.autograd.grad(F.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=True), (qt, kt, vt), gt))
