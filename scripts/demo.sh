#!/usr/bin/env bash
# demo.sh - set up, build, and let SmolLM2-135M answer a prompt on a 2-stage local fleet:
# the model is split in two, stage 1 runs in a worker process on loopback.
# Usage: scripts/demo.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --no-python
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target pipeshard >/dev/null
prompt=${1:-"What is the capital of France? Answer in one sentence."}
# f32 activations: the answer a float reference gives (docs/engine.md); q8 is the faster default.
exec build/pipeshard run -m .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --local-stages 2 --chat -p "$prompt" -n 128 \
  --activations f32 --stats
