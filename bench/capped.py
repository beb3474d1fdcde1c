#!/usr/bin/env python3
"""capped.py - a model that no worker holds: the model split in --stages, stages 1.. as
`pipeshard worker --max-mem SIZE` (SIZE below half the model file, so that none could hold it
whole) and stage 0 in the coordinator, against the unsplit model; the same greedy tokens, and
decode tok/s of each.

  bench/capped.py [--model llama-3.1-8b:Q4_0] [--stages 4] [--threads 2] [--tokens 16]
                  [--repeats 1] [--max-mem SIZE] [--ctx 256] [--pin]

The model is `synth`'s preset of that shape and type, written into .cache/bench (reused when
present), split once into .cache/bench/SHAPE-TYPE-split-N (reused). The workers run on this
machine, each with --threads threads and the cap (default: 45 % of the model file); stage 0
runs in `run --fleet` with --threads too. Each configuration generates --tokens tokens after the
same 8-token prompt (`--prompt-ids`, greedy, --ignore-eos, `--stats`), unsplit and split
alternating for --repeats rounds (the first round unsplit first, the next split first, ...).
The split run's tokens must equal the unsplit run's (exit 1 when not). Prints each run, the
medians, the spread (max - min, % of the median) and split / unsplit.

--pin passes --pin to `run` and the workers (thread i on the i-th CPU the process may use): on
a machine whose processes share the same cores this piles the stages' threads on the first
cores; use it where each process gets cores of its own (taskset). On the 2-core development
VM the 8B model decodes at about 5 tok/s: one round of 16 tokens takes about a minute with
start-up; `--model llama-3.2-1b:Q4_0` is a quicker check.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import BIN, CACHE, ROOT, sh, synth_model  # noqa: E402 (also puts tests/ on the path)

from psworker import Worker  # noqa: E402

PROMPT = "1,450,4996,17354,1701,432,7063,278"  # 8 ids, below every preset's vocabulary



def size_arg(s):
    """A --max-mem size as the CLI takes it (bytes, or 500M, 1.9G), for the message only."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    u = s[-1].upper()
    return int(float(s[:-1]) * units[u]) if u in units else int(s)


def generate(args, a):
    """(token ids, decode tok/s) of one `run` with args naming the model or the fleet."""
    cmd = [BIN, "run", *args, "--prompt-ids", a.prompt_ids, "-n", str(a.tokens), "--ignore-eos", "--temp", "0",
           "-t", str(a.threads), "-c", str(a.ctx), "--print-ids", "--stats"] + (["--pin"] if a.pin else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    stats = json.loads([line for line in p.stderr.splitlines() if line.startswith("{")][-1])
    return [int(t) for t in p.stdout.split()], stats["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description="a model on --max-mem-capped workers against the unsplit model")
    ap.add_argument("--model", default="llama-3.1-8b:Q4_0", help="synth preset SHAPE:TYPE (llama-3.1-8b:Q4_0)")
    ap.add_argument("--stages", type=int, default=4, help="stages, stage 0 in the coordinator (4)")
    ap.add_argument("--threads", type=int, default=2, help="threads of the coordinator and of each worker (2)")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per run (16)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of unsplit and split, alternating (1)")
    ap.add_argument("--max-mem", help="each worker's --max-mem (default: 45%% of the model file)")
    ap.add_argument("--ctx", type=int, default=256, help="context of the runs (-c, 256)")
    ap.add_argument("--prompt-ids", default=PROMPT, help="the prompt's token ids")
    ap.add_argument("--pin", action="store_true", help="--pin to run and the workers (see above)")
    a = ap.parse_args()
    shape, qtype = a.model.split(":")
    model = synth_model(a.model)
    size = os.path.getsize(model)
    cap = a.max_mem or f"{int(size * 0.45) >> 20}M"
    if size_arg(cap) * 2 >= size:
        print(f"note: --max-mem {cap} is not below half the model file ({size / 2**30:.2f} GiB)")
    split_dir = os.path.join(CACHE, f"{shape}-{qtype}-split-{a.stages}")
    fleet_path = os.path.join(split_dir, "fleet.json")
    if not os.path.exists(fleet_path) or os.path.getmtime(fleet_path) < os.path.getmtime(model):
        print(f"splitting into {split_dir}", flush=True)
        sh([BIN, "split", "-m", model, "--stages", str(a.stages), "-o", split_dir, "--quiet"])
    with open(fleet_path) as f:
        fleet = json.load(f)
    shards = [os.path.getsize(os.path.join(split_dir, s["shard"])) for s in fleet["stages"]]
    print(f"{shape} {qtype}: {size / 2**30:.2f} GiB, {a.stages} stages {[tuple(s['layers']) for s in fleet['stages']]},"
          f" shards {' '.join(f'{b / 1e9:.2f}' for b in shards)} GB; workers --max-mem {cap} -t {a.threads}"
          f"{' --pin' if a.pin else ''}", flush=True)

    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="capped_", dir=os.path.join(ROOT, "bench", "out"))
    key = os.path.join(tmp, "key")
    sh([BIN, "keygen", "-o", key])
    workers = []
    try:
        for k in range(1, a.stages):
            extra = ["--max-mem", cap] + (["--pin"] if a.pin else [])
            try:
                w = Worker(BIN, os.path.join(split_dir, fleet["stages"][k]["shard"]),
                           os.path.join(tmp, f"stage-{k}.log"), f"stage-{k}", key=key, threads=a.threads, extra=extra,
                           timeout_ms=120000)
            except AssertionError as e:
                sys.exit(f"stage {k}'s worker did not start: {e}")
            fleet["stages"][k]["address"] = w.addr
            workers.append(w)
        local = os.path.join(tmp, "fleet.json")
        with open(local, "w") as f:
            json.dump(dict(fleet, stages=[dict(s, shard=os.path.join(split_dir, s["shard"])) for s in fleet["stages"]]),
                      f)
        runs = {"unsplit": [], "split": []}
        toks = {}
        for r in range(a.repeats):
            for tag in (("unsplit", "split") if r % 2 == 0 else ("split", "unsplit")):
                ids, tps = generate(["-m", model] if tag == "unsplit" else ["--fleet", local, "--key-file", key], a)
                runs[tag].append(tps)
                toks.setdefault(tag, ids)
                if ids != toks[tag]:
                    sys.exit(f"{tag}: round {r} gave other tokens than round 0:\n{ids}\n{toks[tag]}")
                print(f"round {r}: {tag:<8} {tps:7.2f} tok/s", flush=True)
    finally:
        for w in workers:
            w.stop()
    if toks["split"] != toks["unsplit"]:
        sys.exit(f"the split run's tokens differ from the unsplit run's:\nunsplit {toks['unsplit']}\n"
                 f"split   {toks['split']}")
    print(f"\ntokens (both): {' '.join(map(str, toks['unsplit']))}")
    print(f"\n{'':<30} {'decode tok/s (median)':>22} {'spread':>8}   runs")
    med = {}
    for tag, label in (("unsplit", "unsplit (run -m)"), ("split", f"{a.stages} stages, workers capped")):
        xs = runs[tag]
        med[tag] = statistics.median(xs)
        spread = (max(xs) - min(xs)) / med[tag] * 100
        print(f"{label:<30} {med[tag]:>22.2f} {spread:>7.1f}%   {' '.join(f'{x:.2f}' for x in xs)}")
    print(f"\nsplit / unsplit = {med['split'] / med['unsplit']:.2f} ({a.tokens} tokens, {a.repeats} round"
          f"{'' if a.repeats == 1 else 's'}, -t {a.threads})")


if __name__ == "__main__":
    main()
