"""src/tokenizer/unicode_tables.cpp is exactly what scripts/gen_unicode_tables.py generates from
Unicode 15.1 (the `unicodedata2` backport, the version llama.cpp's tables use), and its ranges
give every code point the category of that Unicode version.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLES = ROOT / "src" / "tokenizer" / "unicode_tables.cpp"

if os.environ.get("NT_ALLOW_MISSING_REFERENCE") == "1":
    unicodedata2 = pytest.importorskip("unicodedata2")
else:
    import unicodedata2  # pip install unicodedata2==15.1.0


def test_tables_are_generated():
    assert unicodedata2.unidata_version == "15.1.0", "pip install unicodedata2==15.1.0"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_unicode_tables.py")],
                       capture_output=True, check=True)
    assert r.stdout == TABLES.read_bytes(), "regenerate with scripts/gen_unicode_tables.py"


def test_ranges_match_categories():
    text = TABLES.read_text()
    ranges = [(int(a, 16), int(b, 16)) for a, b in
              re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", text)]
    flag = {"C": 0x80, "L": 0x04, "M": 0x10, "N": 0x02, "P": 0x20, "S": 0x40, "Z": 0x08}
    ranges.append((0x110000, 0))
    assert ranges[0][0] == 0
    for (start, flags), (end, _) in zip(ranges, ranges[1:]):
        assert start < end
        for cp in range(start, end):
            cat = unicodedata2.category(chr(cp))
            want = 0x01 if cat == "Cn" else flag[cat[0]]
            assert flags == want, f"U+{cp:04X} ({cat})"
