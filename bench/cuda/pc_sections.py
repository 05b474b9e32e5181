#!/usr/bin/env python3
"""One kernel's PC samples (pc_stalls.cpp's NT_PC_OUT CSV) cut into the sections of its SASS:
before its programmatic wait (ACQBULK), then from one block barrier (BAR.SYNC) to the next, so
that a stall reason can be put on a step of the kernel's work. Also its most sampled PCs with
their instructions.

    cuobjdump -sass OBJ > k.sass
    pc_sections.py STALLS.csv k.sass KERNEL [--mangled MANGLED] [--top N]

KERNEL is a substring of the demangled name in the CSV (e.g. "attn_decode_tiled<128, 4, 256>");
MANGLED a substring of the mangled name cuobjdump prints (default: KERNEL's text before '<').
Reasons are merged with their `_not_issued` twins.
"""
import argparse
import collections
import csv
import re
import sys

INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def kernel_sass(text, mangled):
    """{pc offset: instruction} of the first function whose name contains `mangled`."""
    for part in text.split("Function : ")[1:]:
        name, body = part.split("\n", 1)
        if mangled in name:
            return {int(m.group(1), 16): m.group(2) for m in map(INSN.match, body.split("\n")) if m}
    return None


def samples_by_pc(path, kernel):
    by_pc = collections.defaultdict(collections.Counter)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if kernel in r["kernel"]:
                by_pc[int(r["pc"], 16)][r["reason"].replace("_not_issued", "")] += int(r["samples"])
    return by_pc


def sections(insns):
    """[(start, end, label)]: before the wait, then between block barriers."""
    waits = sorted(a for a, i in insns.items() if "ACQBULK" in i)
    bars = sorted(a for a, i in insns.items() if "BAR.SYNC" in i)
    end = max(insns) + 16
    cuts = [0]
    if waits:
        cuts.append(waits[0] + 16)
    cuts += [b + 16 for b in bars if not waits or b > waits[0]]
    cuts.append(end)
    out = []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        if a < b:
            label = "before the wait" if waits and i == 0 else f"section {len(out)}"
            out.append((a, b, label))
    return out


def fmt(counter, n=6):
    total = sum(counter.values())
    return ", ".join(f"{r} {100 * v / total:.0f}%" for r, v in counter.most_common(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("sass")
    ap.add_argument("kernel")
    ap.add_argument("--mangled")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    by_pc = samples_by_pc(a.csv, a.kernel)
    if not by_pc:
        sys.exit(f"no samples of a kernel named like {a.kernel!r} in {a.csv}")
    with open(a.sass) as f:
        insns = kernel_sass(f.read(), a.mangled or a.kernel.split("<")[0])
    if not insns:
        sys.exit(f"no function like {a.mangled or a.kernel.split('<')[0]!r} in {a.sass}")
    total = sum(sum(c.values()) for c in by_pc.values())
    print(f"{total} samples; by section (PC range, samples, share, reasons):")
    for lo, hi, label in sections(insns):
        c = collections.Counter()
        for pc, r in by_pc.items():
            if lo <= pc < hi:
                c.update(r)
        if c:
            n = sum(c.values())
            print(f"  [{lo:#07x}, {hi:#07x}) {label:<16} {n:8d} {100 * n / total:5.1f}%  {fmt(c)}")
    print(f"the {a.top} most sampled PCs:")
    for pc, c in sorted(by_pc.items(), key=lambda kv: -sum(kv[1].values()))[:a.top]:
        print(f"  {pc:#07x} {sum(c.values()):8d}  {insns.get(pc, '?')[:48]:<48}  {fmt(c, 3)}")


if __name__ == "__main__":
    main()
