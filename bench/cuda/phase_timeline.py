#!/usr/bin/env python3
"""A decode layer in place, phase by phase, from the marks a -DNT_PHASE_TRACE=ON build leaves
(src/backend/cuda/phase_trace.cuh; `NT_PHASE_OUT=FILE ntransformer bench ...` writes them).

Each launch's CTAs mark when they start, when their programmatic wait returns, when their first
weights (or K/V tile) are in shared memory, and when they are done, on the GPU's nanosecond
clock. Per kernel of a layer (attention to attention), averaged over the last layers traced,
all in us against the end of the kernel before (its last CTA's done mark):

  start      its first CTA's start (negative: it started before the kernel before ended)
  waited     its first and last CTA's wait returning: the first is the handoff's latency
  first      its last CTA's first data in shared memory, against its first wait
  done       its last CTA done, against its first wait: the work after the handoff
  advance    its last CTA done against the kernel before's (the layer's time is their sum)

Kernels that mark steps inside their work (phase_trace.cuh's kStep1..kStep4) get a second line:
each step's last CTA against the first wait, like `done` (the attention: its first tile
scored, weighted, summed, its output written; the norm: its sum of squares reduced).

    phase_timeline.py FILE [--layers N]
"""
import argparse
import collections
import sys
import warnings

import numpy as np

REC = np.dtype([("t", "<u8"), ("tag", "<u4"), ("sm", "<u2"), ("kind", "u1"), ("mark", "u1")])
ATTENTION = 4  # phase_trace.cuh's Kind
KINDS = {1: "gemv", 2: "gemv pair", 3: "gemv slices", ATTENTION: "attention", 5: "norm"}
TYPES = {0: "", 4: " Q4_K", 6: " Q6_K", 8: " Q8_0"}
ENTRY, WAITED, FIRST, DONE = range(4)
MARKS = 8  # phase_trace.cuh's kMarks
STEPS = range(DONE + 1, MARKS)  # kStep1..kStep4
SPLIT_NS = 100_000  # one launch's marks lie closer together than this; a token takes ms


def name(kind):
    return KINDS.get(kind & 15, f"kind {kind & 15}") + TYPES.get(kind >> 4, f" type {kind >> 4}")


def launches(recs):
    """Every launch: its kind and, per mark, the times of that mark (numpy arrays)."""
    out = []
    order = np.lexsort((recs["t"], recs["tag"]))
    recs = recs[order]
    tags = recs["tag"]
    cuts = np.flatnonzero((np.diff(tags) != 0) | (np.diff(recs["t"].astype(np.int64)) > SPLIT_NS)) + 1
    for part in np.split(recs, cuts):
        if len(part) == 0:
            continue
        marks = {m: part["t"][part["mark"] == m].astype(np.int64) for m in range(MARKS)}
        if len(marks[DONE]) == 0 or len(marks[WAITED]) == 0:
            continue
        kind = collections.Counter(part["kind"].tolist()).most_common(1)[0][0]
        out.append({"kind": int(kind), "tag": int(part["tag"][0]), "m": marks,
                    "done": int(marks[DONE].max()), "waited": int(marks[WAITED].min()),  # last / first
                    "n_done": len(marks[DONE])})
    return out


def main():
    warnings.simplefilter("ignore", RuntimeWarning)  # the mean of no first-data marks: nan
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--layers", type=int, default=64, help="the last N layers traced (default 64)")
    a = ap.parse_args()
    recs = np.fromfile(a.file, dtype=REC)
    if len(recs) == 0:
        sys.exit(f"{a.file}: no marks")
    ls = launches(recs)
    # A launch whose marks the ring overwrote in part has fewer done marks than its tag's others.
    full = collections.defaultdict(int)
    for l in ls:
        full[l["tag"]] = max(full[l["tag"]], l["n_done"])
    ls = [l for l in ls if l["n_done"] == full[l["tag"]]]
    ls.sort(key=lambda l: l["done"])
    att = [i for i, l in enumerate(ls) if l["kind"] & 15 == ATTENTION]
    layers = []
    for i0, i1 in zip(att, att[1:]):
        seq = ls[i0:i1]
        if len(seq) == 7 and i0 > 0:
            layers.append((ls[i0 - 1], seq))
    if not layers:
        sys.exit("no whole layer (attention to attention, 7 kernels) among the marks")
    layers = layers[-a.layers:]
    # Layers alike in their kernels' kinds are averaged together.
    groups = collections.defaultdict(list)
    for before, seq in layers:
        groups[tuple(l["kind"] for l in seq)].append((before, seq))
    for kinds, rows in groups.items():
        print(f"a layer, {len(rows)} alike (us; against the kernel before's last CTA done):")
        print(f"{'kernel':<18} {'CTAs':>5} {'start':>7} {'waited':>15} {'first':>7} {'done':>7} {'advance':>8}")
        total = 0.0
        for k in range(len(kinds)):
            st = collections.defaultdict(list)
            for before, seq in rows:
                prev = (seq[k - 1] if k else before)["done"]
                l = seq[k]
                m = l["m"]
                st["start"].append(m[ENTRY].min() - prev if len(m[ENTRY]) else np.nan)
                st["w0"].append(l["waited"] - prev)
                st["w1"].append(m[WAITED].max() - prev)
                st["first"].append(m[FIRST].max() - l["waited"] if len(m[FIRST]) else np.nan)
                st["done"].append(l["done"] - l["waited"])
                st["adv"].append(l["done"] - prev)
                st["ctas"].append(len(m[WAITED]))
                for j in STEPS:
                    st[f"s{j}"].append(m[j].max() - l["waited"] if len(m[j]) else np.nan)
            f = {key: np.nanmean(v) / 1000.0 if key != "ctas" else np.mean(v) for key, v in st.items()}
            total += f["adv"]
            first = f"{f['first']:7.2f}" if not np.isnan(f["first"]) else f"{'':7}"
            print(f"{name(kinds[k]):<18} {f['ctas']:5.0f} {f['start']:7.2f} {f['w0']:7.2f}-{f['w1']:<7.2f} "
                  f"{first} {f['done']:7.2f} {f['adv']:8.2f}")
            steps = [f[f"s{j}"] for j in STEPS if not np.isnan(f[f"s{j}"])]
            if steps:
                print(f"{'  steps':<18} " + " ".join(f"{v:6.2f}" for v in steps))
        print(f"{'the layer':<18} {'':5} {'':7} {'':15} {'':7} {'':7} {total:8.2f}\n")


if __name__ == "__main__":
    main()
