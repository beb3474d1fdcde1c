#!/usr/bin/env bash
# core.sh - prefill and decode speed of the CPU engine on synthetic models, 2 threads,
# pp128 / tg64, printed as a table beside llama.cpp's figures for this machine class
# (February 2025 build, from the issue) and, when you point it at one, a llama-bench
# binary measured in the same run on the same files.
#
# Usage: bench/core.sh [--llama-bench PATH] [--threads N] [--activations q8|f32] [--mem-bw GBS] [--rows "shape:type ..."]
# Models are written by `pipeshard synth` into .cache/bench (kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
peer="" threads=2 act=q8 bw=""
rows="smollm2-135m:Q8_0 smollm2-135m:Q4_0 llama-3.2-1b:Q4_0 llama-3.2-1b:Q4_K_M llama-3.2-1b:Q8_0"
while (($#)); do
  case "$1" in
    --llama-bench) peer=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --activations) act=$2; shift 2 ;;
    --mem-bw) bw="--mem-bw $2"; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    *) echo "core.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bin=build/pipeshard
[ -x "$bin" ] || { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" --target pipeshard >/dev/null; }
mkdir -p .cache/bench

# llama.cpp (Feb 2025, 2 threads, pp128/tg64) on this machine class, from the issue.
declare -A ref_pp=([smollm2-135m:Q8_0]=563 [smollm2-135m:Q4_0]=802 [llama-3.2-1b:Q4_0]=123 [llama-3.2-1b:Q4_K_M]=60 [llama-3.2-1b:Q8_0]=94)
declare -A ref_tg=([smollm2-135m:Q8_0]=97 [smollm2-135m:Q4_0]=117 [llama-3.2-1b:Q4_0]=18.7 [llama-3.2-1b:Q4_K_M]=25.6 [llama-3.2-1b:Q8_0]=19.6)

field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
echo "pipeshard --activations $act, $threads threads, pp128 / tg64, medians of 3"
printf "%-14s %-7s %10s %10s %7s %8s %8s %8s %8s" shape type "pp tok/s" "tg tok/s" "bw%" "ref pp" "ref tg" "pp x" "tg x"
[ -n "$peer" ] && printf " %9s %9s" "peer pp" "peer tg"
printf "\n"
for row in $rows; do
  shape=${row%%:*} type=${row#*:}
  f=.cache/bench/$shape-$type.gguf
  [ -s "$f" ] || "$bin" synth --like "$shape" --type "$type" -o "$f" >/dev/null
  j=$("$bin" bench -m "$f" -p 128 -n 64 -t "$threads" -r 3 --activations "$act" $bw --json)
  pp=$(field "$j" prefill_tok_s) tg=$(field "$j" decode_tok_s) share=$(field "$j" bandwidth_share)
  rp=${ref_pp[$row]:-0} rt=${ref_tg[$row]:-0}
  printf "%-14s %-7s %10.1f %10.2f %6.0f%% %8s %8s %8s %8s" "$shape" "$type" "$pp" "$tg" \
    "$(python3 -c "print($share*100)")" "$rp" "$rt" \
    "$(python3 -c "print(f'{$pp/$rp:.2f}' if $rp else '-')")" "$(python3 -c "print(f'{$tg/$rt:.2f}' if $rt else '-')")"
  if [ -n "$peer" ]; then
    pj=$("$peer" -m "$f" -p 128 -n 64 -t "$threads" -r 3 -o json 2>/dev/null || echo "[]")
    python3 - "$pj" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
pp = next((r["avg_ts"] for r in rows if r.get("n_prompt") and not r.get("n_gen")), 0)
tg = next((r["avg_ts"] for r in rows if r.get("n_gen") and not r.get("n_prompt")), 0)
print(f" {pp:9.1f} {tg:9.2f}", end="")
PY
  fi
  printf "\n"
done
