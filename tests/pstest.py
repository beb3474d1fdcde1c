"""pstest.py - what the Python tests share: a check counter and the ASan re-exec.

    from pstest import check, verdict, reexec_with_asan
    check(cond, "what went wrong")   # counts, prints FAIL lines on stderr, returns cond
    return verdict()                 # prints "ok: N checks" or "FAILED: ..."; 0 or 1
    tmp = tmpdir("name-")            # a fresh folder under $PS_TEST_TMP (or the system's)
    return conclude(tmp, t0)         # removes it unless a check failed, then verdict()
"""
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

_count = {"checks": 0, "failures": 0}


def check(cond, what):
    """Counts one check; prints what failed on stderr. Returns cond."""
    _count["checks"] += 1
    if not cond:
        _count["failures"] += 1
        print(f"FAIL: {what}", file=sys.stderr)
    return cond


def failures():
    return _count["failures"]


def verdict(extra=""):
    """Prints the summary line; returns the exit status (0 pass, 1 fail)."""
    n, bad = _count["checks"], _count["failures"]
    if bad:
        print(f"FAILED: {bad} of {n} checks")
        return 1
    print(f"ok: {n} checks{extra}")
    return 0


def tmpdir(prefix):
    """A fresh folder for a test's files, under $PS_TEST_TMP when it is set (created if need
    be), else the system's temporary folder."""
    base = os.environ.get("PS_TEST_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def conclude(tmp, t0):
    """Removes tmp, or keeps it (and says so) when a check failed; returns verdict() with the
    time since t0."""
    if failures():
        print(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return verdict(f" in {time.time() - t0:.1f} s")


def reexec_with_asan(lib=None):
    """A sanitizer build of the library needs the ASan runtime loaded before Python: re-run
    this script with it preloaded, leak checks off (the interpreter itself leaks). No-op for
    a normal build, or when already preloaded."""
    lib = lib or os.environ.get("PS_LIBPSCORE", "")
    if not lib or "libasan" in os.environ.get("LD_PRELOAD", ""):
        return
    try:
        ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    except OSError:
        return
    for line in ldd.splitlines():
        if "libasan" in line and "=>" in line:
            env = dict(os.environ, LD_PRELOAD=line.split("=>")[1].split()[0],
                       ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
            sys.stdout.flush()
            os.execve(sys.executable, [sys.executable] + sys.argv, env)


def read_ready_port(r, timeout=60):
    """The port a starting `pipeshard worker --ready-fd W` writes to the pipe whose read end is r
    (its "unix:PATH" address when it listens on a Unix socket), read until the worker closes its
    end (r is closed here); None when it did not start."""
    got, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.time()))
        chunk = os.read(r, 64) if ready else b""
        if not chunk:
            break
        got += chunk
    os.close(r)
    line = got.decode(errors="replace").strip()
    return int(line) if line.isdigit() else line if line.startswith("unix:") else None
