#!/usr/bin/env python3
"""test_spec.py - speculative decoding in `pipeshard run` (`--spec ngram --spec-k K`): the guesses
of prompt lookup checked by the last stage in one trip around the ring.

  1. The tokens are those of plain decoding, exactly: for K = 1..10 and auto on 1, 2 and 3 stages, greedy
     and seeded (temperature 0.8), with the prompt in one micro-batch and chunked
     (--prefill-chunk), on stories260K (../shared/models); K = 1, 4, 10 and auto on 1 and 2 stages on
     SmolLM2-135M-Instruct (.cache/models). A repetitive prompt makes the guesses land: the
     --stats line's spec figures must show guesses kept (more than one token per trip) and add
     up (kept <= drafted <= K x trips).
  2. Usage errors: --spec-k 0 and 17, an unknown draft source, --spec-k without --spec, --spec
     with --dump-logits, `serve` and `chat` with --spec: exit 2 with a line that says why.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, conclude, require, skip, tmpdir  # noqa: E402

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
    for cmd in ("serve", "chat"):
        p = subprocess.run([BIN, cmd, "-m", model, "--spec", "ngram"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        check(p.returncode == 2 and "--spec" in p.stderr, f"{cmd} --spec: exit {p.returncode}, {p.stderr.strip()!r}")
    print("  ok: usage errors")


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
        if not ran:
            case_usage(SMOL)
    else:
        skip(f"SmolLM2: {SMOL} is absent (scripts/setup.sh fetches it)")
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
