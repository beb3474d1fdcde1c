#!/usr/bin/env python3
"""spec.py - speculative decoding against plain decoding, side by side in one run: decode tok/s,
acceptance and tokens per trip for each K at each emulated hop latency.

  bench/spec.py --model FILE [--draft FILE [--draft-threads N]] [--stages 2,3] [--latency 0,10,50,100]
                [--k 1,2,4,6,8,10] [--tokens 96] [--threads 1] [--prompts code,prose] [--rounds 2]
                [--turns 1] [--serve [--streams 1]] [--overlap] [--llama-speculative PATH] [--no-plain]
                [--json FILE]

For each stage count and latency, `pipeshard run -m FILE --local-stages N --pin -t THREADS
--sim-latency-ms L --temp 0 -n TOKENS --stats` runs plain and with `--spec ngram --spec-k K`
for each K (with --draft, `--draft FILE --spec-k K` instead), in turns (plain, K1, K2, ..., then again for --rounds rounds, so that a machine
whose speed drifts slows every configuration alike), on each prompt. Printed per row: the
median decode tok/s, its ratio to plain's (median of the rounds' ratios, with their min..max),
the acceptance (guesses kept / guesses sent), the mean tokens per trip that carried guesses and
per decoding trip of any kind ('all'), the speedup's share of the latter ('eff': 1 when a trip
of guesses costs what a plain one does) and the mean K of the decoding trips. Greedy, so every
configuration must print the same ids: a row whose ids differ from plain's is marked WRONG.
Needs stages x threads cores (one pinned core per stage thread).
With --turns N (2 to 5), each configuration is a conversation instead (`pipeshard chat`, N turns
on the prompt's theme, each answer --tokens long, --ignore-eos): rows '1st' give its first answer,
rows 'later' the others taken together, where `--spec-k auto` starts from what the answers before
measured (the same text for every configuration: greedy; a row whose text differs is WRONG).
With --serve, each configuration is a `pipeshard serve --parallel 1` with the same flags instead, and
its answers streamed /v1/completions requests of --tokens tokens (with --turns, /v1/chat/completions
turns of one conversation) at temperature 0 with ignore_eos: decode tok/s from the arrival of the
first token's chunk to the last one's, the spec figures from /metrics ('all' is not known there;
K is the mean of the trips that carried guesses). --streams S (with --serve, one turn): S requests
at once (`--parallel S`), each prompt after a first line of its own; tok/s is then the aggregate
decode rate: every stream's tokens after its first over the time from the first stream's first
token to the last stream's last.
With --draft and --overlap, each K and auto also runs with `--spec-overlap off` (rows 'no-ov'), in
the same turns: what the overlap gains.
With --draft and --llama-speculative PATH (llama.cpp's `llama-speculative`, built by the user), the
unsplit rows at 0 ms also run `PATH -m MODEL -md DRAFT --draft-max K -t THREADS -td DRAFT_THREADS
--temp 0` on the same prompt, in the same turns, for each K: its decode tok/s beside ours.
With --no-plain, plain decoding does not run (at 100 ms a hop it is the slowest run by far) and each
ratio is to the round's best fixed K instead: what `auto` reaches of the best K in hindsight; the ids
are then checked against the first configuration's.
"""
import re
import argparse
import concurrent.futures
import itertools
import json
import os
import http.client
import statistics
import subprocess
import sys
import time

from serve import Server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PIPESHARD_BIN", os.path.join(ROOT, "build", "pipeshard"))
PROMPTS = {
    "code": ("def add_user(db, name, email):\n    user = {\"name\": name, \"email\": email}\n"
             "    db.insert(\"users\", user)\n    return user\n\n\ndef add_order(db, user, item, price):\n"
             "    order = {\"user\": user, \"item\": item, \"price\": price}\n    db.insert(\"orders\", order)\n"
             "    return order\n\n\ndef add_"),
    "prose": ("The lighthouse keeper climbed the stairs every evening. At the top of the stairs he lit the lamp, "
              "and the lamp turned all night. Every morning he climbed the stairs again and put out the lamp. "
              "One evening, when the keeper climbed the stairs,"),
}
# --turns N: the turns of a conversation (`pipeshard chat`, each answer --tokens long)
TURNS = {
    "code": ["Write a Python class for a bank account with deposit, withdraw and a history of operations.",
             "Add type hints and docstrings to it.", "Now write unit tests for it with unittest.",
             "Add a transfer method between two accounts, with its tests.", "Go on."],
    "prose": ["Tell me a story about a lighthouse keeper who finds a message in a bottle.", "Go on.",
              "What happens next?", "Go on.", "How does it end?"],
}


# --streams S: the first line of stream i's prompt (then i + 1)
STREAM_LINE = {"code": "# module ", "prose": "Chapter "}


def run(a, model, stages, latency, prompt, extra):
    """One configuration's answers: what it printed (ids, or with --turns the chat's text) and the
    --stats of each answer."""
    common = ["-m", model, "--mmap", "--pin", "-t", str(a.threads), "--sim-latency-ms", str(latency), *extra]
    if stages > 1:
        common += ["--local-stages", str(stages)]
    if a.serve:
        return serve_run(a, ["-c", str(a.turns * (a.tokens + 160) + 256), *common], prompt)
    common += ["-n", str(a.tokens), "--temp", "0", "--ignore-eos", "--stats"]
    if a.turns > 1:
        cmd = [BIN, "chat", "-c", str(a.turns * (a.tokens + 160)), *common]
        turns = TURNS[prompt][:a.turns]
        stdin = "".join(t + "\n" for t in turns)
    else:
        cmd, stdin = [BIN, "run", "-c", "1024", "--print-ids", "-p", PROMPTS[prompt], *common], None
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=900)
    if p.returncode:
        sys.exit(f"spec.py: {' '.join(cmd)}: exit {p.returncode}: {p.stderr[-600:]}")
    stats = [json.loads(line) for line in p.stderr.splitlines() if line.startswith("{")]
    return p.stdout.split(), stats[-a.turns:]


def metrics(port):
    """/metrics' speculation counters."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("pipeshard_spec_") and name.endswith("_total"):
            out[name[len("pipeshard_spec_"):-len("_total")]] = float(value)
    return out


def ask(port, path, body):
    """One streamed request: (its text, completion tokens, first and last text chunks' times)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", path, json.dumps({**body, "temperature": 0, "ignore_eos": True, "stream": True,
                                        "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"spec.py: POST {path}: {r.status} {r.read()[:300]!r}")
    text, times, n = [], [], 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        d = json.loads(line[6:])
        n = d["usage"]["completion_tokens"] if d.get("usage") else n
        ch = d.get("choices") or [{}]
        part = ch[0].get("text") or (ch[0].get("delta") or {}).get("content")
        if part:
            text.append(part), times.append(time.perf_counter())
    return "".join(text), n, times[0], times[-1]


def serve_run(a, cmd, prompt):
    """run() through `pipeshard serve`: one answer per turn, its stats from the chunks and /metrics."""
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    srv = Server([BIN, "serve", "--parallel", str(a.streams), *cmd], "spec")  # its log: bench/out/serve-spec.log
    try:
        texts, stats, messages = [], [], []
        for turn in (TURNS[prompt][:a.turns] if a.turns > 1 else [None]):
            before = metrics(srv.port)
            if turn is None:  # each stream its own first line before the prompt
                with concurrent.futures.ThreadPoolExecutor(a.streams) as ex:
                    got = list(ex.map(lambda i: ask(srv.port, "/v1/completions", {
                        "prompt": (f"{STREAM_LINE[prompt]}{i + 1}\n" if a.streams > 1 else "") + PROMPTS[prompt],
                        "max_tokens": a.tokens}), range(a.streams)))
                text = "\n".join(g[0] for g in got)
                n = sum(g[1] - 1 for g in got) + 1  # decoded tokens, all streams: from the first first token
                t0, t1 = min(g[2] for g in got), max(g[3] for g in got)
            else:
                messages.append({"role": "user", "content": turn})
                text, n, t0, t1 = ask(srv.port, "/v1/chat/completions", {"messages": messages, "max_tokens": a.tokens})
                messages.append({"role": "assistant", "content": text})
            d = {k: v - before.get(k, 0) for k, v in metrics(srv.port).items()}
            trips, drafted, kept = d.get("trips", 0), d.get("drafted_tokens", 0), d.get("kept_tokens", 0)
            spec = dict(trips=trips, drafted=drafted, kept=kept, acceptance=kept / drafted if drafted else 0,
                        tokens_per_trip=(kept + trips) / trips if trips else 0,
                        k_mean=drafted / trips if trips else 0) if "--draft" in cmd or "--spec" in cmd else {}
            texts.append(text)
            stats.append(dict(decode_tok_s=(n - 1) / (t1 - t0) if t1 > t0 else 0, generated_tokens=n, spec=spec))
        return texts, stats
    finally:
        srv.stop()


def pooled(stats):
    """The decode tok/s and --stats 'spec' figures of several answers taken together."""
    if len(stats) == 1:
        return stats[0]
    n = sum(st["generated_tokens"] - 1 for st in stats)
    secs = sum((st["generated_tokens"] - 1) / st["decode_tok_s"] for st in stats if st["decode_tok_s"] > 0)
    specs = [st.get("spec", {}) for st in stats]
    by_k = [sum(t) for t in itertools.zip_longest(*[s.get("trips_by_k", []) for s in specs], fillvalue=0)]
    drafted, kept = sum(s.get("drafted", 0) for s in specs), sum(s.get("kept", 0) for s in specs)
    trips = sum(s.get("trips", 0) for s in specs)
    spec = dict(acceptance=kept / drafted if drafted else 0, tokens_per_trip=(kept + trips) / trips if trips else 0,
                trips_by_k=by_k, k_mean=drafted / trips if trips else 0) if specs[0] else {}
    return dict(decode_tok_s=n / secs if secs else 0, generated_tokens=n + 1, spec=spec)


def llama_speculative(a, prompt, k):
    """llama-speculative's decode tok/s (its 'decoded N tokens in S seconds, speed: X t/s')."""
    cmd = [a.llama_speculative, "-m", a.model, "-md", a.draft, "-p", prompt, "-n", str(a.tokens), "--draft-max",
           str(k), "-t", str(a.threads), "-td", str(a.draft_threads), "--temp", "0", "-c", "1024", "--ignore-eos"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    m = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", p.stdout + p.stderr)
    if not m:
        sys.exit(f"spec.py: {' '.join(cmd)}: exit {p.returncode}, no speed line: {(p.stdout + p.stderr)[-600:]}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--draft-threads", type=int, default=1)
    ap.add_argument("--stages", default="2,3")
    ap.add_argument("--latency", default="0,10,50,100")
    ap.add_argument("--k", default="1,2,4,6,8,10")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", default="code,prose")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--llama-speculative")
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    ks = [int(k) for k in a.k.split(",") if k != "auto"]
    if not 1 <= a.turns <= len(TURNS["code"]) or (a.turns > 1 and a.llama_speculative):
        sys.exit(f"spec.py: --turns {a.turns}: 1 to {len(TURNS['code'])}, and 1 with --llama-speculative")
    if not 1 <= a.streams <= 64 or (a.streams > 1 and (not a.serve or a.turns > 1)):
        sys.exit(f"spec.py: --streams {a.streams}: 1 to 64, more than 1 only with --serve and one turn")
    if a.no_plain and not ks:
        sys.exit("spec.py: --no-plain needs a fixed K in --k: the ratios are to the best of them")
    answers = [("", slice(None))] if a.turns == 1 else [("1st", slice(0, 1)), ("later", slice(1, None))]
    rows = []
    print(f"{'prompt':6} {'stages':>6} {'ms/hop':>6} {'config':>10} {'tok/s':>8} {'ratio':>6} {'min..max':>12} "
          f"{'accept':>7} {'tok/trip':>8} {'all':>5} {'eff':>5}  K used")
    for prompt in a.prompts.split(","):
        for stages in [int(s) for s in a.stages.split(",")]:
            for latency in [float(x) for x in a.latency.split(",")]:
                src = (["--draft", a.draft, "--draft-threads", str(a.draft_threads)] if a.draft else
                       ["--spec", "ngram"])
                configs = [("plain", [])] * (not a.no_plain) + \
                    [(f"K={k}", src + ["--spec-k", str(k)]) for k in ks] + [("auto", src)]
                if a.overlap and a.draft:  # each draft configuration again without the overlap
                    configs += [(n + " no-ov", x + ["--spec-overlap", "off"]) for n, x in configs[1:]]
                got = {name: [] for name, _ in configs}
                ids0 = None
                peer = a.llama_speculative and a.draft and stages == 1 and latency == 0
                for _ in range(a.rounds):
                    for name, extra in configs:
                        ids, stats = run(a, a.model, stages, latency, prompt, extra)
                        ids0 = ids0 or ids
                        got[name].append((stats, ids == ids0))
                        if peer and name.startswith("K="):
                            got.setdefault("llama " + name, []).append(
                                ([{"decode_tok_s": llama_speculative(a, PROMPTS[prompt], int(name[2:]))}], True))
                names = [name for name, _ in configs] + [n for n in got if n.startswith("llama ")]
                # the yardstick of each round: plain decoding, or with --no-plain the best fixed K
                yard = ["plain"] if not a.no_plain else [n for n in names if n.startswith("K=")]
                plain_of = {which: [max(pooled(got[n][r][0][part])["decode_tok_s"] for n in yard)
                                    for r in range(a.rounds)] for which, part in answers}
                for (which, part), name in [(w, n) for w in answers for n in names]:
                    runs = [(pooled(stats[part]), same) for stats, same in got[name]]
                    plain = plain_of[which]
                    tps = [st["decode_tok_s"] for st, _ in runs]
                    ratios = [t / p for t, p in zip(tps, plain)]
                    sp = [st.get("spec", {}) for st, _ in runs]
                    ours = name != "plain" and not name.startswith("llama ")
                    acc = statistics.median([s.get("acceptance", 0) for s in sp]) if ours else float("nan")
                    tpt = statistics.median([s.get("tokens_per_trip", 1) for s in sp]) if ours else float("nan")
                    # every decoding trip, those that carried no guess too: what a trip yields on average
                    # (decoded tokens: all but the prompt trip's), and the speedup's share of it
                    by_k = [s.get("trips_by_k", []) for s in sp]
                    per = [(st["generated_tokens"] - 1) / sum(b) for (st, _), b in zip(runs, by_k) if sum(b)]
                    tall = statistics.median(per) if ours and per else float("nan")
                    k_used = [sum(k * n for k, n in enumerate(b)) / sum(b) for b in by_k if sum(b)] or \
                        [s["k_mean"] for s in sp if "k_mean" in s]  # serve: of the trips with guesses
                    ok = all(same for _, same in got[name])
                    label = f"{name} {which}".strip()
                    row = dict(prompt=prompt, stages=stages, latency_ms=latency, config=label,
                               tok_s=statistics.median(tps), ratio=statistics.median(ratios), ratio_min=min(ratios),
                               ratio_max=max(ratios), acceptance=acc, tokens_per_trip=tpt, tokens_per_any_trip=tall,
                               efficiency=statistics.median(ratios) / tall if tall == tall else float("nan"),
                               mean_k=statistics.median(k_used) if ours and k_used else float("nan"), same_ids=ok)
                    rows.append(row)
                    print(f"{prompt:6} {stages:>6} {latency:>6g} {label:>10} {row['tok_s']:>8.2f} {row['ratio']:>6.2f} "
                          f"{row['ratio_min']:>5.2f}..{row['ratio_max']:<5.2f} {acc:>7.2f} {tpt:>8.2f} {tall:>5.2f} "
                          f"{row['efficiency']:>5.2f}  {row['mean_k']:.1f}"
                          f"{'' if ok else '  WRONG: ids differ from plain'}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
