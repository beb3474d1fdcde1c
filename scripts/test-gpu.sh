#!/usr/bin/env bash
# test-gpu.sh - the GPU tests (tests/test_cuda.c: every weight type, the real models found,
# CPU+GPU fleets; tests/test_gpu_fleet.py: fleets of GPU stages, device to device) on a
# machine with an NVIDIA GPU and its driver, from a build made where nvcc was found
# (scripts/test.sh's, or cmake -S . -B build && cmake --build build). Exits 77 (skipped)
# where there is no GPU.
# Usage: scripts/test-gpu.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
if [ ! -x "$b/test_cuda" ] || [ ! -x "$b/pipeshard" ]; then
  echo "test-gpu.sh: $b/test_cuda or $b/pipeshard is missing: build first (cmake -S . -B $b && cmake --build $b)" >&2
  exit 2
fi
export PIPESHARD_BIN=$PWD/$b/pipeshard
export PS_TEST_TMP=${PS_TEST_TMP:-$PWD/$b/test-tmp}
export PS_SHARED_MODELS=${PS_SHARED_MODELS:-$PWD/../shared/models}
export PS_MODEL_CACHE=${PS_MODEL_CACHE:-$PWD/.cache/models}
mkdir -p "$PS_TEST_TMP"
rc=0
"$b/test_cuda" || rc=$?
python3 tests/test_gpu_fleet.py || { r=$?; [ $rc -ne 0 ] || rc=$r; }
exit $rc
