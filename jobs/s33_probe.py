"""Thirty-third session, probe 1 (no kernel change): where the decode calls that lose to cuDNN
spend their time (H200, bf16, GQA 32/8, d128, sq 1). For each (batch, cache):
- CUDA-graph call time (bench_decode's Runner: L2 flushed, median) of flash_attn_with_kvcache
  with cache_seqlens (as the sweep), without it, with forced split counts; SDPA-cuDNN; the
  read floor;
- kernel durations (torch.profiler, L2 flushed before each call, eager) of each;
- the eager host time of the three, 3 interleaved rounds (the sweep's 59.3 us vs 36.8 last
  session).
Usage: PYTHONPATH=<built module> python3 jobs/s33_probe.py OUTDIR"""
import json
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")
import bench_decode as bd  # noqa: E402
import flashattn2  # noqa: E402

out_dir = sys.argv[1]
args = bd.parse_args(["--rep", "60"])
run = bd.Runner(args)
print(f"{run.gpu} copy {run.copy_gbps:.0f} GB/s flush {run.flush_ms * 1e3:.0f} us", flush=True)
h, h_k, d = 32, 8, 128
bf16 = dict(device="cuda", dtype=torch.bfloat16)
CONFIGS = [(1, 1024, [8, 16, 64]), (1, 8192, [8, 16, 64]), (1, 32768, [16, 64]),
           (4, 8192, [4, 16]), (4, 32768, [4, 16]), (16, 1024, [2]), (16, 8192, []),
           (64, 1024, [])]
rows = []


def kernel_times(fn):
    """{kernel name: mean us} over 30 eager calls, each after an L2 flush."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(30):
            run.flush()
            fn()
        torch.cuda.synchronize()
    got = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and "reduce" not in e.key and e.count >= 30:
            got[e.key[:60]] = round(e.device_time_total / e.count, 2)
    return got


for b, s, splits in CONFIGS:
    q = torch.randn(b, 1, h, d, **bf16)
    k, v = (torch.randn(b, s, h_k, d, **bf16) for _ in range(2))
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    fns = {"fa2 seqlens auto": lambda: flashattn2.flash_attn_with_kvcache(
        q, k, v, cache_seqlens=seqlens)}
    fns["fa2 noseqlens auto"] = lambda: flashattn2.flash_attn_with_kvcache(q, k, v)
    for n in splits:
        fns[f"fa2 seqlens s{n}"] = (lambda n=n: flashattn2.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=seqlens, num_splits=n))
    fns["cudnn"] = bd.sdpa_call("sdpa_cudnn", qt, kt, vt, enable_gqa=True)
    fns["floor"] = bd.read_floor_call(k, v)
    for rnd in range(2):
        for name, fn in fns.items():
            us, _ = run.time_us(fn)
            r = dict(b=b, s=s, impl=name, round=rnd, us=round(us, 2))
            if rnd == 1:
                r["kernels"] = kernel_times(fn)
            rows.append(r)
            print(json.dumps(r), flush=True)
    del q, k, v, qt, kt, vt
    torch.cuda.empty_cache()

q = torch.randn(1, 1, h, d, **bf16)
k, v = (torch.randn(1, 1024, h_k, d, **bf16) for _ in range(2))
seqlens = torch.full((1,), 1024, dtype=torch.int32, device="cuda")
qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
host = {"fa2": lambda: flashattn2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        "fa2 noseqlens": lambda: flashattn2.flash_attn_with_kvcache(q, k, v),
        "flash": bd.sdpa_call("sdpa_flash", qt, kt, vt, enable_gqa=True),
        "cudnn": bd.sdpa_call("sdpa_cudnn", qt, kt, vt, enable_gqa=True)}
for rnd in range(3):
    for name, fn in host.items():
        # (run 1 called bench_decode's host_us, 5 rounds of 200 calls, since replaced)
        r = dict(host=name, round=rnd, us=round(bd.host_round_us(fn), 2))
        rows.append(r)
        print(json.dumps(r), flush=True)
with open(f"{out_dir}/probe.json", "w") as f:
    json.dump(rows, f, indent=1)
