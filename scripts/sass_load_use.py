"""Where each global load's result is first read, in a cuobjdump -sass listing: the check that
found the decode kernel's block-table clamp (NOTES, twenty-third session). A load issued early
on purpose (a page entry a step ahead, a prologue's address) does nothing if an instruction
right after it reads its register: the warp waits there for the whole latency.

    cuobjdump -sass kernel.o > kernel.sass
    python scripts/sass_load_use.py kernel.sass [--function decode_kernel] [--near 16]

For each function (or those whose name contains --function): every LDG / LD (not LDGSTS, the
cp.async copies, nor constant LDC) with the instruction distance to the first instruction that
reads its destination, marked "near" at --near or fewer. A heuristic, not a control-flow
analysis: conditional branches are not taken, and a predicated write does not end the search. The first reader is searched along
the path: unconditional branches are followed (a backward one, the loop's back edge, once).
"""
import argparse
import re

INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LOAD = re.compile(r"^(?:@!?U?P\w+\s+)?(LDG|LD)(\.[A-Z0-9_.]+)?\s+(R\d+)")
BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:\w+,\s*)?(0x[0-9a-f]+)")


def functions(text):
    """{name: [(address, instruction text)]} of a cuobjdump -sass listing."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = INSTR.match(line)
        if m and name:
            out[name].append((int(m.group(1), 16), m.group(2)))
    return out


def operands(instr):
    """(opcode, destination operands, source operands) of one instruction."""
    body = re.sub(r"^@!?U?P\w+\s+", "", instr)
    parts = body.split(None, 1)
    if len(parts) < 2:
        return parts[0].split(".")[0] if parts else "", "", ""
    opcode, ops = parts[0].split(".")[0], parts[1].split(",")
    # Stores, reductions and branches read every register they name; other instructions
    # write their first operand (an address in brackets there is read).
    if opcode in ("STG", "ST", "STS", "RED", "REDG", "ATOM", "ATOMG", "BRA"):
        return opcode, "", ",".join(ops)
    return opcode, ops[0], ",".join(ops[1:] + [o for o in ops[:1] if "[" in o])


def names(text, regs):
    return any(re.search(r"\b" + r + r"\b", text) for r in regs)


def first_reader(code, i, regs, limit=3000):
    """(distance, index) of the first instruction after code[i] on its path that reads regs:
    unconditional branches are followed (a backward one, the loop's back edge, once); (None,
    None) if a write of them comes first or nothing reads them within limit."""
    address = {a: k for k, (a, _) in enumerate(code)}
    k, steps, back = i + 1, 0, False
    while k < len(code) and steps < limit:
        instr = code[k][1]
        _, dst, src = operands(instr)
        steps += 1
        if names(src, regs):
            return steps, k
        if names(dst, regs) and not instr.startswith("@"):
            return None, None  # overwritten unread (a predicated write may not happen)
        m = BRANCH.search(instr)
        if m and not instr.startswith("@") and int(m.group(1), 16) in address:
            target = address[int(m.group(1), 16)]
            if target > k or not back:
                back = back or target <= k
                k = target
                continue
        k += 1
    return None, None


def report(code, near):
    rows = []
    for i, (a, instr) in enumerate(code):
        m = LOAD.match(instr)
        if not m or "LDGSTS" in instr or "LDGDEPBAR" in instr:
            continue
        reg = int(m.group(3)[1:])
        wide = m.group(2) and any(w in m.group(2) for w in (".64", ".128"))
        count = (4 if ".128" in m.group(2) else 2) if wide else 1
        regs = [f"R{reg + j}" for j in range(count)]
        dist, k = first_reader(code, i, regs)
        rows.append((a, instr, dist, code[k][1] if k is not None else None,
                     dist is not None and dist <= near))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--function", default="")
    ap.add_argument("--near", type=int, default=16)
    a = ap.parse_args()
    for name, code in functions(open(a.sass).read()).items():
        if a.function not in name:
            continue
        print(name)
        for addr, instr, dist, reader, is_near in report(code, a.near):
            where = f"{dist:4d} later: {reader}" if dist is not None else "   - no reader found"
            print(f"  {'near' if is_near else '    '} {addr:#07x} {instr[:56]:56s} {where[:70]}")


if __name__ == "__main__":
    main()
