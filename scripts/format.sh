#!/usr/bin/env bash
# format.sh - applies .clang-format to every C source and header (src/, tests/, bench/);
# --check changes nothing and fails, naming the files, when one drifts from it (a CTest test
# runs it). clang-format 14, from Debian's clang-format package (scripts/setup.sh).
# Usage: scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
mapfile -t files < <(git ls-files 'src/*.c' 'src/*.h' 'src/*.cu' 'src/*.cuh' 'tests/*.c' 'tests/*.h' 'bench/*.c' 2>/dev/null ||
                     find src tests bench -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')
case "${1:-}" in
  "") clang-format -i "${files[@]}" ;;
  --check)
    bad=()
    for f in "${files[@]}"; do
      clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if ((${#bad[@]})); then
      echo "format.sh: these files drift from .clang-format (run scripts/format.sh): ${bad[*]}" >&2
      exit 1
    fi
    echo "format.sh: ${#files[@]} files follow .clang-format" ;;
  *) echo "format.sh: unknown option '$1'" >&2; exit 2 ;;
esac
