#!/usr/bin/env python3
"""test_capped.py - a model no worker holds, end to end: `pipeshard plan` over four hosts that each
offer less than half the model file writes the shards and fleet.json (-o), each stage but 0 runs
as `pipeshard worker --max-mem` with that host's memory as its cap, and the fleet's greedy and
seeded tokens equal the unsplit model's. (bench/capped.py measures the same with the 8B model;
this is SmolLM2-135M's shape, written by `pipeshard synth`, so that it runs in a test's time.)
Exit 0 pass, 1 fail.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from psworker import Worker, san_check  # noqa: E402
from pstest import check, failures, require  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "")
PROMPT = "1,450,4996,17354,1701,432,7063,278"


def sh(args, timeout=600):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout)
    require(p.returncode == 0, lambda: f"pipeshard {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    san_check(p.stderr, args[0])
    return p.stdout


def tokens(target, seed):
    """Token ids of 24 tokens after PROMPT: greedy (seed None) or seeded at temperature 0.9."""
    sampling = ["--temp", "0"] if seed is None else ["--temp", "0.9", "--seed", str(seed)]
    out = sh(["run", *target, "--prompt-ids", PROMPT, "-n", "24", "--ignore-eos", "-t", "1", "-c", "128",
              "--print-ids", *sampling])
    return [int(t) for t in out.split()]


def main():
    require(BIN, "PIPESHARD_BIN is not set")
    tmp = tempfile.mkdtemp(prefix="capped_", dir=os.environ.get("PS_TEST_TMP"))
    model = os.path.join(tmp, "m.gguf")
    sh(["synth", "--like", "smollm2-135m", "--type", "Q8_0", "-o", model])
    size = os.path.getsize(model)
    cap = int(size * 0.45)  # each host: less than half the model
    hosts = {"hosts": [{"name": f"h{i}", "address": f"127.0.0.1:{7900 + i}", "mem": cap, "ms_per_gb": 50 + 10 * i}
                       for i in range(4)]}
    hp = os.path.join(tmp, "hosts.json")
    with open(hp, "w") as f:
        json.dump(hosts, f)
    out_dir = os.path.join(tmp, "plan")
    table = sh(["plan", "-m", model, "--hosts", hp, "--ctx", "128", "-o", out_dir])
    with open(os.path.join(out_dir, "fleet.json")) as f:
        fleet = json.load(f)
    stages = fleet["stages"]
    require(len(stages) >= 3, f"{len(stages)} stages for hosts of {cap} bytes each (the model: {size}):\n{table}")
    shard_sizes = [os.path.getsize(os.path.join(out_dir, s["shard"])) for s in stages]
    check(max(shard_sizes) < size / 2, f"a shard of {max(shard_sizes)} bytes, half the model is {size / 2}")
    print(f"  plan: {len(stages)} stages {[tuple(s['layers']) for s in stages]}, shards {shard_sizes} bytes, "
          f"each host {cap} of the model's {size}")

    key = os.path.join(tmp, "key")
    sh(["keygen", "-o", key])
    workers = []
    try:
        for k in range(1, len(stages)):
            w = Worker(BIN, os.path.join(out_dir, stages[k]["shard"]), os.path.join(tmp, f"w{k}.log"), f"w{k}",
                       key=key, extra=["--max-mem", str(cap)], timeout_ms=60000)
            stages[k]["address"] = w.addr  # the plan's addresses, on this machine's free ports
            workers.append(w)
        fleet_path = os.path.join(tmp, "fleet.json")
        with open(fleet_path, "w") as f:
            json.dump(dict(fleet, stages=[dict(s, shard=os.path.join(out_dir, s["shard"])) for s in stages]), f)
        for seed in (None, 7):
            alone = tokens(["-m", model], seed)
            split = tokens(["--fleet", fleet_path, "--key-file", key], seed)
            check(split == alone, f"{'greedy' if seed is None else f'seed {seed}'}: the capped fleet's tokens "
                  f"{split} differ from the unsplit model's {alone}")
            print(f"  ok: {'greedy' if seed is None else f'seed {seed}'}: {len(split)} tokens equal to the unsplit "
                  f"model's on {len(stages)} stages under --max-mem {cap}")
    finally:
        for w in workers:
            w.stop()
            san_check(w.text(), w.name)
    for w in workers:
        check(re.search(r"listening on", w.text()), f"{w.name}: {w.text()}")
    return failures()


if __name__ == "__main__":
    sys.exit(main())
