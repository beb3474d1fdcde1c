#!/usr/bin/env python3
"""test_spec.py - speculative decoding in `pipeshard run` (`--spec ngram --spec-k K`): the guesses
of prompt lookup checked by the last stage in one trip around the ring.

  1. The tokens are those of plain decoding, exactly: for K = 1..10 and auto on 1, 2 and 3 stages, greedy
     and seeded (temperature 0.8), with the prompt in one micro-batch and chunked
     (--prefill-chunk), on stories260K (../shared/models); K = 1, 4, 10 and auto on 1 and 2 stages on
     SmolLM2-135M-Instruct (.cache/models). A repetitive prompt makes the guesses land: the
     --stats line's spec figures must show guesses kept (more than one token per trip) and add
     up (kept <= drafted <= K x trips).
  2. `serve --spec ngram` on 2 stages (SmolLM2): 8 requests at once, greedy and seeded, each with
     the top-2 log-probabilities of every token, get exactly the answers of a server without
     --spec; /metrics counts the trips, the guesses sent and kept.
  3. Usage errors: --spec-k 0 and 17, an unknown draft source, --spec-k without --spec, --spec
     with --dump-logits, `chat` with --spec: exit 2 with a line that says why.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, conclude, require, skip, tmpdir  # noqa: E402
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
                        (["--spec", "ngram", "--dump-logits", "/dev/null"], "does not go with --spec")):
        p = subprocess.run([BIN, "run", "-m", model, "-p", "x", *args], capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and words in p.stderr, f"run {args}: exit {p.returncode}, {p.stderr.strip()!r}")
    p = subprocess.run([BIN, "chat", "-m", model, "--spec", "ngram"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    check(p.returncode == 2 and "--spec" in p.stderr, f"chat --spec: exit {p.returncode}, {p.stderr.strip()!r}")
    print("  ok: usage errors")


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
    with Server(common + ["--spec", "ngram"], "spec", tmp) as s:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda i: ask(s, i), range(8)))
        m = s.metrics()
    for i in range(8):
        check(got[i] == want[i], f"serve --spec: request {i}: {got[i][0]!r} differs from plain's {want[i][0]!r} "
              "(or its log-probabilities do)")
    trips, kept = m["pipeshard_spec_trips_total"], m["pipeshard_spec_kept_tokens_total"]
    check(trips > 0 and 0 < kept <= m["pipeshard_spec_drafted_tokens_total"], f"serve --spec: metrics {m}")
    print(f"  ok: serve --spec on 2 stages: 8 requests at once got plain decoding's answers and log-probabilities "
          f"({trips:.0f} trips, {kept:.0f} guesses kept)")


def main():
    t0 = time.time()
    tmp = tmpdir("spec-")
    ran = False
    if os.path.exists(STORIES):
        case_exact(STORIES, "stories260K", list(range(1, 11)) + ["auto"], [1, 2, 3], True)
        case_usage(STORIES)
        ran = True
    else:
        skip(f"stories260K: {STORIES} is absent")
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
