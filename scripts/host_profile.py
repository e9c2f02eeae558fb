"""Where one eager ``flash_attn_with_kvcache`` call spends its host time (issue 20's host
target: at most SDPA's per-call time, b1, cache 1k, sq 1, GQA 32 / 8, d128).

    python scripts/host_profile.py [--calls 2000] [--top 25]

Prints the per-call wall time of flashattn2 and SDPA (flash, cuDNN) measured as
bench_decode.py's host part does (the GPU held busy by a sleep kernel, so no call waits for
it), then a cProfile of flashattn2's calls sorted by own time: which Python steps and which
torch / extension calls cost what.
"""
import argparse
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2


def per_call_us(fn, calls):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        torch.cuda._sleep(200_000_000)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, **bf16)
    kc, vc = (torch.randn(1, 1024, 8, 128, **bf16) for _ in range(2))
    seqlens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, kc, vc))

    def ours():
        return flashattn2.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        return call

    for name, fn in (("flashattn2", ours), ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                     ("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION))):
        try:
            print(f"{name:<11} {per_call_us(fn, a.calls):7.1f} us per call")
        except RuntimeError as e:
            print(f"{name:<11} refused: {str(e).splitlines()[0]}")
    prof = cProfile.Profile()
    torch.cuda._sleep(400_000_000)
    prof.enable()
    for _ in range(a.calls):
        ours()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
