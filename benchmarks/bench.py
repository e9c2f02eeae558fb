#!/usr/bin/env python3
"""Benchmark flashattn2 against PyTorch SDPA's backends: the project's one benchmark command.

Standard sweep (the defaults): hidden 2048 (nheads = 2048 // d), head dims 64/128/256,
seqlen 512..16384 at 16k tokens per batch (batch = 16384 // seqlen), causal and not,
bf16 and fp16, forward. Every impl runs in the same process on the same BSHD tensors
(SDPA gets `.transpose(1, 2)` views). Time = median of CUDA-event timings
(triton.testing.do_bench when triton imports). FLOPs as flash-attn counts them:
fwd 4*b*sq*sk*h*d, halved for causal; bwd 2.5x fwd; fwd_bwd 3.5x fwd.

    python benchmarks/bench.py                                  # standard sweep
    python benchmarks/bench.py --quick                          # smoke run
    python benchmarks/bench.py --headdims 128 --seqlens 4096 --causal false --dtypes bf16
    python benchmarks/bench.py --modes fwd,bwd,fwd_bwd --impls flashattn2,sdpa_flash
    python benchmarks/bench.py --plot-only benchmarks/out/X/results.json   # no GPU needed

Attention variants (flashattn2 only; each adds rows next to the plain ones, column
`variant`; FLOPs count only the visible (query, key) pairs, so a local window's TFLOP/s is
comparable with full attention's and its time should scale with the window):

    python benchmarks/bench.py --headdims 128 --seqlens 16384 --dtypes bf16 --causal true \
        --modes fwd,bwd --impls flashattn2 --window 256,1024,4096    # sliding window (w, 0)
    python benchmarks/bench.py --headdims 64,128 --seqlens 2048,8192 --dtypes bf16 \
        --impls flashattn2 --softcap 30 --alibi                     # modifier cost vs plain

The grid people use to judge an FA2 implementation (issue 21), one flag: batch 1, causal,
seqlen 128..65536, head dims 16/32/64/128, bf16 and fp32, forward / backward / forward +
backward latency, against plain PyTorch attention (eager, where it fits in memory) and
SDPA's backends (a backend that declines a dtype or size leaves its cell empty; flashattn2's
fp32 cells need a build with FLASHATTN2_EXPERIMENTAL=bias;fp32):

    python benchmarks/bench.py --grid

An additive bias (flashattn2's attn_bias, builds with FLASHATTN2_EXPERIMENTAL=bias):
`--bias` adds rows with a full (b, h, sq, sk) bias in q's dtype, for flashattn2 and for the
SDPA backends that take an attn_mask (the causal mask folded into their bias), and a
`bias_read_ms` column: the time to read the bias once (a float32 sum over it). The issue's
targets: flashattn2 with the bias <= its plain forward + 1.2 x bias_read_ms, and >= 1.5x
sdpa_efficient with the same bias.

    python benchmarks/bench.py --headdims 64,128 --seqlens 1024,4096 --dtypes bf16 \
        --modes fwd,bwd --impls flashattn2,sdpa_efficient,sdpa_cudnn --bias

`--bias-grad` adds rows (variant `bias_grad`, bwd / fwd_bwd) whose bias requires grad, so the
backward also computes dbias; a backend whose attn_mask takes no gradient (cuDNN) leaves its
cell empty with a note. The summary gives flashattn2 / sdpa_efficient (target >= 1.5x).

    python benchmarks/bench.py --headdims 64,128 --seqlens 1024,4096,8192 --dtypes bf16 \
        --modes bwd --impls flashattn2,sdpa_efficient,sdpa_cudnn --bias --bias-grad

float32 rows (`--dtypes fp32`) run under PyTorch's TF32 setting for float32 matmuls as the
process has it, unless `--fp32-precision ieee|tf32` sets torch.backends.cuda.matmul.fp32_precision
(allow_tf32 on torch < 2.9) for the whole run, before anything is timed: flashattn2's float32
kernels follow it (tf32: one TF32 product per multiply on the Hopper float32 kernels; ieee:
3xTF32), and so do torch_eager and SDPA's math backend (cuBLAS); the meta records the
effective setting (fp32_tf32).

    python benchmarks/bench.py --headdims 64,128 --seqlens 1024,4096 --dtypes fp32 \
        --modes fwd,bwd --impls flashattn2,sdpa_math,sdpa_efficient --fp32-precision tf32

Writes results.json ({"meta": ..., "rows": [...]}), results.csv, results.png (bf16 forward
TFLOP/s) and latency.png (ms of every dtype and mode: the grid's view) to --out.
"""
import argparse
import csv
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys

COLUMNS = ["gpu", "impl", "mode", "dtype", "batch", "nheads", "nheads_k", "headdim",
           "seqlen_q", "seqlen_k", "causal", "ms", "tflops", "gbps", "deterministic", "variant",
           "bias_read_ms", "finished"]
# flashattn2_det: flashattn2 with deterministic=True (rows: impl flashattn2, deterministic).
# flashattn2_sm80: flashattn2 on its mma.sync kernels (force_sm80), beside the Hopper ones.
# sdpa_efficient: SDPA's memory-efficient backend; torch_eager: softmax(q k^T) v in plain
# PyTorch ops (eager_attention), as a model without fused attention runs it.
IMPLS = ("flashattn2", "sdpa_flash", "sdpa_cudnn", "sdpa_math", "flashattn2_det",
         "flashattn2_sm80", "sdpa_efficient", "torch_eager")
SHORT = {"flashattn2": "fa2", "sdpa_flash": "flash", "sdpa_cudnn": "cudnn", "sdpa_math": "math",
         "flashattn2_det": "fa2det", "flashattn2_sm80": "fa2sm80", "sdpa_efficient": "effic",
         "torch_eager": "eager"}
# The impls that take a bias (--bias): flashattn2's attn_bias, SDPA's attn_mask.
BIAS_IMPLS = ("flashattn2", "sdpa_cudnn", "sdpa_math", "sdpa_efficient", "torch_eager")
REFS = ("sdpa_flash", "sdpa_cudnn")        # flashattn2 is reported as a ratio to these
MODES = ("fwd", "bwd", "fwd_bwd")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
DTYPES = ("bf16", "fp16", "fp32")
TARGET = {64: 1.0, 128: 1.0, 256: 0.9}     # flashattn2 / sdpa_flash on every bf16 fwd config
QUICK = dict(headdims=[64, 128], seqlens=[1024, 4096], causal="both", dtypes=["bf16"],
             warmup=10, rep=30)
GRID = dict(headdims=[16, 32, 64, 128], seqlens=[128 << i for i in range(10)], causal="true",
            dtypes=["bf16", "fp32"], modes=["fwd", "bwd", "fwd_bwd"], tokens=0,
            impls=["flashattn2", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "torch_eager"])


def csv_list(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--headdims", type=csv_list(int), help="default 64,128,256")
    p.add_argument("--seqlens", type=csv_list(int), help="default 512,1024,...,16384")
    p.add_argument("--causal", choices=["both", "true", "false"], help="default both")
    p.add_argument("--dtypes", type=csv_list(str), help="bf16,fp16[,fp32] (default bf16,fp16)")
    p.add_argument("--modes", type=csv_list(str), help="fwd,bwd,fwd_bwd (default fwd)")
    p.add_argument("--impls", type=csv_list(str),
                   help="default flashattn2,sdpa_flash,sdpa_cudnn; also sdpa_math, "
                        "sdpa_efficient, torch_eager, flashattn2_det, flashattn2_sm80")
    p.add_argument("--hidden", type=int, default=2048, help="nheads = hidden // headdim")
    p.add_argument("--tokens", type=int, help="batch = max(1, tokens // seqlen) (default 16384)")
    p.add_argument("--grid", action="store_true",
                   help="issue 21's grid: batch 1, causal, seqlen 128..65536, d16-128, bf16 "
                        "and fp32, fwd/bwd/fwd_bwd, against torch_eager and SDPA (options "
                        "given explicitly still win)")
    p.add_argument("--bias", action="store_true",
                   help="rows with a full (b, h, sq, sk) additive bias, for the impls that "
                        "take one, and the bias read time")
    p.add_argument("--bias-grad", action="store_true",
                   help="rows (bwd / fwd_bwd) with a full bias that requires grad: the "
                        "backward also computes dbias")
    p.add_argument("--warmup", type=float, help="warm-up per measurement, ms (default 25)")
    p.add_argument("--rep", type=float, help="measuring time per measurement, ms (default 100)")
    p.add_argument("--timer", choices=["do_bench", "events"], default="do_bench",
                   help="do_bench: triton's (the L2 flushed before each call; the default); "
                        "events: back-to-back calls, CUDA events around each, no flush")
    p.add_argument("--quick", action="store_true", help="a few configs, short timings")
    p.add_argument("--out", help="output dir (default benchmarks/out/<gpu>-<date>)")
    p.add_argument("--summary", action=argparse.BooleanOptionalAction, default=True,
                   help="print min / geomean ratios per head dim at the end (default on)")
    p.add_argument("--window", type=csv_list(int), default=[],
                   help="flashattn2 variants with window_size (W, 0) if causal else (W, W), "
                        "one per W, e.g. 256,1024,4096")
    p.add_argument("--softcap", type=csv_list(float), default=[],
                   help="flashattn2 variants with softcap=X, one per X, e.g. 30")
    p.add_argument("--alibi", action="store_true",
                   help="a flashattn2 variant with ALiBi (standard slopes 2^(-8 i / h))")
    p.add_argument("--fp32-precision", choices=["ieee", "tf32"],
                   help="set torch.backends.cuda.matmul.fp32_precision (allow_tf32 on torch "
                        "< 2.9) for the whole run, before anything is timed, so that float32 "
                        "rows of flashattn2 and of SDPA / eager run under the same setting "
                        "(default: leave PyTorch's setting as it is)")
    p.add_argument("--plot-only", metavar="RESULTS_JSON",
                   help="re-render table, summary and plot from a saved results.json")
    a = p.parse_args(argv)
    base = QUICK if a.quick else dict(headdims=[64, 128, 256], causal="both",
                                      seqlens=[512 << i for i in range(6)],
                                      dtypes=["bf16", "fp16"], warmup=25, rep=100)
    base = dict(base, modes=["fwd"], impls=list(IMPLS[:3]), tokens=16384)
    if a.grid:
        base = dict(base, warmup=25, rep=100, **GRID)
    for key, value in base.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    for name, values, allowed in (("dtypes", a.dtypes, DTYPES), ("modes", a.modes, MODES),
                                  ("impls", a.impls, IMPLS)):
        bad = sorted(set(values) - set(allowed))
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {','.join(allowed)}")
    return a


# ----------------------------------------------------------------------------- output

def note(msg):
    """One line on stdout that does not break the progress bar."""
    try:
        from tqdm import tqdm
        tqdm.write(msg)
    except ImportError:
        print(msg, flush=True)


def config_key(r):
    return (r["dtype"], r["headdim"], r["causal"], r["seqlen_q"],
            (MODES + ("decode",)).index(r["mode"]), r["deterministic"],
            r.get("variant", "plain"))


def variants(args):
    """["plain", then one name per --window / --softcap value and --alibi]."""
    return (["plain"] + [f"window={w}" for w in args.window]
            + [f"softcap={x:g}" for x in args.softcap] + (["alibi"] if args.alibi else [])
            + (["bias"] if args.bias else []) + (["bias_grad"] if args.bias_grad else []))


def variant_kwargs(variant, nheads, causal, device):
    """flash_attn_func keyword arguments of a variant name (the bias: make_call)."""
    if variant in ("plain", "bias", "bias_grad"):
        return {}
    name, _, value = variant.partition("=")
    if name == "window":
        return {"window_size": (int(value), 0 if causal else int(value))}
    if name == "softcap":
        return {"softcap": float(value)}
    import torch
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / nheads) for i in range(nheads)],
                          device=device)
    return {"alibi_slopes": slopes}


def visible_pairs(sq, sk, causal, variant):
    """(query, key) pairs the mask lets through (bottom-right aligned, as the kernels)."""
    left, right = -1, (0 if causal else -1)
    if variant.startswith("window="):
        w = int(variant.partition("=")[2])
        left, right = w, (0 if causal else w)
    if left < 0 and right < 0:
        return sq * sk
    total = 0
    for i in range(sq):
        diag = i + sk - sq
        lo = 0 if left < 0 else max(0, diag - left)
        hi = sk - 1 if right < 0 else min(sk - 1, diag + right)
        total += max(0, hi - lo + 1)
    return total


def table_header(impls):
    cols = [f"{SHORT[i]:>7}" for i in impls]
    cols += [f"fa2/{SHORT[r]:<5}" for r in REFS if "flashattn2" in impls and r in impls]
    return f"{'d':>4} {'seqlen':>6} {'causal':>6} {'dtype':>5} {'mode':>8} | " + \
        " ".join(cols) + "   (TFLOP/s)"


def table_line(rows, impls):
    """One table line for the rows of one config (same key, different impls)."""
    r0 = rows[0]
    tf = {r["impl"] + ("_det" if r["deterministic"] else ""): r["tflops"] for r in rows}
    cols = [f"{tf[i]:7.1f}" if tf.get(i) else f"{'-':>7}" for i in impls]
    for ref in REFS:
        if "flashattn2" in impls and ref in impls:
            ok = tf.get("flashattn2") and tf.get(ref)
            cols.append(f"{tf['flashattn2'] / tf[ref]:8.2f}x" if ok else f"{'-':>9}")
    mode = r0["mode"] + ("(det)" if r0["deterministic"] else "")
    if r0.get("variant", "plain") != "plain":
        mode += " " + r0["variant"]
    return (f"{r0['headdim']:>4} {r0['seqlen_q']:>6} {str(r0['causal']):>6} "
            f"{r0['dtype']:>5} {mode:>8} | " + " ".join(cols))


def grouped(rows):
    groups = {}
    for r in sorted(rows, key=config_key):
        groups.setdefault(config_key(r), []).append(r)
    return list(groups.values())


def print_table(rows):
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    print(table_header(impls))
    for group in grouped(rows):
        print(table_line(group, impls))


def print_summary(rows):
    print("\nSummary: flashattn2 / reference, bf16 fwd; min and geometric mean over configs "
          "(target: >=1.0x sdpa_flash for d64/d128, >=0.9x for d256)")
    fwd = [r for r in rows if r["dtype"] == "bf16" and r["mode"] == "fwd"
           and not r["deterministic"] and r["tflops"] and r.get("variant", "plain") == "plain"]
    for d in sorted({r["headdim"] for r in fwd}):
        configs = [{r["impl"]: r["tflops"] for r in grp}
                   for grp in grouped(fwd) if grp[0]["headdim"] == d]
        parts = []
        for ref in REFS + ("flashattn2_sm80",):
            if ref == "flashattn2_sm80" and not any(ref in c for c in configs):
                continue
            ratios = [c["flashattn2"] / c[ref] for c in configs if "flashattn2" in c and ref in c]
            missing = sum(1 for c in configs if ref in c and "flashattn2" not in c)
            gaps = f", {missing} without flashattn2" if missing else ""
            if not ratios:
                parts.append(f"vs {ref}: n/a" + (f" ({missing} cfgs without flashattn2)"
                                                 if missing else ""))
                continue
            lo = min(ratios)
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            met = ""
            if ref == "sdpa_flash" and d in TARGET:
                met = " MET" if lo >= TARGET[d] else f" MISSED (<{TARGET[d]}x)"
            if met and missing:
                met = " MISSED (configs without flashattn2)"
            parts.append(f"vs {ref}: min {lo:.2f}x geomean {gm:.2f}x "
                         f"({len(ratios)} cfgs{gaps}){met}")
        print(f"  d{d:<4} " + " | ".join(parts))
    print_bias_summary(rows)


BIAS_TARGET = 1.5  # issue 21: flashattn2 >= 1.5x sdpa_efficient with the same bias


def print_bias_summary(rows):
    """flashattn2 / sdpa_efficient per (bias variant, mode, head dim) against BIAS_TARGET."""
    sel = [r for r in rows if r.get("variant") in ("bias", "bias_grad") and r["tflops"]
           and not r["deterministic"]]
    keys = sorted({(r["variant"], r["mode"], r["headdim"]) for r in sel},
                  key=lambda k: (k[0], MODES.index(k[1]), k[2]))
    if keys:
        print(f"\nBias: flashattn2 / sdpa_efficient (target >= {BIAS_TARGET}x), min and geomean")
    for variant, mode, d in keys:
        configs = [{r["impl"]: r["tflops"] for r in grp} for grp in grouped(sel)
                   if (grp[0]["variant"], grp[0]["mode"], grp[0]["headdim"]) == (variant, mode, d)]
        ratios = [c["flashattn2"] / c["sdpa_efficient"] for c in configs
                  if "flashattn2" in c and "sdpa_efficient" in c]
        if not ratios:
            print(f"  {variant:<9} {mode:<7} d{d:<4} n/a")
            continue
        lo, gm = min(ratios), math.exp(sum(map(math.log, ratios)) / len(ratios))
        met = "MET" if lo >= BIAS_TARGET else "MISSED"
        print(f"  {variant:<9} {mode:<7} d{d:<4} min {lo:.2f}x geomean {gm:.2f}x "
              f"({len(ratios)} cfgs) {met}")


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None where matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _seqlen_axis(ax, seqs, fontsize=None):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [f"{x // 1024}k" if x >= 1024 else str(x) for x in seqs],
                  fontsize=fontsize)
    ax.minorticks_off()
    ax.grid(alpha=0.3)


def _save(plt, fig, title, path, dpi):
    """Title, layout, write (to the working folder where `path`'s is read-only, e.g. fetched
    results), close; the path written."""
    fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=dpi)
    except OSError:
        path = os.path.basename(path)
        fig.savefig(path, dpi=dpi)
    plt.close(fig)
    print(f"wrote {path}")
    return path


def plot_latency(rows, path):
    """Latency (ms, log-log against seqlen) of every impl, one panel per head dim (rows) and
    (dtype, mode, causal) (columns): issue 21's grid view (bf16 and fp32, fwd / bwd / fwd_bwd)
    next to plain PyTorch, which a TFLOP/s plot of the bf16 forward alone cannot show."""
    plt = _pyplot()
    sel = [r for r in rows if r.get("ms") and not r["deterministic"]
           and r.get("variant", "plain") == "plain" and r["mode"] in MODES]
    if plt is None or not sel:
        return None
    dims = sorted({r["headdim"] for r in sel})
    cols = sorted({(r["dtype"], MODES.index(r["mode"]), r["causal"]) for r in sel})
    fig, axes = plt.subplots(len(dims), len(cols), squeeze=False,
                             figsize=(4.2 * len(cols), 3.2 * len(dims)))
    seqs = sorted({r["seqlen_q"] for r in sel})
    for (i, d), (j, (dtype, m, c)) in ((x, y) for x in enumerate(dims) for y in enumerate(cols)):
        ax = axes[i][j]
        for impl in IMPLS:
            pts = sorted((r["seqlen_q"], r["ms"]) for r in sel if r["impl"] == impl
                         and r["headdim"] == d and r["dtype"] == dtype
                         and r["mode"] == MODES[m] and r["causal"] == c)
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=3, label=impl)
        _seqlen_axis(ax, seqs, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"d={d} {dtype} {MODES[m]}" + (" causal" if c else ""), fontsize=9)
        ax.set_ylabel("ms")
        ax.legend(fontsize=6)
    return _save(plt, fig, sel[0]["gpu"], path, dpi=100)


def plot(rows, path):
    plt = _pyplot()
    if plt is None:
        print("note: matplotlib not importable, skipping the plot")
        return
    sel = [r for r in rows if r["dtype"] == "bf16" and r["mode"] == "fwd"
           and not r["deterministic"] and r["tflops"] and r.get("variant", "plain") == "plain"]
    if not sel:
        print("note: no bf16 fwd rows, skipping the plot")
        return
    dims = sorted({r["headdim"] for r in sel})
    flags = sorted({r["causal"] for r in sel})
    fig, axes = plt.subplots(len(dims), len(flags), squeeze=False,
                             figsize=(5.5 * len(flags), 3.6 * len(dims)))
    seqs = sorted({r["seqlen_q"] for r in sel})
    for (i, d), (j, c) in ((x, y) for x in enumerate(dims) for y in enumerate(flags)):
        ax = axes[i][j]
        for impl in IMPLS:
            pts = sorted((r["seqlen_q"], r["tflops"]) for r in sel
                         if r["impl"] == impl and r["headdim"] == d and r["causal"] == c)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        _seqlen_axis(ax, seqs)
        ax.tick_params(labelbottom=True)
        ax.set_title(f"d={d}, causal={c}, bf16 fwd")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    _save(plt, fig, sel[0]["gpu"], path, dpi=120)


def write_results(rows, meta, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"\nwrote {out}/results.json, results.csv ({len(rows)} rows)")
    plot(rows, os.path.join(out, "results.png"))
    plot_latency(rows, os.path.join(out, "latency.png"))


def best_rows(rows):
    """One row per (config, impl): the fastest, for files that hold several rounds (merged
    interleaved runs), whose table, summary and plot would otherwise show whichever round
    sorted last."""
    best = {}
    for r in rows:
        key = (config_key(r), r["impl"])
        if key not in best or (r["tflops"] or 0) > (best[key]["tflops"] or 0):
            best[key] = r
    return list(best.values())


def plot_only(args):
    with open(args.plot_only) as f:
        data = json.load(f)
    rows, meta = best_rows(data["rows"]), data.get("meta", {})
    print(f"{meta.get('gpu', '?')}  torch {meta.get('torch', '?')}  "
          f"flashattn2 {meta.get('flashattn2', '?')}  {meta.get('date', '')}"
          + (f"  fp32_tf32 {meta['fp32_tf32']}" if "fp32_tf32" in meta else ""))
    print_table(rows)
    if args.summary:
        print_summary(rows)
    out = args.out or os.path.dirname(os.path.abspath(args.plot_only))
    os.makedirs(out, exist_ok=True)
    plot(rows, os.path.join(out, "results.png"))
    plot_latency(rows, os.path.join(out, "latency.png"))


# ----------------------------------------------------------------------------- timing

def event_bench(fn, warmup_ms, rep_ms):
    """Median of per-call CUDA-event times; calls counts derived from a first estimate."""
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    n = max(5, int(rep_ms / estimate))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for s, e in events:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def make_timer(warmup, rep, kind="do_bench"):
    if kind == "events":
        return lambda fn: event_bench(fn, warmup, rep), "cuda-event loop median (no L2 flush)"
    try:
        from triton.testing import do_bench
        return (lambda fn: do_bench(fn, warmup=warmup, rep=rep, return_mode="median"),
                "triton.testing.do_bench median")
    except Exception:               # no triton, or a triton that cannot load its driver
        return lambda fn: event_bench(fn, warmup, rep), "cuda-event loop median"


# ----------------------------------------------------------------------------- sweep

def attn_flops(b, sq, sk, h, d, causal, mode, variant="plain"):
    if variant.startswith("window="):
        return 4 * b * visible_pairs(sq, sk, causal, variant) * h * d * FLOP_FACTOR[mode]
    return 4 * b * sq * sk * h * d / (2 if causal else 1) * FLOP_FACTOR[mode]


_CAUSAL_MASKS = {}


def causal_hidden(sq, sk, device):
    """Bool (sq, sk), True where a bottom-right aligned causal mask hides the key (cached, as
    a model keeps its mask in a buffer)."""
    key = (sq, sk, str(device))
    if key not in _CAUSAL_MASKS:
        import torch
        _CAUSAL_MASKS[key] = torch.ones(sq, sk, dtype=torch.bool, device=device).triu(sk - sq + 1)
    return _CAUSAL_MASKS[key]


def eager_attention(q, k, v, causal, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v in plain PyTorch ops (float32 softmax), BSHD in and
    out; the causal mask bottom-right aligned as flashattn2's."""
    import torch
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if kt.shape[1] != qt.shape[1]:
        group = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    scores = torch.matmul(qt, kt.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    if causal:
        scores = scores.masked_fill(causal_hidden(q.shape[1], k.shape[1], q.device), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, vt).transpose(1, 2)


def make_call(impl, q, k, v, causal, variant="plain", bias=None):
    """(context, fn): fn() computes attention on the BSHD tensors inside context. Variants
    "bias" and "bias_grad": ``bias`` is (flashattn2's, the others') (b, h, sq, sk) bias; the
    others' has the causal mask folded in (SDPA takes attn_mask or is_causal, not both)."""
    import contextlib
    import torch.nn.functional as F
    if impl in ("flashattn2", "flashattn2_det", "flashattn2_sm80"):
        import flashattn2
        det = impl == "flashattn2_det"
        kwargs = variant_kwargs(variant, q.shape[2], causal, q.device)
        if variant in ("bias", "bias_grad"):
            kwargs["attn_bias"] = bias[0]
        ctx = flashattn2.force_sm80() if impl == "flashattn2_sm80" else contextlib.nullcontext()
        return ctx, lambda: flashattn2.flash_attn_func(
            q, k, v, causal=causal, deterministic=det, **kwargs)
    mask = bias[1] if variant in ("bias", "bias_grad") else None
    if impl == "torch_eager":
        return contextlib.nullcontext(), lambda: eager_attention(q, k, v, causal and mask is None,
                                                                 mask)  # fmt: skip
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                                   "sdpa_math": "MATH", "sdpa_efficient": "EFFICIENT_ATTENTION"}[impl])
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))     # BHSD views, no copies
    extra = {"enable_gqa": True} if q.shape[2] != k.shape[2] else {}
    if mask is not None:
        extra["attn_mask"] = mask
    return sdpa_kernel(backend), lambda: F.scaled_dot_product_attention(
        qt, kt, vt, is_causal=causal and mask is None, **extra).transpose(1, 2)  # BSHD, like dout


class BackwardMissing(Exception):
    """The impl has no backward pass (NotImplementedError from autograd)."""


def grad_inputs(impl, q, k, v, variant, bias):
    """q, k, v, and with "bias_grad" the impl's bias (a leaf): what the backward differentiates."""
    if variant != "bias_grad":
        return (q, k, v)
    return (q, k, v, bias[0] if impl.startswith("flashattn2") else bias[1])


def measure(impl, mode, q, k, v, dout, causal, timer, variant="plain", bias=None):
    """Median ms of one impl/mode. A first untimed call surfaces refusals: whatever the
    forward raises, or BackwardMissing (or RuntimeError: a bias_grad bias the output ignores)."""
    import torch
    ctx, fwd = make_call(impl, q, k, v, causal, variant, bias)
    inputs = grad_inputs(impl, q, k, v, variant, bias)
    with ctx, torch.set_grad_enabled(mode != "fwd"):
        out = fwd()
        if mode != "fwd":
            try:
                torch.autograd.grad(out, inputs, dout, retain_graph=True)
            except NotImplementedError as e:
                raise BackwardMissing(e) from e
        if mode == "fwd":
            step = fwd
        elif mode == "bwd":
            def step():
                torch.autograd.grad(out, inputs, dout, retain_graph=True)
        else:
            def step():
                torch.autograd.grad(fwd(), inputs, dout)
        torch.cuda.synchronize()
        return timer(step)


def set_fp32_precision(precision):
    """PyTorch's float32 matmul precision for the rest of the process: "tf32" or "ieee" in
    torch.backends.cuda.matmul.fp32_precision (torch >= 2.9; allow_tf32 before), or None:
    left as it is. flashattn2's float32 kernels read the same setting at each call
    (flashattn2._ext.fp32_tf32)."""
    if precision is None:
        return
    import torch
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = precision
    else:
        matmul.allow_tf32 = precision == "tf32"


def fp32_tf32():
    """Whether float32 matmuls may run in TF32 now, read back as flashattn2 reads it
    (flashattn2._ext.fp32_tf32); None where flashattn2 does not import."""
    try:
        from flashattn2._ext import fp32_tf32 as read
    except ImportError:
        return None
    return read()


def build_meta(args, gpu, timer_name):
    import torch
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable] + sys.argv), "gpu": gpu,
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "timer": timer_name, "warmup_ms": args.warmup, "rep_ms": args.rep,
            "fp32_precision": getattr(args, "fp32_precision", None), "fp32_tf32": fp32_tf32(),
            "flashattn2": None, "flashattn2_build": None}
    try:
        import flashattn2
        meta["flashattn2"] = getattr(flashattn2, "__version__", "unknown")
        meta["flashattn2_build"] = flashattn2.build_info()
    except Exception as e:  # the benchmark still runs the SDPA backends
        meta["flashattn2_build"] = f"unavailable: {type(e).__name__}: {e}"
    return meta


def run_sweep(args):
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench.py: no CUDA device (use --plot-only to render saved results)")
    gpu = torch.cuda.get_device_name()
    set_fp32_precision(args.fp32_precision)  # (before any timing, for every impl)
    timer, timer_name = make_timer(args.warmup, args.rep, args.timer)
    meta = build_meta(args, gpu, timer_name)
    impls = list(args.impls)
    if meta["flashattn2"] is None and {"flashattn2", "flashattn2_det"} & set(impls):
        note(f"note: flashattn2 not importable ({meta['flashattn2_build']}); SDPA only")
        impls = [i for i in impls if i not in ("flashattn2", "flashattn2_det")]
    out = args.out or os.path.join("benchmarks", "out", re.sub(r"[^A-Za-z0-9.]+", "-", gpu)
                                   + "-" + datetime.datetime.now().strftime("%Y%m%d-%H%M"))
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    configs = [(dt, d, c, s) for dt in args.dtypes for d in args.headdims
               for c in causals for s in args.seqlens]
    # (impl, variant) pairs: the variants run on flashattn2 only, the bias on BIAS_IMPLS.
    runs = [(i, "plain") for i in impls] + [
        (i, var) for var in variants(args)[1:] for i in impls
        if (i in ("flashattn2", "flashattn2_sm80") and var != "bias_grad")
        or (var.startswith("bias") and i in BIAS_IMPLS)]
    total = len(configs) * len(args.modes) * len(runs)
    try:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="run", dynamic_ncols=True)
    except ImportError:
        bar = None
    print(f"{gpu} | torch {meta['torch']} cuda {meta['cuda']} | flashattn2 "
          f"{meta['flashattn2']} | {timer_name}, warmup {args.warmup} ms rep {args.rep} ms"
          + (f" | float32 matmuls {'TF32' if meta['fp32_tf32'] else 'full precision'}"
             if "fp32" in args.dtypes else ""))
    print(table_header(impls))
    rows, skipped, done = [], set(), 0
    torch.manual_seed(0)
    for dt, d, causal, s in configs:
        b, h = max(1, args.tokens // s), args.hidden // d
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)
        bias, bias_read_ms = None, None
        if args.bias or args.bias_grad:  # (flashattn2's, the others': the causal mask folded in)
            try:
                full = torch.randn(b, h, s, s, device="cuda", dtype=dtype)
                others = full.masked_fill(causal_hidden(s, s, full.device), float("-inf")) \
                    if causal else full
                bias = (full, others)
                bias_read_ms = timer(lambda: full.sum(dtype=torch.float32))
            except RuntimeError as e:  # out of memory
                note(f"note: no bias for d{d} s{s}: {str(e).splitlines()[0][:100]}")
        for mode in args.modes:
            cfg_rows = []
            for impl, variant in runs:
                done += 1
                if bar is not None:
                    bar.set_description(f"d{d} s{s} {'causal' if causal else 'full'} {dt} "
                                        f"{mode} {impl} {variant}")
                    bar.update(1)
                elif sys.stderr.isatty() or done % max(1, total // 20) == 0 or done == total:
                    end = "" if sys.stderr.isatty() else "\n"
                    print(f"\r[{done}/{total}]", end=end, file=sys.stderr, flush=True)
                if (impl, mode, d) in skipped or (variant.startswith("bias") and bias is None):
                    continue
                if variant == "bias_grad" and mode == "fwd":  # (the "bias" row's forward)
                    continue
                # (bias_grad: leaves sharing the memory; "bias" rows keep no grad, or dbias runs)
                vbias = bias if variant != "bias_grad" else tuple(
                    x.detach().requires_grad_() for x in bias)
                try:
                    ms = measure(impl, mode, q, k, v, dout, causal, timer, variant, vbias)
                except BackwardMissing as e:   # per head dim (flashattn2: d > 128 on sm_86/89)
                    skipped.add((impl, mode, d))
                    note(f"note: {impl} {mode}: no backward for d{d} ({e}); skipping it for d{d}")
                    continue
                except (RuntimeError, ValueError, NotImplementedError) as e:  # declined, OOM
                    first = (str(e).strip().splitlines() or [""])[0][:120]
                    note(f"note: {impl} unavailable for d{d} s{s} causal={causal} {dt} "
                         f"{mode}: {first}")
                    continue
                cfg_rows.append(dict(
                    gpu=gpu, impl="flashattn2" if impl == "flashattn2_det" else impl,
                    mode=mode, dtype=dt, batch=b, nheads=h, nheads_k=h,
                    headdim=d, seqlen_q=s, seqlen_k=s, causal=causal, ms=ms,
                    tflops=attn_flops(b, s, s, h, d, causal, mode, variant) / (ms * 1e-3) / 1e12,
                    gbps=None, deterministic=impl == "flashattn2_det", variant=variant,
                    bias_read_ms=bias_read_ms if variant.startswith("bias") else None,
                    finished=datetime.datetime.now().isoformat(timespec="milliseconds")))
            for var in variants(args):
                var_rows = [r for r in cfg_rows if r["variant"] == var]
                if var_rows:
                    note(table_line(var_rows, impls) + (
                        f"   {var_rows[0]['ms']:.3f} ms" if var != "plain" else ""))
            rows += cfg_rows
        del q, k, v, dout, bias
        torch.cuda.empty_cache()
    if bar is not None:
        bar.close()
    elif sys.stderr.isatty():
        print(file=sys.stderr)
    write_results(rows, meta, out)
    if args.summary:
        print_summary(rows)


def main(argv=None):
    args = parse_args(argv)
    if args.plot_only:
        plot_only(args)
    else:
        run_sweep(args)


if __name__ == "__main__":
    main()
