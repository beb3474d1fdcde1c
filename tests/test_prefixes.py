#!/usr/bin/env python3
"""test_prefixes.py - captured prefixes (`serve --prefix-dir`, POST and GET /v1/prefixes): the keys
and values of a prompt's whole KV blocks saved on every stage, restored by a restarted server.

On SmolLM2-135M-Instruct (.cache/models), a chat's long system message:
  1. reference: the answers (greedy and seeded) of a server without the prefix cache; there
     POST /v1/prefixes is refused (400, "the prefix cache is off").
  2. capture on 2 stages: 200 with a 16-hex-digit id and the whole blocks saved; the record and
     both stages' files in --prefix-dir (mode 0600); GET /v1/prefixes lists it as captured; bad
     bodies (too short a prompt, none, a wrong type) are 400s and PUT a 405 naming both methods.
  3. restart: the prefix is restored (stderr, GET), and the very first request reuses all its
     saved tokens (usage.prompt_tokens_details.cached_tokens) and gives the reference answers,
     greedy and seeded. The same on 1 stage (captured and restored unsplit).
  4. another split (3 stages): not restored, the reason naming the layers the file holds; the
     answers are still the reference's, computed afresh. A stage file damaged by one byte: not
     restored ("damaged", naming stage 1). A record of another model (stories260K, when
     ../shared/models has it): not restored ("another model").
  5. a fleet of a worker started without --prefix-dir: the capture fails with a 500 that says so,
     and the server serves on; with --prefix-dir the worker keeps its part in its own folder.
  6. no prefix folder (PIPESHARD_CACHE=off and no --prefix-dir): 400, "no prefix directory"; a
     record cut short is listed as not restored; `worker --prefix-dir` without --key-file: exit 2.
A sanitizer build runs 2, 3 and 4 (3 stages) on stories260K, whose forward pass is quick there.
"""
import json
import os
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, conclude, require, skip, tmpdir  # noqa: E402
from psserve import BIN, Server  # noqa: E402
import psworker  # noqa: E402

SMOL = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
STORIES = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
SYSTEM = " ".join(["You answer in one short sentence, as a lighthouse keeper who has seen every storm on this "
                   "coast would."] * 10)


def sanitized():
    p = subprocess.run(["ldd", BIN], capture_output=True, text=True)
    return "libasan" in p.stdout


class Case:
    """A model and how to ask it: the prefix to capture, and a request that starts with it."""

    def __init__(self, model, args, chat):
        self.model, self.args, self.chat = model, ["-m", model, "--mmap", "-c", "512", *args], chat

    def capture_body(self):
        if self.chat:
            return {"messages": [{"role": "system", "content": SYSTEM}]}
        return {"prompt": "Once upon a time " + "there was a little dog who liked to run in the park. " * 6}

    def ask(self, s, seed=None):
        """(text, prompt tokens, cached tokens) of the request that begins with the prefix."""
        sampling = {"temperature": 0} if seed is None else {"temperature": 0.8, "seed": seed}
        if self.chat:
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Any storms?"}]}
        else:
            path, body = "/v1/completions", {"prompt": self.capture_body()["prompt"] + "One day"}
        st, _, data = s.request("POST", path, {**body, "max_tokens": 16, **sampling})
        require(st == 200, f"{s.name}: {path}: {st} {data[:300]!r}")
        d = json.loads(data)
        c = d["choices"][0]
        text = c["message"]["content"] if self.chat else c["text"]
        return text, d["usage"]["prompt_tokens"], d["usage"]["prompt_tokens_details"]["cached_tokens"]

    def answers(self, s):
        return [self.ask(s)[0], self.ask(s, seed=11)[0]]


def listed(s):
    st, _, data = s.get("/v1/prefixes")
    require(st == 200, f"{s.name}: GET /v1/prefixes: {st} {data[:300]!r}")
    return json.loads(data)["data"]


def capture(s, case, d):
    """POST /v1/prefixes: checks the answer and the files; returns (id, saved tokens)."""
    st, _, data = s.request("POST", "/v1/prefixes", case.capture_body())
    require(st == 200, f"{s.name}: POST /v1/prefixes: {st} {data[:400]!r}")
    r = json.loads(data)
    pid, saved = r["id"], r["saved_tokens"]
    check(len(pid) == 16 and int(pid, 16) > 0 and r["object"] == "prefix", f"{s.name}: capture answered {r}")
    check(saved == r["prompt_tokens"] // 32 * 32 and saved >= 64, f"{s.name}: capture answered {r}")
    n = r["stages"]
    files = sorted(os.listdir(d))
    want = sorted([f"{pid}.json"] + [f"{pid}-{k}.kv" for k in range(n)])
    check(all(f in files for f in want), f"{s.name}: {d} holds {files}, want {want}")
    for f in want:
        if os.path.exists(os.path.join(d, f)):
            mode = stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode)
            check(mode == 0o600, f"{s.name}: {f} has mode {mode:o}, want 600 (a prompt's keys are private)")
    with open(os.path.join(d, f"{pid}.json")) as f:
        rec = json.load(f)
    check(rec["id"] == pid and len(rec["tokens"]) == saved and rec["stages"] == n, f"{s.name}: record {rec}")
    got = [(p["id"], p["status"], p["tokens"]) for p in listed(s)]
    check((pid, "captured", saved) in got, f"{s.name}: GET /v1/prefixes: {got}")
    return pid, saved


def bad_requests(s):
    for body, status, words in (({"prompt": "Hello there"}, 400, "whole blocks of 32 tokens"),
                                ({}, 400, "'prompt' is required"),
                                ({"prompt": 5}, 400, "'prompt' must be"),
                                ({"prompt": "x", "messages": []}, 400, "not both")):
        st, _, data = s.request("POST", "/v1/prefixes", body)
        check(st == status and words.encode() in data, f"{s.name}: POST /v1/prefixes {body}: {st} {data[:300]!r}")
    st, h, data = s.request("PUT", "/v1/prefixes", b"{}")
    check(st == 405 and "POST" in h.get("allow", "") and "GET" in h.get("allow", ""),
          f"{s.name}: PUT /v1/prefixes: {st} {h.get('allow')} {data[:200]!r}")


def restored(s, pid, case, ref, saved):
    """The first request of a restarted server reuses the whole prefix and gives the reference."""
    check("restored" in s.stderr(), f"{s.name}: stderr does not say restored: {s.stderr()[-600:]}")
    got = [(p["id"], p["status"]) for p in listed(s)]
    check((pid, "restored") in got, f"{s.name}: GET /v1/prefixes: {got}")
    text, n, cached = case.ask(s)
    check(cached == saved, f"{s.name}: the first request reused {cached} of {n} prompt tokens, want {saved}")
    check(text == ref[0], f"{s.name}: restored: {text!r}, cold {ref[0]!r}")
    seeded = case.ask(s, seed=11)[0]
    check(seeded == ref[1], f"{s.name}: restored, seeded: {seeded!r}, cold {ref[1]!r}")


def refused(s, pid, case, ref, words):
    """The prefix is listed as not restored for a reason with words; the answers are the reference's."""
    got = {p["id"]: p for p in listed(s)}
    p = got.get(pid, {})
    check(p.get("status") == "not_restored" and all(w in p.get("reason", "") for w in words),
          f"{s.name}: GET /v1/prefixes: {p or got}, want not_restored with {words}")
    text, _, cached = case.ask(s)
    check(cached == 0 and text == ref[0], f"{s.name}: {text!r} ({cached} cached), want {ref[0]!r} computed afresh")


def fleet_cases(tmp, case):
    """6: a worker without --prefix-dir, then one with it."""
    split = os.path.join(tmp, "split")
    p = subprocess.run([BIN, "split", "-m", case.model, "--stages", "2", "-o", split], capture_output=True, text=True)
    require(p.returncode == 0, f"split: {p.stderr[-500:]}")
    key = os.path.join(tmp, "key")
    subprocess.run([BIN, "keygen", "-o", key], check=True, capture_output=True)
    with open(os.path.join(split, "fleet.json")) as f:
        fleet = json.load(f)
    wdir = os.path.join(tmp, "worker-prefixes")
    for name, extra in (("bare", []), ("keeping", ["--prefix-dir", wdir])):
        w = psworker.Worker(BIN, os.path.join(split, "stage-1.gguf"), os.path.join(tmp, f"w-{name}.log"), name,
                            key=key, extra=extra)
        fleet["stages"][1]["address"] = w.addr
        for st in fleet["stages"]:
            st["shard"] = os.path.join(split, os.path.basename(st["shard"]))
        path = os.path.join(tmp, f"fleet-{name}.json")
        with open(path, "w") as f:
            json.dump(fleet, f)
        d = os.path.join(tmp, f"coord-{name}")
        args = ["--fleet", path, "--key-file", key, "--mmap", "-c", "512", "-t", "1", "--prefix-dir", d]
        try:
            with Server(args, f"fleet-{name}", tmp) as s:
                if not extra:
                    st, _, data = s.request("POST", "/v1/prefixes", case.capture_body())
                    check(st == 500 and b"keeps no prefixes (start it with --prefix-dir DIR)" in data,
                          f"fleet-bare: capture: {st} {data[:400]!r}")
                    case.ask(s)  # serves on
                    print("  ok: a worker without --prefix-dir: the capture fails saying so; the server serves on")
                else:
                    st, _, data = s.request("POST", "/v1/prefixes", case.capture_body())
                    pid = json.loads(data)["id"] if st == 200 else None
                    check(pid and os.path.exists(os.path.join(wdir, f"{pid}-1.kv")) and
                          os.path.exists(os.path.join(d, f"{pid}-0.kv")),
                          f"fleet-keeping: {st} {data[:300]!r}; worker folder {os.listdir(wdir)}")
                    print("  ok: a worker with --prefix-dir keeps its part of the prefix in its own folder")
        finally:
            w.stop()


def main():
    t0 = time.time()
    tmp = tmpdir("prefixes-")
    san = sanitized()
    have_smol, have_stories = os.path.exists(SMOL), os.path.exists(STORIES)
    if san and not have_stories:
        skip(f"a sanitizer build runs this test on {STORIES}, which is absent")
        return conclude(tmp, t0)
    if not san and not have_smol:
        skip(f"{SMOL} is absent (scripts/setup.sh fetches it): test_prefixes did not run")
        return conclude(tmp, t0)
    case = Case(STORIES, [], False) if san else Case(SMOL, [], True)
    p = subprocess.run([BIN, "worker", "--shard", case.model, "--listen", "127.0.0.1:0", "--prefix-dir", tmp],
                       capture_output=True, text=True)
    check(p.returncode == 2 and "--prefix-dir needs --key-file" in p.stderr,
          f"worker --prefix-dir without --key-file: exit {p.returncode}, {p.stderr.strip()!r}")
    d = os.path.join(tmp, "prefixes")
    with Server([*case.args, "--local-stages", "2", "-t", "1", "--prefix-cache", "off"], "reference", tmp) as s:
        ref = case.answers(s)
        st, _, data = s.request("POST", "/v1/prefixes", case.capture_body())
        check(st == 400 and b"the prefix cache is off" in data, f"prefix cache off: capture: {st} {data[:300]!r}")
    two = [*case.args, "--local-stages", "2", "-t", "1", "--prefix-dir", d]
    with Server(two, "capture-2", tmp) as s:
        pid, saved = capture(s, case, d)
        bad_requests(s)
        text, _, cached = case.ask(s)
        check(cached == saved and text == ref[0], f"capture-2: after the capture: {text!r} ({cached} cached)")
    print(f"  ok: captured {saved} tokens on 2 stages as {pid}")
    with open(os.path.join(d, "00000000000000aa.json"), "w") as f:
        f.write('{"id": "00000000000000aa", "tokens": [1, 2')  # a record cut short
    with Server(two, "restart-2", tmp) as s:
        restored(s, pid, case, ref, saved)
        junk = {p["id"]: p for p in listed(s)}.get("00000000000000aa", {})
        check(junk.get("status") == "not_restored" and "is not a prefix record" in junk.get("reason", ""),
              f"restart-2: a record cut short: {junk}")
    print("  ok: restarted on 2 stages: restored; the first request reused them all and gave the cold answers")
    with Server([*case.args, "--local-stages", "3", "-t", "1", "--prefix-dir", d], "split-3", tmp) as s:
        refused(s, pid, case, ref, ["holds layers", "this stage runs layers"])
    print("  ok: another split (3 stages) refuses the files, naming the layers; the answers are unchanged")
    if not san:
        path = os.path.join(d, f"{pid}-1.kv")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 1]))
        with Server(two, "damaged", tmp) as s:
            refused(s, pid, case, ref, ["stage 1", "damaged"])
        print("  ok: a stage file with one byte changed is refused as damaged")
        d1 = os.path.join(tmp, "prefixes-1")
        one = [*case.args, "-t", "2", "--prefix-dir", d1]
        with Server(one, "capture-1", tmp) as s:
            pid1, saved1 = capture(s, case, d1)
        with Server(one, "restart-1", tmp) as s:
            restored(s, pid1, case, ref, saved1)
        print("  ok: captured and restored on 1 stage")
        if have_stories:
            with Server(["-m", STORIES, "--mmap", "-c", "256", "--prefix-dir", d1], "other-model", tmp) as s:
                p = {x["id"]: x for x in listed(s)}.get(pid1, {})
                check(p.get("status") == "not_restored" and "another model" in p.get("reason", ""),
                      f"other-model: {p}")
            with Server(["-m", STORIES, "--mmap", "-c", "256"], "no-dir", tmp) as s:
                st, _, data = s.request("POST", "/v1/prefixes", Case(STORIES, [], False).capture_body())
                check(st == 400 and b"no prefix directory" in data, f"no-dir: {st} {data[:300]!r}")
            print("  ok: another model's record is not restored; without a prefix folder a capture is a 400")
        else:
            skip(f"another model's record: {STORIES} is absent")
        fleet_cases(tmp, case)
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
