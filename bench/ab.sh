#!/usr/bin/env bash
# ab.sh - two builds of pipeshard side by side, in alternating turns (A, B, A, B, ...), so
# that a machine whose speed drifts slows both alike: the engine's prefill and decode on
# core.sh's synthetic models (`bench -m`), and the split/unsplit decode ratio (`bench
# --stages`). For a change that must leave speed alone (a restructuring): B/A near 1; on a
# GPU (--device cuda, the split ratio left out) for a kernel change, B/A is its gain.
#
# Usage: bench/ab.sh OLD_PIPESHARD NEW_PIPESHARD [--pairs N] [--threads N] [--rows "shape:type ..."]
#                    [--stages LIST] [--stages-model shape:type] [--no-stages]
#                    [--device cpu|cuda[:N]] [--prompt P] [--gen N]
# Prints, per model and per build, the median over the pairs, and B/A with its spread
# (min..max over the pairs). Models are written by `pipeshard synth` into .cache/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0" >&2; exit 2; }
a=$1 b=$2
shift 2
pairs=3 threads=2 rows="smollm2-135m:Q8_0 smollm2-135m:Q4_0 llama-3.2-1b:Q4_0 llama-3.2-1b:Q4_K_M"
stages=2,3 stages_model=smollm2-135m:Q8_0 device=cpu prompt=128 gen=64
while (($#)); do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --stages-model) stages_model=$2; shift 2 ;;
    --no-stages) stages=""; shift ;;
    --device) device=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    *) echo "ab.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for bin in "$a" "$b"; do [ -x "$bin" ] || { echo "ab.sh: '$bin' is not an executable" >&2; exit 2; }; done
for v in "$pairs" "$prompt" "$gen"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: '$v' is not a positive count" >&2; exit 2; }; done
[ "$device" = cpu ] || stages="" # the split ratio is the CPU's (bench --stages)
mkdir -p .cache/bench
model() { local f=.cache/bench/${1%%:*}-${1#*:}.gguf; [ -s "$f" ] || "$b" synth --like "${1%%:*}" --type "${1#*:}" -o "$f" >/dev/null; echo "$f"; }

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((p = 0; p < pairs; p++)); do
  for row in $rows; do
    f=$(model "$row")
    for side in A B; do
      bin=$a; [ $side = B ] && bin=$b
      echo "engine $row $side $("$bin" bench -m "$f" -p "$prompt" -n "$gen" -t "$threads" -r 3 --device "$device" --json)" >>"$out"
    done
  done
  if [ -n "$stages" ]; then
    f=$(model "$stages_model")
    for side in A B; do
      bin=$a; [ $side = B ] && bin=$b
      echo "stages $stages_model $side $("$bin" bench -m "$f" --stages "$stages" -t "$threads" --pin -p 16 -n 128 -r 3 --json)" >>"$out"
    done
  fi
done
python3 - "$out" "$a" "$b" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, model, side, js = line.split(" ", 3)
    j = json.loads(js)
    if kind == "engine":
        figs = {"pp tok/s": j["prefill_tok_s"], "tg tok/s": j["decode_tok_s"]}
    else:
        figs = {f"{c['stages']} stages ratio": c["ratio"] for c in j["configs"] if c["stages"] > 1}
    for name, v in figs.items():
        rows.setdefault((model, name), {"A": [], "B": []})[side].append(v)
print(f"A = {sys.argv[2]}\nB = {sys.argv[3]}")
print(f"{'model':22} {'figure':16} {'A median':>10} {'B median':>10} {'B/A':>6}  spread of B/A over the pairs")
for (model, name), d in rows.items():
    r = [b / a for a, b in zip(d["A"], d["B"])]
    print(f"{model:22} {name:16} {statistics.median(d['A']):10.3f} {statistics.median(d['B']):10.3f} "
          f"{statistics.median(r):6.3f}  {min(r):.3f}..{max(r):.3f} ({len(r)} pairs)")
PY
