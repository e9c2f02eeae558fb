#!/usr/bin/env python3
"""Memory a backward allocates beyond its outputs (issue 18), ours next to SDPA's backends.

    python3 benchmarks/bwd_memory.py [--out results.json]

For each config (bf16, hidden 2048 = heads x d, 16k tokens): the forward runs first, then the
peak of torch.cuda.max_memory_allocated during out.backward(dout), minus what was allocated
before it, minus the gradients' own bytes (dq, dk, dv): the backward's workspace (ours: the
float32 dQ accumulator, the dsum rows and order counters; SDPA's: whatever its kernels
allocate through torch). Not a timing: one run each.
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2

BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
            "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def workspace_bytes(impl, b, s, h, d, causal, deterministic=False):
    torch.cuda.empty_cache()
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    if impl == "flashattn2":
        out = flashattn2.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    else:
        with sdpa_kernel(BACKENDS[impl]):
            out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                 is_causal=causal).transpose(1, 2)
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if impl == "flashattn2":
        out.backward(dout)
    else:
        with sdpa_kernel(BACKENDS[impl]):
            out.backward(dout)
    torch.cuda.synchronize()
    grads = sum(t.grad.numel() * t.grad.element_size() for t in (q, k, v))
    return torch.cuda.max_memory_allocated() - before - grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for d in (64, 128):
        for s in (1024, 8192):
            b, h = 16384 // s, 2048 // d
            for causal in (False, True):
                for impl in ("flashattn2", "flashattn2_det", *BACKENDS):
                    try:
                        ws = workspace_bytes(impl.removesuffix("_det"), b, s, h, d, causal,
                                             deterministic=impl.endswith("_det"))
                        err = None
                    except RuntimeError as e:
                        ws, err = None, str(e).splitlines()[0]
                    grads = 3 * b * s * h * d * 2
                    rows.append(dict(impl=impl, headdim=d, seqlen=s, batch=b, nheads=h,
                                     causal=causal, workspace_mib=None if ws is None else ws / 2**20,
                                     grads_mib=grads / 2**20, error=err))
                    r = rows[-1]
                    print(f"d{d} s{s} {'causal' if causal else 'full':6} {impl:15} workspace "
                          + (f"{r['workspace_mib']:8.1f} MiB" if ws is not None else err)
                          + f" (gradients {r['grads_mib']:.0f} MiB)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
