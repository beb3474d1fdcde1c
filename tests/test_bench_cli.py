#!/usr/bin/env python3
"""test_bench_cli.py - `pipeshard bench`: its figures are what it says they are, and bad
command lines are clear errors.

On synthetic models (`pipeshard synth`, tied and untied, Q8_0 and Q4_K_M):
  * --json carries every field, with the numbers of the command line (n_prompt, n_gen, threads);
  * decode_bytes_per_token equals the bytes one decode step reads, counted here from the file
    with the `gguf` package: every layer matrix, the output head (token_embd when tied), one
    embedding row, and the f32 keys and values of the positions attended to (on average over
    the steps: step i after a p-token prompt attends to p + i + 1 positions);
  * with --mem-bw G the limit is G / bytes and the share decode / limit;
  * measured bandwidth: positive and finite; with one repetition, share = decode / limit exactly
    (with several, each repetition's share uses its own bandwidth, so the medians need not agree);
  * the table form prints the prefill, decode and bandwidth lines;
  * bad flags and files: non-zero exit and one clear line;
  * --stages 2,3 (split against unsplit, one process): a row per stage count with 1 first, every
    ratio = that row's decode speed / the unsplit one, the rounds' quantiles ordered, a ring
    overhead only for splits; a split whose stage 0 computes something else (its cached shard
    bent) is caught by the token comparison; --pin runs; bad --stages/--segment lines fail.
Exit 0 pass, 1 fail.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
from pstest import check, verdict  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "")
LAYER_MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def bench(args, timeout=300):
    return subprocess.run([BIN, "bench"] + args, capture_output=True, text=True, timeout=timeout)


def decode_bytes(path, n_prompt, n_gen):
    """Bytes one decode step reads (mean over the steps), from the file alone:
    (weights, keys and values)."""
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    b = sum(int(x.n_bytes) for n, x in t.items() if n.startswith("blk.") and n.split(".")[2] in LAYER_MATS)
    head = t.get("output.weight", t["token_embd.weight"])
    emb = t["token_embd.weight"]
    rows = int(emb.shape[-1])  # gguf lists the row count last
    weights = b + int(head.n_bytes) + int(emb.n_bytes) // rows
    layers = len({n.split(".")[1] for n in t if n.startswith("blk.")})
    kv_dim = int(t["blk.0.attn_k.weight"].shape[-1])  # rows of the key projection
    positions = sum(n_prompt + i + 1 for i in range(n_gen)) / n_gen
    return weights, 2 * 4 * kv_dim * layers * positions


def synth(tmp, name, typ, untied):
    path = os.path.join(tmp, name)
    cmd = [BIN, "synth", "--layers", "3", "--dim", "256", "--heads", "4", "--kv-heads", "2", "--ffn", "512",
           "--vocab", "600", "--type", typ, "-o", path]
    subprocess.run(cmd + (["--untied"] if untied else []), check=True, capture_output=True, timeout=300)
    return path


def case_json(path, typ, untied):
    what = f"{typ} {'untied' if untied else 'tied'}"
    p = bench(["-m", path, "-p", "8", "-n", "6", "-t", "2", "-r", "3", "--json", "--mem-bw", "12.5"])
    check(p.returncode == 0, f"{what}: bench --json exits 0 (stderr {p.stderr[-300:]!r})")
    if p.returncode:
        return
    j = json.loads(p.stdout)
    for k in ("model", "isa", "activations", "threads", "n_prompt", "n_gen", "prefill_tok_s", "decode_tok_s",
              "decode_bytes_per_token", "read_bandwidth_gb_s", "decode_limit_tok_s", "bandwidth_share"):
        check(k in j, f"{what}: --json has {k}")
    check(j["n_prompt"] == 8 and j["n_gen"] == 6 and j["threads"] == 2, f"{what}: n_prompt, n_gen, threads as given")
    check(j["activations"] == "q8", f"{what}: q8 activations by default")
    check(j["prefill_tok_s"] > 0 and j["decode_tok_s"] > 0, f"{what}: positive speeds {j['prefill_tok_s']:.1f} / "
          f"{j['decode_tok_s']:.1f}")
    weights, kv = decode_bytes(path, 8, 6)
    want = weights + kv
    check(math.isclose(j["kv_bytes_per_token"], kv, rel_tol=1e-12), f"{what}: key/value bytes per token "
          f"{j['kv_bytes_per_token']} == {kv} counted from the shapes")
    check(math.isclose(j["decode_bytes_per_token"], want, rel_tol=1e-12), f"{what}: decode bytes per token "
          f"{j['decode_bytes_per_token']} == {want} counted from the file")
    check(j["read_bandwidth_gb_s"] == 12.5, f"{what}: --mem-bw 12.5 is the bandwidth used")
    limit = 12.5e9 / want
    check(math.isclose(j["decode_limit_tok_s"], limit, rel_tol=1e-9), f"{what}: limit = bandwidth / bytes")
    check(math.isclose(j["bandwidth_share"], j["decode_tok_s"] / limit, rel_tol=1e-9),
          f"{what}: share = decode / limit with a fixed bandwidth")


def case_measured(path):
    p = bench(["-m", path, "-p", "4", "-n", "4", "-t", "1", "-r", "1", "--json", "--activations", "f32"])
    check(p.returncode == 0, f"measured bandwidth: exits 0 (stderr {p.stderr[-300:]!r})")
    if p.returncode:
        return
    j = json.loads(p.stdout)
    bw = j["read_bandwidth_gb_s"]
    check(math.isfinite(bw) and 0.1 < bw < 10000, f"measured bandwidth {bw:.1f} GB/s is plausible")
    check(j["activations"] == "f32", "--activations f32 reported")
    # one repetition: its share, decode speed and bandwidth are the medians, so share = decode / limit
    want = j["decode_tok_s"] / j["decode_limit_tok_s"]
    check(math.isclose(j["bandwidth_share"], want, rel_tol=1e-9),
          f"measured bandwidth: share {j['bandwidth_share']} == decode / limit {want}")


def case_table(path):
    p = bench(["-m", path, "-p", "4", "-n", "2", "-r", "1"])
    check(p.returncode == 0, "table form exits 0")
    for word in ("prefill", "decode", "bandwidth", "measured before each repetition"):
        check(word in p.stdout, f"table form prints {word!r}")


def case_errors(tmp, path):
    junk = os.path.join(tmp, "junk.gguf")
    with open(junk, "wb") as f:
        f.write(b"not a model at all" * 10)
    cases = [
        ([], ["no model given"]),
        (["-m", path, "-r", "0"], ["-r"]),
        (["-m", path, "-p", "0"], ["-p"]),
        (["-m", path, "-n", "-3"], ["-n"]),
        (["-m", path, "-t", "x"], ["-t"]),
        (["-m", path, "--mem-bw", "0"], ["--mem-bw"]),
        (["-m", path, "--mem-bw"], ["--mem-bw"]),
        (["-m", path, "--activations", "int4"], ["--activations", "int4"]),
        (["-m", path, "--frobnicate"], ["unknown option", "--frobnicate"]),
        (["-m", os.path.join(tmp, "missing.gguf")], ["missing.gguf"]),
        (["-m", junk], ["junk.gguf"]),
        (["-m", path, "--stages", "1"], ["--stages", "distinct stage counts 2..64"]),
        (["-m", path, "--stages", "2,2"], ["--stages", "'2,2'"]),
        (["-m", path, "--stages", "2,"], ["--stages", "'2,'"]),
        (["-m", path, "--stages", "65"], ["--stages", "'65'"]),
        (["-m", path, "--stages", "x"], ["--stages", "'x'"]),
        (["-m", path, "--stages", "2", "--segment", "0"], ["--segment"]),
        (["-m", path, "--segment", "4"], ["--segment goes with --stages"]),
        (["-m", path, "--local-transport", "unix"], ["--local-transport goes with --stages"]),
        (["-m", path, "--stages", "2", "--local-transport", "pipe"], ["--local-transport must be tcp or unix"]),
        (["-m", path, "--stages", "2", "--mem-bw", "10"], ["--mem-bw", "not with --stages"]),
        (["-m", path, "--stages", "4"], ["cannot cut 3 layers into 4 stages"]),
    ]
    for args, words in cases:
        p = bench(args)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        first = lines[0] if lines else ""
        check(0 < p.returncode < 128 and all(w.lower() in first.lower() for w in words),
              f"bench {' '.join(args)!r}: clean failure naming {words} (exit {p.returncode}, {first!r})")


def case_stages(tmp, path):
    env = dict(os.environ, PIPESHARD_CACHE=os.path.join(tmp, "cache"))
    p = subprocess.run([BIN, "bench", "-m", path, "--stages", "2,3", "-p", "6", "-n", "10", "--segment", "3", "-r", "2",
                        "-t", "1", "--json"], capture_output=True, text=True, timeout=300, env=env)
    if not check(p.returncode == 0, f"--stages 2,3: exits 0 (stderr {p.stderr[-500:]!r})"):
        return
    j = json.loads(p.stdout)
    check((j["n_prompt"], j["n_gen"], j["segment"], j["reps"], j["rounds"]) == (6, 10, 3, 2, 8),
          f"--stages: n_prompt, n_gen, segment, reps and rounds (ceil(10 / 3) x 2 = 8): {j}")
    cs = j["configs"]
    check([c["stages"] for c in cs] == [1, 2, 3], f"--stages 2,3: rows for 1, 2, 3 stages: {cs}")
    base = cs[0]["decode_tok_s"]
    for c in cs:
        n = c["stages"]
        check(c["decode_tok_s"] > 0 and c["prefill_tok_s"] > 0, f"--stages: {n} stages, positive speeds")
        check(math.isclose(c["ratio"], c["decode_tok_s"] / base, rel_tol=1e-12),
              f"--stages: {n} stages, ratio {c['ratio']} = {c['decode_tok_s']} / {base}")
        check(0 < c["round_ratio_p10"] <= c["round_ratio_median"] <= c["round_ratio_p90"],
              f"--stages: {n} stages, rounds' ratio quantiles ordered: {c}")
        check((c["ring_overhead_us_per_token"] > 0) == (n > 1), f"--stages: ring overhead only for splits: {c}")
        # a token's time holds every stage's compute and the ring's overhead (stage 0's compute
        # plus the wait for the token), and little else
        spent = c["compute_us_per_token"] + c["ring_overhead_us_per_token"]
        check(0.3e6 / c["decode_tok_s"] < spent <= 1e6 / c["decode_tok_s"],
              f"--stages: {n} stages, compute + ring overhead {spent} us within a token's {1e6 / c['decode_tok_s']} us")
    check(cs[0]["round_ratio_p10"] == cs[0]["round_ratio_p90"] == 1, "--stages: the unsplit row's rounds are 1")
    p = subprocess.run([BIN, "bench", "-m", path, "--stages", "2", "-p", "4", "-n", "4", "-r", "1", "-t", "2", "--pin"],
                       capture_output=True, text=True, timeout=300, env=env)
    rows = [l.split()[0] for l in p.stdout.splitlines() if l.split() and l.split()[0].isdigit()]
    check(p.returncode == 0 and rows == ["1", "2"] and "ratio" in p.stdout,
          f"--stages 2 --pin, table: rows 1 and 2 (exit {p.returncode}, {p.stdout!r}, {p.stderr[-300:]!r})")
    p = subprocess.run([BIN, "bench", "-m", path, "--stages", "2", "--local-transport", "unix", "-p", "4", "-n", "4",
                        "-r", "1", "-t", "1", "--json"], capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 0 and [c["stages"] for c in json.loads(p.stdout or "{}").get("configs", [])] == [1, 2],
          f"--stages 2 --local-transport unix (exit {p.returncode}, {p.stdout!r}, {p.stderr[-300:]!r})")
    # bend stage 0 of the cached 2-stage split (the coordinator maps it without rehashing):
    # its tokens then differ from the unsplit model's, and the benchmark must say so
    cached = [os.path.join(r, "stage-0.gguf") for r, _, fs in os.walk(env["PIPESHARD_CACHE"]) if r.endswith("-2")]
    if not check(len(cached) == 1, f"--stages: one cached 2-stage split: {cached}"):
        return
    t = {x.name: x for x in gguf.GGUFReader(cached[0]).tensors}["blk.0.ffn_down.weight"]
    with open(cached[0], "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(bytes(int(t.n_bytes)))
    p = subprocess.run([BIN, "bench", "-m", path, "--stages", "2", "-p", "6", "-n", "10", "-r", "1", "-t", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    check(p.returncode == 1 and "2 stages generated token" in p.stderr and "where the unsplit model generated" in p.stderr,
          f"--stages with a bent stage 0: exit 1 naming the first differing token (exit {p.returncode}, {p.stderr!r})")


def main():
    if not BIN or not os.access(BIN, os.X_OK):
        print(f"PIPESHARD_BIN={BIN!r} is not an executable (run through ctest)")
        return 1
    with tempfile.TemporaryDirectory(dir=os.environ.get("PS_TEST_TMP")) as tmp:
        q8 = synth(tmp, "q8.gguf", "Q8_0", False)
        case_json(q8, "Q8_0", False)
        case_json(synth(tmp, "q8u.gguf", "Q8_0", True), "Q8_0", True)
        case_json(synth(tmp, "km.gguf", "Q4_K_M", True), "Q4_K_M", True)
        case_measured(q8)
        case_table(q8)
        case_errors(tmp, q8)
        case_stages(tmp, q8)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
