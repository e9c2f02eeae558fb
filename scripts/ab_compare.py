"""Summarise an interleaved A/B of gpu_job.sh's envab step (or a results file that merged one).

    python scripts/ab_compare.py JOB_OUT --group 1 --specs base,new,probe
    python scripts/ab_compare.py benchmarks/results/h100-fwd-...-ab.json --specs base,new

A spec's rows come from JOB_OUT/envab<group>_<spec>_<round>/ (bench.py's results.json or
bench_decode.py's decode.json), or from a merged file's rows whose "run" is <spec>_<round>
(optionally with a suffix: "base_fp16_1" counts for spec base). Per config, flashattn2's best
round of each spec, its ratio to the first spec's, and the reference's (SDPA-cuDNN: its best
over every spec's runs, since its code is the same in all; decode: the read floor too); then
the geomean of each spec's ratio to the first per (dtype, head dim, causal), or per
(layout, batch, query tokens) for decode. Speeds: TFLOP/s, or 1 / time for decode rows.
"""
import argparse
import collections
import glob
import json
import math
import os
import re


def load(source, group, specs):
    """(spec, row) pairs of every row of the A/B's runs."""
    out = []
    if os.path.isdir(source):
        for spec in specs:
            for path in sorted(glob.glob(os.path.join(source, f"envab{group}_{spec}_*", "*.json"))):
                out += [(spec, row) for row in json.load(open(path))["rows"]]
    else:
        for row in json.load(open(source))["rows"]:
            spec = re.sub(r"(_[A-Za-z0-9]+)*_\d+$", "", row.get("run", ""))
            if spec in specs:
                out.append((spec, row))
    return out


def key_of(row):
    """The config (without the implementation) and whether it is a decode row."""
    if row.get("bench") == "decode" or "layout" in row:
        return ("decode", row["layout"], row.get("page_size"), row["batch"], row["seqlen_q"],
                row["seqlen_k"], row["headdim"]), True
    return (row["mode"], row["dtype"], row["headdim"], row["causal"], row["seqlen_q"],
            row.get("variant", "plain")), False


def speed(row, decode):
    if row.get("error"):
        return None
    value = row.get("us") if decode else row.get("tflops")
    if not value:
        return None
    return 1.0 / value if decode else value


def order(key):
    """Sort key of a config: numbers as numbers, everything else (None too) as text after."""
    return tuple((0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x)) for x in key)


LABEL = {"sdpa_cudnn": "cudnn", "read_floor": "floor"}


def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a gpu_job.sh output folder or a merged results JSON")
    p.add_argument("--specs", required=True, help="comma-separated; the first is the baseline")
    p.add_argument("--group", default="1", help="envab group (folders envab<group>_*)")
    a = p.parse_args(argv)
    specs = a.specs.split(",")
    best = collections.defaultdict(dict)  # config -> {(spec, impl): best speed}
    decode_rows = False
    for spec, row in load(a.source, a.group, specs):
        key, decode = key_of(row)
        decode_rows |= decode
        s = speed(row, decode)
        if s is None:
            continue
        slot = (spec if row["impl"] == "flashattn2" else "*", row["impl"])
        best[key][slot] = max(best[key].get(slot, 0.0), s)
    if not best:
        raise SystemExit(f"no rows of specs {specs} in {a.source}")
    refs = ["sdpa_cudnn", "read_floor"] if decode_rows else ["sdpa_cudnn"]
    ratios = collections.defaultdict(list)  # (summary group, spec) -> ratios to specs[0]
    unit = "us" if decode_rows else "TFLOP/s"
    shown = (lambda s: 1.0 / s) if decode_rows else (lambda s: s)  # speed -> the unit
    print(f"flashattn2, best round per spec ({unit}); (x.xxx) = / {specs[0]}; "
          + ", ".join(f"/{LABEL[r]} = the speed ratio to {r}" for r in refs))
    for key in sorted(best, key=order):
        v = best[key]
        base = v.get((specs[0], "flashattn2"))
        if base is None:
            continue
        line = " ".join(str(k) for k in key[1:]) + " |"
        for spec in specs:
            s = v.get((spec, "flashattn2"))
            if s is None:
                line += f" {spec} -"
                continue
            line += f" {spec} {shown(s):8.1f} ({s / base:5.3f})"
            for ref in refs:
                # (the read floor's rows have no query tokens: seqlen_q 0)
                r = best[key[:4] + (0,) + key[5:]] if ref == "read_floor" else v
                r = r.get(("*", ref))
                if r:
                    line += f" /{LABEL[ref]} {s / r:4.2f}"
            group = (key[1], key[3], key[4]) if decode_rows else key[1:4]
            ratios[(group, spec)].append(s / base)
        print(line)
    print(f"\ngeomean / {specs[0]}, per " + ("(layout, batch, query tokens)" if decode_rows
                                             else "(dtype, head dim, causal)"))
    for group in sorted({g for g, _ in ratios}, key=order):
        print("  " + " ".join(str(g) for g in group) + ": " + "  ".join(
            f"{spec} {geomean(ratios[(group, spec)]):.4f}" for spec in specs[1:]
            if ratios[(group, spec)]))


if __name__ == "__main__":
    main()
