"""Stall samples of an ncu source-counter CSV (scripts/ncu.sh SOURCE=...) per source line.

    python scripts/ncu_lines.py KERNEL.cubin MANGLED_NAME_PART SOURCE.csv [--top 40]

KERNEL.cubin: a local compile of the measured instance (nvcc -c -lineinfo for sm_90a, then
`cuobjdump -xelf all x.o`); it must be byte-identical to the measured one: every row's opcode
is checked against the disassembly (the mismatch count is printed; 0 means the map holds).
nvdisasm (on PATH or $NVDISASM) disassembles it with --print-line-info; the function is the
one whose mangled name contains MANGLED_NAME_PART (e.g. "Lb0ELb0ELb0ELb1ELb1ELi0"). Prints
each line's share of all stall samples (every warp of the CTA: producer warps' waits too),
its executed instructions and its top three stall reasons.
"""
import argparse
import collections
import os
import re
import subprocess

from sass_stalls import rows


def line_table(cubin, name_part):
    """{address: ((file, line), instruction)} of the function whose name contains name_part."""
    nvdisasm = os.environ.get("NVDISASM", "nvdisasm")
    text = subprocess.run([nvdisasm, "--print-line-info", cubin], check=True,
                          capture_output=True, text=True).stdout
    sections = re.split(r"\n\t\.section\t\.text\.", text)
    matches = [s for s in sections[1:] if name_part in s.split(",", 1)[0]]
    if len(matches) != 1:
        raise SystemExit(f"{len(matches)} functions match {name_part!r}")
    table, where = {}, None
    for line in matches[0].splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            table[int(m.group(1), 16)] = (where, m.group(2).strip())
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cubin")
    ap.add_argument("name_part")
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    table = line_table(args.cubin, args.name_part)
    samples, executed = collections.Counter(), collections.Counter()
    by_reason = collections.defaultdict(collections.Counter)
    mismatches = base = 0
    for n, (row, op, ex, stalls, reasons) in enumerate(rows(args.csv)):
        address = int(row["Address"], 16)
        base = address if n == 0 else base
        where, ins = table.get(address - base, (None, ""))
        mismatches += op not in ins
        samples[where] += stalls
        executed[where] += ex
        by_reason[where].update(reasons)
    total = sum(samples.values()) or 1
    print(f"{n + 1} SASS rows, {len(table)} disassembled, opcode mismatches {mismatches}, "
          f"{total} stall samples")
    for where, count in samples.most_common(args.top):
        top = " ".join(f"{k}:{100 * v / count:.0f}" for k, v in by_reason[where].most_common(3)
                       if count)
        label = f"{where[0]}:{where[1]}" if where else "?"
        print(f"{100 * count / total:5.1f}%  {label:32s} executed {executed[where]:>11}  {top}")


if __name__ == "__main__":
    main()
