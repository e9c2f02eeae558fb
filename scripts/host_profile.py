#!/usr/bin/env python3
"""Where the host time of one eager flash_attn_with_kvcache call goes (issue 20: b 1, cache
1k, one query token, GQA 32 / 8, d128, bf16), or with --attn that of flash_attn_func, forward
and forward + backward (torch.autograd.grad), at issue 21's grid shapes (b 1, causal, seqlen
128, 16 heads of d128; --dtype fp32 for the float32 kernels).

    python3 scripts/host_profile.py [--calls 400]     # GPU
    python3 scripts/host_profile.py --attn [--dtype fp32]   # GPU: flash_attn_func
    python3 scripts/host_profile.py --mock            # CPU only: the Python layer

GPU: the calls are issued while the stream waits behind a GPU sleep (as bench_decode.py's host
part), so the time per call is host work only; prints it for ours (16 splits: the decode
kernel, then the combine kernel) and SDPA-flash's and SDPA-cuDNN's in the same run, then ours under cProfile
by own and cumulative time. Keep --calls x 2 launches under the driver's queue of pending
launches (~1000), or the launches block on the sleeping GPU and _C.fwd looks slow.

--mock: no GPU; _C.fwd / _C.num_splits_heuristic answer at once (16 splits) and CPU tensors
pass the device check (same queries, no refusal), so the time is that of the Python layer:
checks, allocations, argument building. Also times _C.fwd's argument conversion on the real
binding (a call that its first check refuses), by position and by keyword.
"""
import argparse
import cProfile
import pstats
import time

import torch

import flashattn2
from flashattn2 import _checks, _ext, _launch, kvcache


def shapes(device):
    bf16 = dict(device=device, dtype=torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, **bf16)
    k_cache, v_cache = (torch.randn(1, 1024, 8, 128, **bf16) for _ in range(2))
    seqlens = torch.full((1,), 1024, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, seqlens


def cpu_per_call_us(fn, calls=20000, rounds=5):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def mock(args):
    class FakeC:
        def __init__(self, real):
            self.real = real

        def fwd(self, *a, **k):
            return 81

        def num_splits_heuristic(self, *a, **k):
            return 16

        def __getattr__(self, name):
            return getattr(self.real, name)

    real = _launch._C
    _launch._C = kvcache._C = FakeC(real)
    _ext.current_stream = lambda device: 0

    def check_devices(*named, tracing=None):  # _checks._check_devices' queries, CPU allowed
        for _, t in named:
            t.is_cuda  # noqa: B018
        device = named[0][1].get_device()
        for _, t in named:
            t.get_device() != device  # noqa: B015
        _checks._tracing() if tracing is None else tracing

    _checks._check_devices = kvcache._check_devices = check_devices
    q, k_cache, v_cache, seqlens = shapes("cpu")
    ours = lambda: flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    print(f"Python layer of flash_attn_with_kvcache (mocked _C): {cpu_per_call_us(ours):.2f} us")
    empty = lambda: torch.empty(1, 32, 1, dtype=torch.float32)
    print(f"  (a CPU torch.empty for scale: {cpu_per_call_us(empty):.2f} us)")
    strides = (4096, 4096, 128)
    lead = (16, 16, 16, 16, 16, strides, strides, strides, strides, (32, 1), 1, 1, 1024, 32, 8,
            128, 0.08, -1, -1, 1, 0, 0)
    rest = dict(_launch._FWD_LAYOUT, num_splits=0, o_accum=0, lse_accum=0,
                **_launch._FWD_VARLEN, **_launch._FWD_MODS, q_pack=4, allow_sm90=True,
                tile_counter=0, **_launch._FWD_BIAS, allow_decode=True,
                sm90_stage_o=False, sm90_narrow_step=True, sm90_fa3_order=False, fp32_tf32=False)
    assert tuple(rest) == _launch._FWD_OPTIONAL

    def refused(call):
        def run():
            try:
                call()
            except ValueError:  # (num_splits 0: mha_fwd's first check)
                pass
        return run
    by_position = cpu_per_call_us(refused(lambda: real.fwd(*lead, *rest.values())))
    by_keyword = cpu_per_call_us(refused(lambda: real.fwd(*lead, **rest)))
    print(f"_C.fwd refused by its first check (argument conversion + a C++ exception): "
          f"{by_position:.2f} us by position, {by_keyword:.2f} us by keyword")
    if args.profile:
        profile(ours, 20000)


def gpu_per_call_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return us


def profile(fn, calls):
    prof = cProfile.Profile()
    if torch.cuda.is_available():
        torch.cuda._sleep(400_000_000)
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)


def gpu(args):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k_cache, v_cache, seqlens = shapes("cuda")
    ours = lambda: flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)

    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k_cache, v_cache))

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        return call

    for name, fn in (("flashattn2", ours), ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                     ("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION))):
        print(f"{name}: {gpu_per_call_us(fn, args.calls):.1f} us per eager call "
              f"({args.calls} calls)")
    ours()
    print(f"(flashattn2's last call: kernel {_ext.last_fwd_kernel})")
    if args.profile:
        profile(ours, args.calls)


def attn(args):
    """flash_attn_func's host time per eager call against SDPA's flash and memory-efficient
    backends (a backend that refuses the dtype is skipped), forward alone and forward +
    backward, then ours under cProfile (forward + backward: where the backward's time goes).
    The thirty-seventh session measured 39-44 us forward and 389-625 us forward + backward
    against SDPA's 15-31 / 196-278 us (results/h200-host-time-fwd-bwd-2026-11-28-s37.txt);
    without the materialised lse gradient (thirty-eighth), forward + backward 440-470 us
    against 197-256 (results/h200-host-time-2026-11-28-s38.txt, which has the breakdown)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    qt, kt, vt, gt = (x.detach().transpose(1, 2).contiguous() for x in (q, k, v, g))
    for x in (qt, kt, vt):
        x.requires_grad_()

    def grads(fn, inputs, dout):
        return lambda: torch.autograd.grad(fn(), inputs, dout)

    fa2 = lambda: flashattn2.flash_attn_func(q, k, v, causal=True)  # noqa: E731
    calls = [("flashattn2 fwd", lambda: flashattn2.flash_attn_func(
                 q.detach(), k.detach(), v.detach(), causal=True)),
             ("flashattn2 fwd+bwd", grads(fa2, (q, k, v), g))]
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def sdpa(grad, backend=backend):
            with sdpa_kernel(backend):
                if grad:
                    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
                    return torch.autograd.grad(out, (qt, kt, vt), gt)
                return F.scaled_dot_product_attention(qt.detach(), kt.detach(), vt.detach(),
                                                      is_causal=True)
        try:
            sdpa(True)
        except RuntimeError as e:
            print(f"{name}: refused ({str(e).splitlines()[0][:60]})")
            continue
        calls += [(f"{name} fwd", lambda s=sdpa: s(False)),
                  (f"{name} fwd+bwd", lambda s=sdpa: s(True))]
    for name, fn in calls:
        n = args.calls // (4 if "bwd" in name else 1)  # (under the driver's launch queue)
        print(f"{name}: {gpu_per_call_us(fn, n):.1f} us per eager call ({n} calls)")
    if args.profile:
        profile(calls[1][1], args.calls // 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--mock", action="store_true", help="CPU only: the Python layer")
    ap.add_argument("--attn", action="store_true", help="flash_attn_func (GPU)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="with --attn")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    args = ap.parse_args()
    (mock if args.mock else attn if args.attn else gpu)(args)


if __name__ == "__main__":
    main()
