#!/usr/bin/env python3
"""Sustained attention on a warm GPU: TFLOP/s, SM clock, power and energy per FLOP.

bench.py times short bursts (25 ms warm-up, 100 ms of calls), mostly on a cool GPU. A
training run keeps the GPU at its power cap, where the clock governor lowers the SM clock
until the board's power fits; a kernel that draws more power per unit of work then runs at a
lower clock than another that does the same work (eighteenth session: our backward rows at
1575-1755 MHz, cuDNN's at 1875-1980, both at the 700 W cap). This script runs each
(impl, config) for --seconds, back to back, while nvidia-smi samples the SM clock, power,
temperature and clock-event reasons every --smi-ms, and reports the steady state (the last
half of each run): TFLOP/s, median SM clock and power, and pJ per FLOP (power / throughput).
Rounds alternate the order of the impls, so that neither always runs on the hotter GPU.

    python benchmarks/bench_power.py                                   # bwd, d64/128/256, 8k
    python benchmarks/bench_power.py --modes fwd,bwd --headdims 128 --seconds 20

Writes results.json ({"meta", "rows"}: one row per run, with its chunk series and the
nvidia-smi samples) to --out. Needs nvidia-smi on PATH; the GPU's settings are only read.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SMI_FIELDS = ["timestamp", "clocks.sm", "power.draw", "temperature.gpu"]
SMI_TIME = "%Y/%m/%d %H:%M:%S.%f"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--headdims", type=bench.csv_list(int), default=[64, 128, 256])
    p.add_argument("--seqlens", type=bench.csv_list(int), default=[8192])
    p.add_argument("--causal", choices=["both", "true", "false"], default="false")
    p.add_argument("--dtypes", type=bench.csv_list(str), default=["bf16"])
    p.add_argument("--modes", type=bench.csv_list(str), default=["bwd"])
    p.add_argument("--impls", type=bench.csv_list(str), default=["flashattn2", "sdpa_cudnn"])
    p.add_argument("--hidden", type=int, default=2048, help="nheads = hidden // headdim")
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seqlen")
    p.add_argument("--seconds", type=float, default=10.0, help="each run's length")
    p.add_argument("--rounds", type=int, default=2, help="round r runs the impls reversed if odd")
    p.add_argument("--chunk-ms", type=float, default=50.0, help="calls between two syncs, ms")
    p.add_argument("--smi-ms", type=int, default=100)
    p.add_argument("--out", help="output dir (default benchmarks/out/power-<date>)")
    a = p.parse_args(argv)
    bad = [m for m in a.modes if m not in ("fwd", "bwd", "fwd_bwd")]
    if bad or a.seconds <= 0 or a.rounds < 1 or a.chunk_ms <= 0:
        p.error(f"modes fwd / bwd / fwd_bwd (got {bad}), --seconds > 0, --rounds >= 1, "
                "--chunk-ms > 0")
    return a


def parse_smi_line(line, reasons_field=True):
    """One nvidia-smi CSV line (SMI_FIELDS [+ reasons], no units in the header's order) ->
    dict (time: datetime, clock MHz, power W, temp C, reasons str), or None for a header or
    a line it cannot read ("[N/A]", a warning)."""
    parts = [x.strip() for x in line.split(",")]
    if len(parts) != len(SMI_FIELDS) + (1 if reasons_field else 0):
        return None
    try:
        t = datetime.datetime.strptime(parts[0], SMI_TIME)
        num = [float(re.sub(r"[^0-9.]", "", x)) for x in parts[1:4]]
    except ValueError:
        return None
    return {"time": t, "clock": num[0], "power": num[1], "temp": num[2],
            "reasons": parts[4] if reasons_field else ""}


def steady(chunks, samples, start, end):
    """The last half of a run [start, end] (datetimes): chunks [(t_end, seconds, flop)] ->
    TFLOP/s over the chunks that start in it; samples (parse_smi_line dicts) in it -> median
    clock and power, max temperature, the reasons seen; pJ per FLOP = power / throughput."""
    mid = start + (end - start) / 2
    late = [c for c in chunks if c[0] - datetime.timedelta(seconds=c[1]) >= mid]
    secs = sum(c[1] for c in late)
    tflops = sum(c[2] for c in late) / secs / 1e12 if secs > 0 else None
    smi = [s for s in samples if mid <= s["time"] <= end]
    out = {"tflops": tflops, "clock_mhz": None, "power_w": None, "temp_max": None,
           "reasons": sorted({s["reasons"] for s in smi}), "smi_samples": len(smi)}
    if smi:
        out.update(clock_mhz=statistics.median(s["clock"] for s in smi),
                   power_w=statistics.median(s["power"] for s in smi),
                   temp_max=max(s["temp"] for s in smi))
    out["pj_per_flop"] = out["power_w"] / tflops if tflops and out["power_w"] else None
    return out


def smi_command(ms):
    reasons = "clocks_event_reasons.active"
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={reasons}", "--format=csv"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        reasons = "clocks_throttle_reasons.active"
    return ["nvidia-smi", "--query-gpu=" + ",".join(SMI_FIELDS + [reasons]),
            "--format=csv,noheader", "-lms", str(ms)]


def sustain(step, seconds, chunk_ms, flop):
    """Calls step() in chunks of about chunk_ms (calibrated on the first call), syncing after
    each: [(end time, chunk seconds, chunk FLOP)]."""
    import torch
    step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    per_call = max(time.perf_counter() - t0, 1e-6)
    n = max(1, int(chunk_ms / 1e3 / per_call))
    chunks, stop = [], time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        chunks.append((datetime.datetime.now(), time.perf_counter() - t0, n * flop))
    return chunks


def run(args):
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench_power.py: no CUDA device")
    gpu = torch.cuda.get_device_name()
    out = args.out or os.path.join(
        "benchmarks", "out", "power-" + datetime.datetime.now().strftime("%Y%m%d-%H%M"))
    os.makedirs(out, exist_ok=True)
    cmd = smi_command(args.smi_ms)
    smi_path = os.path.join(out, "smi.csv")
    smi_file = open(smi_path, "w")
    smi = subprocess.Popen(cmd, stdout=smi_file, stderr=subprocess.STDOUT)
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([sys.executable] + sys.argv), "gpu": gpu,
            "torch": torch.__version__, "smi": " ".join(cmd), "seconds": args.seconds,
            "chunk_ms": args.chunk_ms, "steady": "the last half of each run"}
    rows = []
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    print(f"{gpu} | {args.seconds:g} s per run, steady state = its last half")
    print(f"{'impl':>11} {'mode':>7} {'d':>4} {'seqlen':>6} {'causal':>6} {'round':>5} | "
          f"{'TFLOP/s':>7} {'MHz':>5} {'W':>5} {'pJ/FLOP':>7}")
    try:
        for dt in args.dtypes:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
            for d in args.headdims:
                for causal in causals:
                    for s in args.seqlens:
                        b, h = max(1, args.tokens // s), args.hidden // d
                        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype)
                                         for _ in range(4))
                        for x in (q, k, v):
                            x.requires_grad_(True)
                        for mode in args.modes:
                            flop = bench.attn_flops(b, s, s, h, d, causal, mode)
                            for r in range(args.rounds):
                                impls = args.impls if r % 2 == 0 else args.impls[::-1]
                                for impl in impls:
                                    rows.append(one_run(impl, mode, q, k, v, dout, causal, flop,
                                                        args, smi_path, r, dict(
                                                            gpu=gpu, dtype=dt, batch=b, nheads=h,
                                                            headdim=d, seqlen=s)))
                        del q, k, v, dout
                        torch.cuda.empty_cache()
    finally:
        smi.terminate()
        smi.wait()
        smi_file.close()
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1, default=str)
    print(f"\nwrote {out}/results.json ({len(rows)} rows), {smi_path}")


def one_run(impl, mode, q, k, v, dout, causal, flop, args, smi_path, rnd, base):
    import torch
    ctx, fwd = bench.make_call(impl, q, k, v, causal)
    with ctx, torch.set_grad_enabled(mode != "fwd"):
        out = fwd()
        if mode == "fwd":
            step = fwd
        elif mode == "bwd":
            def step():
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            def step():
                torch.autograd.grad(fwd(), (q, k, v), dout)
        start = datetime.datetime.now()
        chunks = sustain(step, args.seconds, args.chunk_ms, flop)
        end = datetime.datetime.now()
    time.sleep(2 * args.smi_ms / 1e3)  # (the samples of the run's end reach the file)
    with open(smi_path) as f:
        samples = [x for x in map(parse_smi_line, f) if x and start <= x["time"] <= end]
    st = steady(chunks, samples, start, end)
    first = [c for c in chunks if c[0] <= start + datetime.timedelta(seconds=0.5)]
    row = dict(base, impl=impl, mode=mode, causal=causal, round=rnd, start=start, end=end,
               first_tflops=(sum(c[2] for c in first) / sum(c[1] for c in first) / 1e12
                             if first else None), **st,
               chunks=[[c[0].isoformat(timespec="milliseconds"), c[1], c[2]] for c in chunks],
               smi=[[x["time"].isoformat(timespec="milliseconds"), x["clock"], x["power"],
                     x["temp"], x["reasons"]] for x in samples])
    fmt = lambda x, p: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print(f"{impl:>11} {mode:>7} {base['headdim']:>4} {base['seqlen']:>6} {str(causal):>6} "
          f"{rnd:>5} | {fmt(st['tflops'], 1):>7} {fmt(st['clock_mhz'], 0):>5} "
          f"{fmt(st['power_w'], 0):>5} {fmt(st['pj_per_flop'], 3):>7}", flush=True)
    return row


if __name__ == "__main__":
    run(parse_args())
