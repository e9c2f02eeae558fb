"""The per-tile fixed cost of a forward (or backward), fitted from a length sweep at fixed tokens.

    python scripts/tile_overhead.py RESULTS.json [RESULTS2.json ...] [--headdim 128] [--mode bwd]

bench.py's full-attention rows of one mode (its default shapes: batch x seqlen = 16k tokens,
so every length has the same number of 128-row query tiles, or 128-key blocks in the
backward, and only their length changes). A tile of n = seqlen / 128 blocks costs n c + o;
so TFLOP/s(n) = P n / (n + x), with P the speed without fixed costs and x = o / c the fixed
cost in blocks' worth of work (prologue, first softmax, epilogue; the backward's K / V load
and dK / dV store). Per implementation and dtype: P and x by least squares over the lengths
(the best row of each length over all files and runs), then each length's measured and
fitted speed. A length far above its fit is something that implementation does there.
"""
import argparse
import collections
import json


def fit(points):
    """(P, x, residual) minimising sum (t - P n / (n + x))^2 over x in [0, 16] (P closed form)."""
    best = None
    for i in range(1601):
        x = i / 100
        basis = [n / (n + x) for n, _ in points]
        p = sum(b * t for b, (_, t) in zip(basis, points)) / sum(b * b for b in basis)
        res = sum((t - p * b) ** 2 for b, (_, t) in zip(basis, points))
        if best is None or res < best[2]:
            best = (p, x, res)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench.py results.json files (or merged ones)")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--mode", default="fwd", choices=["fwd", "bwd", "fwd_bwd"])
    args = ap.parse_args(argv)
    speed = collections.defaultdict(float)  # (impl, dtype, seqlen) -> best TFLOP/s
    for path in args.results:
        for r in json.load(open(path))["rows"]:
            if (r["mode"] != args.mode or r["causal"] or r["headdim"] != args.headdim
                    or r.get("variant", "plain") != "plain" or r["seqlen_q"] != r["seqlen_k"]):
                continue
            key = (r["impl"], r["dtype"], r["seqlen_q"])
            speed[key] = max(speed[key], r["tflops"])
    for impl, dtype in sorted({k[:2] for k in speed}):
        lens = sorted(s for i, d, s in speed if (i, d) == (impl, dtype))
        if len(lens) < 3:
            continue
        points = [(s / 128, speed[(impl, dtype, s)]) for s in lens]
        p, x, _ = fit(points)
        print(f"{impl} {dtype} d{args.headdim} {args.mode}: P {p:.1f} TFLOP/s, fixed cost per "
              f"tile {x:.2f} key blocks")
        for n, t in points:
            print(f"  {int(n * 128):6d}  measured {t:6.1f}  fitted {p * n / (n + x):6.1f}")


if __name__ == "__main__":
    main()
