"""Prepared in the thirty-third session (its device time ran out; not run): a probe, with
jobs/s33_decode_small_ctas.patch and jobs/s33_decode_fused_merge.patch applied, of the
decode kernel's fused split merge against the
combine kernel in the same build (monkeypatching _launch._tile_counter to None sends the
launch to the combine kernel), CUDA-graph call times as bench_decode's Runner takes them,
2 rounds interleaved, with SDPA-cuDNN (d128, GQA 32/8, sq 1).
Usage: PYTHONPATH=<built module> python3 jobs/s34_fused_probe.py OUTDIR (jobs/s34_fused_probe.sh)"""
import json
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_decode as bd  # noqa: E402
import flashattn2  # noqa: E402
from flashattn2 import _launch  # noqa: E402

args = bd.parse_args(["--rep", "40", "--warmup", "5"])
run = bd.Runner(args)
fused_counter = _launch._tile_counter
bf16 = dict(device="cuda", dtype=torch.bfloat16)
rows = []
for b, s in [(1, 1024), (1, 8192), (1, 32768), (4, 1024), (4, 8192), (4, 32768)]:
    q = torch.randn(b, 1, 32, 128, **bf16)
    k, v = (torch.randn(b, s, 8, 128, **bf16) for _ in range(2))
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    call = lambda: flashattn2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)  # noqa
    ref = None
    for rnd in range(2):
        for name in ("fused", "combine", "cudnn"):
            _launch._tile_counter = fused_counter if name == "fused" else (lambda d, ints=None: None)
            fn = bd.sdpa_call("sdpa_cudnn", qt, kt, vt, enable_gqa=True) if name == "cudnn" else call
            out = fn()
            if name != "cudnn":
                ref = out if ref is None else ref
                assert torch.equal(out, ref) or (out - ref).abs().max() < 1e-2, name
            us, _ = run.time_us(fn)
            r = dict(b=b, s=s, impl=name, round=rnd, us=round(us, 2))
            rows.append(r)
            print(json.dumps(r), flush=True)
    _launch._tile_counter = fused_counter
    del q, k, v, qt, kt, vt
    torch.cuda.empty_cache()
json.dump(rows, open(f"{sys.argv[1]}/fused_probe.json", "w"), indent=1)
