"""Kernel times of one decoding step (b=1, 32/8 heads, d128, bf16) per num_splits, from the
torch profiler: where the microseconds of a small decode go (fwd kernel, combine, other)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import flashattn2

cache = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
kc = torch.randn(1, cache, 8, 128, device="cuda", dtype=torch.bfloat16)
vc = torch.randn_like(kc)
seqlens = torch.full((1,), cache, dtype=torch.int32, device="cuda")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
print("heuristic splits:", flashattn2._ext._C.num_splits_heuristic(1, 8, 4, cache, 128, 0))
for splits in (0, 1, 8, 16, 32, 64):
    fn = lambda: flashattn2.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=splits)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name.split("<")[0][-30:]
            times.setdefault(name, []).append(e.device_time)
    summary = ", ".join(f"{k}: {sorted(v)[len(v)//2]:.1f}us" for k, v in times.items()
                        if "fill" not in k and "zero" not in k.lower())
    print(f"splits {splits:3d}: {summary}")
