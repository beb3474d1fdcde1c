#!/usr/bin/env python3
"""mixed.py - a mixed fleet against the model on one device: stage 0 on the CPU with the token
embedding alone (`split --layers 0:0,0:L`), every layer on one worker (`--device`), against the
unsplit model on that device (`run -m M --device D`); decode tok/s of each, their ratio, and the
same greedy tokens.

  bench/mixed.py [--model llama-3.2-1b:Q4_0] [--device cuda] [--tokens 128] [--prompt 16]
                 [--repeats 3] [--threads 2]

The model is `synth`'s preset of that shape and type in .cache/bench (reused), split once into
.cache/bench/SHAPE-TYPE-lean. The worker runs on this machine with --device and --threads; the
coordinator (stage 0: the embedding, sampling) with --threads on the CPU. Unsplit and mixed runs
alternate for --repeats rounds; each prints decode tok/s from `--stats`. Issue 13 asks for the
mixed fleet at 0.9x the all-GPU speed or better; with --device cpu it measures what the hop and
the coordinator's share cost on the CPU alone.
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


def generate(target, a):
    """(token ids, decode tok/s) of one greedy `run`."""
    cmd = [BIN, "run", *target, "--prompt-ids", ",".join(["1"] * a.prompt), "-n", str(a.tokens), "--ignore-eos",
           "--temp", "0", "-t", str(a.threads), "--print-ids", "--stats"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode:
        sys.exit(f"{' '.join(cmd)}: {p.stderr}")
    stats = json.loads([line for line in p.stderr.splitlines() if line.startswith("{")][-1])
    return p.stdout.split(), stats["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description="stage 0 on the CPU (embedding only), every layer on one device")
    ap.add_argument("--model", default="llama-3.2-1b:Q4_0", help="synth preset SHAPE:TYPE (llama-3.2-1b:Q4_0)")
    ap.add_argument("--device", default="cuda", help="the layers' device: cuda, cuda:N or cpu (cuda)")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per run (128)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (16)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of unsplit and mixed, alternating (3)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of the coordinator and the worker (2)")
    a = ap.parse_args()
    shape, qtype = a.model.split(":")
    model = synth_model(a.model)
    lean = os.path.join(CACHE, f"{shape}-{qtype}-lean")
    fleet_path = os.path.join(lean, "fleet.json")
    if not os.path.exists(fleet_path) or os.path.getmtime(fleet_path) < os.path.getmtime(model):
        n_layer = json.loads(sh([BIN, "inspect", model, "--json"]))["hparams"]["block_count"]
        sh([BIN, "split", "-m", model, "--layers", f"0:0,0:{n_layer}", "-o", lean, "--quiet"])
    with open(fleet_path) as f:
        fleet = json.load(f)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="mixed_", dir=os.path.join(ROOT, "bench", "out"))
    w = Worker(BIN, os.path.join(lean, fleet["stages"][1]["shard"]), os.path.join(tmp, "worker.log"), "layers",
               threads=a.threads, extra=["--device", a.device], timeout_ms=120000)
    runs, toks = {"unsplit": [], "mixed": []}, {}
    try:
        fleet["stages"][1]["address"] = w.addr
        local = os.path.join(tmp, "fleet.json")
        with open(local, "w") as f:
            json.dump(dict(fleet, stages=[dict(s, shard=os.path.join(lean, s["shard"])) for s in fleet["stages"]]), f)
        print(f"{shape} {qtype}: stage 0 on the CPU (embedding), layers 0:{fleet['n_layer']} on {a.device} "
              f"({w.addr}); {a.prompt}-token prompt, {a.tokens} tokens", flush=True)
        for r in range(a.repeats):
            for tag in (("unsplit", "mixed") if r % 2 == 0 else ("mixed", "unsplit")):
                target = ["-m", model, "--device", a.device] if tag == "unsplit" else ["--fleet", local]
                ids, tps = generate(target, a)
                runs[tag].append(tps)
                toks.setdefault(tag, ids)
                print(f"round {r}: {tag:<8} {tps:8.2f} tok/s", flush=True)
    finally:
        w.stop()
    if toks["mixed"] != toks["unsplit"]:
        sys.exit(f"the mixed fleet's tokens differ from the unsplit run's:\n{toks['unsplit']}\n{toks['mixed']}")
    med = {t: statistics.median(x) for t, x in runs.items()}
    spread = {t: (max(x) - min(x)) / med[t] * 100 for t, x in runs.items()}
    print(f"\nunsplit on {a.device}: {med['unsplit']:.2f} tok/s (spread {spread['unsplit']:.1f} %); mixed: "
          f"{med['mixed']:.2f} (spread {spread['mixed']:.1f} %); mixed / unsplit = {med['mixed'] / med['unsplit']:.3f}"
          f"; the same {a.tokens} tokens")


if __name__ == "__main__":
    main()
