"""The patches under bench/cuda that decode_device.sh builds in for a run and takes out again
(probes and candidates not yet measured) still apply to this tree, and come out again: a patch
that no longer applies fails only on the GPU machine, where its run is lost."""
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "bench" / "cuda").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git apply")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_patch_applies_and_reverses(patch, tmp_path):
    # In a copy of the files it touches, so that the tree itself is never changed.
    files = subprocess.run(["git", "apply", "--numstat", str(patch)], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    paths = [line.split("\t")[2] for line in files if line.strip()]
    assert paths, f"{patch.name} touches no file"
    for rel in paths:
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).exists():  # (a file the patch creates is not there before it)
            shutil.copy2(ROOT / rel, dst)

    def contents():
        return {rel: (tmp_path / rel).read_bytes() if (tmp_path / rel).exists() else None
                for rel in paths}

    before = contents()
    for args in ([], ["-R"]):
        r = subprocess.run(["git", "apply", *args, str(patch)], cwd=tmp_path,
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{patch.name} {' '.join(args)}: {r.stderr.strip()}"
    assert contents() == before


def test_there_are_patches():
    assert PATCHES, "no probe patches found under bench/cuda: the glob or the layout changed"
