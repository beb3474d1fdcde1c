#!/usr/bin/env bash
# cross_neon.sh - the NEON kernels on an x86 machine: builds tests/test_matmul.c with the
# tensor module for aarch64 (static, no other library needed) and runs it under qemu-user,
# once per CPU model, checking which kernel families each run tested:
#   armv8.2-a+dotprod build on -cpu max          ref neon neondot
#   armv8-a build on -cpu max                    ref neon neondot (sdot picked at run time)
#   armv8-a build on -cpu cortex-a53 (no sdot)   ref neon         (the fallback)
#   armv8-a build with ASan + UBSan on -cpu max  ref neon neondot (when the cross
#                                                libasan is there: overreads, UB)
# test_matmul checks every family against ref (bit for bit for neon and neondot) and for
# batch invariance. Exit 0 pass, 77 skip (no aarch64-linux-gnu-gcc or qemu-aarch64;
# Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user; or, after the other runs
# passed, no cross libasan for the sanitizer run), else fail.
# Usage: tests/cross_neon.sh [build dir]   (default: $TMPDIR/ps-cross-neon)
set -euo pipefail
cd "$(dirname "$0")/.."

cc=aarch64-linux-gnu-gcc qemu=qemu-aarch64
for tool in "$cc" "$qemu"; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: $tool not found (scripts/setup.sh installs it)"
    exit 77
  fi
done
out=${1:-${TMPDIR:-/tmp}/ps-cross-neon}
mkdir -p "$out"

# What test_matmul links: the tensor module without the f32-activation kernels (gemm.c, f32_*.c) and ps.c.
srcs=(src/ps.c src/tensor/types.c src/tensor/cpu.c src/tensor/pool.c src/tensor/matmul.c
      src/tensor/q8_*.c tests/test_matmul.c tests/ps_test.c)
# The project's flags (CMakeLists.txt), as errors.
flags=(-std=c11 -O3 -Wall -Wextra -Werror -D_GNU_SOURCE -fno-math-errno -ffp-contract=off
       -Isrc -Itests)

build() { # build <name> <-march> [extra flags]
  "$cc" "${flags[@]}" -march="$2" "${@:3}" "${srcs[@]}" -lm -pthread -o "$out/$1"
}
san=0
[ -e "$("$cc" -print-file-name=libasan.so)" ] && [ -e "$("$cc" -print-file-name=libubsan.so)" ] && san=1
status=0
build test_matmul_dotprod armv8.2-a+dotprod -static & pid1=$!
build test_matmul_v8 armv8-a -static & pid2=$!
wait $pid1 || status=1
wait $pid2 || status=1
if ((san)); then
  build test_matmul_san armv8-a -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer || status=1
fi
if ((status)); then echo "cross_neon: build failed" >&2; exit 1; fi

# run <binary> <qemu cpu> <families expected>: the test passes and tested exactly those.
run() {
  local log="$out/$1-$2.log"
  echo "== $1 on qemu -cpu $2"
  if ! ASAN_OPTIONS=detect_leaks=0 "$qemu" -L /usr/aarch64-linux-gnu -cpu "$2" "$out/$1" >"$log" 2>&1; then
    tail -n 30 "$log"
    echo "cross_neon: $1 failed on -cpu $2" >&2
    return 1
  fi
  local fams
  fams=$(sed -n 's/^kernel families tested: //p' "$log")
  grep -E '^(best kernel family|ok):' "$log"
  if [ "$fams" != "$3" ]; then
    echo "cross_neon: $1 on -cpu $2 tested families '$fams', expected '$3'" >&2
    return 1
  fi
}
# Two runs at a time (each is mostly one busy thread).
run test_matmul_dotprod max "ref neon neondot" >"$out/r1" 2>&1 & p1=$!
run test_matmul_v8 cortex-a53 "ref neon" >"$out/r2" 2>&1 & p2=$!
wait $p1 || status=1
wait $p2 || status=1
cat "$out/r1" "$out/r2"
if ((san)); then
  run test_matmul_san max "ref neon neondot" >"$out/r3" 2>&1 & p3=$!
else
  echo "== no aarch64 libasan/libubsan: no sanitizer run" >"$out/r3"; p3=
fi
run test_matmul_v8 max "ref neon neondot" || status=1
[ -z "$p3" ] || wait $p3 || status=1
cat "$out/r3"
if ((status)); then echo "cross_neon: FAILED" >&2; exit 1; fi
if ((!san)); then  # the rest passed, but not all of it ran: CTest's "Skipped", not "Passed"
  echo "SKIPPED part: the sanitizer run (no aarch64 libasan/libubsan: gcc-aarch64-linux-gnu brings them)"
  exit 77
fi
echo "cross_neon: ok"
