#!/usr/bin/env python3
"""pipeline.py - a split model against the unsplit one, measured side by side in one run.

  bench/pipeline.py [--threads 2] [--repeats 3] [--tokens 128] [--models "llama-3.2-1b:Q4_0 smollm2-135m:Q8_0"]
                    [--transports tcp] [--latencies 0,10,50,100] [--ttft-prompt 1024] [--skip decode,latency,ttft]

Models are written by `pipeshard synth` into .cache/bench (kept between runs); shards into
bench/out. Every stage runs with --threads threads; workers are `pipeshard worker` processes on
loopback. Three tables:
  1. decode tok/s of 1, 2 and 3 stages, from `pipeshard bench --stages 2,3` (see its --help): one
     process holds the unsplit model and a local fleet of each size, and they decode in turns of 8
     tokens, so that a drift of the machine's speed slows them alike; --repeats repetitions of
     --tokens tokens each; ratio = split tok/s / unsplit tok/s, the spread of single rounds' ratios,
     and what the ring's hops cost per token (the coordinator's wait minus the workers' compute);
     threads placed by the scheduler, then pinned (--pin); the local fleets on loopback TCP, and with
     --transports tcp,unix once more on Unix sockets (--local-transport unix);
  2. decode tok/s of 2 and 3 stages at each emulated one-way latency per hop (--sim-latency-ms on the
     coordinator and on every worker);
  3. time to first token of a --ttft-prompt-token prompt on 1, 2 and 3 stages (--prefill-chunk 128).
     When the machine has at least threads x 3 cores, each stage is pinned to cores of its own
     (taskset), as if every stage had a machine of its own. Otherwise the stages share the cores
     (pipelining cannot shorten the prefill then), and a second set of rows gives each stage one
     core of its own, for as many stages as there are cores.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "pipeshard")
OUT = os.path.join(ROOT, "bench", "out")


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def model_path(spec):
    shape, typ = spec.split(":")
    path = os.path.join(ROOT, ".cache", "bench", f"{shape}-{typ}.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sh([BIN, "synth", "--like", shape, "--type", typ, "-o", path])
    return path


class Fleet:
    """Workers of a split model on loopback (stages 1..n-1), optionally pinned to cores."""

    def __init__(self, model, n, threads, latency=0.0, cpus=None):
        self.n, self.procs = n, []
        name = os.path.basename(model).rsplit(".", 1)[0]
        self.dir = os.path.join(OUT, f"{name}-{n}")
        fleet_json = os.path.join(self.dir, "fleet.json")
        if not os.path.exists(fleet_json) or os.path.getmtime(fleet_json) < os.path.getmtime(model):
            shutil.rmtree(self.dir, ignore_errors=True)
            sh([BIN, "split", "-m", model, "--stages", str(n), "-o", self.dir, "--quiet"])
        fleet = json.load(open(fleet_json))
        for k in range(1, n):
            r, w = os.pipe()
            cmd = [BIN, "worker", "--shard", os.path.join(self.dir, fleet["stages"][k]["shard"]),
                   "--listen", "127.0.0.1:0", "-t", str(threads), "--ready-fd", str(w),
                   "--sim-latency-ms", str(latency)]
            if cpus:
                cmd = ["taskset", "-c", cpus[k]] + cmd
            log = open(os.path.join(self.dir, f"worker-{k}.log"), "w")
            self.procs.append(subprocess.Popen(cmd, pass_fds=(w,), stderr=log))
            os.close(w)
            port = os.read(r, 16).decode().strip()
            os.close(r)
            if not port:
                raise RuntimeError(f"worker {k} did not start: see {log.name}")
            fleet["stages"][k]["address"] = f"127.0.0.1:{port}"
        self.fleet_json = os.path.join(self.dir, "fleet-bench.json")
        json.dump(fleet, open(self.fleet_json, "w"))

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=30)


def run(model_args, threads, prompt, n, extra=(), cpus0=None):
    cmd = [BIN, "run"] + list(model_args) + ["-t", str(threads), "--prompt-ids", ",".join(map(str, prompt)),
                                              "-n", str(n), "--ignore-eos", "--temp", "0", "--print-ids",
                                              "--stats", "-c", "2048"] + list(extra)
    if cpus0:
        cmd = ["taskset", "-c", cpus0] + cmd
    # the ids go nowhere: a reader woken by every token would take a core from the stages
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[-500:]}")
    return json.loads(p.stderr.strip().splitlines()[-1])


def decode_table(models, threads, repeats, tokens, transports):
    print(f"\n1. decode, {threads} threads per stage, {' / '.join(transports)}: `pipeshard bench --stages 2,3` (one process holds the"
          f" unsplit model and both local fleets; after a 16-token prompt each decodes {tokens} tokens in turns of 8,"
          f" the order rotating, x {repeats} repetitions; greedy, tokens checked equal); ratio = decode tok/s / the"
          f" unsplit model's; 'rounds' = the p10/median/p90 of the ratios of single rounds; 'hops' = ring overhead"
          f" in us per token; threads as the scheduler places them, then pinned (--pin) in every configuration")
    print(f"{'model':26} {'link':>5} {'threads':>8} {'stages':>6} {'tok/s':>9} {'ratio':>7} {'rounds p10/50/90':>20} "
          f"{'hops':>6}")
    for spec in models:
        model = model_path(spec)
        for link in transports:
            for pin in ([], ["--pin"]):
                out = sh([BIN, "bench", "-m", model, "--stages", "2,3", "-t", str(threads), "-p", "16", "-n",
                          str(tokens), "-r", str(repeats), "--local-transport", link, "--json"] + pin, timeout=3600).stdout
                for c in json.loads(out)["configs"]:
                    hops = f"{c['ring_overhead_us_per_token']:6.0f}" if c["stages"] > 1 else ""
                    rounds = f"{c['round_ratio_p10']:.3f}/{c['round_ratio_median']:.3f}/{c['round_ratio_p90']:.3f}"
                    print(f"{spec:26} {link:>5} {'pinned' if pin else 'free':>8} {c['stages']:6} "
                          f"{c['decode_tok_s']:9.2f} {c['ratio']:7.3f} {rounds:>20} {hops:>6}", flush=True)


def latency_table(models, threads, latencies):
    print(f"\n2. decode tok/s with emulated one-way latency per hop ({threads} threads per stage, 16 tokens)")
    print(f"{'model':26} {'stages':>6} " + " ".join(f"{str(l) + ' ms':>9}" for l in latencies))
    prompt = list(range(1, 17))
    for spec in models:
        model = model_path(spec)
        for n in (2, 3):
            row = []
            for lat in latencies:
                f = Fleet(model, n, threads, latency=lat)
                try:
                    j = run(["--fleet", f.fleet_json], threads, prompt, 16, ["--sim-latency-ms", str(lat)])
                finally:
                    f.stop()
                row.append(j["decode_tok_s"])
            print(f"{spec:26} {n:6} " + " ".join(f"{x:9.2f}" for x in row))
            ideal = [1 / (n * lat / 1e3 + 1 / row[0]) for lat in latencies]  # n hops per token
            print(f"{'  bound: 1/(hops*lat + 1/tok_s@0)':33} " + " ".join(f"{x:9.2f}" for x in ideal))


def ttft_rows(spec, model, prompt, threads, stages, pin):
    base = None
    for n in stages:
        cpus = [f"{k * threads}-{k * threads + threads - 1}" for k in range(n)] if pin else None
        f = Fleet(model, n, threads, cpus=cpus) if n > 1 else None
        try:
            args = ["-m", model] if n == 1 else ["--fleet", f.fleet_json]
            ms = statistics.median(run(args, threads, prompt, 1, ["--prefill-chunk", "128"],
                                       cpus0=cpus[0] if cpus else None)["ttft_ms"] for _ in range(2))
        finally:
            if f:
                f.stop()
        base = base or ms
        print(f"{spec:26} {n:6} {threads:7} {'own' if pin else 'shared':>6} {ms:9.1f} {ms / base:7.3f}")


def ttft_table(models, threads, n_prompt):
    ncpu = len(os.sched_getaffinity(0))
    print(f"\n3. time to first token, {n_prompt}-token prompt, --prefill-chunk 128, medians of 2; 'own': each stage"
          f" pinned to cores of its own (as if on its own machine), 'shared': all stages on this machine's {ncpu} cores")
    print(f"{'model':26} {'stages':>6} {'threads':>7} {'cores':>6} {'ttft ms':>9} {'vs 1':>7}")
    rng = random.Random(1)
    for spec in models:
        model = model_path(spec)
        prompt = [rng.randrange(1, 40000) for _ in range(n_prompt)]
        own = ncpu >= 3 * threads
        ttft_rows(spec, model, prompt, threads, (1, 2, 3), own)
        if not own:  # one core per stage, as many stages as cores (up to 3)
            ttft_rows(spec, model, prompt, 1, tuple(range(1, min(3, ncpu) + 1)), True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--models", default="llama-3.2-1b:Q4_0 smollm2-135m:Q8_0")
    ap.add_argument("--latencies", default="0,10,50,100")
    ap.add_argument("--ttft-prompt", type=int, default=1024)
    ap.add_argument("--skip", default="")
    ap.add_argument("--transports", default="tcp", help="local fleets' links in the decode table: tcp, unix or both")
    a = ap.parse_args()
    subprocess.run(["cmake", "-S", ROOT, "-B", os.path.join(ROOT, "build"), "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", os.path.join(ROOT, "build"), "-j", "--target", "pipeshard"], check=True,
                   capture_output=True)
    os.makedirs(OUT, exist_ok=True)
    models, skip = a.models.split(), a.skip.split(",")
    print(f"pipeshard {time.strftime('%Y-%m-%d %H:%M')}, {len(os.sched_getaffinity(0))} cores")
    if "decode" not in skip:
        transports = a.transports.split(",")
        if not transports or any(t not in ("tcp", "unix") for t in transports):
            ap.error(f"--transports takes tcp, unix or tcp,unix, not {a.transports!r}")
        decode_table(models, a.threads, a.repeats, a.tokens, transports)
    if "latency" not in skip:
        latency_table(models, a.threads, [float(x) for x in a.latencies.split(",")])
    if "ttft" not in skip:
        ttft_table(models, a.threads, a.ttft_prompt)


if __name__ == "__main__":
    sys.exit(main())
