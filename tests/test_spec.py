#!/usr/bin/env python3
"""test_spec.py - speculative decoding (`--spec ngram`, `--draft MODEL`, `--spec-k K|auto`,
`--spec-overlap`) in run, chat and serve: guesses checked by the last stage in one trip around the
ring, which must never change the tokens of greedy decoding nor the distribution of sampled ones.

  1. Prompt lookup (--spec ngram) gives plain decoding's tokens exactly: for K = 1..10 and auto on 1, 2 and 3 stages, greedy
     and seeded (temperature 0.8), with the prompt in one micro-batch and chunked
     (--prefill-chunk), on stories260K (../shared/models); K = 1, 4, 10 and auto on 1 and 2 stages on
     SmolLM2-135M-Instruct (.cache/models). A repetitive prompt makes the guesses land: the
     --stats line's spec figures must show guesses kept (more than one token per trip) and add
     up (kept <= drafted <= K x trips).
  2. `serve --spec ngram` and `serve --draft` (SmolLM2 drafting for itself, K 3, hops of 20 ms) with
     and without --spec-overlap on 2 stages: 8 requests at once, greedy and seeded, each with the
     top-2 log-probabilities of every token, get exactly the answers of a server without --spec
     (the draft's seeded ones, whose guesses are sampled: the answers they get alone, the same with
     the overlap as without); /metrics counts the trips, the guesses sent and kept, and the trips
     whose guesses the overlap drafted (some with it, none without).
  3. A draft model (--draft): stories260K drafting for itself keeps every greedy guess, and a
     synthetic model with the target's vocabulary but other weights keeps almost none; for K = 1,
     3, 10 and auto on 1, 2 and 3 stages, with and without --spec-overlap, greedy runs give plain
     decoding's ids, and seeded runs (guesses drawn from the draft's distribution, checked by the
     rejection rule) the same ids for a fixed K on every split with and without overlap; the
     self-draft keeps over 90 % of its sampled guesses, the bad draft under 30 % (the good draft's
     overlap must have drafted some trips). Another vocabulary is refused naming the first
     difference (the sizes, or a token's texts). With --spec-k auto a trip's guesses stop where
     the draft's probability of them all falls below 0.1, checked trip by trip against the NumPy
     reference's softmax (stories260K drafting for itself; run with and without the overlap, and
     serve), and reach past auto's K where the hops make most of a trip's wait (in serve too, where
     a lone request's trips know the stages' compute).
  4. The distribution: 600 seeded draws at temperature 0.25 with the bad draft and with the model
     drafting for itself (sampled guesses, the rejection rule), of the first token and of the
     second given the first, against the target's softmax (from --dump-logits of a plain run):
     chi-square p-values above 0.001.
  5. Usage errors: --spec-k 0 and 17, an unknown draft source, --spec-k without --spec, --spec
     with --dump-logits, --spec with --draft, --draft-threads without --draft: exit 2 with a line
     that says why. `chat` answers two turns the same with --spec ngram and --draft as without.
A sanitizer build runs 1 (K 1, 4, 10 and auto on 1 and 2 stages), 3 and 5 on stories260K and
synthetic models only.
"""
import concurrent.futures
import math
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, conclude, require, skip, spec_trace, tmpdir  # noqa: E402
from psserve import Server  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
STORIES = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
SMOL = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = ("Once upon a time, there was a little girl named Lily. She liked to play in the park. "
          "One day, Lily went to the park. Once upon a time, there was a little")
SAMPLING = {"greedy": ["--temp", "0"], "seeded": ["--temp", "0.8", "--seed", "5"]}


def run(model, extra, n=40):
    """`run --print-ids --stats`: (ids, stats) or a failed check."""
    args = [BIN, "run", "-m", model, "--mmap", "-p", PROMPT, "-n", str(n), "--print-ids", "--stats", "-c", "256",
            "-t", "1", *extra]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    require(p.returncode == 0, lambda: f"{' '.join(args[3:])}: exit {p.returncode}: {p.stderr[-800:]}")
    return p.stdout.split(), json.loads(p.stderr.strip().splitlines()[-1])


def case_exact(model, name, ks, stages, chunked):
    kept = 0
    for n_stages in stages:
        fleet = ["--local-stages", str(n_stages)] if n_stages > 1 else []
        for how, sampling in SAMPLING.items():
            for chunk in ([], ["--prefill-chunk", "11"]) if chunked else ([],):
                plain, _ = run(model, fleet + sampling + chunk)
                for k in ks:
                    what = f"{name}, {n_stages} stage(s), {how}, K={k}{' chunked' if chunk else ''}"
                    ids, st = run(model, fleet + sampling + chunk + ["--spec", "ngram", "--spec-k", str(k)])
                    check(ids == plain, f"{what}: {ids} differ from plain decoding's {plain}")
                    sp = st.get("spec", {})
                    most = 10 if k == "auto" else k
                    check(sp.get("k") == k and sp["kept"] <= sp["drafted"] <= most * sp["trips"] and
                          st["generated_tokens"] == len(ids), f"{what}: stats {st}")
                    kept += sp.get("kept", 0)
    check(kept > 0, f"{name}: no guess was ever kept")
    print(f"  ok: {name}: the same tokens as plain decoding for K in {ks} on {stages} stage(s), greedy and seeded"
          f"{', chunked and not' if chunked else ''} ({kept} guesses kept)")


def case_usage(model):
    for args, words in ((["--spec", "ngram", "--spec-k", "0"], "--spec-k"),
                        (["--spec", "ngram", "--spec-k", "17"], "--spec-k"),
                        (["--spec", "draft-model"], "unknown draft source 'draft-model'"),
                        (["--spec-k", "4"], "--spec-k sets the guesses of --spec"),
                        (["--spec", "ngram", "--dump-logits", "/dev/null"], "does not go with --spec"),
                        (["--spec", "ngram", "--draft", model], "give one of them"),
                        (["--draft-threads", "2"], "--draft-threads sets the threads of --draft"),
                        (["--spec", "ngram", "--spec-overlap", "on"], "--spec-overlap drafts with --draft"),
                        (["--draft", model, "--spec-overlap", "maybe"], "must be on or off")):
        p = subprocess.run([BIN, "run", "-m", model, "-p", "x", *args], capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and words in p.stderr, f"run {args}: exit {p.returncode}, {p.stderr.strip()!r}")
    chats = []
    for extra in ([], ["--spec", "ngram"], ["--draft", model]):  # two turns on standard input
        p = subprocess.run([BIN, "chat", "-m", model, "--chat-template", "chatml", "-n", "24", "--temp", "0", *extra],
                           input="Once upon a time\nThe dog ran to the park\n", capture_output=True, text=True,
                           timeout=120)
        check(p.returncode == 0, f"chat {extra}: exit {p.returncode}, {p.stderr[-300:]!r}")
        chats.append(p.stdout)
    check(chats[0] == chats[1] == chats[2] and chats[0].strip(), f"chat with and without speculation: {chats}")
    print("  ok: usage errors; chat answers the same with --spec and --draft")


def synth(path, seed, extra=()):
    p = subprocess.run([BIN, "synth", "--like", "tiny", "--layers", "4", "--type", "Q8_0", "--seed", str(seed), "-o",
                        path, *extra],
                       capture_output=True, text=True, timeout=120)
    require(p.returncode == 0, f"synth: {p.stderr[-300:]}")
    return path


def case_draft(tmp):
    """A draft that is the model (every guess kept) and one of other weights (almost none kept)."""
    target, bad = synth(os.path.join(tmp, "t.gguf"), 1), synth(os.path.join(tmp, "bad.gguf"), 2)
    for name, model, draft, want in (("stories260K drafting for itself", STORIES, STORIES, "all"),
                                     ("a synthetic draft of other weights", target, bad, "few")):
        if not os.path.exists(model):
            skip(f"{name}: {model} is absent")
            continue
        kept = drafted = overlapped = 0
        sampled = {}  # seeded: K -> [(what, ids, kept, drafted)]
        for n_stages in (1, 2, 3):
            fleet = ["--local-stages", str(n_stages)] if n_stages > 1 else []
            for how, sampling in SAMPLING.items():
                plain, _ = run(model, fleet + sampling)
                for k, overlap in ((1, "on"), (3, "off"), (3, "on"), (10, "on"), ("auto", "off"), ("auto", "on")):
                    what = f"{name}, {n_stages} stage(s), {how}, K={k}, overlap {overlap}"
                    ids, st = run(model, fleet + sampling + ["--draft", draft, "--spec-k", str(k), "--spec-overlap",
                                                             overlap])
                    sp = st.get("spec", {})
                    overlapped += sp.get("overlapped", 0)
                    check(overlap == "on" or sp.get("overlapped") == 0, f"{what}: --spec-overlap off: {sp}")
                    check(sp["kept"] <= sp["drafted"], f"{what}: stats {sp}")
                    if how == "greedy":
                        check(ids == plain, f"{what}: {ids} differ from {plain}")
                        kept, drafted = kept + sp.get("kept", 0), drafted + sp.get("drafted", 0)
                    else:
                        sampled.setdefault(k, []).append((what, ids, sp.get("kept", 0), sp.get("drafted", 0)))
        rate = kept / drafted if drafted else float("nan")
        check(rate == 1 if want == "all" else rate < 0.2, f"{name}: {kept} of {drafted} greedy guesses kept")
        check(overlapped > 0 if want == "all" else True, f"{name}: no trip used guesses drafted while one was out")
        for k, runs in sampled.items():  # sampled guesses: the tokens depend on which positions had one
            if k != "auto":
                for what, ids, _, _ in runs[1:]:
                    check(ids == runs[0][1], f"{what}: {ids} differ from {runs[0][0]}'s {runs[0][1]}")
        s_kept, s_drafted = (sum(r[i] for runs in sampled.values() for r in runs) for i in (2, 3))
        s_rate = s_kept / s_drafted if s_drafted else float("nan")
        check(s_rate > 0.9 if want == "all" else s_rate < 0.3, f"{name}: {s_kept} of {s_drafted} sampled guesses kept")
        print(f"  ok: {name}: greedy, plain decoding's ids on 1, 2 and 3 stages, K 1, 3, 10 and auto "
              f"({kept} of {drafted} guesses kept); seeded, each fixed K the same ids on every split with and "
              f"without overlap ({s_kept} of {s_drafted} sampled guesses kept)")
    other = synth(os.path.join(tmp, "other.gguf"), 1, ["--vocab", "300"])
    p = subprocess.run([BIN, "run", "-m", target, "-p", "hi", "-n", "2", "--draft", other], capture_output=True,
                       text=True, timeout=60)
    check(p.returncode == 2 and "has 300 tokens, the model 512" in p.stderr, f"another vocabulary: {p.stderr!r}")
    if os.path.exists(STORIES):  # 512 tokens too, other texts
        p = subprocess.run([BIN, "run", "-m", STORIES, "-p", "hi", "-n", "2", "--draft", target], capture_output=True,
                           text=True, timeout=60)
        check(p.returncode == 2 and "does not have the model's vocabulary: token 0 is" in p.stderr,
              f"another vocabulary of the same size: {p.stderr!r}")
    print("  ok: a draft of another vocabulary is refused, naming the difference")
    return target, bad


def case_trace(target, draft):
    """PS_SPEC_TRACE=1: a line on stderr for each decoding trip, with its K; none without it."""
    args = [BIN, "run", "-m", target, "--mmap", "-p", PROMPT, "-n", "30", "--stats", "-c", "256", "-t", "1", "--temp",
            "0", "--local-stages", "2", "--draft", draft]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "PS_SPEC_TRACE": "1"})
    require(p.returncode == 0, lambda: f"PS_SPEC_TRACE=1 run: exit {p.returncode}: {p.stderr[-800:]}")
    by_k = json.loads(p.stderr.strip().splitlines()[-1])["spec"]["trips_by_k"]
    trips = [t for t in map(spec_trace, p.stderr.splitlines()) if t]
    got = [[t["k"] for t in trips].count(k) for k in range(len(by_k))]
    check(got == by_k and all("next" in t for t in trips),
          f"PS_SPEC_TRACE=1: trips by K {got} in the trace, {by_k} in --stats:\n{p.stderr[-1500:]}")
    waits = [(t["wait_ms"], t["compute_ms"]) for t in trips]
    check(all(0 < c <= w + 0.001 for w, c in waits),
          f"PS_SPEC_TRACE=1: each trip's stages' compute is within its wait, not {waits}")
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "PS_SPEC_TRACE": "0"})
    check(p.returncode == 0 and "spec trace:" not in p.stderr, f"PS_SPEC_TRACE=0: {p.stderr[-800:]}")
    print(f"  ok: PS_SPEC_TRACE=1 traces every decoding trip ({sum(by_k)}, each one's compute within its wait), "
          "PS_SPEC_TRACE=0 none")


def case_sure(tmp):
    """--spec-k auto with a draft model: a trip's guesses stop after the one that takes the draft's
    probability of them all below 0.1 (spec.h, PS_SPEC_SURE). stories260K drafts for itself, so
    every guess is kept and a trip's guesses are the answer's next tokens; their probabilities come
    from the NumPy reference's softmax (tests/ref/forward.py). Each trip's K must be the least of
    what auto let it carry (the trace line before's reach: its next K, or more where the hops make
    most of a trip's wait), where the product first falls below 0.1, and the tokens left: in run
    on 2 stages with hops of 10 ms (so that guesses pay), with the overlap (which drafts guesses
    while a trip is out, and stops there too) and without, and in serve (one request: its trips
    alone on the ring, so that they know the stages' compute, the hops' floor and the reach too).
    Products within 0.2 % of 0.1 are not judged."""
    if not os.path.exists(STORIES):
        return skip(f"the draft's sureness: {STORIES} is absent")
    import numpy as np
    from ref.forward import Model
    prompt, n = [1, 403, 407, 261, 378], 80  # <s> Once upon a time
    fleet = ["-m", STORIES, "--local-stages", "2", "--sim-latency-ms", "10", "-t", "1", "--draft", STORIES]
    ids, logs = None, {}
    for overlap in ("on", "off"):
        p = subprocess.run([BIN, "run", *fleet, "--spec-overlap", overlap, "--prompt-ids", ",".join(map(str, prompt)),
                            "-n", str(n), "--temp", "0", "--ignore-eos", "--print-ids"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PS_SPEC_TRACE": "1"})
        require(p.returncode == 0, lambda: f"sureness run: exit {p.returncode}: {p.stderr[-800:]}")
        check(ids is None or [int(t) for t in p.stdout.split()] == ids, f"overlap {overlap}: other ids")
        ids, logs[f"run, overlap {overlap}"] = [int(t) for t in p.stdout.split()], p.stderr
    with Server(fleet + ["-c", "256"], "sure", tmp, env={"PS_SPEC_TRACE": "1"}) as srv:
        st, _, data = srv.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                              "ignore_eos": True})
        require(st == 200, f"sureness serve: {st} {data[:300]!r}")
    logs["serve"] = srv.stderr()
    ref = Model(STORIES)
    logits = ref.forward(prompt + ids, 0).astype(np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    sure = [float(e[len(prompt) + m - 1, ids[m]] / e[len(prompt) + m - 1].sum()) for m in range(n)]
    for what, log in logs.items():
        at, asked, judged, cut, bad = 0, None, 0, 0, []  # ids[at]: the token before the trip
        trips = [t for t in map(spec_trace, log.splitlines()) if t]
        beyond = sum(t["reach"] > t["next"] for t in trips)  # hops of 10 ms against a tiny model's compute
        timed = sum(0 < t["compute_ms"] < t["wait_ms"] for t in trips)  # serve: one request, one micro-batch out
        check(beyond > 0 and timed == len(trips),
              f"{what}: {beyond} trips may carry more than auto's K, {timed} of {len(trips)} know the stages' "
              "compute within their wait (the hops' floor)")
        for t in trips:
            k, kept, most = int(t["k"]), int(t["kept"]), n - at - 2
            if asked is not None and k > 0:
                stop, prod, near = None, 1.0, False
                for i in range(1, min(asked, most) + 1):
                    prod *= sure[at + i]
                    near |= abs(prod / 0.1 - 1) < 0.002
                    if prod < 0.1:
                        stop = i
                        break
                want = min(asked, most, stop or asked)
                if not near:
                    judged, cut = judged + 1, cut + (want < min(asked, most))
                    if k != want:
                        bad.append((at, asked, k, want, [round(x, 3) for x in sure[at + 1:at + 1 + asked]]))
            asked, at = int(t["reach"]), at + kept + 1
        check(not bad and judged >= 8 and cut >= 3 and at == n - 1,
              f"{what}: trips whose K is not where the draft's sureness falls below 0.1 (token, auto's reach, K sent, "
              f"expected, the draft's probabilities): {bad[:5]}; {judged} judged, {cut} cut short, the trips "
              f"reaching token {at}")
        if not bad:
            print(f"  ok: {what}: {judged} trips' guesses stop where the draft's probability of them all falls below "
                  f"0.1 ({cut} of them before auto's reach)")


def chi2_p(observed, expected):
    """The chi-square statistic of counts against expected counts (bins under 5 merged) and its
    p-value (Wilson-Hilferty's normal approximation)."""
    obs, exp, o_rest, e_rest = [], [], 0, 0.0
    for o, e in zip(observed, expected):
        if e >= 5:
            obs.append(o), exp.append(e)
        else:
            o_rest, e_rest = o_rest + o, e_rest + e
    if e_rest > 0:
        obs.append(o_rest), exp.append(e_rest)
    require(len(obs) >= 3, f"chi-square: only {len(obs)} bins of 5 expected draws or more")
    x = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return x, df, 0.5 * math.erfc(z / math.sqrt(2))


def case_distribution(tmp, target, draft, name, n=600):
    """Seeded draws of 4 tokens with 2 sampled guesses per trip: the first token comes from the
    prompt's trip, the second and third from the rejection rule (a guess kept, or a draw from the
    residual). Each is checked against the target's softmax after the draw's own earlier tokens:
    the counts of a token against the sum of those probabilities over the draws."""
    import numpy as np
    prompt = [5, 17, 42, 99, 7]
    temp = 0.25  # the random model's distribution at temperature 1 is nearly flat: too many bins for 600 draws
    sampling = ["--temp", str(temp), "--top-k", "0", "--top-p", "1", "--min-p", "0", "--repeat-penalty", "1"]
    cache = {}

    def softmax_after(ids):
        if tuple(ids) not in cache:
            path = os.path.join(tmp, "logits.bin")
            p = subprocess.run([BIN, "run", "-m", target, "--prompt-ids", ",".join(map(str, ids)), "-n", "1", "--temp",
                                "0", "--print-ids", "--dump-logits", path], capture_output=True, text=True, timeout=60)
            require(p.returncode == 0, f"dump-logits: {p.stderr[-300:]}")
            lg = np.fromfile(path, dtype=np.float32).astype(np.float64) / temp
            e = np.exp(lg - lg.max())
            cache[tuple(ids)] = e / e.sum()
        return cache[tuple(ids)]
    draws, kept, drafted = [], 0, 0
    for seed in range(n):
        args = [BIN, "run", "-m", target, "--prompt-ids", ",".join(map(str, prompt)), "-n", "4", "--print-ids",
                "--stats", *sampling, "--seed", str(seed), "--draft", draft, "--spec-k", "2", "--ignore-eos"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=60)
        require(p.returncode == 0, f"draw {seed}: {p.stderr[-300:]}")
        draws.append(list(map(int, p.stdout.split())))
        sp = json.loads(p.stderr.strip().splitlines()[-1])["spec"]
        kept, drafted = kept + sp["kept"], drafted + sp["drafted"]
    check(drafted >= 2 * n, f"{name}: {drafted} guesses in {n} draws: the second trip carries 2")
    ps = []
    for j in range(3):
        expected = sum(softmax_after(prompt + d[:j]) for d in draws)
        x, df, pv = chi2_p(np.bincount([d[j] for d in draws], minlength=len(expected)), expected)
        check(pv > 1e-3, f"{name}: token {j + 1}: chi-square {x:.1f} on {df} degrees of freedom, p = {pv:.2g}")
        ps.append(f"{pv:.3f} ({df} df)")
    print(f"  ok: {n} seeded draws with {name} ({kept} of {drafted} sampled guesses kept): chi-square p of the "
          f"first token {ps[0]}, the second {ps[1]}, the third {ps[2]}")


CODE = ("def add_user(db, name):\n    db.insert(\"users\", name)\n\ndef add_order(db, order):\n"
        "    db.insert(\"orders\", order)\n\ndef add_")


def case_serve(tmp, model):
    def ask(s, i):
        sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
        prompt = CODE if i % 4 < 2 else PROMPT
        st, _, data = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 40, "logprobs": 2,
                                                             **sampling})
        require(st == 200, f"{s.name}: {st} {data[:300]!r}")
        c = json.loads(data)["choices"][0]
        return c["text"], c["logprobs"]
    common = ["-m", model, "--mmap", "-c", "512", "--parallel", "8", "--local-stages", "2", "-t", "1"]
    with Server(common, "plain", tmp) as s:
        want = [ask(s, i) for i in range(8)]
    draft = ["--draft", model, "--spec-k", "3", "--sim-latency-ms", "20"]  # trips long enough to draft during
    seeded = None  # the draft servers' seeded answers alone
    for name, extra in (("--spec ngram", ["--spec", "ngram"]), ("--draft (itself)", draft),
                        ("--draft (itself), --spec-overlap off", draft + ["--spec-overlap", "off"])):
        with Server(common + extra, "spec-" + name.split()[0].strip("-") + str(len(extra)), tmp) as s:
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                got = list(ex.map(lambda i: ask(s, i), range(8)))
            again = [ask(s, i) for i in range(1, 8, 2)]  # the seeded ones alone, one after another
            m = s.metrics()
        for i in range(8):
            if i % 2 == 0 or "ngram" in name:  # greedy, or guesses that are single tokens: plain decoding's
                check(got[i] == want[i], f"serve {name}: request {i}: {got[i][0]!r} differs from plain's "
                      f"{want[i][0]!r} (or its log-probabilities do)")
            else:  # sampled guesses: the same answer in any company
                check(got[i] == again[i // 2], f"serve {name}: seeded request {i}: {got[i][0]!r} among 8, "
                      f"{again[i // 2][0]!r} alone")
        trips, kept = m["pipeshard_spec_trips_total"], m["pipeshard_spec_kept_tokens_total"]
        overlapped = m["pipeshard_spec_overlapped_trips_total"]
        check(trips > 0 and 0 < kept <= m["pipeshard_spec_drafted_tokens_total"], f"serve {name}: metrics {m}")
        check((overlapped > 0) == (name == "--draft (itself)"), f"serve {name}: {overlapped} trips' guesses drafted "
              "while the trip before was out")
        if "draft" in name:  # a fixed K: the same sampled guesses with the overlap as without
            seeded = seeded or again
            check(again == seeded, f"serve {name}: seeded answers {again} differ from {seeded}")
        print(f"  ok: serve {name} on 2 stages: 8 requests at once got plain decoding's answers and log-probabilities "
              f"({'seeded ones with sampled guesses the same as alone; ' if 'draft' in name else ''}"
              f"{trips:.0f} trips, {kept:.0f} guesses kept, {overlapped:.0f} trips drafted by the overlap)")


def sanitized():
    p = subprocess.run(["ldd", BIN], capture_output=True, text=True)
    return "libasan" in p.stdout


def main():
    t0 = time.time()
    tmp = tmpdir("spec-")
    ran = False
    if sanitized():  # the verification, rollback and draft paths under the sanitizers: the tiny models only
        if not os.path.exists(STORIES):
            skip(f"a sanitizer build runs this test on {STORIES}, which is absent")
            return conclude(tmp, t0)
        case_exact(STORIES, "stories260K", [1, 4, 10, "auto"], [1, 2], True)
        case_draft(tmp)
        case_usage(STORIES)
        return conclude(tmp, t0)
    if os.path.exists(STORIES):
        case_exact(STORIES, "stories260K", list(range(1, 11)) + ["auto"], [1, 2, 3], True)
        case_usage(STORIES)
        ran = True
    else:
        skip(f"stories260K: {STORIES} is absent")
    target, bad = case_draft(tmp)
    case_sure(tmp)
    case_trace(target, bad)
    case_distribution(tmp, target, bad, "a bad draft")
    case_distribution(tmp, target, target, "a good draft (the model itself)")
    if os.path.exists(SMOL):
        case_exact(SMOL, "SmolLM2-135M", [1, 4, 10, "auto"], [1, 2], False)
        case_serve(tmp, SMOL)
        if not ran:
            case_usage(SMOL)
    else:
        skip(f"SmolLM2: {SMOL} is absent (scripts/setup.sh fetches it)")
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
