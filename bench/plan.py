#!/usr/bin/env python3
"""plan.py - `pipeshard plan`'s predicted decode speed against the measured one, on a local fleet
of uneven "hosts", and against the byte-balanced split (`split --stages`) on the same hosts.

  bench/plan.py [--model llama-3.2-1b:Q4_0] [--tokens 64] [--repeats 3]
                [--hosts-spec NAME:THREADS[:CPUS[:MEM]],...] [--sim-latency-ms MS] [--pin]

The hosts are worker processes on this machine made uneven by their thread counts, their cores
and their memory caps (hosts.json's "mem"). --hosts-spec lists them: a name, the threads of its
worker (and of `probe`), the cores it runs on (a `taskset -c` list such as 0-3 or 4,6; empty: no
taskset, the cores shared with the others) and the memory it offers as a fraction of the model
file (default 0.45: no host holds the model, so it is split over three hosts at least). The
default, for the 2-core development VM, is "big:2::0.55,small:1::0.45,tiny:1::0.45" (no taskset).
On a machine with cores to spare give each host cores of its own, e.g. on 16 cores
"big:6:0-5:0.55,mid:4:6-9,small:2:10-11,tiny:1:12" with --pin.

Each host's ms_per_gb comes from `pipeshard probe -m MODEL -t THREADS` on its cores, run just
before, one host at a time. Stage 0 runs in the coordinator (`run --fleet`) on its host's cores
with its threads; every other stage is a `pipeshard worker` on its host's cores. --sim-latency-ms
MS delays every hop by MS one way (`--sim-latency-ms` of `run` and of each worker), and hosts.json's
default_link says so: rtt_ms = 0.2 + 2 × MS (the model's hop is half the round trip), so that the
predicted hop time is exercised. --pin pins each process's threads to its cores (`--pin` of run
and worker; only for hosts with cores of their own).

Decode tok/s from `run --fleet --stats` (greedy, a 16-token prompt), median of --repeats,
alternating the plan's fleet and the byte-balanced one (the same hosts in the same order, the
layers cut by `split --stages`). Prints the plan, then per fleet its stages, the predicted tok/s
(the cost model of src/coord/plan.h, as tests/test_plan_cli.py writes it out; for the plan's
fleet it is plan's own figure), the measured tok/s and measured / predicted, and plan /
byte-balanced, predicted and measured.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import BIN, ROOT, sh, synth_model  # noqa: E402 (also puts tests/ on the path)

import gguf  # noqa: E402
from psworker import Worker  # noqa: E402
from test_plan_cli import model_sizes, predict, stage_extra  # noqa: E402

DEFAULT_HOSTS = "big:2::0.55,small:1::0.45,tiny:1::0.45"
BASE_RTT_MS = 0.2  # loopback, as hosts.json's default_link says without emulated latency



def parse_hosts(spec):
    """--hosts-spec into [{name, threads, cpus, share}]; exits on a malformed one."""
    hosts = []
    for item in spec.split(","):
        f = item.split(":")
        if not 2 <= len(f) <= 4 or not f[0] or not f[1].isdigit() or int(f[1]) < 1:
            sys.exit(f"--hosts-spec: '{item}' is not NAME:THREADS[:CPUS[:MEM]]")
        cpus = f[2] if len(f) > 2 else ""
        if cpus and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cpus):
            sys.exit(f"--hosts-spec: '{item}': CPUS must be a taskset list such as 0-3 or 4,6")
        try:
            share = float(f[3]) if len(f) > 3 and f[3] else 0.45
        except ValueError:
            share = -1
        if not 0 < share <= 64:
            sys.exit(f"--hosts-spec: '{item}': MEM must be a positive fraction of the model file")
        if any(h["name"] == f[0] for h in hosts):
            sys.exit(f"--hosts-spec: two hosts are named '{f[0]}'")
        hosts.append({"name": f[0], "threads": int(f[1]), "cpus": cpus, "share": share})
    return hosts


def cpu_set(cpus):
    out = set()
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def check_cpus(hosts):
    """Warnings for cores that are not ours, hosts that share cores, more threads than cores."""
    if not any(h["cpus"] for h in hosts):
        return
    if not shutil.which("taskset"):
        sys.exit("--hosts-spec gives cores, but taskset is not installed (util-linux)")
    ours, seen = os.sched_getaffinity(0), {}
    for h in hosts:
        if not h["cpus"]:
            print(f"note: host {h['name']} has no cores of its own: it shares them with the others")
            continue
        s = cpu_set(h["cpus"])
        if not s <= ours:
            sys.exit(f"host {h['name']}: cores {sorted(s - ours)} are not this process's ({sorted(ours)})")
        if len(s) < h["threads"]:
            print(f"note: host {h['name']}: {h['threads']} threads on {len(s)} core(s)")
        for c in s:
            if c in seen:
                print(f"note: hosts {seen[c]} and {h['name']} share core {c}")
            seen[c] = h["name"]


def prefix(host):
    return ["taskset", "-c", host["cpus"]] if host["cpus"] else []


def dims(path):
    """(dim, q_dim, kv_dim, ffn) from the model's metadata, for the cost model's hop and buffers."""
    r = gguf.GGUFReader(path)

    def meta(key, default=None):
        v = r.fields.get(key)
        return int(v.parts[v.data[0]][0]) if v is not None else default

    arch = bytes(r.fields["general.architecture"].parts[r.fields["general.architecture"].data[0]]).decode()
    dim, n_head = meta(f"{arch}.embedding_length"), meta(f"{arch}.attention.head_count")
    head_dim = meta(f"{arch}.attention.key_length", dim // n_head)
    n_kv = meta(f"{arch}.attention.head_count_kv", n_head)
    return dim, n_head * head_dim, n_kv * head_dim, meta(f"{arch}.feed_forward_length")


def decode(fleet, key, host, a):
    cmd = prefix(host) + [BIN, "run", "--fleet", fleet, "--key-file", key, "--prompt-ids", ",".join(["1"] * 16),
                          "-n", str(a.tokens), "--ignore-eos", "--temp", "0", "-t", str(host["threads"]), "--stats"]
    cmd += (["--sim-latency-ms", str(a.sim_latency_ms)] if a.sim_latency_ms else []) + (["--pin"] if a.pin else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    return json.loads([line for line in p.stderr.splitlines() if line.startswith("{")][-1])["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description="plan's predicted decode speed against the measured one")
    ap.add_argument("--model", default="llama-3.2-1b:Q4_0", help="synth preset SHAPE:TYPE (llama-3.2-1b:Q4_0)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per run (64)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each fleet, alternating (3)")
    ap.add_argument("--hosts-spec", default=DEFAULT_HOSTS,
                    help=f"NAME:THREADS[:CPUS[:MEM]],... (see above; default {DEFAULT_HOSTS})")
    ap.add_argument("--sim-latency-ms", type=float, default=0,
                    help="emulated one-way delay of every hop, ms; hosts.json's rtt_ms = 0.2 + 2 x this (0)")
    ap.add_argument("--pin", action="store_true", help="--pin to run and the workers (hosts with cores of their own)")
    a = ap.parse_args()
    hosts = parse_hosts(a.hosts_spec)
    check_cpus(hosts)
    by_name = {h["name"]: h for h in hosts}
    model = synth_model(a.model)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="plan_", dir=os.path.join(ROOT, "bench", "out"))
    key = os.path.join(tmp, "key")
    sh([BIN, "keygen", "-o", key])
    size = os.path.getsize(model)
    entries = []
    for h in hosts:
        out = sh(prefix(h) + [BIN, "probe", "-m", model, "-t", str(h["threads"]), "--name", h["name"], "--address",
                              "127.0.0.1:1"])
        e = json.loads(out.strip().splitlines()[-1])
        e["mem"] = int(size * h["share"])
        entries.append(e)
        where = f" on cores {h['cpus']}" if h["cpus"] else ""
        print(f"probe {h['name']}: {h['threads']} thread(s){where}, {e['ms_per_gb']} ms per GB, "
              f"{h['share']:.2f} of the model's memory")
    rtt = BASE_RTT_MS + 2 * a.sim_latency_ms
    default_link = {"rtt_ms": rtt, "mbps": 10000}
    hj = os.path.join(tmp, "hosts.json")
    with open(hj, "w") as f:
        json.dump({"hosts": entries, "default_link": default_link}, f)
    if a.sim_latency_ms:
        print(f"emulated latency: {a.sim_latency_ms} ms one way on every hop; hosts.json rtt_ms {rtt}")
    plan_dir = os.path.join(tmp, "plan")
    out = sh([BIN, "plan", "-m", model, "--hosts", hj, "--ctx", "256", "-o", plan_dir])
    print(out)
    predicted_plan = 1000 / float(re.search(r"predicted: ([\d.]+) ms per token", out).group(1))
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(\d+):(\d+)\s", out, re.M)
    order = [r[1] for r in rows]
    # the byte-balanced split over the same hosts in the same order
    even_dir = os.path.join(tmp, "even")
    sh([BIN, "split", "-m", model, "--stages", str(len(order)), "-o", even_dir, "--quiet"])

    def layers(split_dir):
        with open(os.path.join(split_dir, "fleet.json")) as f:
            return [tuple(s["layers"]) for s in json.load(f)["stages"]]

    # the cost model for both placements (plan's own figure for its placement, checked against it)
    sizes, dm = model_sizes(model), dims(model)
    model_hosts = [{"mem": e["mem"], "ms_per_gb": e["ms_per_gb"]} for e in entries]
    names = [h["name"] for h in hosts]
    idx = [names.index(n) for n in order]
    predicted, fits = {}, {}
    for tag, d in (("plan", plan_dir), ("even", even_dir)):
        bounds = [0] + [b for _, b in layers(d)]
        t, ok, _ = predict(model_hosts, {}, (rtt, 10000), sizes, dm, 256, 1, idx, bounds, stage_extra(out))
        predicted[tag], fits[tag] = 1000 / t, ok
    if abs(predicted["plan"] - predicted_plan) > 1e-3 * predicted_plan:
        print(f"note: the cost model here gives {predicted['plan']:.2f} tok/s for the plan, plan says {predicted_plan}")
    predicted["plan"] = predicted_plan
    print("byte-balanced split:", layers(even_dir), "" if fits["even"] else "(does not fit the hosts' memory)")

    def start(split_dir, tag):
        with open(os.path.join(split_dir, "fleet.json")) as f:
            fleet = json.load(f)
        ws = []
        extra = (["--sim-latency-ms", str(a.sim_latency_ms)] if a.sim_latency_ms else []) + (["--pin"] if a.pin else [])
        for k in range(1, len(order)):
            h = by_name[order[k]]
            w = Worker(BIN, os.path.join(split_dir, fleet["stages"][k]["shard"]), os.path.join(tmp, f"{tag}-{k}.log"),
                       h["name"], key=key, threads=h["threads"], prefix=prefix(h), extra=extra)
            fleet["stages"][k]["address"] = w.addr
            ws.append(w)
        path = os.path.join(split_dir, "fleet-local.json")
        with open(path, "w") as f:
            json.dump(fleet, f)
        return path, ws

    results = {"plan": [], "even": []}
    fleets = {}
    try:
        for tag, d in (("plan", plan_dir), ("even", even_dir)):
            fleets[tag] = start(d, tag)
        for r in range(a.repeats):
            for tag in (("plan", "even") if r % 2 == 0 else ("even", "plan")):
                results[tag].append(decode(fleets[tag][0], key, by_name[order[0]], a))
    finally:
        for _, ws in fleets.values():
            for w in ws:
                w.stop()
    med = {tag: statistics.median(results[tag]) for tag in results}
    print(f"\n{'fleet':<20} {'stages (host layers)':<36} {'predicted':>9} {'measured':>9} {'meas/pred':>9}   runs")
    for tag, label, d in (("plan", "plan's placement", plan_dir), ("even", "byte-balanced split", even_dir)):
        st = " ".join(f"{n} {a_}:{b}" for n, (a_, b) in zip(order, layers(d)))
        print(f"{label:<20} {st:<36} {predicted[tag]:>9.2f} {med[tag]:>9.2f} {med[tag] / predicted[tag]:>9.2f}   "
              f"{' '.join(f'{x:.2f}' for x in results[tag])}")
    print(f"\nplan / byte-balanced: predicted {predicted['plan'] / predicted['even']:.2f}, "
          f"measured {med['plan'] / med['even']:.2f}")
    print(f"predicted {predicted['plan']:.2f} tok/s, measured {med['plan']:.2f}: measured / predicted = "
          f"{med['plan'] / predicted['plan']:.2f}; plan / byte-balanced = {med['plan'] / med['even']:.2f}")


if __name__ == "__main__":
    main()
