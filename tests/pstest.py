"""pstest.py - what the Python tests share: a check counter, visible skips and the ASan re-exec.

    from pstest import check, require, skip, verdict, reexec_with_asan
    check(cond, "what went wrong")   # counts, prints FAIL lines on stderr, returns cond
    require(cond, "what went wrong") # the same, then raises CheckFailed: ends the case, as assert
                                     # did (what may be a callable, evaluated only on failure);
                                     # never a plain assert, which `python -O` removes
    skip("what could not run, why")  # a part that could not run (a model absent): verdict is 77
    return verdict()                 # prints "ok: N checks" or "FAILED: ..."; 0, 1 or 77 (SKIP)
    tmp = tmpdir("name-")            # a fresh folder under $PS_TEST_TMP (or the system's)
    synth_small(path)                # the small synthetic model local-fleet tests split
    rc, out, term = on_terminal(args)  # a run with stderr a pseudo-terminal (progress lines)
    return conclude(tmp, t0)         # removes it unless a check failed, then verdict()
"""
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

_count = {"checks": 0, "failures": 0}
_skipped = []
SKIP = 77  # CTest's SKIP_RETURN_CODE (CMakeLists.txt): "Skipped", never "Passed"


class CheckFailed(AssertionError):
    """Raised by require(): a failed check that ends the current case."""


def check(cond, what):
    """Counts one check; prints what failed on stderr (what: a string, or a callable giving
    one, called only on failure). Returns cond."""
    _count["checks"] += 1
    if not cond:
        _count["failures"] += 1
        print(f"FAIL: {what() if callable(what) else what}", file=sys.stderr)
    return cond


def require(cond, what):
    """check(cond, what), then raises CheckFailed(what) when cond is false: for a check the rest
    of a case depends on. Unlike assert it stays under `python -O`."""
    if not check(cond, what):
        raise CheckFailed(what() if callable(what) else what)


def skip(what):
    """Records a part of the test that could not run (a model file or a tool absent) and prints
    it. verdict() then returns SKIP (77) when every check that ran passed, so that CTest reports
    "Skipped", never "Passed", for a test that did not run all of itself."""
    _skipped.append(what)
    print(f"SKIPPED part: {what}")


def skipped():
    """The parts skip() recorded, in order."""
    return list(_skipped)


def exit_status(failed):
    """The exit status of a test that counts its own failed cases: 1 when any failed or a
    check failed, else SKIP when a part was skipped (listed once more), else 0."""
    if failed or failures():
        return 1
    if _skipped:
        print(f"SKIPPED: {len(_skipped)} part(s) did not run: " + "; ".join(_skipped))
        return SKIP
    return 0


def failures():
    return _count["failures"]


def verdict(extra=""):
    """Prints the summary line; returns the exit status (0 pass, 1 fail, SKIP when every check
    passed but a part was skipped)."""
    n, bad = _count["checks"], _count["failures"]
    if bad:
        print(f"FAILED: {bad} of {n} checks")
        return 1
    print(f"ok: {n} checks{extra}")
    return exit_status(0)


def tmpdir(prefix):
    """A fresh folder for a test's files, under $PS_TEST_TMP when it is set (created if need
    be), else the system's temporary folder."""
    base = os.environ.get("PS_TEST_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def synth_small(path):
    """Writes the small synthetic Q8_0 model (6 layers, width 128, vocabulary 768, seed 1) that
    the local-fleet tests split into stages; requires `pipeshard synth` to succeed."""
    p = subprocess.run([os.environ.get("PIPESHARD_BIN", "build/pipeshard"), "synth", "--like", "tiny", "--layers",
                        "6", "--dim", "128", "--ffn", "384", "--heads", "4", "--kv-heads", "2", "--vocab", "768",
                        "--type", "Q8_0", "--seed", "1", "-o", path], capture_output=True, text=True)
    require(p.returncode == 0, f"synth: {p.stderr}")
    return path


def spec_trace(line):
    """A PS_SPEC_TRACE=1 line ("spec trace: seq 0 k 2 kept 2 ... | accept 0.93 ... | k:wait_ms/tok_s
    ... | next 4 reach 5") as {field: number}: each "name value" pair before the per-K list, next
    and reach; None for any other line."""
    if not line.startswith("spec trace: "):
        return None
    head, _, tail = line.partition("| k:")
    fields = {key: float(value) for key, value in re.findall(r"(\w+) (-?[\d.]+)\b", head)}
    m = re.search(r"\| next (\d+) reach (\d+)$", tail)
    if m:
        fields["next"], fields["reach"] = int(m.group(1)), int(m.group(2))
    return fields


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


def on_terminal(args, env=None, limit=300):
    """Runs args with stderr a pseudo-terminal; returns (exit status, stdout bytes, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    got, deadline = b"", time.time() + limit
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.time()))
        if not ready:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every holder of the terminal has closed it
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    try:
        out, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return p.returncode, out, got.decode(errors="replace")
