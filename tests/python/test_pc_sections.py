"""bench/cuda/pc_sections.py on a made-up kernel: its samples cut at the programmatic wait and the
block barriers, reasons merged with their `_not_issued` twins, other kernels' rows left out."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "cuda" / "pc_sections.py"

SASS = """
	code for sm_90
		Function : _Z5otherv
        /*0000*/                   EXIT ;
		Function : _Z6kernelPf
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   ACQBULK ;
        /*0020*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0040*/                   FADD R2, R2, R2 ;
        /*0050*/                   EXIT ;
"""

CSV = """kernel,pc,reason,samples
"kernel(float*)",0x0,no_instructions,6
"kernel(float*)",0x0,no_instructions_not_issued,4
"kernel(float*)",0x10,barrier,10
"kernel(float*)",0x20,long_scoreboard,30
"kernel(float*)",0x40,selected,15
"kernel(float*)",0x40,wait,5
"other()",0x0,selected,999
"""


def run(tmp_path, *extra):
    (tmp_path / "k.sass").write_text(SASS)
    (tmp_path / "s.csv").write_text(CSV)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "s.csv"),
                           str(tmp_path / "k.sass"), "kernel(", "--mangled", "_Z6kernel", *extra],
                          capture_output=True, text=True)


def test_sections(tmp_path):
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("70 samples"), r.stdout
    wait = next(l for l in lines if "before the wait" in l)
    assert "[0x00000, 0x00020)" in wait and " 20 " in wait and "no_instructions 50%" in wait
    assert "barrier 50%" in wait
    s1 = next(l for l in lines if "section 1" in l)  # the wait to the barrier: the load
    assert "[0x00020, 0x00040)" in s1 and "long_scoreboard 100%" in s1
    s2 = next(l for l in lines if "section 2" in l)
    assert "[0x00040, 0x00060)" in s2 and "selected 75%" in s2 and "wait 25%" in s2
    top = lines[lines.index("the 20 most sampled PCs:") + 1]
    assert "0x00020" in top and "LDG.E" in top


def test_unknown_kernel(tmp_path):
    (tmp_path / "k.sass").write_text(SASS)
    (tmp_path / "s.csv").write_text(CSV)
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "s.csv"), str(tmp_path / "k.sass"),
                        "missing"], capture_output=True, text=True)
    assert r.returncode != 0 and "no samples" in r.stderr
