"""Summarise ncu source-page CSVs (scripts/ncu.sh with SOURCE=...): executed instructions
and warp-stall samples by opcode, and stall samples by reason, side by side per file.

    python scripts/sass_stalls.py ours.csv fa2.csv [--steps N]

--steps divides instruction counts (e.g. by the warp-steps of the main loop).
"""
import argparse
import collections
import csv


def rows(path):
    """Each SASS row of an ncu source-page CSV as (row, opcode, executed instructions, stall
    samples, {reason: samples}); also read by ncu_lines.py."""
    table = list(csv.reader(open(path)))
    header, data = table[1], [r for r in table[2:] if len(r) == len(table[1])]
    src = header.index("Source")
    executed = header.index("Instructions Executed")
    samples = header.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    for r in data:
        words = r[src].split()
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0] \
            if words else ""
        yield (dict(zip(header, r)), op, int(r[executed] or 0), int(r[samples] or 0),
               {header[i][len("stall_"):]: int(r[i] or 0) for i in reasons})


def load(path):
    by_op, samples_by_op, by_reason = (collections.Counter() for _ in range(3))
    for _, op, executed, samples, reasons in rows(path):
        if not op:
            continue
        by_op[op] += executed
        samples_by_op[op] += samples
        by_reason.update(reasons)
    return by_op, samples_by_op, by_reason


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--steps", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    tables = [load(path) for path in args.csv]
    print("instructions (/ steps) and % of stall samples, by opcode")
    ops = collections.Counter()
    for by_op, _, _ in tables:
        ops.update(by_op)
    for op, _ in ops.most_common(args.top):
        cells = []
        for by_op, samples_by_op, _ in tables:
            total = sum(samples_by_op.values()) or 1
            cells.append(f"{by_op[op] / args.steps:14.1f} {100 * samples_by_op[op] / total:5.1f}%")
        print(f"{op:10s}" + "".join(cells))
    print("\nstall samples by reason (%), total")
    for path, (_, _, by_reason) in zip(args.csv, tables):
        total = sum(by_reason.values()) or 1
        top = " ".join(f"{k}:{100 * v / total:.1f}" for k, v in by_reason.most_common(10))
        print(f"{path}: {total} {top}")


if __name__ == "__main__":
    main()
