#!/usr/bin/env python3
"""serve.py - `pipeshard serve` under load: aggregate decode tok/s, time to first token and
inter-token latency for 1, 2, 4, ... concurrent streams, measured side by side in one run.

  bench/serve.py [--models "smollm2-135m:Q8_0 llama-3.2-1b:Q4_0" | --model FILE] [--stages 1,2]
                 [--streams 1,2,4,8,16,32] [--tokens 64] [--prompt-tokens 32] [--threads 2]
                 [--llama-server PATH] [--prefix 1000] [--mmap on|off] [--pp] [--device D[,D...]]
                 [--host-hops] [--temperature T] [--json FILE]

Each configuration is a server on loopback: `pipeshard serve -m MODEL --parallel S --pin`, with
--threads threads unsplit, and with --local-stages N one pinned core per stage (each stage as if
on a machine of its own: the machine needs N cores); with a fleet, also the unsplit model on one
core (`1 core`), the yardstick of a fleet whose stages have one core each. The load: S clients (threads), each sending
one streamed /v1/completions request of --tokens tokens at temperature 0 (--temperature T:
sampled at T, no truncation, stream i with seed i, past the end of text) after a distinct
prompt of about --prompt-tokens tokens, all at once; the figures come from the chunks' arrival
times (a client reads every SSE chunk as it comes):
  agg tok/s   completion tokens of all streams / wall time from the first request to the last end
  decode      steady aggregate decode tok/s: tokens that arrived while every stream was decoding
              (after the last stream's first token, before the first stream's end) / that window
  ttft p50/p99  request sent to its first token, over the streams
  itl p50/p99   between consecutive chunks of a stream, over all streams
With --llama-server PATH (a llama.cpp `llama-server` binary the user built), the same load runs
against `llama-server -m MODEL -np S -cb -t THREADS` on the same file, in the same run.
--prefix N: time to first token of a request whose N-token system prompt is in the prefix cache
(sent once before), against the same request cold (the cache off: --prefix-cache off).
After each pipeshard row, a line 'per token' gives, from /metrics over that load, each stage's
compute ms and each hop's send ms per completion token (prompts included), and with one stream
the rest of its wall ms per token (waiting, HTTP, scheduling).
--mmap on maps the weights instead of reading them into huge pages (serve's default, and off
here): mapped files decode at speeds that depend on where their pages lie, so a fleet's fresh
shards and the original file are not comparable (docs/notes/huge-pages.md).
--pp: in each turn, also the unsplit model's prefill rate (`pipeshard bench -p 128 -t THREADS`),
the compute ceiling of batched decode; each row of that turn then shows its decode over it.
--device: the servers' layers on GPUs: the unsplit model on the first device, stage k of a
fleet on the k-th (the last for the rest; `serve --device LIST`); `--device cuda:0,cuda:1
--stages 1,2` measures one GPU against two (no `1 core` row then). --host-hops: the fleets'
activations by TCP instead of device to device.
Models given as shape:type are written by `pipeshard synth` into .cache/bench.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PIPESHARD_BIN", os.path.join(ROOT, "build", "pipeshard"))
TEMPERATURE = 0.0  # --temperature
WORDS = ("river stone light quiet north garden paper winter signal orange market silver field thunder "
         "window marble forest engine shadow candle harbor meadow copper lantern").split()


def model_path(spec):
    if os.path.exists(spec):
        return spec
    shape, typ = spec.split(":")
    path = os.path.join(ROOT, ".cache", "bench", f"{shape}-{typ}.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([BIN, "synth", "--like", shape, "--type", typ, "-o", path], check=True, capture_output=True)
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free port, up once /health answers."""

    def __init__(self, cmd, name):
        self.port = free_port()
        self.log = open(os.path.join(ROOT, "bench", "out", f"serve-{name}.log"), "w")
        self.p = subprocess.Popen(cmd + ["--port", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{name} exited: see {self.log.name}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not come up")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


def stream(port, prompt, tokens, out, seed=0):
    """One streamed completion; appends (t_sent, [chunk times], completion tokens) to out."""
    req = {"prompt": prompt, "max_tokens": tokens, "temperature": TEMPERATURE, "stream": True,
           "stream_options": {"include_usage": True}}
    if TEMPERATURE > 0:
        req.update(seed=seed, ignore_eos=True)
    body = json.dumps(req)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    times, n_tok = [], None
    for line in r:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        now = time.perf_counter()
        d = json.loads(line[6:])
        if d.get("usage"):
            n_tok = d["usage"]["completion_tokens"]
        if d.get("choices") and d["choices"][0].get("text"):
            times.append(now)
    out.append((t0, times, n_tok if n_tok is not None else len(times)))


def stage_seconds(port):
    """{'compute': [s per stage], 'hop': [s per hop]} from /metrics (counters since start)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    out = {"compute": {}, "hop": {}}
    for line in c.getresponse().read().decode().splitlines():
        for key, name in (("compute", "pipeshard_stage_compute_seconds_total{stage=\""),
                          ("hop", "pipeshard_hop_seconds_total{from=\"")):
            if line.startswith(name):
                out[key][line[len(name):].split("\"")[0]] = float(line.split()[-1])
    return {k: [v[i] for i in sorted(v, key=int)] for k, v in out.items()}


def prefill_rate(path, threads):
    """The unsplit model's 128-token prefill tok/s (pipeshard bench, median of 3)."""
    p = subprocess.run([BIN, "bench", "-m", path, "-p", "128", "-n", "1", "-t", str(threads), "--pin", "-r", "3",
                        "--json"], capture_output=True, text=True, check=True)
    return json.loads(p.stdout)["prefill_tok_s"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def load(port, n, tokens, prompt_tokens, salt):
    """n streams at once; (agg tok/s, ttft p50, p99, itl p50, p99) in tok/s and ms."""
    res, ths = [], []
    for i in range(n):
        words = [WORDS[(i * 7 + j * 3 + salt) % len(WORDS)] for j in range(prompt_tokens)]
        ths.append(threading.Thread(target=stream, args=(port, f"{i} {salt} " + " ".join(words), tokens, res, i)))
    t0 = time.perf_counter()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = max(r[1][-1] for r in res if r[1]) - t0
    ttft = [(r[1][0] - r[0]) * 1e3 for r in res if r[1]]
    itl = [(b - a) * 1e3 for r in res for a, b in zip(r[1], r[1][1:])]
    # steady decode: the chunks that arrived while every stream was decoding (after the last first
    # chunk, before the first stream's last), over that window
    lo, hi = max(r[1][0] for r in res if r[1]), min(r[1][-1] for r in res if r[1])
    n_in = sum(1 for r in res for t in r[1] if lo < t <= hi)
    steady = n_in / (hi - lo) if hi > lo and n_in else float("nan")
    return sum(r[2] for r in res) / wall, steady, pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99)


def prefix_ttft(port, n_words, repeats=3):
    """Time to first token (ms, median) of requests that share an n_words-word system prompt."""
    system = " ".join(WORDS[(j * 5) % len(WORDS)] for j in range(n_words))
    out = []
    for k in range(repeats + 1):
        res = []
        stream(port, f"{system}\nQuestion {k}: what comes next?", 4, res)
        if k and res[0][1]:
            out.append((res[0][1][0] - res[0][0]) * 1e3)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m:Q8_0")
    ap.add_argument("--stages", default="1,2")
    ap.add_argument("--streams", default="1,2,4,8,16,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--llama-server")
    ap.add_argument("--prefix", type=int, default=0)
    ap.add_argument("--mmap", choices=("on", "off"), default="off")
    ap.add_argument("--pp", action="store_true")
    ap.add_argument("--device")
    ap.add_argument("--host-hops", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    global TEMPERATURE
    TEMPERATURE = a.temperature
    mmap = ["--mmap"] if a.mmap == "on" else []
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    streams = [int(x) for x in a.streams.split(",")]
    rows = []
    print(f"{'model':24} {'server':18} {'streams':>7} {'agg tok/s':>10} {'decode':>10} {'ttft p50':>9} {'p99':>8} "
          f"{'itl p50':>8} {'p99':>8}   (ms)")
    for spec in a.models.split():
        path = model_path(spec)
        configs = []
        stages = [int(x) for x in a.stages.split(",")]
        if max(stages) > 1 and a.threads > 1 and not a.device:  # a CPU fleet: the unsplit model on one core too
            configs.append(("pipeshard 1 core", [BIN, "serve", "-m", path, "--parallel", str(max(streams)), "-c",
                                                 str(a.ctx), "--pin", *mmap, "--queue-size", "256", "-t", "1"]))
        for n in stages:
            cmd = [BIN, "serve", "-m", path, "--parallel", str(max(streams)), "-c", str(a.ctx), "--pin", *mmap,
                   "--queue-size", "256"]
            cmd += ["-t", str(a.threads)] if n == 1 else ["--local-stages", str(n), "-t", "1"]
            if a.device:
                devs = a.device.split(",")[:n]
                cmd += ["--device", ",".join(devs)] + (["--host-hops"] if a.host_hops and n > 1 else [])
            configs.append((f"pipeshard {n} stage{'s' if n > 1 else ''}", cmd))
        if a.llama_server:
            configs.append(("llama-server", [a.llama_server, "-m", path, "-np", str(max(streams)), "-cb", "-t",
                                             str(a.threads), "-c", str(a.ctx * max(streams)), "--host", "127.0.0.1"]))
        servers = []
        try:
            for name, cmd in configs:
                servers.append((name, Server(cmd, f"{os.path.basename(path)}-{name.replace(' ', '-')}")))
            for n in streams:  # the servers in turns at each load, so that a drifting machine slows all alike
                pp = prefill_rate(path, a.threads) if a.pp else None
                if pp:
                    print(f"{spec:24} prefill 128 tokens, {a.threads} threads: {pp:.1f} tok/s", flush=True)
                for name, s in servers:
                    load(s.port, 1, 4, 4, 99)  # warm
                    ours = name.startswith("pipeshard")
                    before = stage_seconds(s.port) if ours else None
                    agg, steady, t50, t99, i50, i99 = load(s.port, n, a.tokens, a.prompt_tokens, n)
                    rows.append(dict(model=spec, server=name, streams=n, agg_tok_s=agg, decode_tok_s=steady,
                                     ttft_p50_ms=t50, ttft_p99_ms=t99, itl_p50_ms=i50, itl_p99_ms=i99))
                    if pp:
                        rows[-1]["prefill_tok_s"] = pp
                    print(f"{spec:24} {name:18} {n:7} {agg:10.1f} {steady:10.1f} {t50:9.1f} {t99:8.1f} {i50:8.2f} "
                          f"{i99:8.2f}" + (f"   decode/pp {steady / pp:.3f}" if pp else ""), flush=True)
                    if ours:
                        after, tokens = stage_seconds(s.port), n * a.tokens
                        ms = {k: [(y - x) * 1e3 / tokens for x, y in zip(before[k], after[k])] for k in after}
                        rows[-1].update(stage_ms_per_token=ms["compute"], hop_ms_per_token=ms["hop"])
                        ring = f", rest {1e3 / agg - sum(ms['compute']) - sum(ms['hop']):.2f} ms" if n == 1 else ""
                        print(f"{'':24} per token: compute {' '.join(f'{v:.2f}' for v in ms['compute'])} ms, "
                              f"hops {' '.join(f'{v:.3f}' for v in ms['hop'])} ms{ring}", flush=True)
        finally:
            for _, s in servers:
                s.stop()
        if a.prefix:
            res = {}
            for cache in ("on", "off"):
                s = Server([BIN, "serve", "-m", path, "-t", str(a.threads), "--pin", *mmap, "-c",
                            str(max(a.ctx, a.prefix * 2 + 64)), "--prefix-cache", cache], f"prefix-{cache}")
                try:
                    res[cache] = prefix_ttft(s.port, a.prefix)
                finally:
                    s.stop()
            print(f"{spec:24} ttft with a {a.prefix}-word system prompt cached {res['on']:.1f} ms, cold "
                  f"{res['off']:.1f} ms: {res['on'] / res['off']:.3f}x")
            rows.append(dict(model=spec, prefix_words=a.prefix, ttft_cached_ms=res["on"], ttft_cold_ms=res["off"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
