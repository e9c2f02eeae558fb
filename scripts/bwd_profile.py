"""Where a backward's time goes: CUDA time per kernel of one flashattn2 backward (preprocess,
main kernel, dQ convert), from the torch profiler, next to SDPA-cuDNN's backward kernels
(float32: SDPA memory-efficient's; cuDNN refuses float32), on bench.py's standard shapes
(hidden 2048: nheads = 2048 // d; batch = 16384 // seqlen; bf16 unless --dtype fp32).

    python3 scripts/bwd_profile.py [--headdims 128] [--seqlens 512,1024,4096] [--causal both]
        [--dtype fp32]

Kernel times are medians over the runs; the L2 is not flushed (as in bench.py's timing).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashattn2


def kernel_times(fn, runs):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times.setdefault(e.name, []).append(e.device_time)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items() if len(v) >= runs}


def short(name):
    return name.split("(")[0].split("<")[0].replace("void ", "")[-40:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--headdims", default="128")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,16384")
    ap.add_argument("--causal", choices=["true", "false", "both"], default="both")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    args = ap.parse_args()
    causals = {"true": [True], "false": [False], "both": [False, True]}[args.causal]
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    backend = SDPBackend.EFFICIENT_ATTENTION if args.dtype == "fp32" else SDPBackend.CUDNN_ATTENTION
    for d in map(int, args.headdims.split(",")):
        for s in map(int, args.seqlens.split(",")):
            for causal in causals:
                b, h = max(1, 16384 // s), 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype,
                                       requires_grad=True) for _ in range(3))
                out = flashattn2.flash_attn_func(q, k, v, causal=causal)
                dout = torch.randn_like(out)
                ours = kernel_times(lambda: torch.autograd.grad(out, (q, k, v), dout,
                                                                retain_graph=True), args.runs)
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
                with sdpa_kernel(backend):
                    ref_out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    ref = kernel_times(lambda: torch.autograd.grad(
                        ref_out, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True), args.runs)
                total, ref_total = sum(ours.values()), sum(ref.values())
                parts = ", ".join(f"{short(n)} {t:.1f} us ({100 * t / total:.0f} %)"
                                  for n, t in sorted(ours.items(), key=lambda x: -x[1]))
                print(f"d{d} s{s} b{b} h{h} causal={causal}: flashattn2 {total:.1f} us "
                      f"[{parts}]; SDPA {backend.name} {ref_total:.1f} us ({len(ref)} kernels)")


if __name__ == "__main__":
    main()
