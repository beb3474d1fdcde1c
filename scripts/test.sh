#!/usr/bin/env bash
# test.sh - the whole test suite, from a fresh machine: set-up, a release build and a
# sanitizer (address + undefined) build, then CTest on both. Prints CTest's summary lines.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPS_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
status=0
echo "== release build: all tests"
ctest --test-dir build --output-on-failure -j"$jobs" || status=1
echo "== sanitizer build: C unit tests, and the tests that feed bad input to the binary or the library"
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" -L unit || status=1
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j"$jobs" \
  -R '^py_test_(cli_errors|gguf_interop|gguf_inspect|chat_ref|synth|split|pipeline|worker_fuzz|bench_cli)$' || status=1
exit $status
