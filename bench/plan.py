#!/usr/bin/env python3
"""plan.py - `pipeshard plan`'s predicted decode speed against the measured one, on a local fleet
of uneven "hosts", and against the byte-balanced split (`split --stages`) on the same hosts.

  bench/plan.py [--model llama-3.2-1b:Q4_0] [--tokens 64] [--repeats 3]

The hosts are worker processes on this machine made uneven by their thread counts and memory
caps (hosts.json's "mem"): by default "big" (2 threads), "small" (1 thread) and "tiny" (1
thread), with memory for about 55 %, 45 % and 45 % of the model file, so that it must be split. Each
host's ms_per_gb comes from `pipeshard probe -m MODEL -t THREADS` run just before. Stage 0
runs in the coordinator with its host's threads. Decode tok/s from `run --fleet --stats`
(greedy, a 16-token prompt), median of --repeats, alternating the plan's fleet and the
byte-balanced one. Prints the plan, then predicted / measured / ratio per fleet.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PIPESHARD_BIN", os.path.join(ROOT, "build", "pipeshard"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from psworker import Worker  # noqa: E402


def sh(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode:
        sys.exit(f"{' '.join(args)}: {p.stderr}")
    return p.stdout


def decode(fleet, key, threads, tokens):
    p = subprocess.run([BIN, "run", "--fleet", fleet, "--key-file", key, "--prompt-ids", ",".join(["1"] * 16),
                        "-n", str(tokens), "--ignore-eos", "--temp", "0", "-t", str(threads), "--stats"],
                       capture_output=True, text=True, timeout=1200)
    if p.returncode:
        sys.exit(f"run --fleet {fleet}: {p.stderr}")
    return json.loads([l for l in p.stderr.splitlines() if l.startswith("{")][-1])["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b:Q4_0")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    shape, qtype = a.model.split(":")
    cache = os.path.join(ROOT, ".cache", "bench")
    os.makedirs(cache, exist_ok=True)
    model = os.path.join(cache, f"{shape}-{qtype}.gguf")
    if not os.path.exists(model):
        sh([BIN, "synth", "--like", shape, "--type", qtype, "-o", model])
    tmp = tempfile.mkdtemp(prefix="plan_", dir=os.path.join(ROOT, "bench", "out"))
    key = os.path.join(tmp, "key")
    sh([BIN, "keygen", "-o", key])
    size = os.path.getsize(model)
    hosts = [("big", 2, 0.55), ("small", 1, 0.45), ("tiny", 1, 0.45)]
    entries = []
    for name, threads, share in hosts:
        out = sh([BIN, "probe", "-m", model, "-t", str(threads), "--name", name, "--address", "127.0.0.1:1"])
        e = json.loads(out.strip().splitlines()[-1])
        e["mem"] = int(size * share)
        entries.append(e)
        print(f"probe {name}: {threads} thread(s), {e['ms_per_gb']} ms per GB")
    hj = os.path.join(tmp, "hosts.json")
    with open(hj, "w") as f:
        json.dump({"hosts": entries, "default_link": {"rtt_ms": 0.2, "mbps": 10000}}, f)
    plan_dir = os.path.join(tmp, "plan")
    out = sh([BIN, "plan", "-m", model, "--hosts", hj, "--ctx", "256", "-o", plan_dir])
    print(out)
    predicted = float(re.search(r"([\d.]+) tok/s one stream", out).group(1))
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(\d+):(\d+)\s", out, re.M)
    order = [r[1] for r in rows]
    threads_of = {n: t for n, t, _ in hosts}
    # the byte-balanced split over the same hosts in the same order
    even_dir = os.path.join(tmp, "even")
    sh([BIN, "split", "-m", model, "--stages", str(len(order)), "-o", even_dir, "--quiet"])
    with open(os.path.join(even_dir, "fleet.json")) as f:
        even = json.load(f)
    print("byte-balanced split:", [tuple(s["layers"]) for s in even["stages"]])

    def start(split_dir, tag):
        with open(os.path.join(split_dir, "fleet.json")) as f:
            fleet = json.load(f)
        ws = []
        for k in range(1, len(order)):
            w = Worker(BIN, os.path.join(split_dir, fleet["stages"][k]["shard"]), os.path.join(tmp, f"{tag}-{k}.log"),
                       order[k], key=key, threads=threads_of[order[k]])
            fleet["stages"][k]["address"] = w.addr
            ws.append(w)
        path = os.path.join(split_dir, "fleet-local.json")
        with open(path, "w") as f:
            json.dump(fleet, f)
        return path, ws

    results = {"plan": [], "even": []}
    fleets = {"plan": start(plan_dir, "plan"), "even": start(even_dir, "even")}
    try:
        for r in range(a.repeats):
            for tag in (("plan", "even") if r % 2 == 0 else ("even", "plan")):
                results[tag].append(decode(fleets[tag][0], key, threads_of[order[0]], a.tokens))
    finally:
        for _, ws in fleets.values():
            for w in ws:
                w.stop()
    print(f"\n{'fleet':<22} {'decode tok/s (median)':>22} {'runs':>28}")
    for tag, label in (("plan", "plan's placement"), ("even", "byte-balanced split")):
        runs = results[tag]
        print(f"{label:<22} {statistics.median(runs):>22.2f} {' '.join(f'{x:.2f}' for x in runs):>28}")
    m = statistics.median(results["plan"])
    print(f"\npredicted {predicted:.2f} tok/s, measured {m:.2f}: measured / predicted = {m / predicted:.2f}; "
          f"plan / byte-balanced = {m / statistics.median(results['even']):.2f}")


if __name__ == "__main__":
    main()
