#!/usr/bin/env python3
"""recovery.py - how long a fleet pauses when a stage dies mid-generation, against the length of
the sequence it must replay, beside the time a prefill of that length takes.

  bench/recovery.py [--model llama-3.2-1b:Q4_0] [--contexts 64,256,1024] [--threads 1]

A 2-stage fleet on loopback (stage 1 a worker, a standby started with --cache); for each
context length L: an undisturbed run of an L-token prompt and 32 greedy tokens (its --stats
time to first token is the prefill of L tokens on this fleet), then the same run with the
stage-1 worker killed (SIGKILL) once 8 tokens are out. The pause is the longest gap between
two tokens on stdout (the replay of L + 8 positions, the standby's connection and its shard's
transfer included); the tokens must equal the undisturbed run's.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from common import BIN, ROOT, sh, synth_model  # noqa: E402 (also puts tests/ on the path)

from psworker import Worker  # noqa: E402



def generate(fleet, key, n_prompt, threads, standby=None, kill=None):
    """Runs the fleet, reading token ids as they come; kills `kill` after 8. Returns (ids, the
    longest gap between tokens in s, --stats)."""
    args = [BIN, "run", "--fleet", fleet, "--key-file", key, "--prompt-ids", ",".join(["7"] * n_prompt), "-n", "32",
            "--ignore-eos", "--temp", "0", "--print-ids", "-t", str(threads), "-c", str(n_prompt + 64), "--stats"]
    if standby:
        args += ["--standby", standby]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    ids, times, word = [], [], ""
    while True:
        ch = p.stdout.read(1)
        if not ch:
            break
        if ch.isspace():
            if word:
                ids.append(word)
                times.append(time.time())
                if kill and len(ids) == 8:
                    kill.p.send_signal(signal.SIGKILL)
            word = ""
        else:
            word += ch
    err = p.stderr.read()
    p.wait()
    if p.returncode:
        sys.exit(f"run: {err}")
    stats = json.loads([l for l in err.splitlines() if l.startswith("{")][-1])
    gap = max((b - a for a, b in zip(times, times[1:])), default=0)
    return ids, gap, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b:Q4_0")
    ap.add_argument("--contexts", default="64,256,1024")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    model = synth_model(a.model)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="recovery_", dir=os.path.join(ROOT, "bench", "out"))
    key = os.path.join(tmp, "key")
    sh([BIN, "keygen", "-o", key])
    split = os.path.join(tmp, "split")
    sh([BIN, "split", "-m", model, "--stages", "2", "-o", split, "--quiet"])
    print(f"{'context':>8} {'prefill ms':>11} {'pause ms':>9} {'reconnect ms':>13} {'pause / prefill':>16}  tokens")
    for n in [int(x) for x in a.contexts.split(",")]:
        def fleet(tag, standby):
            w = Worker(BIN, os.path.join(split, "stage-1.gguf"), os.path.join(tmp, f"{tag}.log"), "stage 1",
                       key=key, threads=a.threads)
            sb = Worker(BIN, None, os.path.join(tmp, f"{tag}-sb.log"), "standby", key=key, threads=a.threads,
                        cache=os.path.join(tmp, f"{tag}-cache")) if standby else None
            with open(os.path.join(split, "fleet.json")) as f:
                fj = json.load(f)
            fj["stages"][1]["address"] = w.addr
            fj["stages"][0]["shard"] = os.path.join(split, "stage-0.gguf")
            fj["stages"][1]["shard"] = os.path.join(split, "stage-1.gguf")
            path = os.path.join(split, f"fleet-{tag}.json")
            with open(path, "w") as f:
                json.dump(fj, f)
            return path, w, sb

        path, w, _ = fleet(f"ref{n}", False)
        ref, _, st = generate(path, key, n, a.threads)
        w.stop()
        path, w, sb = fleet(f"kill{n}", True)
        got, gap, st2 = generate(path, key, n, a.threads, standby=sb.addr, kill=w)
        w.stop(), sb.stop()
        prefill = st["ttft_ms"]
        print(f"{n:>8} {prefill:>11.0f} {gap * 1e3:>9.0f} {st2.get('recovery_ms', 0):>13.0f} "
              f"{gap * 1e3 / prefill:>16.2f}  {'same' if got == ref else 'DIFFER'}")


if __name__ == "__main__":
    main()
