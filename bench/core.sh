#!/usr/bin/env bash
# core.sh - prefill and decode speed of the CPU engine on synthetic models, 2 threads,
# pp128 / tg64, printed as a table beside llama.cpp's figures for this machine class
# (February 2025 build, from the issue) and, when you point it at one, a llama-bench
# binary measured in the same run on the same files.
#
# Usage: bench/core.sh [--llama-bench PATH] [--threads N] [--activations q8|f32] [--mem-bw GBS] [--rows "shape:type ..."]
#                      [--depth D]
# --depth D: prefill a D-token prompt, then decode 64 tokens after it (long-context speed);
# the peer runs -p D and -pg D,64 and its decode rate is 64 / (time of pg - time of pp).
# Without it, pipeshard decodes after its 128-token prefill and llama-bench's tg64 starts
# from an empty context (so the peer's attention is cheaper).
# Models are written by `pipeshard synth` into .cache/bench (kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
peer="" threads=2 act=q8 bw="" depth=""
rows="smollm2-135m:Q8_0 smollm2-135m:Q4_0 llama-3.2-1b:Q4_0 llama-3.2-1b:Q4_K_M llama-3.2-1b:Q8_0"
while (($#)); do
  case "$1" in
    --llama-bench) peer=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --activations) act=$2; shift 2 ;;
    --mem-bw) bw="--mem-bw $2"; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --depth) depth=$2; shift 2 ;;
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
npp=${depth:-128}
echo "pipeshard --activations $act, $threads threads, pp$npp / tg64${depth:+ at depth $depth}, medians of 3"
printf "%-14s %-7s %10s %10s %7s %8s %8s %8s %8s" shape type "pp tok/s" "tg tok/s" "bw%" "ref pp" "ref tg" "pp x" "tg x"
[ -n "$peer" ] && printf " %9s %9s" "peer pp" "peer tg"
printf "\n"
for row in $rows; do
  shape=${row%%:*} type=${row#*:}
  f=.cache/bench/$shape-$type.gguf
  [ -s "$f" ] || "$bin" synth --like "$shape" --type "$type" -o "$f" >/dev/null
  j=$("$bin" bench -m "$f" -p "$npp" -n 64 -t "$threads" -r 3 --activations "$act" $bw --json)
  pp=$(field "$j" prefill_tok_s) tg=$(field "$j" decode_tok_s) share=$(field "$j" bandwidth_share)
  rp=${ref_pp[$row]:-0} rt=${ref_tg[$row]:-0}
  [ -n "$depth" ] && rp=0 rt=0  # the issue's figures are pp128 / tg64 from an empty context
  printf "%-14s %-7s %10.1f %10.2f %6.0f%% %8s %8s %8s %8s" "$shape" "$type" "$pp" "$tg" \
    "$(python3 -c "print($share*100)")" "$rp" "$rt" \
    "$(python3 -c "print(f'{$pp/$rp:.2f}' if $rp else '-')")" "$(python3 -c "print(f'{$tg/$rt:.2f}' if $rt else '-')")"
  if [ -n "$peer" ]; then
    if [ -n "$depth" ]; then
      pj=$("$peer" -m "$f" -p "$depth" -n 0 -pg "$depth,64" -t "$threads" -r 3 -o json 2>/dev/null || echo "[]")
    else
      pj=$("$peer" -m "$f" -p 128 -n 64 -t "$threads" -r 3 -o json 2>/dev/null || echo "[]")
    fi
    python3 - "$pj" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
pp_row = next((r for r in rows if r.get("n_prompt") and not r.get("n_gen")), None)
pg_row = next((r for r in rows if r.get("n_prompt") and r.get("n_gen")), None)
tg_row = next((r for r in rows if r.get("n_gen") and not r.get("n_prompt")), None)
pp = pp_row["avg_ts"] if pp_row else 0
if pg_row and pp_row:  # decode after the prompt: the pg run's time beyond the pp run's
    tg = pg_row["n_gen"] / max(1e-9, (pg_row["avg_ns"] - pp_row["avg_ns"]) / 1e9)
else:
    tg = tg_row["avg_ts"] if tg_row else 0
print(f" {pp:9.1f} {tg:9.2f}", end="")
PY
  fi
  printf "\n"
done
