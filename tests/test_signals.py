#!/usr/bin/env python3
"""test_signals.py - `run --local-stages 2` ended by a signal or by its reader leaves nothing behind:
its private temporary directory (the run's key, worker logs, sockets) is removed and no worker
process survives, on every way out (issue 16).

Each case runs with TMPDIR set to a fresh folder of its own (so the run's directory is the only
thing that could appear there) on a 6-layer synthetic model (always written, so the test never
skips), with --sim-latency-ms 20: every token takes at least two 20 ms hops, so a 100000-token
generation cannot end by itself within the test (hours). Cases:
  1. SIGINT once the first token is on stdout: exit 130, the text ends with a newline, the
     --stats JSON line is printed; SIGTERM the same with 143.
  2. SIGINT during start-up: the prompt file is a FIFO nobody opens, so the run blocks after
     starting its worker and before generating; SIGINT once the worker exists: exit 130.
  3. a second SIGINT while the first waits for a stopped (SIGSTOP) worker: exit 130 at once,
     the stopped worker killed (the stage timeout, 10 minutes, is not what ends it).
  4. the reader closes stdout after the first bytes (`| head -c 10`): exit 141, nothing on stderr.
A sanitizer build (PIPESHARD_BIN) must report nothing: the cancelled run frees everything.
Waits are for events (bytes on stdout, a process appearing, a signal no longer pending); each has a
120 s limit, against well under a second on an idle machine. Exit 0 pass, 1 fail.
"""
import json
import os
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pstest import check, conclude, require, synth_small, tmpdir  # noqa: E402
from psworker import die_with_parent  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
LIMIT = 120  # seconds for any awaited event (under a second on an idle machine)
TMP = None


def wait_for(what, cond):
    """Polls cond every 20 ms until it holds, at most LIMIT seconds; require()s it."""
    deadline = time.time() + LIMIT
    while not cond() and time.time() < deadline:
        time.sleep(0.02)
    require(cond(), f"waited {LIMIT} s for {what}")


def workers_of(tmp):
    """Pids of the processes whose command line names tmp (the local workers: their --key-file
    lies in the run's directory under TMPDIR)."""
    pids, needle = [], tmp.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{d}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and b"worker" in cmd and state != b"Z":
            pids.append(int(d))
    return pids


def start(name, args, stdout=subprocess.PIPE):
    """`run --local-stages 2` with TMPDIR a fresh folder; returns (process, folder, stderr path)."""
    tmp = os.path.join(TMP, name)
    os.makedirs(tmp)
    err = os.path.join(TMP, f"{name}.err")
    env = dict(os.environ, TMPDIR=tmp, PIPESHARD_CACHE="off")
    cmd = [BIN, "run", "-m", MODEL, "--local-stages", "2", "--sim-latency-ms", "20", "-t", "1", "--ignore-eos",
           "--stage-timeout-ms", "600000"] + args
    with open(err, "wb") as e:
        p = subprocess.Popen(cmd, stdout=stdout, stderr=e, env=env, preexec_fn=die_with_parent)
    return p, tmp, err


def first_bytes(p):
    """Waits for the first bytes on p's stdout; returns them."""
    ready, _, _ = select.select([p.stdout], [], [], LIMIT)
    require(ready, f"no output within {LIMIT} s")
    return os.read(p.stdout.fileno(), 4096)


def finish(p, name, tmp, err, want_rc):
    """Waits for p's end; checks its status, that tmp is empty and that no worker survives.
    Returns (rest of stdout, stderr)."""
    out, deadline = b"", time.time() + LIMIT
    fd = p.stdout.fileno() if p.stdout and not p.stdout.closed else None
    if fd is not None:
        os.set_blocking(fd, False)  # a surviving worker may hold the pipe open: never block on it
    while p.poll() is None and time.time() < deadline:
        if fd is not None and select.select([fd], [], [], 0.02)[0]:
            out += os.read(fd, 65536)
        elif fd is None:
            time.sleep(0.02)
    if p.poll() is None:
        p.kill()
        p.wait()
    try:
        out += os.read(fd, 65536) if fd is not None else b""
    except BlockingIOError:
        pass
    with open(err, "rb") as f:
        e = f.read().decode(errors="replace")
    check(p.returncode == want_rc, f"{name}: exit {p.returncode}, want {want_rc}; stderr: {e[-500:]}")
    check("Sanitizer" not in e, f"{name}: a sanitizer report (leak, bad access): {e[-2000:]}")
    left = os.listdir(tmp)
    check(not left, f"{name}: the run left {left} in TMPDIR")
    survivors = workers_of(tmp)
    check(not survivors, f"{name}: worker processes survive: {survivors}")
    for pid in survivors:  # not to leave them to the machine
        os.kill(pid, signal.SIGKILL)
    return out, e


def signal_in_generation(sig, want_rc):
    """Case 1: a signal once generation has started ends the run cleanly."""
    name = f"gen-{signal.Signals(sig).name}"
    p, tmp, err = start(name, ["-p", "hello", "-n", "100000", "--stats"])
    head = first_bytes(p)
    require(workers_of(tmp), f"{name}: no worker found")
    p.send_signal(sig)
    out, e = finish(p, name, tmp, err, want_rc)
    text = head + out
    check(text.endswith(b"\n"), f"{name}: the text does not end with a newline: {text[-40:]!r}")
    lines = [ln for ln in e.splitlines() if ln.startswith("{")]
    stats = json.loads(lines[-1]) if lines else {}
    check(0 < stats.get("generated_tokens", 0) < 100000, f"{name}: no --stats line: {e[-500:]!r}")


def signal_in_startup():
    """Case 2: SIGINT while the run is starting (blocked opening a FIFO for its prompt)."""
    fifo = os.path.join(TMP, "prompt.fifo")
    os.mkfifo(fifo)
    p, tmp, err = start("startup", ["-f", fifo, "-n", "5"])
    wait_for("the local worker", lambda: workers_of(tmp))
    p.send_signal(signal.SIGINT)
    finish(p, "startup", tmp, err, 130)


def pending(pid, sig):
    """Whether sig is pending for the process pid (ShdPnd of /proc/pid/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("ShdPnd:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def second_sigint():
    """Case 3: the first SIGINT waits for a stopped worker; the second ends the run at once."""
    p, tmp, err = start("second", ["-p", "hello", "-n", "100000"])
    first_bytes(p)
    w = workers_of(tmp)
    require(w, "second: no worker found")
    os.kill(w[0], signal.SIGSTOP)
    p.send_signal(signal.SIGINT)
    wait_for("the first SIGINT to be handled", lambda: p.poll() is not None or not pending(p.pid, signal.SIGINT))
    t0 = time.time()
    p.send_signal(signal.SIGINT)
    finish(p, "second", tmp, err, 130)
    check(time.time() - t0 < LIMIT, "second: the second SIGINT did not end the run")


def reader_goes_away():
    """Case 4: `| head -c 10`: the reader closes the pipe after the first bytes."""
    p, tmp, err = start("pipe", ["-p", "hello", "-n", "100000"])
    first_bytes(p)
    p.stdout.close()
    _, e = finish(p, "pipe", tmp, err, 128 + signal.SIGPIPE)
    check(e == "", f"pipe: stderr is not empty: {e[-500:]!r}")


def main():
    global TMP, MODEL
    t0 = time.time()
    TMP = tmpdir("signals-")
    MODEL = os.path.join(TMP, "synth.gguf")
    synth_small(MODEL)
    for case in (lambda: signal_in_generation(signal.SIGINT, 130), lambda: signal_in_generation(signal.SIGTERM, 143),
                 signal_in_startup, second_sigint, reader_goes_away):
        try:
            case()
        except AssertionError:
            pass
    return conclude(TMP, t0)


if __name__ == "__main__":
    sys.exit(main())
