#!/usr/bin/env python3
"""test_gpu_fleet.py - fleets of GPU stages on one host (`--local-stages N --device cuda`): the
activations go device to device (DHOP: the next stage's ring in GPU memory, stage.h) and the tokens
are the unsplit model's on the same GPU, bit for bit.

For two synthetic models (Q8_0, and Q4_K_M with 256-wide rows), against `run -m M --device cuda`:
2 and 3 stages, greedy and seeded (temperature 0.8), the prompt in chunks of 16 rows (the GPU's
direct path) and of 4 (its graphs: 17 micro-batches of a 70-token prompt sent back to back, so
stage 0 runs ahead of stage 1 by more than the ring's 4 slots and waits for them), prompt lookup
speculation (rows rolled back); each prints the unsplit model's ids, says its first hop went
"device to device", and sent no activations in its frames (fewer bytes a frame than one row of
them). With --host-hops the same ids, the hop "by TCP (--host-hops)" and a row's bytes a frame.
And `serve --parallel 4` on 2 and 3 GPU stages, four requests at once (greedy and seeded, each
its own prompt: micro-batches of several sequences, several in flight) answers each as the
unsplit server does. A worker killed mid-run (kill -9) ends the run with an error naming stage
1, not a crash of the coordinator, whose ring writes stop at the receiver's exit. On a machine
with two GPUs or more, also 2 stages on GPUs 0 and 1
(`--device cuda:0,cuda:1`, device to device across them) against the unsplit model on GPU 0.
Skipped (77) where pipeshard has no CUDA device; scripts/test-gpu.sh runs it on a machine with one.
"""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pstest import check, conclude, require, skip, tmpdir, verdict  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
PROMPT = [(i * 37 + 11) % 700 + 3 for i in range(70)]


def pipeshard(args, timeout=300):
    return subprocess.run([BIN] + args, capture_output=True, text=True, errors="replace", timeout=timeout,
                          stdin=subprocess.DEVNULL)


def synth(path, kind, dim, ffn):
    p = pipeshard(["synth", "--like", "tiny", "--layers", "6", "--dim", str(dim), "--ffn", str(ffn), "--heads", "4",
                   "--kv-heads", "2", "--vocab", "768", "--type", kind, "--seed", "3", "-o", path])
    require(p.returncode == 0, f"synth {kind}: {p.stderr}")
    return path


def run(model, extra, what):
    """(ids, --stats JSON) of a run of 24 tokens after PROMPT on the GPU, or (None, None)."""
    args = ["run", "-m", model, "--device", "cuda", "--prompt-ids", ",".join(map(str, PROMPT)), "-n", "24",
            "--ignore-eos", "--print-ids", "--stats", "-c", "256"] + extra
    p = pipeshard(args)
    if not check(p.returncode == 0, f"{what}: exit {p.returncode}: {p.stderr[-1500:]}"):
        return None, None
    return p.stdout.split(), json.loads(p.stderr.strip().splitlines()[-1])


def serve_answers(model, extra, what):
    """The texts `serve` gives four requests sent at once (None where one failed)."""
    p = subprocess.Popen([BIN, "serve", "-m", model, "--device", "cuda", "--port", "0", "--parallel", "4", "-c",
                          "256"] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = [None] * 4
    try:
        m = re.search(r"listening on http://([^/]+):(\d+)/", p.stdout.readline())
        if not check(m, f"{what}: serve did not start: {p.stderr.read()[-1500:] if p.poll() is not None else ''}"):
            return out

        def ask(i):
            body = {"prompt": PROMPT[i * 7:i * 7 + 20 + 9 * i], "max_tokens": 16, "temperature": 0.8 if i % 2 else 0,
                    "seed": 40 + i, "ignore_eos": True}
            c = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=120)
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            j = json.loads(r.read())
            out[i] = j["choices"][0]["text"] if r.status == 200 else f"HTTP {r.status}: {j}"
        ts = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        p.terminate()
        p.wait(60)
    return out


def killed_worker(model):
    """`run --local-stages 2 --device cuda` (each hop slowed to 20 ms) with its worker killed
    after 2 s: exit 1 and a message naming stage 1."""
    p = subprocess.Popen([BIN, "run", "-m", model, "--device", "cuda", "--local-stages", "2", "--prompt-ids",
                          ",".join(map(str, PROMPT)), "-n", "150", "--ignore-eos", "--print-ids", "-c", "256",
                          "--sim-latency-ms", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    for k in kids:
        os.kill(int(k), 9)
    out, err = p.communicate(timeout=120)
    check(kids and p.returncode == 1 and "stage 1" in err,
          f"a killed GPU worker: workers {kids}, exit {p.returncode}, stderr {err[-800:]!r}")


def main():
    t0 = time.time()
    tmp = tmpdir("gpu-fleet-")
    probe = pipeshard(["run", "-m", synth(os.path.join(tmp, "q8.gguf"), "Q8_0", 128, 384), "--device", "cuda",
                       "--prompt-ids", "5,6", "-n", "1"])
    if probe.returncode != 0 and ("without CUDA" in probe.stderr or "no CUDA device" in probe.stderr):
        skip(f"no GPU here: {probe.stderr.strip().splitlines()[-1]}")
        return verdict()
    models = [("Q8_0", os.path.join(tmp, "q8.gguf"), 128),
              ("Q4_K_M", synth(os.path.join(tmp, "q4k.gguf"), "Q4_K_M", 256, 768), 256)]
    modes = [("greedy", ["--temp", "0"]), ("seeded", ["--temp", "0.8", "--seed", "7"])]
    for kind, model, dim in models:
        for mode, sampling in modes:
            for batch in ("16", "4"):
                ref, _ = run(model, sampling + ["-b", batch], f"{kind} {mode} unsplit, chunks of {batch}")
                for stages, hops in (("2", []), ("3", []), ("2", ["--host-hops"])):
                    what = f"{kind} {mode}, {stages} stages{' ' + hops[0] if hops else ''}, chunks of {batch}"
                    ids, st = run(model, sampling + ["-b", batch, "--local-stages", stages] + hops, what)
                    if ids is None or ref is None:
                        continue
                    check(ids == ref, f"{what}: ids {ids} differ from the unsplit model's {ref}")
                    hop = st["hops"][0]
                    per_frame = hop["bytes"] / max(hop["frames"], 1)
                    if hops:
                        check(hop["path"] == "by TCP (--host-hops)" and per_frame > dim * 4,
                              f"{what}: hop 0 {hop}, want TCP with activations in the frames")
                    else:
                        check(hop["path"].startswith("device to device") and per_frame < dim * 4,
                              f"{what}: hop 0 {hop}, want device to device with no activations in the frames")
        ref, _ = run(model, ["--temp", "0"], f"{kind} unsplit")
        ids, st = run(model, ["--temp", "0", "--local-stages", "2", "--spec", "ngram", "--spec-k", "4"],
                      f"{kind} prompt lookup, 2 stages")
        check(ids is None or ids == ref, f"{kind} prompt lookup, 2 stages: ids {ids} differ from {ref}")
    two = pipeshard(["run", "-m", models[0][1], "--device", "cuda:1", "--prompt-ids", "5,6", "-n", "1"])
    for kind, model, dim in models if two.returncode == 0 else []:
        for mode, sampling in modes:
            ref, _ = run(model, sampling, f"{kind} {mode} unsplit on GPU 0")
            ids, st = run(model, sampling + ["--local-stages", "2", "--device", "cuda:0,cuda:1"],
                          f"{kind} {mode}, stages on GPUs 0 and 1")
            check(ids is not None and ids == ref and st["hops"][0]["path"].startswith("device to device"),
                  f"{kind} {mode}, GPUs 0 and 1: ids {ids} (unsplit {ref}), hop {st and st['hops'][0]}")
    print("two GPUs: stages on GPUs 0 and 1 checked" if two.returncode == 0 else
          f"one GPU here ({(two.stderr.strip().splitlines() or [''])[-1]}): the two-GPU fleet not run")
    killed_worker(models[0][1])
    ref = serve_answers(models[1][1], [], "serve, unsplit")
    for stages in ("2", "3"):
        got = serve_answers(models[1][1], ["--local-stages", stages], f"serve, {stages} stages")
        check(None not in ref and got == ref, f"serve, {stages} GPU stages, 4 requests at once: {got}, unsplit {ref}")
    print("Q8_0 and Q4_K_M: 2 and 3 GPU stages give the unsplit model's ids, and serve's answers")
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
