#!/usr/bin/env python3
"""test_plan_cli.py - `pipeshard plan` and `probe`: plan's table and prediction recomputed here from the model
file and hosts.json (the `gguf` package reads the tensors' sizes; the cost model of
src/coord/plan.h written out in Python), the best placement (one stream, and the aggregate of
2 and 4 sequences) against a brute force over every ordered choice of hosts and every cut, -o writing shards and a fleet.json with the plan's
layers and the hosts' addresses, probe's entry taken by plan as it is, and the refusals (memory
missing, a malformed hosts.json).
Models are written by tests/ref/synth.py. Exit 0 pass, 1 fail.
"""
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
from pstest import failures, require  # noqa: E402
from ref.synth import write_model  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "")


def plan(args):
    return subprocess.run([BIN, "plan"] + args, capture_output=True, text=True, timeout=120)


def model_sizes(path):
    """Bytes of each layer, the embedding, and the head (output_norm + output, or the tied embedding)."""
    r = gguf.GGUFReader(path)
    layers, embed, head, tied = {}, 0, 0, True
    for t in r.tensors:
        n = int(t.n_bytes)
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m:
            layers[int(m.group(1))] = layers.get(int(m.group(1)), 0) + n
        elif t.name == "token_embd.weight":
            embed = n
        elif t.name == "output.weight":
            head += n
            tied = False
        elif t.name == "output_norm.weight":
            head += n
    if tied:
        head += embed
    return [layers[i] for i in range(len(layers))], embed, head


def stage_extra(out):
    """The bytes plan counts on every stage beside its layers (buffers, file metadata: what a worker
    counts against --max-mem, which tests/test_capped.py checks end to end), from its output."""
    m = re.search(r"and (\d+) bytes of buffers \(128 rows on 16 threads\)", out)
    require(m, f"no buffers line: {out}")
    return int(m.group(1))


def predict(hosts, links, default, sizes, dims, ctx, par, order, bounds, buf):
    """The cost model of plan.h: (ms per token, fits, aggregate tok/s of par sequences: min(par, stages)
    micro-batches in flight, each stage reading its weights once per micro-batch); buf: each stage's
    bytes beside its layers (stage_extra)."""
    layers, embed, head = sizes
    dim, q_dim, kv_dim, ffn = dims
    kv = -(-ctx // 32) * 32 * par * kv_dim * 2 * 4  # the KV cache in whole blocks of 32 positions
    n, L, t, ok, cmax = len(order), len(layers), 0.0, True, 0.0
    for k, h in enumerate(order):
        a, b = bounds[k], bounds[k + 1]
        w = sum(layers[a:b])
        mem = w + (embed if a == 0 else 0) + (head if b == L else 0) + (b - a) * kv + buf
        ok = ok and mem <= hosts[h]["mem"]
        c = hosts[h]["ms_per_gb"] * (w + (head if b == L else 0)) / 1e9
        t, cmax = t + c, max(cmax, c)
        if n > 1:
            nxt = order[(k + 1) % n]
            rtt, mbps = links.get((h, nxt), default)
            t += rtt / 2 + (0 if k == n - 1 else dim * 4 * 8 / (mbps * 1e6) * 1000)
    return t, ok, par * 1000 / max(t, min(par, n) * cmax)


def brute(hosts, links, default, sizes, dims, ctx, par, buf):
    """The least ms per token and the most aggregate tok/s of any placement."""
    L, best, agg = len(sizes[0]), None, None
    for n in range(1, min(len(hosts), L) + 1):
        for order in itertools.permutations(range(len(hosts)), n):
            for cuts in itertools.combinations(range(1, L), n - 1):
                bounds = [0, *cuts, L]
                t, ok, a = predict(hosts, links, default, sizes, dims, ctx, par, order, bounds, buf)
                if ok and (best is None or t < best):
                    best = t
                if ok and (agg is None or a > agg):
                    agg = a
    return best, agg


def main():
    if not BIN or not os.access(BIN, os.X_OK):
        print("PIPESHARD_BIN is not set (run through ctest)")
        return 1
    tmp = tempfile.mkdtemp(prefix="plan_", dir=os.environ.get("PS_TEST_TMP") or None)
    path = write_model(os.path.join(tmp, "m.gguf"), "llama", n_layer=6, n_embd=64, n_head=4, n_head_kv=2,
                       n_ff=96, n_vocab=320, n_ctx=256)
    sizes = model_sizes(path)
    dims = (64, 64, 32, 96)
    one = os.path.join(tmp, "one.json")  # one host of ample memory: plan's per-stage extra for ctx 256
    with open(one, "w") as f:
        json.dump({"hosts": [{"name": "big", "mem": "1G", "ms_per_gb": 10}]}, f)
    kv, buf = 256 * 32 * 2 * 4, stage_extra(plan(["-m", path, "--hosts", one, "--ctx", "256"]).stdout)
    total = sum(sizes[0]) + sizes[1] + sizes[2] + 6 * kv + buf
    # three hosts, none of which holds the whole model: a fast one, a middling one, a slow one
    # with the most memory; a slow link between the first two
    hosts = [{"name": "fast", "address": "10.0.0.1:7701", "mem": int(total * 0.45), "ms_per_gb": 20},
             {"name": "mid", "address": "10.0.0.2:7701", "mem": f"{total * 0.5 / 1024:.1f}K", "ms_per_gb": 50},
             {"name": "slow", "address": "10.0.0.3:7701", "mem": int(total * 0.7), "ms_per_gb": 90}]
    spec = {"hosts": hosts, "links": [{"between": ["fast", "mid"], "rtt_ms": 9, "mbps": 50}],
            "default_link": {"rtt_ms": 0.4, "mbps": 1000}}
    hp = os.path.join(tmp, "hosts.json")
    with open(hp, "w") as f:
        json.dump(spec, f)
    mem = [h["mem"] if isinstance(h["mem"], int) else int(float(h["mem"][:-1]) * 1024) for h in hosts]
    hs = [{"mem": mem[i], "ms_per_gb": h["ms_per_gb"]} for i, h in enumerate(hosts)]
    links = {(0, 1): (9, 50), (1, 0): (9, 50)}
    for ctx, par in ((256, 1), (64, 2), (64, 4)):
        p = plan(["-m", path, "--hosts", hp, "--ctx", str(ctx), "--parallel", str(par)])
        require(p.returncode == 0, f"plan failed: {p.stderr}")
        rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(\d+):(\d+)\s", p.stdout, re.M)
        names = [h["name"] for h in hosts]
        order = [names.index(r[1]) for r in rows]
        bounds = [0] + [int(r[3]) for r in rows]
        buf = stage_extra(p.stdout)
        t, ok, agg = predict(hs, links, (0.4, 1000), sizes, dims, ctx, par, order, bounds, buf)
        shown = float(re.search(r"predicted: ([\d.]+) ms per token", p.stdout).group(1))
        require(ok, f"the plan does not fit by the cost model: {p.stdout}")
        require(abs(shown - t) < 0.01, f"predicted {shown} ms, recomputed {t:.4f}")
        require("(exact search)" in p.stdout, f"not exact: {p.stdout}")
        best, best_agg = brute(hs, links, (0.4, 1000), sizes, dims, ctx, par, buf)
        if par == 1:
            require(abs(t - best) < 1e-6 * best, f"plan {t} ms per token, brute force {best}")
        else:
            m = re.search(r"([\d.]+) tok/s with (\d+) sequences", p.stdout)
            require(m and int(m.group(2)) == par and abs(float(m.group(1)) - agg) < 0.051,
                    f"aggregate shown {m and m.group(1)}, recomputed {agg:.3f}")
            require(abs(agg - best_agg) < 1e-6 * best_agg, f"plan {agg} tok/s with {par}, brute force {best_agg}")
        print(f"  ok: ctx {ctx} x {par}: {len(rows)} stages {[names[i] for i in order]} {bounds}, {t:.4f} ms, "
              f"{agg:.1f} tok/s")

    # -o: shards and fleet.json with the plan's layers and the hosts' addresses
    out = os.path.join(tmp, "fleet")
    p = plan(["-m", path, "--hosts", hp, "--ctx", "256", "-o", out])
    require(p.returncode == 0, f"plan -o failed: {p.stderr}")
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(\d+):(\d+)\s", p.stdout, re.M)
    with open(os.path.join(out, "fleet.json")) as f:
        fleet = json.load(f)
    stages = fleet["stages"]
    require(len(stages) == len(rows), f"fleet.json has {len(stages)} stages, the plan {len(rows)}")
    for k, (st, r) in enumerate(zip(stages, rows)):
        require(st["layers"] == [int(r[2]), int(r[3])], f"stage {k}: {st}")
        if k > 0:
            addr = next(h["address"] for h in hosts if h["name"] == r[1])
            require(st["address"] == addr, f"stage {k}: address {st['address']}, host's {addr}")
    print(f"  ok: -o wrote {len(stages)} shards and fleet.json")

    # probe: its entry is a hosts.json host that plan takes as it is
    pr = subprocess.run([BIN, "probe", "-t", "1", "-m", path, "--name", "here", "--address", "127.0.0.1:7701"],
                        capture_output=True, text=True, timeout=120)
    require(pr.returncode == 0, f"probe failed: {pr.stderr}")
    entry = json.loads(pr.stdout.strip().splitlines()[-1])
    require(entry["name"] == "here" and entry["address"] == "127.0.0.1:7701" and entry["ms_per_gb"] > 0
            and re.fullmatch(r"[\d.]+G", entry["mem"]), f"probe's entry {entry}")
    with open(hp, "w") as f:
        json.dump({"hosts": [entry]}, f)
    p = plan(["-m", path, "--hosts", hp, "--ctx", "64"])
    require(p.returncode == 0 and re.search(r"^\s+0\s+here\s+0:6\s", p.stdout, re.M), f"plan of probe's host: {p.stdout}")
    bad = subprocess.run([BIN, "probe", "--address", "nowhere"], capture_output=True, text=True, timeout=60)
    require(bad.returncode == 2 and "--address" in bad.stderr, f"probe --address nowhere: {bad.stderr!r}")
    print(f"  ok: probe: {entry}")

    # --like: a preset's shape planned without its file gives what the written file gives
    with open(hp, "w") as f:
        json.dump(spec, f)
    hosts4 = {"hosts": [{"name": f"h{i}", "address": f"10.0.0.{i}:7701", "mem": "24G", "ms_per_gb": 40 + 10 * i}
                        for i in range(4)], "default_link": {"rtt_ms": 0.4, "mbps": 1000}}
    h4 = os.path.join(tmp, "hosts4.json")
    with open(h4, "w") as f:
        json.dump(hosts4, f)
    full = os.path.join(tmp, "smol.gguf")
    w = subprocess.run([BIN, "synth", "--like", "smollm2-135m", "--type", "Q4_0", "-o", full],
                       capture_output=True, text=True, timeout=300)
    require(w.returncode == 0, f"synth: {w.stderr}")
    a = plan(["-m", full, "--hosts", h4])
    b = plan(["--like", "smollm2-135m", "--type", "Q4_0", "--hosts", h4])
    # the same placement and prediction; the memory column (two decimals) differs only by what --like
    # cannot know: the file's metadata, the kernels' scratch (plan's per-stage extra, printed)
    strip = lambda out: [re.sub(r"\s+[\d.]+ \(\s*[\d.]+\)\s+", " MEM ", l) for l in out.splitlines()  # noqa: E731
                         if not l.startswith(("plan for", "each stage's memory"))]
    gib = lambda out: re.search(r"([\d.]+) GiB of weights", out).group(1)  # noqa: E731
    mems = lambda out: [float(x) for x in re.findall(r"\s([\d.]+) \(\s*[\d.]+\)\s", out)]  # noqa: E731
    require(a.returncode == 0 and b.returncode == 0 and gib(a.stdout) == gib(b.stdout)
            and strip(a.stdout) == strip(b.stdout), f"-m file vs --like:\n{a.stdout}\n{b.stdout}\n{a.stderr}{b.stderr}")
    gap = (stage_extra(a.stdout) - stage_extra(b.stdout)) / 2**30
    require(all(abs(x - y - gap) <= 0.0101 for x, y in zip(mems(a.stdout), mems(b.stdout))),
            f"memory -m {mems(a.stdout)} vs --like {mems(b.stdout)}: more than the extra's {gap:.4f} GiB apart")
    c = plan(["--like", "llama-3.1-70b", "--type", "Q4_0", "--hosts", h4])
    require(c.returncode == 0 and "llama-3.1-70b-shaped Q4_0 model (not written): 80 layers" in c.stdout,
            f"70B on 4 hosts of 24G: {c.stdout}{c.stderr}")
    for h in hosts4["hosts"]:
        h["mem"] = "8G"
    with open(h4, "w") as f:
        json.dump(hosts4, f)
    c = plan(["--like", "llama-3.1-70b", "--type", "Q4_0", "--hosts", h4])
    require(c.returncode == 1 and "GiB missing" in c.stderr, f"70B on 4 hosts of 8G: {c.stderr!r}")
    for args, word in ((["--like", "llama-3.1-70b", "--hosts", h4], "go together"),
                       (["--like", "nope", "--type", "Q4_0", "--hosts", h4], "unknown preset"),
                       (["-m", full, "--like", "tiny", "--type", "Q4_0", "--hosts", h4], "give one"),
                       (["--like", "tiny", "--type", "Q4_0", "--hosts", h4, "-o", tmp], "-o writes")):
        c = plan(args)
        require(c.returncode == 2 and word in c.stderr, f"plan {args}: exit {c.returncode}, {c.stderr!r}")
    print("  ok: --like plans as the written file does; 70B on 4 hosts of 24G; refusals")

    # refusals
    small = dict(spec, hosts=[dict(h, mem=100000) for h in hosts])
    with open(hp, "w") as f:
        json.dump(small, f)
    p = plan(["-m", path, "--hosts", hp])
    require(p.returncode == 1 and "GiB missing" in p.stderr and p.stderr.count("\n") == 1,
            f"too little memory: exit {p.returncode}, {p.stderr!r}")
    for bad, word in (({"hosts": []}, "\"hosts\""),
                      ({"hosts": [{"name": "a", "mem": "12Q", "ms_per_gb": 1}]}, "\"mem\""),
                      ({"hosts": [{"name": "a", "mem": "1G", "ms_per_gb": -1}]}, "\"ms_per_gb\""),
                      ({"hosts": [{"name": "a", "mem": "1G", "ms_per_gb": 1}, {"name": "a", "mem": "1G", "ms_per_gb": 1}]}, "two hosts"),
                      ({"hosts": [{"name": "a", "mem": "1G", "ms_per_gb": 1}], "links": [{"between": ["a", "b"], "rtt_ms": 1, "mbps": 1}]}, "\"between\""),
                      ({"hosts": [{"name": "a", "address": "nowhere", "mem": "1G", "ms_per_gb": 1}]}, "\"address\"")):
        with open(hp, "w") as f:
            json.dump(bad, f)
        p = plan(["-m", path, "--hosts", hp])
        require(p.returncode == 1 and word in p.stderr and p.stderr.startswith("pipeshard plan: "),
                f"{bad}: exit {p.returncode}, {p.stderr!r}")
    p = plan(["--hosts", hp])
    require(p.returncode == 2 and "-m MODEL" in p.stderr, f"no model: {p.stderr!r}")
    print("  ok: refusals")
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
