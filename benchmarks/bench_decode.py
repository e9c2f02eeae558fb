#!/usr/bin/env python3
"""Benchmark flashattn2's decode (KV cache) and varlen prefill paths against PyTorch SDPA.

Decode (defaults): bf16 (or --dtype fp16), 32 query / 8 KV heads, d 128, batch 1/4/16/64, cache
1k/8k/32k/128k, every cache_seqlens = the full cache, sq 1 and 4. flash_attn_with_kvcache runs
on a contiguous cache (b, s, h_k, d) and on the same memory as pages in a shuffled block table
(--page-sizes), num_splits=0 (its heuristic) plus any --splits. Baselines in the same run:
SDPA's flash and cuDNN backends on (b, h, s, d) copies made before timing, GQA via
enable_gqa=True or, where a backend refuses it, K/V heads expanded before timing (column `gqa`).
And a floor: `read_floor` is one Triton kernel that only reads K and V once (no attention),
timed the same way, so it is the least time any decode kernel can take here (launch included);
the summary says what speedup over SDPA it would allow. sq = 4 is non-causal for every impl:
SDPA's is_causal is top-left aligned, flash-attn's bottom-right, and a causal mask over 4 new
tokens hides 6 of 4*s scores, so the work is the same. A config whose tensors (cache plus SDPA
copies) exceed --mem-budget-gib is skipped. KV bandwidth = 2*b*s*h_k*d*2 bytes (K and V read
once) / time, in GB/s and as a fraction of the device-copy bandwidth measured at start (a copy_
of --copy-gib; bytes read + written / time).

Varlen prefill: --varlen-tokens causal tokens as n sequences of seeded random lengths
(flash_attn_varlen_func) vs n equal sequences as a dense batch (flash_attn_func), plus varlen on
exactly the dense shapes (equal lengths) for a like-for-like time ratio. Random lengths do other
work (sum l^2 != n*(T/n)^2), so they are compared in TFLOP/s (causal: 4*l^2*h*d/2 per sequence).

Host time (part `host`): what one eager call costs the CPU (checks, allocations, launches),
flash_attn_with_kvcache at batch 1, cache 1k, sq 1 next to SDPA's flash and cuDNN backends on
the same shapes: the calls are issued while the stream waits behind a long GPU sleep
(torch.cuda._sleep), so the CPU never waits for the GPU and the time per call is all host
work (median of 5 rounds of 200 calls, the impls taking turns in each round; column `us`,
timer "host").

Timing: median CUDA-event time of single calls, each after a read of 4x the L2 size (cold cache,
as in decoding, where every layer reads another cache; a read leaves no dirty lines to write back
inside the timed call), the call replayed from a CUDA graph (`timer`: eager with --no-graphs or
when capture fails).

    python benchmarks/bench_decode.py             # full run (meant to take < 3 min on an H100)
    python benchmarks/bench_decode.py --quick     # subset (meant to take < 30 s)
    python benchmarks/bench_decode.py --batches 1 --cache-lens 8k --page-sizes 16,64,256 --splits 4

Writes decode.json ({"meta": ..., "rows": [...]}) and decode.csv to --out.
"""
import argparse
import csv
import datetime
import functools
import itertools
import json
import os
import platform
import random
import re
import shlex
import statistics
import sys

COLUMNS = ["gpu", "bench", "impl", "layout", "page_size", "num_splits", "batch", "seqlen_q",
           "seqlen_k", "tokens", "nheads", "nheads_k", "headdim", "causal", "us", "gbps",
           "frac_copy", "tflops", "gqa", "timer", "error"]
IMPLS = ("flashattn2", "flashattn2_oldkv", "sdpa_flash", "sdpa_cudnn", "read_floor")
# A/B variants of flashattn2, each an impl of its own (not a baseline): the _ext switch it
# turns off, and the summary's line. (The decode kernel's L2-prefetch and early-issue switches,
# flashattn2_noprefetch / flashattn2_lateissue, are gone: both on at compile time, the loop
# copies each chunk once instead of under both values; NOTES, thirty-second session.)
AB_VARIANTS = {"flashattn2_oldkv": ("decode_kernel", "decode kernel vs KV kernel")}
# flashattn2_oldkv: flashattn2 with the decode kernel switched off (flashattn2._ext.decode_kernel
# (False), as FLASHATTN2_DECODE_KERNEL=0): the KV kernel, for an A/B of builds with
# FLASHATTN2_EXPERIMENTAL=decode in one run (identical to flashattn2 in builds without it).
DEFAULT_IMPLS = ("flashattn2", "sdpa_flash", "sdpa_cudnn", "read_floor")
PARTS = ("decode", "varlen", "host")
GiB = 1 << 30
# Targets (issue 20): every decode config >= 1.0x sdpa_cudnn; b=1 cache 8k at most 1.2x the
# read floor; configs with >= 1 GiB of K+V at >= 97% of the read floor's throughput; paged
# within 3% of contiguous; 4 query tokens within 10% of 1; eager host time per call at most
# SDPA's; and varlen within 5% of dense.
T_VS_CUDNN, T_B1_FLOOR, LARGE_KV_GIB, T_FLOOR_FRAC = 1.0, 1.2, 1, 0.97
T_PAGED_SLACK, T_SQ4_SLACK, T_VARLEN_SLACK = 0.03, 0.10, 0.05
FULL = dict(batches=[1, 4, 16, 64], cache_lens=[1 << 10, 8 << 10, 32 << 10, 128 << 10],
            sq=[1, 4], varlen_seqs=[4, 16, 64], varlen_heads=[(16, 16), (32, 8)],
            warmup=10, rep=50)
QUICK = dict(batches=[1, 16], cache_lens=[8 << 10, 32 << 10], sq=[1], varlen_seqs=[16],
             varlen_heads=[(16, 16)], warmup=5, rep=20)


def size(text):
    """'8k' -> 8192."""
    text = text.strip().lower()
    return int(text[:-1]) << 10 if text.endswith("k") else int(text)


def heads(text):
    """'32:8' -> (32, 8); '16' -> (16, 16)."""
    h, _, h_k = text.partition(":")
    return int(h), int(h_k or h)


def torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def csv_list(kind):
    return lambda s: [kind(x) for x in s.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=csv_list(int), help="default 1,4,16,64")
    p.add_argument("--cache-lens", type=csv_list(size), help="default 1k,8k,32k,128k")
    p.add_argument("--sq", type=csv_list(int), help="new tokens per step (default 1,4)")
    p.add_argument("--heads", type=heads, default=(32, 8), help="decode h:h_k (default 32:8)")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                   help="the query, cache and SDPA copies' dtype (default bf16; meta.dtype)")
    p.add_argument("--page-sizes", type=csv_list(int), default=[256],
                   help="paged-cache page sizes, e.g. 16,64,256 ('' for none; default 256); "
                        "skipped for a cache length they do not divide")
    p.add_argument("--page-order", choices=("shuffled", "sequential"), default="shuffled",
                   help="the block table's pages: a random permutation of the cache (default), "
                        "or in order (the contiguous cache's addresses, read through the table)")
    p.add_argument("--bhsd", action="store_true",
                   help="also time flashattn2 on a (b, h_k, s, d) cache (layout bhsd): the "
                        "read pattern of SDPA and the read floor, in the same kernel")
    p.add_argument("--splits", type=csv_list(int), default=[],
                   help="num_splits values to force, timed besides the heuristic (0)")
    p.add_argument("--impls", type=csv_list(str), default=list(DEFAULT_IMPLS),
                   help="flashattn2,sdpa_flash,sdpa_cudnn,read_floor and the A/B variants "
                        "(not by default) " + ",".join(AB_VARIANTS))
    p.add_argument("--parts", type=csv_list(str), default=list(PARTS), help="decode,varlen")
    p.add_argument("--mem-budget-gib", type=float, default=40.0,
                   help="skip decode configs whose tensors, SDPA copies included, exceed it")
    p.add_argument("--copy-gib", type=float, default=2.0, help="size of the timed copy_")
    p.add_argument("--varlen-tokens", type=int, default=16384, help="total tokens (default 16k)")
    p.add_argument("--varlen-seqs", type=csv_list(int), help="sequence counts (default 4,16,64)")
    p.add_argument("--varlen-heads", type=csv_list(heads), help="h:h_k (default 16:16,32:8)")
    p.add_argument("--warmup", type=float, help="warm-up per measurement, ms (default 10)")
    p.add_argument("--rep", type=float, help="measuring time per measurement, ms (default 50)")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="replay each call from a CUDA graph (default on)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="b 1,16; cache 8k,32k; sq 1; 1 varlen")
    p.add_argument("--out", help="output dir (default benchmarks/out/<gpu>-decode-<date>)")
    p.add_argument("--summary", action=argparse.BooleanOptionalAction, default=True,
                   help="print the targets summary at the end (default on)")
    a = p.parse_args(argv)
    for key, value in (QUICK if a.quick else FULL).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    for name, values, allowed in (("impls", a.impls, IMPLS), ("parts", a.parts, PARTS)):
        if set(values) - set(allowed):
            p.error(f"--{name}: unknown {sorted(set(values) - set(allowed))}; "
                    f"choose from {','.join(allowed)}")
    if any(h % h_k for h, h_k in [a.heads] + a.varlen_heads):
        p.error("query heads must be a multiple of KV heads")
    return a


# ----------------------------------------------------------------------------- output

def klen(s):
    return f"{s >> 10}k" if s % 1024 == 0 else str(s)


def kv_bytes(r):
    return 2 * r["batch"] * r["seqlen_k"] * r["nheads_k"] * r["headdim"] * 2


def cfg(r):
    return f"b{r['batch']} sq{r['seqlen_q']} {klen(r['seqlen_k'])}"


DECODE_HEADER = (f"{'impl':<16} {'layout':<10} {'splits':>6} {'b':>3} {'sq':>3} {'cache':>5} | "
                 f"{'us':>9} {'GB/s':>7} {'copy':>5}  gqa / timer")
PREFILL_HEADER = (f"{'impl':<11} {'layout':<14} {'heads':>5} {'n_seq':>5} {'tokens':>6} "
                  f"{'max_len':>7} | {'us':>9} {'TFLOP/s':>7}  timer")


def line(r):
    """One table line: the config, then the timing or the error."""
    decode = r["bench"] == "decode"
    if r["bench"] == "host":
        head = f"{r['impl']:<11} host time per eager call, {cfg(r)} | "
        return head + (f"error: {r['error']}" if r["error"] else f"{r['us']:9.1f} us")
    if decode:
        layout = f"paged{r['page_size']}" if r["layout"] == "paged" else r["layout"]
        splits = {None: "-", 0: "auto"}.get(r["num_splits"], r["num_splits"])
        head = (f"{r['impl']:<16} {layout:<10} {splits:>6} {r['batch']:>3} {r['seqlen_q']:>3} "
                f"{klen(r['seqlen_k']):>5} | ")
    else:
        head = (f"{r['impl']:<11} {r['layout']:<14} {r['nheads']:>2}:{r['nheads_k']:<2} "
                f"{r['batch']:>5} {r['tokens']:>6} {r['seqlen_q']:>7} | ")
    if r["error"]:
        return head + f"error: {r['error']}"
    if decode:
        return head + (f"{r['us']:9.1f} {r['gbps']:7.0f} {r['frac_copy']:5.0%}  "
                       f"{r['gqa']} / {r['timer']}")
    return head + f"{r['us']:9.1f} {r['tflops']:7.1f}  {r['timer']}"


def report(what, text, values, passed):
    state = "MET" if all(map(passed, values)) else "MISSED"
    print(f"  {what}: {text or '-'} -> {state if values else 'n/a (no rows)'}")


def print_summary(rows, meta):
    ok = [r for r in rows if r["us"]]
    key = lambda r: (r["batch"], r["seqlen_q"], r["seqlen_k"])
    dec = [r for r in ok if r["bench"] == "decode"]
    fa = [r for r in dec if r["impl"] == "flashattn2" and r["num_splits"] == 0]
    contig = {key(r): r for r in fa if r["layout"] == "contiguous"}
    base = {(r["impl"],) + key(r): r for r in dec if not r["impl"].startswith("flashattn2")}
    floors = {(r["batch"], r["seqlen_k"]): r["us"] for r in dec if r["impl"] == "read_floor"}
    print(f"\nSummary vs targets (flashattn2 num_splits=auto, contiguous cache unless stated; "
          f"{meta['timer']})")
    vs = sorted((base[("sdpa_cudnn",) + k]["us"] / r["us"], cfg(r)) for k, r in contig.items()
                if ("sdpa_cudnn",) + k in base)
    report(f"every config >= {T_VS_CUDNN:g}x sdpa_cudnn (speed ratio)",
           vs and f"worst {vs[0][0]:.2f}x ({vs[0][1]}), best {vs[-1][0]:.2f}x, {len(vs)} cfgs",
           [x for x, _ in vs], lambda x: x >= T_VS_CUDNN)
    b1 = [(r["us"] / floors[(1, 8192)], r) for k, r in sorted(contig.items())
          if k[0] == 1 and k[2] == 8192 and (1, 8192) in floors]
    report(f"b=1 cache 8k at most {T_B1_FLOOR:g}x the read floor",
           ", ".join(f"sq{r['seqlen_q']} {r['us']:.1f} us = {x:.2f}x" for x, r in b1)
           + (f" (floor {floors[(1, 8192)]:.1f} us)" if b1 else ""),
           [x for x, _ in b1], lambda x: x <= T_B1_FLOOR)
    big = sorted((floors[(r["batch"], r["seqlen_k"])] / r["us"], cfg(r)) for r in contig.values()
                 if kv_bytes(r) >= LARGE_KV_GIB * GiB and (r["batch"], r["seqlen_k"]) in floors)
    report(f"K+V >= {LARGE_KV_GIB} GiB at >= {T_FLOOR_FRAC:.0%} of the read floor's speed",
           big and f"min {big[0][0]:.0%} ({big[0][1]}), max {big[-1][0]:.0%} ({big[-1][1]}), "
                   f"{len(big)} cfgs",
           [x for x, _ in big], lambda x: x >= T_FLOOR_FRAC)
    for page in sorted({r["page_size"] for r in fa if r["layout"] == "paged"}):
        slow = sorted((r["us"] / contig[key(r)]["us"] - 1, cfg(r)) for r in fa
                      if r["page_size"] == page and key(r) in contig)
        report(f"paged{page} within {T_PAGED_SLACK:.0%} of contiguous",
               slow and f"worst {slow[-1][0]:+.1%} ({slow[-1][1]}), {len(slow)} cfgs",
               [x for x, _ in slow], lambda x: x <= T_PAGED_SLACK)
    sq4 = sorted((r["us"] / contig[(b, 1, sk)]["us"] - 1, cfg(r))
                 for (b, sq, sk), r in contig.items() if sq == 4 and (b, 1, sk) in contig)
    report(f"sq4 within {T_SQ4_SLACK:.0%} of sq1",
           sq4 and f"worst {sq4[-1][0]:+.1%} ({sq4[-1][1]}), {len(sq4)} cfgs",
           [x for x, _ in sq4], lambda x: x <= T_SQ4_SLACK)
    for variant, (_, what) in AB_VARIANTS.items():  # (no targets: A/B of flashattn2's switches)
        old = {(r["layout"], r["page_size"]) + key(r): r for r in dec
               if r["impl"] == variant and r["num_splits"] == 0}
        ab = sorted((old[k]["us"] / r["us"], cfg(r)) for r in fa
                    if (k := (r["layout"], r["page_size"]) + key(r)) in old)
        if ab:
            print(f"  {what} ({variant} time / flashattn2 time): worst {ab[0][0]:.2f}x "
                  f"({ab[0][1]}), best {ab[-1][0]:.2f}x ({ab[-1][1]}), {len(ab)} cfgs")
    bhsd = sorted((contig[key(r)]["us"] / r["us"], cfg(r)) for r in fa
                  if r["layout"] == "bhsd" and key(r) in contig)
    if bhsd:  # (no target: how much the (b, s, h_k, d) read pattern costs, --bhsd)
        print(f"  bhsd cache vs bshd (contiguous time / bhsd time): min {bhsd[0][0]:.2f}x "
              f"({bhsd[0][1]}), max {bhsd[-1][0]:.2f}x ({bhsd[-1][1]}), {len(bhsd)} cfgs")
    host = {r["impl"]: r["us"] for r in ok if r["bench"] == "host"}
    others = [us for impl, us in host.items() if not impl.startswith("flashattn2")]
    report("eager host time per call at most SDPA's (b=1, cache 1k, sq 1)",
           ", ".join(f"{impl} {us:.1f} us" for impl, us in host.items()),
           [host["flashattn2"] / min(others)] if "flashattn2" in host and others else [],
           lambda x: x <= 1.0)
    groups = {}
    for r in ok:
        if r["bench"] == "prefill":
            groups.setdefault((r["nheads"], r["nheads_k"], r["batch"]), {})[r["layout"]] = r
    equal = sorted((g["varlen-equal"]["us"] / g["dense"]["us"] - 1, f"h{h}:{h_k} n{n}")
                   for (h, h_k, n), g in groups.items() if {"dense", "varlen-equal"} <= g.keys())
    mixed = [g["varlen-random"]["tflops"] / g["dense"]["tflops"] for g in groups.values()
             if {"dense", "varlen-random"} <= g.keys()]
    text = equal and (f"equal lengths worst {equal[-1][0]:+.1%} time ({equal[-1][1]}), "
                      f"{len(equal)} cfgs")
    if mixed:
        text = f"{text or '-'}; random lengths {min(mixed):.2f}-{max(mixed):.2f}x dense TFLOP/s"
    report(f"varlen within {T_VARLEN_SLACK:.0%} of dense", text,
           [x for x, _ in equal], lambda x: x <= T_VARLEN_SLACK)
    errors = sum(1 for r in rows if r["error"])
    print(f"  {errors} error rows; skipped for memory: {', '.join(meta['skipped']) or 'none'}")


def write_results(rows, meta, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decode.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    with open(os.path.join(out, "decode.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {out}/decode.json, decode.csv ({len(rows)} rows)")


# ----------------------------------------------------------------------------- measuring

REFUSALS = (RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError)


def first_line(e):
    return f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0][:160]


def flashattn2_api(name):
    """flashattn2.<name>, or a stand-in raising an error that names what is missing."""
    try:
        import flashattn2
        fn = getattr(flashattn2, name, None)
        msg = (f"flashattn2.{name} does not exist in this build "
               f"(flashattn2 {getattr(flashattn2, '__version__', '?')})")
    except Exception as e:
        fn, msg = None, f"flashattn2 not importable ({first_line(e)}), needed for {name}"
    if fn is not None:
        return fn

    def missing(*args, **kwargs):
        raise RuntimeError(msg)
    return missing


def sdpa_call(impl, q, k, v, enable_gqa):
    def call():
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                   "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[impl]
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, **extra)
    extra = {"enable_gqa": True} if enable_gqa else {}
    return call


try:  # the read_floor baseline; without Triton its rows carry the error
    import triton
    import triton.language as tl
except ImportError as e:
    triton, TRITON_ERROR = None, first_line(e)
else:
    @triton.jit
    def _read_kv_kernel(k_ptr, v_ptr, out_ptr, n, BLOCK: tl.constexpr):
        """Program p reads block p of K (p < blocks) or block p - blocks of V: K and V once."""
        pid = tl.program_id(0)
        blocks = tl.cdiv(n, BLOCK)
        offs = (pid % blocks) * BLOCK + tl.arange(0, BLOCK)
        if pid < blocks:
            x = tl.load(k_ptr + offs, mask=offs < n, other=0.0)
        else:
            x = tl.load(v_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + pid, tl.sum(x.to(tl.float32)))


def read_floor_call(k, v):
    """One kernel reading the contiguous K and V once (a sum per 4 KiB block; the fastest of
    the block shapes tried on an H100: 2048 elements, 4 warps, one wave of loads per program)."""
    import torch
    if triton is None:
        def call():
            raise RuntimeError(f"read_floor needs Triton ({TRITON_ERROR})")
        return call
    block = 2048
    grid = 2 * triton.cdiv(k.numel(), block)
    out = torch.empty(grid, device="cuda")
    return lambda: _read_kv_kernel[(grid,)](k, v, out, k.numel(), BLOCK=block, num_warps=4)


def over_budget():
    raise RuntimeError("expanded K/V heads would exceed --mem-budget-gib")


class Runner:
    """The device side: copy bandwidth, memory budget, cold-L2 timing of calls into rows."""

    def __init__(self, args):
        import torch
        self.args, self.gpu = args, torch.cuda.get_device_name()
        n = int(args.copy_gib * GiB)
        src = torch.empty(n, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        ms = statistics.median(self.samples(lambda: dst.copy_(src), 10, flush=False))
        self.copy_gbps = 2 * n / ms / 1e6           # bytes read + written
        del src, dst
        torch.cuda.empty_cache()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = getattr(props, "L2_cache_size", 0) or 64 << 20
        self.flush_buf = torch.ones(self.l2_bytes, dtype=torch.float32, device="cuda")  # 4x L2
        self.flush_ms = statistics.median(self.samples(self.flush, 5, flush=False))
        self.budget = min(args.mem_budget_gib * GiB, 0.9 * torch.cuda.mem_get_info()[0])

    def flush(self):
        self.flush_buf.sum()

    def samples(self, step, n, flush=True):
        """CUDA-event ms of n calls of step (after one untimed call), each after a flush."""
        import torch
        step()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            if flush:
                self.flush()
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def time_us(self, fn):
        """(median µs, timer name) of fn(), replayed from a CUDA graph where it captures."""
        import torch
        step, name = fn, "eager"
        if self.args.graphs:
            try:
                side = torch.cuda.Stream()      # warm-up off the capture stream, as torch asks
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        fn()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                step, name = graph.replay, "graph"
            except REFUSALS as e:
                torch.cuda.synchronize()
                name = f"eager (capture failed: {type(e).__name__})"
        estimate = max(statistics.median(self.samples(step, 3)), 1e-3)
        for _ in range(min(1000, int(self.args.warmup / estimate))):
            step()
        n = min(1000, max(10, int(self.args.rep / (estimate + self.flush_ms))))
        return statistics.median(self.samples(step, n)) * 1e3, name

    def measure(self, fields, fn, flops=None, error_prefix=""):
        """One row: a first untimed call surfaces refusals as the row's error."""
        import torch
        r = dict.fromkeys(COLUMNS)
        r.update(gpu=self.gpu, **fields)
        try:
            fn()
            torch.cuda.synchronize()
            r["us"], r["timer"] = self.time_us(fn)
        except REFUSALS as e:
            r["error"] = error_prefix + first_line(e)
        else:
            if r["bench"] == "decode":
                r["gbps"] = kv_bytes(r) / r["us"] / 1e3
                r["frac_copy"] = r["gbps"] / self.copy_gbps
            if flops:
                r["tflops"] = flops / r["us"] / 1e6
        print(line(r), flush=True)
        return r


def flashattn2_call(impl):
    """flash_attn_with_kvcache, or for an AB_VARIANTS impl the same with its switch off."""
    call = flashattn2_api("flash_attn_with_kvcache")
    if impl not in AB_VARIANTS:
        return call
    import flashattn2._ext
    switch = getattr(flashattn2._ext, AB_VARIANTS[impl][0])

    def attend(*args, **kwargs):
        with switch(False):
            return call(*args, **kwargs)
    return attend


def block_table(batch, seqlen, page, order, gen):
    """The (batch, seqlen / page) block table (CPU, int64) over the cache's memory as pages:
    a permutation drawn from ``gen`` (order "shuffled") or the pages in order ("sequential":
    entry b, i is page b * seqlen / page + i, the contiguous cache's own addresses)."""
    import torch
    pages = batch * seqlen // page
    order = torch.randperm(pages, generator=gen) if order == "shuffled" else torch.arange(pages)
    return order.view(batch, seqlen // page)


def decode_flashattn2(run, base, qs, k_cache, v_cache, impl="flashattn2"):
    """flash_attn_with_kvcache on the contiguous cache and on its memory as shuffled pages
    (an AB_VARIANTS impl: with its switch off, also while a graph is captured, so the graph
    replays that path); with --bhsd also on a (b, h_k, s, d) copy passed as its transposed
    view (layout "bhsd": each KV head's keys contiguous, as SDPA and the read floor read
    them, where a (b, s, h_k, d) cache gives 256-byte rows at a 2 KiB stride)."""
    import torch
    b, s, h_k, d = k_cache.shape
    attend = flashattn2_call(impl)
    seqlens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    layouts = [("contiguous", None, k_cache, v_cache, None)]
    if run.args.bhsd:
        layouts.append(("bhsd", None, *(x.transpose(1, 2).contiguous().transpose(1, 2)
                                        for x in (k_cache, v_cache)), None))
    gen = torch.Generator().manual_seed(run.args.seed)
    for page in (p for p in run.args.page_sizes if s % p == 0):
        pages = b * s // page
        table = block_table(b, s, page, run.args.page_order, gen)
        layouts.append(("paged", page, k_cache.view(pages, page, h_k, d),
                        v_cache.view(pages, page, h_k, d), table.to("cuda", torch.int32)))
    rows = []
    for sq, splits, (layout, page, kc, vc, table) in itertools.product(
            run.args.sq, [0] + run.args.splits, layouts):
        rows.append(run.measure(
            dict(base, impl=impl, layout=layout, page_size=page, num_splits=splits,
                 seqlen_q=sq, gqa="native"),
            lambda: attend(qs[sq], kc, vc, cache_seqlens=seqlens, block_table=table,
                           num_splits=splits)))
    return rows


def run_decode(run, b, s):
    """Rows of every impl, layout and sq for one (batch, cache length); None if over budget."""
    import torch
    a = run.args
    (h, h_k), d = a.heads, a.headdim
    sdpa = [i for i in a.impls if i.startswith("sdpa")]
    kv = 2 * b * s * h_k * d * 2
    if kv * (2 if sdpa or a.bhsd else 1) > run.budget:
        return None
    kind = dict(device="cuda", dtype=torch_dtype(a.dtype))
    qs = {sq: torch.randn(b, sq, h, d, **kind) for sq in a.sq}
    k_cache, v_cache = (torch.randn(b, s, h_k, d, **kind) for _ in range(2))
    base = dict(bench="decode", batch=b, seqlen_k=s, nheads=h, nheads_k=h_k, headdim=d,
                causal=False)
    rows = []
    for impl in ("flashattn2",) + tuple(AB_VARIANTS):
        if impl in a.impls:
            rows += decode_flashattn2(run, base, qs, k_cache, v_cache, impl)
    if "read_floor" in a.impls:  # (no query: one row, seqlen_q 0)
        rows.append(run.measure(dict(base, impl="read_floor", layout="contiguous", seqlen_q=0,
                                     gqa="-"), read_floor_call(k_cache, v_cache)))
    if not sdpa:
        return rows
    qs = {sq: q.transpose(1, 2).contiguous() for sq, q in qs.items()}          # (b, h, sq, d)
    k_sdpa, v_sdpa = (x.transpose(1, 2).contiguous() for x in (k_cache, v_cache))
    del k_cache, v_cache
    refused = {}
    for sq, impl in itertools.product(a.sq, sdpa):
        fn = sdpa_call(impl, qs[sq], k_sdpa, v_sdpa, enable_gqa=True)
        try:
            fn()
        except REFUSALS as e:
            refused[(sq, impl)] = f"enable_gqa refused ({first_line(e)}); expanded: "
            continue
        rows.append(run.measure(dict(base, impl=impl, layout="contiguous", seqlen_q=sq,
                                     gqa="enable_gqa"), fn))
    fits = kv * (1 + h // h_k) <= run.budget
    if refused and fits:                    # query head i reads KV head i // (h // h_k)
        k_sdpa, v_sdpa = (x.repeat_interleave(h // h_k, dim=1) for x in (k_sdpa, v_sdpa))
    for (sq, impl), why in refused.items():
        fn = sdpa_call(impl, qs[sq], k_sdpa, v_sdpa, enable_gqa=False) if fits else over_budget
        rows.append(run.measure(dict(base, impl=impl, layout="contiguous", seqlen_q=sq,
                                     gqa="expanded"), fn, error_prefix=why))
    return rows


def host_round_us(fn, calls=200):
    """µs of CPU time per call of fn over `calls` calls, issued while the stream waits behind a
    GPU sleep (so nothing waits for the GPU: the time is the call's host work)."""
    import time
    import torch
    torch.cuda._sleep(100_000_000)  # ~50 ms of GPU spinning, longer than the calls
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return us


def run_host(run, rounds=5):
    """Host-time rows: flash_attn_with_kvcache vs SDPA's backends, b 1, cache 1k, sq 1; the
    median of `rounds` rounds, each timing every impl in turn (the host's speed drifts: a
    single block per impl put 36.8 and 59.3 us on the same code in two sessions)."""
    import torch
    (h, h_k), d, s = run.args.heads, run.args.headdim, 1024
    kind = dict(device="cuda", dtype=torch_dtype(run.args.dtype))
    q = torch.randn(1, 1, h, d, **kind)
    k_cache, v_cache = (torch.randn(1, s, h_k, d, **kind) for _ in range(2))
    seqlens = torch.full((1,), s, dtype=torch.int32, device="cuda")
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k_cache, v_cache))
    calls = [(impl, functools.partial(flashattn2_call(impl), q, k_cache, v_cache,
                                      cache_seqlens=seqlens))
             for impl in ("flashattn2",) + tuple(AB_VARIANTS) if impl in run.args.impls]
    calls += [(impl, sdpa_call(impl, qt, kt, vt, enable_gqa=True))
              for impl in run.args.impls if impl.startswith("sdpa")]
    rows, times = {}, {impl: [] for impl, _ in calls}
    for impl, _ in calls:
        rows[impl] = r = dict.fromkeys(COLUMNS)
        r.update(gpu=run.gpu, bench="host", impl=impl, layout="contiguous", batch=1,
                 seqlen_q=1, seqlen_k=s, nheads=h, nheads_k=h_k, headdim=d, causal=False,
                 timer="host")
    for _ in range(rounds):
        for impl, fn in calls:
            if rows[impl]["error"] is not None:
                continue
            try:
                if not times[impl]:
                    for _ in range(20):  # warm-up
                        fn()
                    torch.cuda.synchronize()
                times[impl].append(host_round_us(fn))
            except REFUSALS as e:
                rows[impl]["error"] = first_line(e)
    for impl, r in rows.items():
        if times[impl] and r["error"] is None:
            r["us"] = statistics.median(times[impl])
        print(line(r), flush=True)
    return list(rows.values())


def random_lengths(total, n, rng):
    """n lengths summing to total, each 0.25x..1.75x total/n before rounding."""
    weights = [rng.uniform(0.25, 1.75) for _ in range(n)]
    lengths = [max(1, int(total * w / sum(weights))) for w in weights]
    lengths[-1] += total - sum(lengths)
    return lengths


def run_prefill(run, n_seq, h, h_k, meta):
    import torch
    a = run.args
    d, s = a.headdim, a.varlen_tokens // n_seq
    total = s * n_seq
    kind = dict(device="cuda", dtype=torch_dtype(a.dtype))
    q = torch.randn(n_seq, s, h, d, **kind)
    k, v = (torch.randn(n_seq, s, h_k, d, **kind) for _ in range(2))
    dense, varlen = flashattn2_api("flash_attn_func"), flashattn2_api("flash_attn_varlen_func")
    base = dict(bench="prefill", impl="flashattn2", batch=n_seq, tokens=total, nheads=h,
                nheads_k=h_k, headdim=d, causal=True)
    flops = lambda lengths: sum(4 * n * n * h * d / 2 for n in lengths)
    rows = [run.measure(dict(base, layout="dense", seqlen_q=s, seqlen_k=s),
                        lambda: dense(q, k, v, causal=True), flops=flops([s] * n_seq))]
    mixed = random_lengths(total, n_seq, random.Random(a.seed * 1000 + n_seq))
    meta["varlen_lengths"][f"n{n_seq}"] = mixed
    qf, kf, vf = (x.view(total, x.shape[2], d) for x in (q, k, v))      # the dense tokens
    for layout, lengths in (("varlen-equal", [s] * n_seq), ("varlen-random", mixed)):
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                          device="cuda")
        m = max(lengths)
        rows.append(run.measure(dict(base, layout=layout, seqlen_q=m, seqlen_k=m),
                                lambda: varlen(qf, kf, vf, cu, cu, m, m, causal=True),
                                flops=flops(lengths)))
    return rows


def build_meta(args, run):
    import torch
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable] + sys.argv), "gpu": run.gpu,
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "dtype": args.dtype,
            "timer": "median CUDA-event time per call after a 4x-L2 read, "
                     + ("CUDA-graph replay" if args.graphs else "eager"),
            "warmup_ms": args.warmup, "rep_ms": args.rep, "copy_gib": args.copy_gib,
            "copy_gbps": run.copy_gbps, "l2_bytes": run.l2_bytes, "mem_budget_gib":
            run.budget / GiB, "sq4": "non-causal for every impl", "skipped": [],
            "varlen_lengths": {}, "flashattn2": None, "flashattn2_build": None}
    try:
        import flashattn2
        meta["flashattn2"] = getattr(flashattn2, "__version__", "unknown")
        meta["flashattn2_build"] = flashattn2.build_info()
    except Exception as e:  # the benchmark still runs the SDPA baselines
        meta["flashattn2_build"] = f"unavailable: {first_line(e)}"
    return meta


def run_all(args):
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py: no CUDA device; this benchmark needs an NVIDIA GPU")
    torch.manual_seed(args.seed)
    run = Runner(args)
    meta = build_meta(args, run)
    out = args.out or os.path.join("benchmarks", "out", re.sub(r"[^A-Za-z0-9.]+", "-", run.gpu)
                                   + "-decode-" + datetime.datetime.now().strftime("%Y%m%d-%H%M"))
    print(f"{run.gpu} | {args.dtype} | torch {meta['torch']} cuda {meta['cuda']} | flashattn2 "
          f"{meta['flashattn2']} | copy {run.copy_gbps:.0f} GB/s | L2 flush "
          f"{run.flush_ms * 1e3:.0f} us | budget {run.budget / GiB:.1f} GiB")
    rows = []
    if "decode" in args.parts:
        print(DECODE_HEADER)
        for b, s in itertools.product(args.batches, args.cache_lens):
            got = run_decode(run, b, s)
            if got is None:
                meta["skipped"].append(f"b{b} {klen(s)}")
                print(f"skip b{b} cache {klen(s)}: over the {run.budget / GiB:.1f} GiB budget")
            rows += got or []
            torch.cuda.empty_cache()
    if "host" in args.parts:
        print()
        rows += run_host(run)
    if "varlen" in args.parts:
        print("\n" + PREFILL_HEADER)
        for (h, h_k), n_seq in itertools.product(args.varlen_heads, args.varlen_seqs):
            rows += run_prefill(run, n_seq, h, h_k, meta)
            torch.cuda.empty_cache()
    write_results(rows, meta, out)
    if args.summary:
        print_summary(rows, meta)


def main(argv=None):
    run_all(parse_args(argv))


if __name__ == "__main__":
    main()
