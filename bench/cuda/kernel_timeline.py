#!/usr/bin/env python3
"""Where a decode token's time goes, kernel by kernel, in place (inside the graph, with the
launches overlapping as they do in a real run), from a kernel trace: kernel_trace.cpp's CSV or
`nsys stats --report cuda_gpu_trace --format csv`.

    kernel_timeline.py TRACE.csv [--tokens 8]

Tokens are split at the embedding kernel; the last --tokens are averaged. Prints each kernel's
duration, its gap (start minus the end of everything before it: negative where it overlapped
the kernel before) and its advance (how far it moves that end: its share of the critical path),
per token and per position within a middle layer (layers split at the attention kernel)."""
import argparse, collections, csv, re, subprocess

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--tokens", type=int, default=8)
args = ap.parse_args()

rows = list(csv.reader(open(args.trace)))
hi = next(i for i, r in enumerate(rows) if any(c.startswith("Start") for c in r))
head = rows[hi]
col = lambda p: next(i for i, c in enumerate(head) if c.startswith(p))
cs, cd, cn = col("Start"), col("Duration"), col("Name")
ev = []
for r in rows[hi + 1:]:
    try:
        ev.append((int(float(r[cs])), int(float(r[cd])), r[cn]))
    except (ValueError, IndexError):
        pass
ev.sort()


TYPES = {"0": "F32", "1": "F16", "8": "Q8_0", "10": "Q2_K", "11": "Q3_K", "12": "Q4_K",
         "13": "Q5_K", "14": "Q6_K"}  # GgmlType values in template arguments


def demangled(names):
    """Names as c++filt prints them (unchanged where it is missing)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.splitlines()
        return dict(zip(names, out)) if len(out) == len(names) else {}
    except (OSError, subprocess.CalledProcessError):
        return {}


def short(n):
    n = plain.get(n, n)
    if n.endswith(")"):  # drop the parameter list
        depth = 0
        for i in range(len(n) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(n[i], 0)
            if depth == 0:
                n = n[:i]
                break
    n = re.sub(r"(void )?(nt::)?(cuda::)?(detail::)?(\(anonymous namespace\)::)?", "", n)
    n = re.sub(r"\(GgmlType\)(\d+)", lambda m: TYPES.get(m.group(1), m.group(1)), n)
    return n.replace("(bool)", "")[:60]


plain = demangled(sorted({e[2] for e in ev}))
starts = [i for i, e in enumerate(ev) if "embed" in e[2]]
toks = [(starts[j], starts[j + 1]) for j in range(len(starts) - 1)][-args.tokens:]
if not toks:
    raise SystemExit("no complete token (no two embedding kernels) in the trace")
print(f"{len(ev)} kernels, {len(starts)} tokens; the last {len(toks)} averaged")

def walk(seg):
    """(name, duration us, gap us, advance us) for each kernel of seg: the gap is its start less
    the latest end before it, the advance how far its end moves that latest end (what the kernel
    adds to the token's critical path)."""
    out, prev_end = [], seg[0][0]  # the first kernel: no gap, its whole duration an advance
    for s, d, n in seg:
        out.append((short(n), d / 1e3, (s - prev_end) / 1e3, max(0, s + d - prev_end) / 1e3))
        prev_end = max(prev_end, s + d)
    return out

dur, gap, cnt = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
tok_us, layers = [], []  # layers: each middle layer's walk, of every token
for a, b in toks:
    tok_us.append((ev[b][0] - ev[a][0]) / 1e3)
    w = walk(ev[a:b])
    for n, d, g, _ in w:
        dur[n] += d
        gap[n] += g
        cnt[n] += 1
    attn = [i for i, (n, _, _, _) in enumerate(w) if "attn" in n]
    for l in range(1, len(attn) - 1):  # whole middle layers: attention to attention
        layers.append(w[attn[l]:attn[l + 1]])
T = len(toks)
print(f"token: {sum(tok_us) / T:.1f} us, start to next start\n")
print(f"{'kernel':60s} {'a token':>7s} {'each us':>8s} {'us/token':>9s} {'gap each':>9s}")
for n in sorted(dur, key=lambda n: -dur[n]):
    print(f"{n:60s} {cnt[n] / T:7.1f} {dur[n] / cnt[n]:8.2f} {dur[n] / T:9.1f} {gap[n] / cnt[n]:9.2f}")

# Per position in a middle layer, averaged over the layers and tokens with the same sequence.
names = lambda L: tuple(r[0] for r in L)
for shape, k in collections.Counter(names(L) for L in layers).most_common(2):
    sel = [L for L in layers if names(L) == shape]
    print(f"\na layer, attention to attention ({k} layers alike), in order:")
    print(f"{'kernel':60s} {'dur us':>7s} {'gap us':>7s} {'advance':>7s}")
    tot = 0.0
    for j, n in enumerate(shape):
        d, g, a = (sum(L[j][c] for L in sel) / len(sel) for c in (1, 2, 3))
        tot += a
        print(f"{n:60s} {d:7.2f} {g:7.2f} {a:7.2f}")
    print(f"{'the layer (sum of advances)':60s} {'':7s} {'':7s} {tot:7.2f}")
