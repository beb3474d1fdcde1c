#!/usr/bin/env python3
"""spec.py - speculative decoding against plain decoding, side by side in one run: decode tok/s,
acceptance and tokens per trip for each K at each emulated hop latency.

  bench/spec.py --model FILE [--draft FILE [--draft-threads N]] [--stages 2,3] [--latency 0,10,50,100]
                [--k 1,2,4,6,8,10] [--tokens 96] [--threads 1] [--prompts code,prose] [--rounds 2]
                [--llama-speculative PATH] [--json FILE]

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
With --draft and --llama-speculative PATH (llama.cpp's `llama-speculative`, built by the user), the
unsplit rows at 0 ms also run `PATH -m MODEL -md DRAFT --draft-max K -t THREADS -td DRAFT_THREADS
--temp 0` on the same prompt, in the same turns, for each K: its decode tok/s beside ours.
"""
import re
import argparse
import json
import os
import statistics
import subprocess
import sys

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


def run(a, model, stages, latency, prompt, extra):
    cmd = [BIN, "run", "-m", model, "--mmap", "--pin", "-t", str(a.threads), "-c", "1024", "-n", str(a.tokens),
           "--temp", "0", "--ignore-eos", "--print-ids", "--stats", "-p", prompt,
           "--sim-latency-ms", str(latency), *extra]
    if stages > 1:
        cmd += ["--local-stages", str(stages)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode:
        sys.exit(f"spec.py: {' '.join(cmd)}: exit {p.returncode}: {p.stderr[-600:]}")
    return p.stdout.split(), json.loads(p.stderr.strip().splitlines()[-1])


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
    ap.add_argument("--llama-speculative")
    ap.add_argument("--json")
    a = ap.parse_args()
    ks = [int(k) for k in a.k.split(",") if k != "auto"]
    rows = []
    print(f"{'prompt':6} {'stages':>6} {'ms/hop':>6} {'config':>10} {'tok/s':>8} {'ratio':>6} {'min..max':>12} "
          f"{'accept':>7} {'tok/trip':>8} {'all':>5} {'eff':>5}  K used")
    for prompt in a.prompts.split(","):
        for stages in [int(s) for s in a.stages.split(",")]:
            for latency in [float(x) for x in a.latency.split(",")]:
                src = (["--draft", a.draft, "--draft-threads", str(a.draft_threads)] if a.draft else
                       ["--spec", "ngram"])
                configs = [("plain", [])] + [(f"K={k}", src + ["--spec-k", str(k)]) for k in ks] + [("auto", src)]
                got = {name: [] for name, _ in configs}
                ids0 = None
                peer = a.llama_speculative and a.draft and stages == 1 and latency == 0
                for _ in range(a.rounds):
                    for name, extra in configs:
                        ids, st = run(a, a.model, stages, latency, PROMPTS[prompt], extra)
                        ids0 = ids0 or ids
                        got[name].append((st, ids == ids0))
                        if peer and name.startswith("K="):
                            got.setdefault("llama " + name, []).append(
                                ({"decode_tok_s": llama_speculative(a, PROMPTS[prompt], int(name[2:]))}, True))
                plain = [st["decode_tok_s"] for st, _ in got["plain"]]
                names = [name for name, _ in configs] + [n for n in got if n.startswith("llama ")]
                for name in names:
                    tps = [st["decode_tok_s"] for st, _ in got[name]]
                    ratios = [t / p for t, p in zip(tps, plain)]
                    sp = [st.get("spec", {}) for st, _ in got[name]]
                    ours = name != "plain" and not name.startswith("llama ")
                    acc = statistics.median([s.get("acceptance", 0) for s in sp]) if ours else float("nan")
                    tpt = statistics.median([s.get("tokens_per_trip", 1) for s in sp]) if ours else float("nan")
                    # every decoding trip, those that carried no guess too: what a trip yields on average
                    # (decoded tokens: all but the prompt trip's), and the speedup's share of it
                    by_k = [s.get("trips_by_k", []) for s in sp]
                    per = [(st["generated_tokens"] - 1) / sum(b) for (st, _), b in zip(got[name], by_k) if sum(b)]
                    tall = statistics.median(per) if ours and per else float("nan")
                    k_used = [sum(k * n for k, n in enumerate(b)) / sum(b) for b in by_k if sum(b)]
                    ok = all(same for _, same in got[name])
                    row = dict(prompt=prompt, stages=stages, latency_ms=latency, config=name,
                               tok_s=statistics.median(tps), ratio=statistics.median(ratios), ratio_min=min(ratios),
                               ratio_max=max(ratios), acceptance=acc, tokens_per_trip=tpt, tokens_per_any_trip=tall,
                               efficiency=statistics.median(ratios) / tall if tall == tall else float("nan"),
                               mean_k=statistics.median(k_used) if ours and k_used else float("nan"), same_ids=ok)
                    rows.append(row)
                    print(f"{prompt:6} {stages:>6} {latency:>6g} {name:>10} {row['tok_s']:>8.2f} {row['ratio']:>6.2f} "
                          f"{row['ratio_min']:>5.2f}..{row['ratio_max']:<5.2f} {acc:>7.2f} {tpt:>8.2f} {tall:>5.2f} "
                          f"{row['efficiency']:>5.2f}  {row['mean_k']:.1f}"
                          f"{'' if ok else '  WRONG: ids differ from plain'}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
