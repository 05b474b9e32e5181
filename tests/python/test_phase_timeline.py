"""bench/cuda/phase_timeline.py on made-up marks whose handoffs are known: each kernel's start,
wait, first data and work against the kernel before's last CTA, a layer's time as the sum of
advances, the steps a kernel marks inside its work, and the layers that are not attention to
attention in seven kernels left out."""
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cuda" / "phase_timeline.py"
REC = np.dtype([("t", "<u8"), ("tag", "<u4"), ("sm", "<u2"), ("kind", "u1"), ("mark", "u1")])
Q4K, Q6K = 4 << 4, 6 << 4

# A layer's kernels: (kind, name as printed, CTAs, start, first wait, last wait, first data after
# the first wait (None: no such mark), work after the first wait), in µs against the kernel
# before's last CTA done.
LAYER = [
    (4, "attention", 8, -6.0, 1.5, 1.75, 0.25, 4.0),
    (1 | Q4K, "gemv Q4_K", 264, -9.0, 1.25, 2.0, 0.5, 3.0),
    (5, "norm", 1, -11.0, 2.0, 2.0, None, 3.5),
    (2 | Q4K, "gemv pair Q4_K", 528, -15.0, 1.0, 3.0, 2.5, 23.0),
    (3 | Q6K, "gemv slices Q6_K", 264, -10.0, 1.5, 2.5, 1.0, 12.5),
    (5, "norm", 1, -6.0, 1.0, 1.0, None, 1.5),
    (1 | Q4K, "gemv Q4_K", 396, -8.0, 1.25, 1.5, 0.75, 2.0),
]
HEAD = (1 | Q6K, "gemv Q6_K", 528, -5.0, 1.0, 1.5, 0.5, 120.0)  # the output matrix, a token's end
# Steps inside a kernel's work (phase_trace.cuh's kStep1..), by kind: µs after the first wait.
STEPS = {4: [0.5, 1.25, 2.0, 3.5], 5: [2.25]}


def write_marks(path, tokens=3, layers=4):
    recs, done = [], 1_000_000.0  # ns: the kernel before's last CTA done

    def launch(tag, kernel):
        nonlocal done
        kind, _, ctas, start, w0, w1, first, work = kernel
        wait0 = done + w0 * 1000
        for c in range(ctas):
            f = c / (ctas - 1) if ctas > 1 else 1.0  # CTA 0 first, the last CTA last
            recs.append((done + start * 1000 + 2 * c, tag, c % 132, kind, 0))
            recs.append((done + (w0 + (w1 - w0) * f) * 1000, tag, c % 132, kind, 1))
            if first is not None:
                recs.append((wait0 + first * 1000 * f, tag, c % 132, kind, 2))
            for j, step in enumerate(STEPS.get(kind, [])):
                recs.append((wait0 + step * 1000 * f, tag, c % 132, kind, 4 + j))
            recs.append((wait0 + work * 1000 * (0.5 + 0.5 * f), tag, c % 132, kind, 3))
        done = wait0 + work * 1000

    for _ in range(tokens):
        for layer in range(layers):
            for k, kernel in enumerate(LAYER):
                launch(100 + 10 * layer + k, kernel)
        launch(99, HEAD)
    rng = np.random.default_rng(0)  # the ring's order is not time order
    arr = np.array([(int(t), tag, sm, kind, m) for t, tag, sm, kind, m in recs], dtype=REC)
    rng.shuffle(arr)
    arr.tofile(path)


ROW = re.compile(r"^(?P<name>.+?)\s+(?P<ctas>\d+)\s+(?P<start>-?[\d.]+)\s+(?P<w0>-?[\d.]+)-(?P<w1>-?[\d.]+)"
                 r"\s+(?:(?P<first>-?[\d.]+)\s+)?(?P<done>-?[\d.]+)\s+(?P<adv>-?[\d.]+)$")


def test_handoffs_and_work(tmp_path):
    marks = tmp_path / "marks.bin"
    write_marks(marks)
    out = subprocess.run([sys.executable, str(SCRIPT), str(marks)], capture_output=True,
                         text=True, check=True).stdout
    lines = out.splitlines()
    # Three tokens of four layers: 11 spans from one attention to the next. The two that take in
    # the output matrix have eight kernels, and the first has no kernel before it: 8 are left.
    assert lines[0].startswith("a layer, 8 alike"), out
    marking = [k for k in LAYER if k[0] in STEPS]
    body = lines[2:2 + len(LAYER) + len(marking)]
    rows, steps = [], []  # steps: (the kind of the kernel row above, the values)
    for l in body:
        if l.startswith("  steps"):  # under the kernel that marks them
            steps.append((LAYER[len(rows) - 1][0], [float(v) for v in l.split()[1:]]))
        else:
            rows.append(ROW.match(l))
    assert all(rows) and len(rows) == len(LAYER), out
    assert len(steps) == len(marking), out
    for kind, values in steps:  # last CTA against first wait
        assert values == STEPS[kind], out
    for kernel, row in zip(LAYER, rows):
        _, name, ctas, start, w0, w1, first, work = kernel
        assert row["name"].strip() == name
        assert int(row["ctas"]) == ctas
        assert abs(float(row["start"]) - start) < 0.01
        assert abs(float(row["w0"]) - w0) < 0.01 and abs(float(row["w1"]) - w1) < 0.01
        if first is None:
            assert row["first"] is None
        else:
            assert abs(float(row["first"]) - first) < 0.01
        assert abs(float(row["done"]) - work) < 0.01
        assert abs(float(row["adv"]) - (w0 + work)) < 0.01
    total = float(lines[2 + len(body)].split()[-1])
    assert abs(total - sum(k[4] + k[7] for k in LAYER)) < 0.02


def test_no_marks(tmp_path):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    r = subprocess.run([sys.executable, str(SCRIPT), str(empty)], capture_output=True, text=True)
    assert r.returncode != 0 and "no marks" in r.stderr
