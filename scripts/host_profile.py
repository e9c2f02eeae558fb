#!/usr/bin/env python3
"""Where the host time of one eager flash_attn_with_kvcache call goes (issue 20: ours 54.9 us
against SDPA-cuDNN's 44.4 us per call at b 1, cache 1k, one query token, H100).

    python3 scripts/host_profile.py [--calls 2000]

The calls are issued while the stream waits behind a GPU sleep (as bench_decode.py's host
part), under cProfile; prints the functions by own time and by cumulative time, and the
per-call time without the profiler, ours and SDPA-cuDNN's, in the same run.
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
    torch.cuda._sleep(200_000_000)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 1, 32, 128, **bf16)
    k_cache, v_cache = (torch.randn(1, 1024, 8, 128, **bf16) for _ in range(2))
    seqlens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
    ours = lambda: flashattn2.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k_cache, v_cache))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    for name, fn in (("flashattn2", ours), ("sdpa_cudnn", cudnn)):
        print(f"{name}: {per_call_us(fn, 200):.1f} us per eager call (median-free, 200 calls)")
    prof = cProfile.Profile()
    torch.cuda._sleep(400_000_000)
    prof.enable()
    for _ in range(args.calls):
        ours()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
