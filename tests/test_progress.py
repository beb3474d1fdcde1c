#!/usr/bin/env python3
"""test_progress.py - `run` shows what a long silent wait is doing on a terminal, and nothing
elsewhere (issue 16).

On a 6-layer synthetic model (always written: the test never skips), `run --local-stages 2` with
the split cache off (so it splits every time) and a 40-token prompt in chunks of 8 (-b 8):
  1. stderr a pseudo-terminal (python pty): it shows "splitting model into 2 stages: N%",
     "starting 1 worker", "loading model" and "prompt: 8/40 tokens" on one line rewritten with
     \\r, cleared (\\r ESC[K) before the run ends; none of it reaches stdout, whose text is the
     same as without a terminal.
  2. stderr a file: it stays empty on success.
Exit 0 pass, 1 fail.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pstest import check, conclude, on_terminal, synth_small, tmpdir  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
LIMIT = 300  # seconds for a run (about one on an idle machine)


def run_args(model):
    ids = ",".join(str(1 + i % 700) for i in range(40))
    return [BIN, "run", "-m", model, "--local-stages", "2", "-t", "1", "-b", "8", "--prompt-ids", ids, "-n", "4",
            "--temp", "0", "--print-ids"]


def main():
    t0 = time.time()
    tmp = tmpdir("progress-")
    model = os.path.join(tmp, "synth.gguf")
    synth_small(model)
    env = dict(os.environ, PIPESHARD_CACHE="off", TMPDIR=tmp)

    plain = subprocess.run(run_args(model), capture_output=True, env=env, timeout=LIMIT)
    check(plain.returncode == 0, f"no terminal: exit {plain.returncode}: {plain.stderr!r}")
    check(plain.stderr == b"", f"no terminal: stderr is not empty: {plain.stderr[-300:]!r}")

    rc, out, term = on_terminal(run_args(model), env, LIMIT)
    check(rc == 0, f"terminal: exit {rc}: {term[-300:]!r}")
    check(out == plain.stdout, f"terminal: stdout {out!r} differs from {plain.stdout!r}")
    for want in ("splitting model into 2 stages: ", "%", "starting 1 worker", "loading model", "prompt: 8/40 tokens",
                 "prompt: 40/40 tokens"):
        check(want in term, f"terminal: no '{want}' in {term!r}")
    check("\r" in term and "\n" not in term, f"terminal: not one line rewritten in place: {term!r}")
    check(term.endswith("\r\x1b[K"), f"terminal: the progress line is not cleared at the end: {term[-60:]!r}")
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
