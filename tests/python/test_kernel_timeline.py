"""bench/cuda/kernel_timeline.py on a made-up trace whose overlaps are known: each kernel's gap
and advance (its share of the critical path), and a layer's time as the sum of advances."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cuda" / "kernel_timeline.py"

# Per layer: (name, start relative to the latest end before it, duration), in µs.
LAYER = [
    ("attn_decode_tiled<128, 4>(DecodeArgs)", -1.0, 5.0),  # overlaps 1 µs: advance 4
    ("gemv_o(float const*)", 0.5, 3.0),  # 0.5 µs gap: advance 3.5
    ("add_rmsnorm_kernel(float*)", -2.0, 2.0),  # hidden under the one before: advance 0
]


def write_trace(path, tokens=4, layers=4):
    t, frontier, rows = 0.0, 0.0, []

    def add(name, rel, dur):
        nonlocal frontier
        start = frontier + rel
        rows.append((int(start * 1000), int(dur * 1000), name))
        frontier = max(frontier, start + dur)

    for _ in range(tokens):
        add("embed_kernel(int const*)", 1.0, 1.0)
        for _ in range(layers):
            for k in LAYER:
                add(*k)
    add("embed_kernel(int const*)", 1.0, 1.0)  # closes the last token
    with open(path, "w") as f:
        f.write('"Start (ns)","Duration (ns)","Name"\n')
        for s, d, n in rows:
            f.write(f'{s},{d},"{n}"\n')


def layer_table(out):
    lines = out.splitlines()
    i = next(j for j, l in enumerate(lines) if l.startswith("a layer"))
    table = {}
    for l in lines[i + 2:]:
        if not l.strip():
            break
        parts, nums = l.split(), []
        while parts:
            try:
                nums.insert(0, float(parts[-1]))
            except ValueError:
                break
            parts.pop()
        table[" ".join(parts)] = nums
    return table


def test_advances_and_gaps(tmp_path):
    trace = tmp_path / "trace.csv"
    write_trace(trace)
    out = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--tokens", "3"],
                         capture_output=True, text=True, check=True).stdout
    assert "3 averaged" in out
    t = layer_table(out)
    attn = next(v for k, v in t.items() if k.startswith("attn_decode_tiled"))
    gemv = next(v for k, v in t.items() if k.startswith("gemv_o"))
    norm = next(v for k, v in t.items() if k.startswith("add_rmsnorm_kernel"))
    assert attn == [5.0, -1.0, 4.0]
    assert gemv == [3.0, 0.5, 3.5]
    assert norm == [2.0, -2.0, 0.0]
    layer = next(v for k, v in t.items() if k.startswith("the layer"))
    assert layer[-1] == 7.5


def test_no_token_is_an_error(tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text('"Start (ns)","Duration (ns)","Name"\n1,2,"gemv(x)"\n')
    r = subprocess.run([sys.executable, str(SCRIPT), str(trace)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "no complete token" in r.stderr
