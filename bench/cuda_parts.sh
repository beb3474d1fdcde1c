#!/usr/bin/env bash
# cuda_parts.sh - what each GPU kernel costs within a decode step, its overlap with the others
# included: `pipeshard bench --device cuda` with PS_CUDA_LEAVE_OUT naming a part's kernels,
# against the whole step, in alternating turns (whole, part 1, whole, part 2, ...). A part's
# cost is the decode's µs a token with it less without it (the tokens without it are wrong:
# only the time counts). Models are written by `pipeshard synth` into .cache/bench.
#
# Usage: bench/cuda_parts.sh PIPESHARD [--rows "shape:type ..."] [--parts "words ..."]
#                            [--rounds N] [--prompt P] [--gen N] [--device cuda[:N]]
# --parts: each a comma-separated PS_CUDA_LEAVE_OUT list (default: the norms, q/k/v's rotation,
# attention's kernels, the SwiGLU, and the decode matmuls k_mv and k_mvs). Prints per model
# the whole step's µs a token and each part's median cost (min..max over the rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,12p "$0" >&2; exit 2; }
bin=$1
shift
rows="llama-3.2-1b:Q4_0 llama-3.1-8b:Q4_0" parts="k_rmsnorm k_qk k_att k_swiglu k_mv k_mvs"
rounds=3 prompt=512 gen=128 device=cuda
while (($#)); do
  case "$1" in
    --rows) rows=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    *) echo "cuda_parts.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "cuda_parts.sh: '$bin' is not an executable" >&2; exit 2; }
for v in "$rounds" "$prompt" "$gen"; do [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "cuda_parts.sh: '$v' is not a positive count" >&2; exit 2; }; done
mkdir -p .cache/bench
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for row in $rows; do
  f=.cache/bench/${row%%:*}-${row#*:}.gguf
  [ -s "$f" ] || "$bin" synth --like "${row%%:*}" --type "${row#*:}" -o "$f" >/dev/null
  for ((r = 0; r < rounds; r++)); do
    for part in $parts; do
      for leave in "" "$part"; do
        tok_s=$(PS_CUDA_LEAVE_OUT="$leave" "$bin" bench -m "$f" --device "$device" -p "$prompt" -n "$gen" -r 1 --json 2>/dev/null |
          python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["decode_tok_s"])')
        echo "$row $part ${leave:-whole} $tok_s" >>"$out"
      done
    done
  done
done
python3 - "$out" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    row, part, what, tok_s = line.split()
    runs.setdefault((row, part), {}).setdefault(what == "whole", []).append(1e6 / float(tok_s))
for model in dict.fromkeys(row for row, _ in runs):
    whole = [us for (row, _), by in runs.items() if row == model for us in by[True]]
    print(f"{model}: a decode token {statistics.median(whole):.1f} us with every kernel")
    for (row, part), by in runs.items():
        if row != model:
            continue
        cost = [a - b for a, b in zip(by[True], by[False])]  # each round: whole, then without the part
        print(f"  {part:28s} {statistics.median(cost):8.1f} us a token ({min(cost):.1f}..{max(cost):.1f})")
EOF
