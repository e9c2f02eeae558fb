# Thirty-eighth session: where the rest of flash_attn_func's forward + backward host time goes
# once lse's zero gradient is gone (run 2: 440-470 us against SDPA's 200-225; the profiler put
# ~320 us a call in _FlashAttnFuncBackward's own CPU time, on the engine's device thread).
# Each iteration stamps: a, before torch.autograd.grad; b / c, the backward's entry and exit (on
# the device thread); d, when autograd.grad returns. The backward's callees are timed per
# thread (main / device). The same callees run directly on the main thread for comparison, and
# a trivial Python Function (clone / clone) gives the engine's own timeline.
# bf16, batch 1, causal, seqlen 1024, 32 heads of d64; calls behind a GPU sleep.
import collections
import os
import statistics
import threading
import time

import torch

import flashattn2
from flashattn2 import _ext, _launch, interface

pc = time.perf_counter
MAIN = threading.get_ident()
acc = collections.defaultdict(float)
cnt = collections.Counter()


def timed(name, fn):
    def wrapper(*a, **k):
        t = pc()
        try:
            return fn(*a, **k)
        finally:
            key = ("main" if threading.get_ident() == MAIN else "device", name)
            acc[key] += pc() - t
            cnt[key] += 1
    return wrapper


class TimedC:
    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        attr = getattr(self.real, name)
        return timed("_C." + name, attr) if callable(attr) else attr


stamps = {}
ORIG = interface._FlashAttnFunc


class Stamped(ORIG):
    @staticmethod
    def backward(ctx, dout, dlse):
        stamps["b"] = pc()
        r = ORIG.backward(ctx, dout, dlse)
        stamps["c"] = pc()
        return r


class PyClone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        stamps["b"] = pc()
        r = g.clone()
        stamps["c"] = pc()
        return r


def timeline(label, fwd, inputs, g, calls=60):
    for _ in range(10):
        torch.autograd.grad(fwd(), inputs, g)
    torch.cuda.synchronize()
    acc.clear()
    cnt.clear()
    parts = collections.defaultdict(list)
    torch.cuda._sleep(400_000_000)
    for _ in range(calls):
        t0 = pc()
        out = fwd()
        a = pc()
        torch.autograd.grad(out, inputs, g)
        d = pc()
        parts["fwd"].append(a - t0)
        parts["a->b (engine to backward entry)"].append(stamps["b"] - a)
        parts["b->c (backward body)"].append(stamps["c"] - stamps["b"])
        parts["c->d (backward exit to grad's return)"].append(d - stamps["c"])
        parts["total"].append(d - t0)
    torch.cuda.synchronize()
    print(f"\n== {label}: median us over {calls} calls")
    for k, v in parts.items():
        print(f"  {k:40s} {statistics.median(v) * 1e6:8.1f}")
    for (th, name), t in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  [{th:6s}] {name:40s} {t / calls * 1e6:8.1f} us a call ({cnt[(th, name)] / calls:.0f}x)")


def main():
    # the callees of the backward, timed per thread
    interface._check_backward = timed("_check_backward", interface._check_backward)
    interface._flash_attn_backward = timed("_flash_attn_backward", interface._flash_attn_backward)
    _launch._launch_bwd = timed("_launch_bwd", _launch._launch_bwd)
    _launch._kernel_ready = timed("_kernel_ready", _launch._kernel_ready)
    _launch._C = TimedC(_launch._C)
    _ext.current_stream = timed("current_stream", _ext.current_stream)
    torch.cuda.get_device_properties = timed("get_device_properties",
                                             torch.cuda.get_device_properties)
    for name in ("empty", "empty_like"):
        setattr(torch, name, timed("torch." + name, getattr(torch, name)))
    interface._FlashAttnFunc = Stamped
    # the forward's layers (main thread), with FORWARD_PARTS=1 (prepared for jobs/s39_host.sh;
    # run 3 of the thirty-eighth session ran without them)
    if os.environ.get("FORWARD_PARTS"):
        for name in ("_check_inputs", "_check_mod_values", "_attention", "_run"):
            setattr(interface, name, timed(name, getattr(interface, name)))
        interface._flash_attn_forward = timed("_flash_attn_forward", interface._flash_attn_forward)
        _launch._launch_fwd = timed("_launch_fwd", _launch._launch_fwd)
        _launch._tile_counter = timed("_tile_counter", _launch._tile_counter)

    q, k, v = (torch.randn(1, 1024, 32, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)
    timeline("flashattn2 fwd+bwd", lambda: flashattn2.flash_attn_func(q, k, v, causal=True),
             (q, k, v), g)
    # the same backward on the main thread, no engine
    out, lse = _launch._flash_attn_forward(q.detach(), k.detach(), v.detach(), 0.125, -1, 0)
    for _ in range(10):
        _launch._flash_attn_backward(g, q.detach(), k.detach(), v.detach(), out, lse, 0.125, -1, 0)
    torch.cuda.synchronize()
    acc.clear()
    cnt.clear()
    torch.cuda._sleep(400_000_000)
    t = pc()
    for _ in range(60):
        _launch._flash_attn_backward(g, q.detach(), k.detach(), v.detach(), out, lse, 0.125, -1, 0)
    print(f"\n== backward direct on the main thread: {(pc() - t) / 60 * 1e6:.1f} us a call")
    for (th, name), t in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  [{th:6s}] {name:40s} {t / 60 * 1e6:8.1f} us a call ({cnt[(th, name)] / 60:.0f}x)")
    torch.cuda.synchronize()
    x = torch.randn(64, device="cuda", requires_grad=True)
    timeline("PyClone (trivial Python Function)", lambda: PyClone.apply(x), (x,),
             torch.randn(64, device="cuda"))
    print(f"\nsys.getswitchinterval() = {__import__('sys').getswitchinterval()}")


if __name__ == "__main__":
    main()
