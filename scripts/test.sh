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

# A test that could not run all of itself (a model, a tool, an address absent) exits 77, which
# CTest reports as "Skipped" (SKIP_RETURN_CODE), never "Passed". Under CI (.ci/run sets
# PS_CI_NO_SKIP=1), where ../shared is present and scripts/setup.sh installed everything, only
# GPU tests (LABELS gpu) may skip: any other skipped test fails the run.
skip_check() { # skip_check <build dir> <ctest log>
  local skipped gpu bad
  skipped=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$2" | sort -u)
  [ -n "$skipped" ] || return 0
  echo "skipped in $1 (the logs above say which parts and why):" $skipped
  if [ "${PS_CI_NO_SKIP:-0}" = 1 ] && [ -d ../shared ]; then
    gpu=$(ctest --test-dir "$1" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p' | sort -u)
    bad=$(comm -23 <(echo "$skipped") <(echo "$gpu"))
    if [ -n "$bad" ]; then
      echo "FAILED: under CI only GPU tests may skip; these skipped:" $bad
      return 1
    fi
  fi
}
# ctest_run <build dir> <ctest arguments...>: CTest with its output also kept for skip_check.
ctest_run() {
  local log rc=0
  log=$(mktemp)
  ctest --test-dir "$1" --output-on-failure -j"$jobs" "${@:2}" | tee "$log" || rc=1
  skip_check "$1" "$log" || rc=1
  rm -f "$log"
  return $rc
}

status=0
echo "== release build: all tests"
ctest_run build || status=1
echo "== sanitizer build: C unit tests, and the tests that feed bad input to the binary or the library"
ASAN_OPTIONS=detect_leaks=1 ctest_run build-asan -L unit || status=1
ASAN_OPTIONS=detect_leaks=1 ctest_run build-asan \
  -R '^py_test_(cli_errors|gguf_interop|gguf_inspect|chat_ref|chat_cli|signals|synth|split|pipeline|worker_fuzz|travel|probe_link|bench_cli|server|prefixes|spec)$' || status=1
exit $status
