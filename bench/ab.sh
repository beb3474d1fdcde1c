#!/usr/bin/env bash
# ab.sh - builds of pipeshard side by side, in alternating turns (A, B, C, A, B, C, ...), so
# that a machine whose speed drifts slows them alike: the engine's prefill and decode on
# core.sh's synthetic models (`bench -m`), and the split/unsplit decode ratio (`bench
# --stages`). For a change that must leave speed alone (a restructuring): B/A near 1; on a
# GPU (--device cuda, the split ratio left out) for a kernel change, B/A is its gain.
#
# Usage: bench/ab.sh A B [C ...] [--pairs N] [--threads N] [--rows "shape:type ..."]
#                    [--stages LIST] [--stages-model shape:type] [--no-stages]
#                    [--device cpu|cuda[:N]] [--prompt P] [--gen N]
# Each build is a pipeshard binary, or BINARY+VAR=VALUE[+VAR=VALUE...]: that binary with
# those variables in its environment (e.g. build/pipeshard+PS_CUDA_ATT_C=1). Prints, per
# model and build, the median over the turns, and each build's ratio to A with its spread
# (min..max over the turns). Models are written by `pipeshard synth` into .cache/bench.
set -euo pipefail
cd "$(dirname "$0")/.."
builds=()
while (($#)) && [[ $1 != --* ]]; do builds+=("$1"); shift; done
[ ${#builds[@]} -ge 2 ] || { sed -n 2,13p "$0" >&2; exit 2; }
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
# vars BUILD: its VAR=VALUE words, one a line
vars() { local rest=${1#"${1%%+*}"}; [ -z "$rest" ] || tr + '\n' <<<"${rest#+}"; }
for b in "${builds[@]}"; do
  [ -x "${b%%+*}" ] || { echo "ab.sh: '${b%%+*}' is not an executable" >&2; exit 2; }
  while read -r v; do
    [[ $v =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || { echo "ab.sh: '$v' in '$b' is not VAR=VALUE" >&2; exit 2; }
  done < <(vars "$b")
done
for v in "$pairs" "$prompt" "$gen"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: '$v' is not a positive count" >&2; exit 2; }; done
[ "$device" = cpu ] || stages="" # the split ratio is the CPU's (bench --stages)
mkdir -p .cache/bench
first=${builds[0]%%+*}
model() { local f=.cache/bench/${1%%:*}-${1#*:}.gguf; [ -s "$f" ] || "$first" synth --like "${1%%:*}" --type "${1#*:}" -o "$f" >/dev/null; echo "$f"; }
# run BUILD ARGS...: the build's binary with its variables in the environment
run() {
  local b=$1 env=()
  shift
  mapfile -t env < <(vars "$b")
  env "${env[@]}" "${b%%+*}" "$@"
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((p = 0; p < pairs; p++)); do
  for row in $rows; do
    f=$(model "$row")
    for i in "${!builds[@]}"; do
      echo "engine $row $i $(run "${builds[$i]}" bench -m "$f" -p "$prompt" -n "$gen" -t "$threads" -r 3 --device "$device" --json)" >>"$out"
    done
  done
  if [ -n "$stages" ]; then
    f=$(model "$stages_model")
    for i in "${!builds[@]}"; do
      echo "stages $stages_model $i $(run "${builds[$i]}" bench -m "$f" --stages "$stages" -t "$threads" --pin -p 16 -n 128 -r 3 --json)" >>"$out"
    done
  fi
done
python3 - "$out" "${builds[@]}" <<'PY'
import json, statistics, sys
builds = sys.argv[2:]
rows = {}
for line in open(sys.argv[1]):
    kind, model, i, js = line.split(" ", 3)
    j = json.loads(js)
    if kind == "engine":
        figs = {"pp tok/s": j["prefill_tok_s"], "tg tok/s": j["decode_tok_s"]}
    else:
        figs = {f"{c['stages']} stages ratio": c["ratio"] for c in j["configs"] if c["stages"] > 1}
    for name, v in figs.items():
        rows.setdefault((model, name), [[] for _ in builds])[int(i)].append(v)
label = lambda k: chr(65 + k) if k < 26 else str(k)
for k, b in enumerate(builds):
    print(f"{label(k)} = {b}")
print(f"{'model':22} {'figure':16} {'build':>5} {'median':>10} {'/A':>6}  spread of /A over the turns")
for (model, name), per in rows.items():
    for k, v in enumerate(per):
        r = [x / a for a, x in zip(per[0], v)]
        spread = f"{min(r):.3f}..{max(r):.3f} ({len(r)} turns)" if k else ""
        print(f"{model:22} {name:16} {label(k):>5} {statistics.median(v):10.3f} {statistics.median(r):6.3f}  {spread}")
PY
