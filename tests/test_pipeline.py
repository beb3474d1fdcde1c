#!/usr/bin/env python3
"""test_pipeline.py - a model split into stages across worker processes gives the unsplit tokens,
refuses wrong peers with a reason on both sides, and reports dead or stalled workers in time.

Models: a 6-layer synthetic model written by `$PIPESHARD_BIN synth` (always, so the test never
fully skips), ../shared/models/stories260K.gguf (5 layers) and $PS_MODEL_CACHE/SmolLM2-135M-
Instruct.Q4_1.gguf when present (those parts skip with a message when absent). The reference is
always the unsplit `run -m MODEL --print-ids`, greedy and seeded (--temp 0.8 --seed 7 --top-k 40
--repeat-penalty 1.3, so the last stage's token history matters). Cases:
  1. bit-exactness: `run --local-stages N` for N = 1..4 prints the reference ids; so does an
     explicit `split` + `worker` processes + `run --fleet` (3 stages; --stats counts 3 hops), a
     20+-token prompt with --prefill-chunk 3 (pipelined chunked prefill), and --activations f32
     against the unsplit f32 run. SmolLM2 stays cheap: greedy on 1..4 stages, seeded on 2 and 4
     (under the sanitizer build: greedy on 4 only). A normally ended session leaves no error in
     any worker's log (regression: stage 2 used to log its previous stage's hang-up as a failure).
  2. the same with every worker in its own network namespace (ip netns: a hub namespace holding a
     bridge, a veth per worker and one from the root namespace, where the coordinator runs), on a
     private /24, 4 stages, with a shared key; skipped with a message where namespaces cannot be
     made. Always cleaned up; leftovers of dead earlier runs are deleted first.
  3. refusals, each stated by the coordinator (run's stderr) AND the worker (its log): wrong key,
     key on one side only (both ways), shards out of order, a shard of another model, a second
     coordinator while a session runs (busy; the first run still prints the unsplit ids), a stale
     protocol version (a Python client sending HELLO with header version 0 gets a REFUSE naming
     the version; a fake Python worker answering with a version-0 frame makes `run` fail naming
     its address and the version). After each, the workers serve a correct run.
  4. failures, in the middle of a 400-token generation: a worker SIGKILLed (stage 2, then stage 1)
     makes `run` exit non-zero within --stage-timeout-ms, naming "stage K (ADDRESS)", the tokens
     printed until then being the unsplit run's; restarted on the same port it serves the next run
     exactly; a SIGSTOPped worker (stage 2, then stage 1) makes `run` exit non-zero in about the
     timeout naming the stalled stage, and once resumed serves again; the other workers survive.
  5. worker start-up errors: a whole model or the stage-0 shard as --shard, a --listen port in
     use: exit 1 with one clear line.
Every worker log and run stderr is also scanned for sanitizer reports (scripts/test.sh runs this
test on the ASan build too). Workers die with the test (PR_SET_PDEATHSIG). Exit 0 pass, 1 fail,
77 when a part was skipped (a model absent, no namespaces) and the rest passed.
"""
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import xxhash  # noqa: E402
from pstest import check, conclude, skip, tmpdir  # noqa: E402
import psworker  # noqa: E402
from psworker import HDR, MAGIC, VERSION, die_with_parent, frame, pstr, san_check  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
SHARED = os.environ.get("PS_SHARED_MODELS", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
CACHE = os.environ.get("PS_MODEL_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "models"))
TMP = None
SANITIZED = False
WORKERS = []   # every Worker started, stopped at the end

GREEDY = ["--temp", "0"]
SEEDED = ["--temp", "0.8", "--seed", "7", "--top-k", "40", "--repeat-penalty", "1.3"]
GEN = ["-n", "24", "--ignore-eos", "--print-ids", "-t", "1"]
TIMEOUT_MS = 5000  # --stage-timeout-ms of the failure runs

MSG_HELLO, MSG_HELLO_REPLY, MSG_AUTH, MSG_WELCOME, MSG_REFUSE = 1, 2, 3, 4, 5
MSG_SETUP, MSG_READY, MSG_TOKENS, MSG_ERROR = 16, 17, 19, 21


# ------------------------------------------------------------------------------ helpers
def pipeshard(args, timeout=180):
    """Runs `pipeshard args`; returns the CompletedProcess (text)."""
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    san_check(p.stderr, "pipeshard " + " ".join(args))
    return p


def ids(args, what, timeout=180):
    """The ids `run args` prints; a failed run is a check failure (returns None)."""
    p = pipeshard(["run"] + args, timeout)
    if not check(p.returncode == 0, f"{what}: run exited {p.returncode}: {p.stderr[-1500:]}"):
        return None
    return p.stdout.split()


def same(got, want, what):
    return check(got is not None and got == want, f"{what}: ids\n  {got}\ndiffer from the unsplit run's\n  {want}")


def split(model, n, out):
    p = pipeshard(["split", "-m", model, "--stages", str(n), "-o", out, "--quiet"])
    if p.returncode != 0:
        raise AssertionError(f"split {model} into {n}: exit {p.returncode}: {p.stderr}")
    return os.path.join(out, "fleet.json")


def load_json(path):
    with open(path) as f:
        return json.load(f)


def write_fleet(fleet, addrs, name):
    """A copy of fleet.json (next to it, so shard paths still resolve) with stage k at addrs[k-1]."""
    j = load_json(fleet)
    for k, a in enumerate(addrs, 1):
        j["stages"][k]["address"] = a
    path = os.path.join(os.path.dirname(fleet), name)
    with open(path, "w") as f:
        json.dump(j, f)
    return path


def shard(fleet, k):
    return os.path.join(os.path.dirname(fleet), f"stage-{k}.gguf")


def key_file(name):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(os.urandom(32))
    return path


class Worker(psworker.Worker):
    """A worker of this test: logs in TMP/<name>.log, stopped at the end (WORKERS), its log checked
    for sanitizer reports when it stops."""

    def __init__(self, shard_path, name, **kw):
        super().__init__(BIN, shard_path, os.path.join(TMP, f"{name}.log"), name, **kw)
        WORKERS.append(self)

    def stop(self):
        super().stop()
        san_check(self.text(), f"worker {self.name}")


def quiet_ends(w, what):
    """Sessions that ended normally (BYE) leave no 'ended: <error>' line in the worker's log."""
    time.sleep(0.05)
    bad = [line for line in w.text().splitlines() if " ended: " in line]
    check(not bad, f"{what}: worker {w.name} logged an error at the end of a normal session: {bad}")


def start_workers(fleet, tag, **kw):
    n = len(load_json(fleet)["stages"])
    return [Worker(shard(fleet, k), f"{tag}-w{k}", **kw) for k in range(1, n)]


def stop_all(workers):
    for w in workers:
        w.stop()


# ------------------------------------------------------------------------------ models
class Model:
    def __init__(self, name, path, prompt, long_prompt, cheap=True):
        self.name, self.path, self.prompt, self.long_prompt, self.cheap = name, path, prompt, long_prompt, cheap
        self.ref = {}

    def reference(self, sampling, extra=(), prompt=None, n=24):
        """The unsplit run's n ids (memoized)."""
        key = (tuple(sampling), tuple(extra), tuple(prompt or self.prompt), n)
        if key not in self.ref:
            gen = ["-n", str(n)] + GEN[2:]
            got = ids(["-m", self.path] + (prompt or self.prompt) + gen + sampling + list(extra),
                      f"{self.name} unsplit {' '.join(sampling + list(extra))}")
            check(got is not None and len(got) == n, f"{self.name}: unsplit run printed {got}, not {n} ids")
            self.ref[key] = got
        return self.ref[key]


def synth_model(name, seed):
    path = os.path.join(TMP, f"{name}.gguf")
    p = pipeshard(["synth", "--like", "tiny", "--layers", "6", "--dim", "128", "--ffn", "384", "--heads", "4",
                   "--kv-heads", "2", "--vocab", "768", "--type", "Q8_0", "--seed", str(seed), "-o", path])
    if p.returncode != 0:
        raise AssertionError(f"synth: {p.stderr}")
    return path


def sanitized():
    """Whether BIN is a sanitizer build (slower by ~10x: the SmolLM2 part shrinks to one split)."""
    try:
        return "libasan" in subprocess.run(["ldd", BIN], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


def models():
    ids_short = ",".join(str((i * 53 + 5) % 768) for i in range(8))
    ids_long = ",".join(str((i * 37 + 11) % 768) for i in range(26))
    out = [Model("synth", synth_model("synth-a", 1), ["--prompt-ids", ids_short], ["--prompt-ids", ids_long])]
    story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her "\
            "dog, a big brown dog named Max, and her best friend Tom."
    stories = os.path.join(SHARED, "stories260K.gguf")
    if os.path.exists(stories):
        out.append(Model("stories260K", stories, ["-p", "Once upon a time"], ["-p", story]))
    else:
        skip(f"stories260K parts: {stories} is absent")
    smol = os.path.join(CACHE, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(smol):
        out.append(Model("SmolLM2", smol, ["-p", "The capital of France is"], ["-p", story], cheap=False))
        if SANITIZED:
            print("SmolLM2 under the sanitizer build: greedy on 4 stages only (the release run does 1-4 stages)")
    else:
        skip(f"SmolLM2 parts: {smol} is absent (scripts/setup.sh fetches it)")
    return out


# ------------------------------------------------------------------------------ case 1: bit-exactness
def case_exact(m):
    t0 = time.time()
    g = m.reference(GREEDY)
    s = m.reference(SEEDED) if m.cheap or not SANITIZED else None
    check(g != s, f"{m.name}: seeded sampling gave the greedy ids {g}")
    for n in (4,) if SANITIZED and not m.cheap else (1, 2, 3, 4):
        same(ids(["-m", m.path, "--local-stages", str(n)] + m.prompt + GEN + GREEDY, f"{m.name} {n} stages greedy"),
             g, f"{m.name}: --local-stages {n} greedy")
        if m.cheap or (n in (2, 4) and not SANITIZED):
            same(ids(["-m", m.path, "--local-stages", str(n)] + m.prompt + GEN + SEEDED,
                     f"{m.name} {n} stages seeded"), s, f"{m.name}: --local-stages {n} seeded")
    if not m.cheap:
        print(f"  {m.name}: local stages in {time.time() - t0:.1f} s")
        return
    # split + workers + run --fleet (workers on 2 threads, the coordinator on 1: threads change nothing)
    fleet = split(m.path, 3, os.path.join(TMP, f"{m.name}-fleet3"))
    ws = []
    try:
        ws = start_workers(fleet, f"exact-{m.name}", threads=2)
        f = write_fleet(fleet, [w.addr for w in ws], "fleet-local.json")
        for sampling, want in ((GREEDY, g), (SEEDED, s)):
            p = pipeshard(["run", "--fleet", f, "--stats"] + m.prompt + GEN + sampling)
            if check(p.returncode == 0, f"{m.name}: run --fleet: {p.stderr[-1500:]}"):
                same(p.stdout.split(), want, f"{m.name}: split + 2 workers + run --fleet {' '.join(sampling)}")
                stats = json.loads(p.stderr.strip().splitlines()[-1])
                check(stats["stages"] == 3 and len(stats["hops"]) == 3 and all(h["bytes"] > 0 for h in stats["hops"]),
                      f"{m.name}: --stats of a 3-stage fleet: {stats}")
                # the coordinator waits for every token through both workers' compute
                workers = sum(st["compute_ms"] for st in stats["stage_stats"][1:])
                check(stats["wait_ms"] > 0 and abs(stats["wait_ms"] - workers - stats["ring_overhead_ms"]) < 1e-6,
                      f"{m.name}: --stats wait_ms / ring_overhead_ms inconsistent: {stats}")
        for w in ws:
            check(w.alive() and "session" in w.text(), f"{m.name}: worker {w.name} served no session: {w.text()}")
            quiet_ends(w, m.name)
    finally:
        stop_all(ws)
    # the same on Unix sockets: workers listening on socket files, and --local-transport unix
    ws = []
    try:
        socks = [os.path.join(TMP, f"{m.name}-w{k}.sock") for k in (1, 2)]
        ws = [Worker(shard(fleet, k), f"unix-{m.name}-w{k}", threads=2, unix_path=socks[k - 1]) for k in (1, 2)]
        f = write_fleet(fleet, [w.addr for w in ws], "fleet-unix.json")
        p = pipeshard(["run", "--fleet", f] + m.prompt + GEN + SEEDED)
        if check(p.returncode == 0, f"{m.name}: run --fleet on Unix sockets: {p.stderr[-1500:]}"):
            same(p.stdout.split(), s, f"{m.name}: 2 workers on Unix sockets, seeded")
    finally:
        stop_all(ws)
    check(not any(os.path.exists(x) for x in socks), f"{m.name}: a stopped worker left its socket file")
    p = pipeshard(["run", "-m", m.path, "--local-stages", "3", "--local-transport", "unix", "--stats"] + m.prompt +
                  GEN + GREEDY)
    if check(p.returncode == 0, f"{m.name}: --local-transport unix: {p.stderr[-1500:]}"):
        same(p.stdout.split(), g, f"{m.name}: --local-stages 3 --local-transport unix")
        addrs = [st["address"] for st in json.loads(p.stderr.strip().splitlines()[-1])["stage_stats"][1:]]
        check(len(addrs) == 2 and all(a.startswith("unix:") and a.endswith(".sock") for a in addrs),
              f"{m.name}: --local-transport unix: the workers' addresses {addrs}")
    # pipelined chunked prefill of a 20+-token prompt: 3 positions per micro-batch
    want = m.reference(GREEDY, prompt=m.long_prompt)
    p = pipeshard(["run", "-m", m.path, "--local-stages", "3", "--prefill-chunk", "3", "--stats"] + m.long_prompt +
                  GEN + GREEDY)
    if check(p.returncode == 0, f"{m.name}: --prefill-chunk 3: {p.stderr[-1500:]}"):
        same(p.stdout.split(), want, f"{m.name}: 3 stages --prefill-chunk 3")
        n_prompt = json.loads(p.stderr.strip().splitlines()[-1])["prompt_tokens"]
        check(n_prompt >= 20, f"{m.name}: the long prompt has only {n_prompt} tokens")
    # stage 0 with the token embedding alone (--layers 0:0,...): every layer on the workers
    L = load_json(fleet)["n_layer"]
    lean = os.path.join(TMP, f"{m.name}-lean")
    p = pipeshard(["split", "-m", m.path, "--layers", f"0:0,0:{L // 2},{L // 2}:{L}", "-o", lean, "--quiet"])
    ws = []
    if check(p.returncode == 0, f"{m.name}: split --layers 0:0,...: {p.stderr}"):
        lean_fleet = os.path.join(lean, "fleet.json")
        check(load_json(lean_fleet)["stages"][0]["layers"] == [0, 0], f"{m.name}: {load_json(lean_fleet)}")
        try:
            ws = start_workers(lean_fleet, f"lean-{m.name}")
            f = write_fleet(lean_fleet, [w.addr for w in ws], "fleet-local.json")
            for sampling, want in ((GREEDY, g), (SEEDED, s)):
                same(ids(["--fleet", f] + m.prompt + GEN + sampling, f"{m.name} lean stage 0"), want,
                     f"{m.name}: stage 0 with no layer + 2 workers {' '.join(sampling)}")
        finally:
            stop_all(ws)
    # f32 activations
    want = m.reference(GREEDY, extra=["--activations", "f32"])
    same(ids(["-m", m.path, "--local-stages", "3", "--activations", "f32"] + m.prompt + GEN + GREEDY,
             f"{m.name} f32"), want, f"{m.name}: 3 stages --activations f32")
    print(f"  {m.name}: bit-exact cases in {time.time() - t0:.1f} s")


# ------------------------------------------------------------------------------ case 2: network namespaces
def sh_ip(*args, ns=None, ok=False):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if p.returncode != 0 and not ok:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return p


class Netns:
    """A hub namespace with a bridge, one namespace per worker with a veth into the bridge, and a
    veth from the root namespace: 10.77.S.1 (root), 10.77.S.(10+k) (worker k). Names carry this
    process's id; leftovers of dead earlier runs are deleted first."""
    PREFIX = "pstpipe"

    def __init__(self, n_workers):
        self.tag = f"{self.PREFIX}{os.getpid()}"
        self.sub = f"10.77.{20 + os.getpid() % 200}"
        self.hub = f"{self.tag}h"
        self.ns = [f"{self.tag}w{k}" for k in range(1, n_workers + 1)]
        self.root_if = f"pst{os.getpid() % 100000}r"
        self.made = []

    @classmethod
    def clean_leftovers(cls):
        p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20)
        for line in p.stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if not name.startswith(cls.PREFIX):
                continue
            digits = ""
            for ch in name[len(cls.PREFIX):]:
                if not ch.isdigit():
                    break
                digits += ch
            if digits and not os.path.exists(f"/proc/{digits}"):
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)

    def addr(self, k):
        return f"{self.sub}.{10 + k}"

    def up(self):
        self.clean_leftovers()
        sh_ip("link", "del", self.root_if, ok=True)
        for ns in [self.hub] + self.ns:
            sh_ip("netns", "add", ns)
            self.made.append(ns)
            sh_ip("link", "set", "lo", "up", ns=ns)
        sh_ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        sh_ip("link", "set", "br0", "up", ns=self.hub)
        # root namespace <-> hub
        sh_ip("link", "add", self.root_if, "type", "veth", "peer", "name", "hroot", "netns", self.hub)
        sh_ip("addr", "add", f"{self.sub}.1/24", "dev", self.root_if)
        sh_ip("link", "set", self.root_if, "up")
        sh_ip("link", "set", "hroot", "master", "br0", "up", ns=self.hub)
        # each worker namespace <-> hub
        for k, ns in enumerate(self.ns, 1):
            sh_ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"h{k}", "netns", self.hub)
            sh_ip("addr", "add", f"{self.addr(k)}/24", "dev", "eth0", ns=ns)
            sh_ip("link", "set", "eth0", "up", ns=ns)
            sh_ip("link", "set", f"h{k}", "master", "br0", "up", ns=self.hub)

    def down(self):
        sh_ip("link", "del", self.root_if, ok=True)
        for ns in reversed(self.made):
            sh_ip("netns", "del", ns, ok=True)
        self.made = []


def case_netns(ms):
    if os.geteuid() != 0 or not shutil.which("ip"):
        skip("network namespace case: needs root and iproute2 (ip)")
        return
    net = Netns(3)
    ws = []
    try:
        try:
            net.up()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            skip(f"network namespace case: cannot make namespaces: {e}")
            return
        t0 = time.time()
        key = key_file("netns.key")
        for m in [m for m in ms if m.cheap]:
            fleet = split(m.path, 4, os.path.join(TMP, f"{m.name}-fleet4"))
            ws = [Worker(shard(fleet, k), f"netns-{m.name}-w{k}", host=net.addr(k), key=key, netns=net.ns[k - 1])
                  for k in (1, 2, 3)]
            f = write_fleet(fleet, [w.addr for w in ws], "fleet-netns.json")
            for sampling, want in ((GREEDY, m.reference(GREEDY)), (SEEDED, m.reference(SEEDED))):
                p = pipeshard(["run", "--fleet", f, "--key-file", key, "--stats"] + m.prompt + GEN + sampling)
                if check(p.returncode == 0, f"netns {m.name}: run --fleet: {p.stderr[-1500:]}"):
                    same(p.stdout.split(), want, f"netns {m.name}: 4 stages in namespaces {' '.join(sampling)}")
            for k, w in enumerate(ws, 1):
                want = f"next {net.addr(k + 1)}:" if k < 3 else "next the coordinator"
                check(w.alive() and want in w.text(), f"netns {m.name}: worker {k} log lacks '{want}': {w.text()}")
                quiet_ends(w, f"netns {m.name}")
            stop_all(ws)
            ws = []
        print(f"  network namespaces ({net.sub}.0/24): ok in {time.time() - t0:.1f} s")
    finally:
        stop_all(ws)
        net.down()


# ------------------------------------------------------------------------------ case 3: refusals
def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError(f"closed after {len(b)} of {n} bytes")
        b += c
    return b


def recv_frame(s):
    magic, ver, typ, flags, n, ck = HDR.unpack(recv_exact(s, HDR.size))
    payload = recv_exact(s, n)
    return magic, ver, typ, flags, payload, ck


def hello_payload(fleet):
    """A coordinator's HELLO payload (auth.c): hello, nonce_c[32], has_key."""
    j = load_json(fleet)
    st0 = j["stages"][0]
    return (struct.pack("<Biiiii", 1, 0, len(j["stages"]), st0["layers"][0], st0["layers"][1], j["n_layer"]) +
            pstr(j["model_fingerprint"]) + pstr(st0["fingerprint"]) + struct.pack("<QI", 12345, 0) + os.urandom(32) + b"\0")


def refused(p, coord_says, worker, worker_says, what):
    """run p failed with coord_says on its stderr, and the worker logged worker_says."""
    check(p.returncode != 0, f"{what}: run succeeded")
    check(coord_says in p.stderr, f"{what}: run's stderr lacks '{coord_says}': {p.stderr[-1500:]}")
    check(p.stderr.startswith("pipeshard run: ") and len(p.stderr.strip().splitlines()) == 1,
          f"{what}: run's stderr is not one 'pipeshard run: ...' line: {p.stderr[-1500:]}")
    check(worker.wait_log(worker_says), f"{what}: the worker's log lacks '{worker_says}': {worker.text()[-1500:]}")


def serves(fleet, m, what, key=None, extra=()):
    args = ["run", "--fleet", fleet] + (["--key-file", key] if key else []) + list(extra) + m.prompt + GEN + GREEDY
    p = pipeshard(args)
    if check(p.returncode == 0, f"{what}: the next run failed: {p.stderr[-1500:]}"):
        same(p.stdout.split(), m.reference(GREEDY), f"{what}: the next run")


def case_refusals(m):
    t0 = time.time()
    fleet = split(m.path, 3, os.path.join(TMP, "refuse-a"))
    fleet_b = split(synth_model("synth-b", 2), 3, os.path.join(TMP, "refuse-b"))
    key_a, key_b = key_file("a.key"), key_file("b.key")
    ws = []
    try:
        keyed = start_workers(fleet, "keyed", key=key_a)
        plain = start_workers(fleet, "plain")
        other = Worker(shard(fleet_b, 1), "other-model-w1")
        ws = keyed + plain + [other]
        f_keyed = write_fleet(fleet, [w.addr for w in keyed], "fleet-keyed.json")
        f_plain = write_fleet(fleet, [w.addr for w in plain], "fleet-plain.json")
        a2 = keyed[1].addr  # the coordinator sets up the last stage first: stage 2 hears of it first

        # wrong key: the coordinator checks the worker's proof first and refuses it
        p = pipeshard(["run", "--fleet", f_keyed, "--key-file", key_b] + m.prompt + GEN + GREEDY, 60)
        refused(p, f"stage 2 ({a2}): refused {a2}: wrong shared key", keyed[1], "wrong shared key", "wrong key")
        mark = len(keyed[0].text())
        serves(f_keyed, m, "wrong key", key_a)
        check(keyed[0].wait_log(", frames sealed", since=mark),
              f"keyed fleet: stage 1 did not say its frames are sealed: {keyed[0].text()[mark:][-800:]}")
        # --plain-frames on the coordinator alone: still sealed (both ends must ask)
        mark = len(keyed[0].text())
        serves(f_keyed, m, "--plain-frames on one end", key_a, ["--plain-frames"])
        check(keyed[0].wait_log(", frames sealed", since=mark),
              f"--plain-frames on the coordinator alone: stage 1's log: {keyed[0].text()[mark:][-800:]}")
        # a key on the worker, none on the coordinator
        p = pipeshard(["run", "--fleet", f_keyed] + m.prompt + GEN + GREEDY, 60)
        refused(p, f"stage 2 ({a2}): {a2} refused: this worker requires a shared key", keyed[1],
                "this worker requires a shared key", "no key on the coordinator")
        serves(f_keyed, m, "no key on the coordinator", key_a)
        # a key on the coordinator, none on the worker
        p2 = plain[1].addr
        p = pipeshard(["run", "--fleet", f_plain, "--key-file", key_a] + m.prompt + GEN + GREEDY, 60)
        refused(p, f"stage 2 ({p2}): {p2} refused: the peer has a shared key but we have none", plain[1],
                "the peer has a shared key but we have none", "no key on the worker")
        serves(f_plain, m, "no key on the worker")
        # shards out of order: stage 1's and stage 2's addresses swapped
        f = write_fleet(fleet, [plain[1].addr, plain[0].addr], "fleet-swapped.json")
        a1 = plain[0].addr
        why = "the worker serves stage 1 (layers 2..4), but fleet.json puts stage 2 (layers 4..6) there"
        p = pipeshard(["run", "--fleet", f] + m.prompt + GEN + GREEDY, 60)
        refused(p, f"stage 2 ({a1}): refused {a1}: {why}", plain[0], why, "shards out of order")
        serves(f_plain, m, "shards out of order")
        # stage 1 of another model split the same way
        f = write_fleet(fleet, [other.addr, plain[1].addr], "fleet-other.json")
        why = "the worker serves a shard of another model (fingerprint "
        p = pipeshard(["run", "--fleet", f] + m.prompt + GEN + GREEDY, 60)
        refused(p, why, other, why, "a shard of another model")
        check(f"stage 1 ({other.addr}): refused {other.addr}: " in p.stderr,
              f"a shard of another model: stage 1 not named: {p.stderr}")
        serves(f_plain, m, "a shard of another model")
        check(other.alive(), "the worker of another model died after refusing")
        # a second coordinator while a session runs: refused as busy, the first run unharmed
        busy(m, f_plain, plain)
        # peers that connect during a run and never speak: the session goes on
        silent_peers(m, f_plain, plain)
        # a stale protocol version, client side: HELLO with header version 0
        host, port = plain[0].addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(frame(MSG_HELLO, hello_payload(fleet), version=0))
            magic, ver, typ, flags, payload, ck = recv_frame(s)
        reason = payload.decode(errors="replace")
        check(magic == MAGIC and typ == MSG_REFUSE and ver == VERSION and ck == xxhash.xxh3_64_intdigest(payload),
              f"stale HELLO: answered with magic {magic:#x} version {ver} type {typ}, not a version-{VERSION} REFUSE")
        check("protocol version 0 is not supported" in reason, f"stale HELLO: REFUSE says '{reason}'")
        check(plain[0].wait_log("protocol version 0 is not supported"),
              f"stale HELLO: the worker's log lacks it: {plain[0].text()[-1500:]}")
        serves(f_plain, m, "stale HELLO")
        # a stale protocol version, server side: a fake worker answering HELLO with a version-0 frame
        stale_worker(m, fleet, plain)
        # a fake worker whose ERROR carries terminal escapes: the coordinator prints them defused
        escaping_worker(m, fleet, plain)
        # a fake worker dripping its answer: the coordinator gives up within --stage-timeout-ms
        dripping_worker(m)
        for w in ws:
            check(w.alive(), f"worker {w.name} died during the refusals: {w.text()[-1500:]}")
        print(f"  refusals: ok in {time.time() - t0:.1f} s")
    finally:
        stop_all(ws)


def busy(m, fleet, plain):
    """The first run holds stage 2 from its session line on, for about 2 s (100 tokens, each 20 ms
    late on the coordinator's hop): the second run comes in that window."""
    args = [BIN, "run", "--fleet", fleet, "-n", "100", "--ignore-eos", "--print-ids", "-t", "1",
            "--sim-latency-ms", "20"] + m.prompt + GREEDY
    mark = len(plain[1].text())
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        check(plain[1].wait_log(": session ", since=mark),
              f"busy: the first run started no session on stage 2: {plain[1].text()[mark:][-1500:]}")
        p = pipeshard(["run", "--fleet", fleet] + m.prompt + GEN + GREEDY, 60)
        running = first.poll() is None
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    check(running, "busy: the first run was over before the second one connected")
    a2 = plain[1].addr
    refused(p, f"stage 2 ({a2}): {a2} refused: busy: serving a session of coordinator 127.0.0.1:", plain[1],
            "busy: serving a session of coordinator", "a second coordinator")
    check(first.returncode == 0, f"busy: the first run failed: {err[-1500:]}")
    same(out.split(), m.reference(GREEDY, n=100), "busy: the first run")


def silent_peers(m, fleet, plain):
    """Nine peers connect to stage 1 during a run and say nothing. Handshakes run beside the
    worker's loop, so no token waits for the 5 s a handshake step may take (before, one silent
    peer stopped the ring for 5 s); the ninth, beyond the eight handshakes under way, cuts the
    oldest short; the tokens are the unsplit run's, and the next run is served."""
    mark = len(plain[0].text())
    p = long_run(fleet, m)
    socks = []
    try:
        got = read_ids(p, 11)
        check(len(got.split()) >= 11 and p.poll() is None,
              f"silent peers: the long run printed {len(got.split())} tokens in 60 s: not 11 while running")
        host, port = plain[0].addr.rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(9)]
        gap, last = 0.0, time.time()
        while True:  # the longest wait for a token from now on
            if not select.select([p.stdout], [], [], 60)[0]:
                break
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            got += chunk.decode()
            gap, last = max(gap, time.time() - last), time.time()
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        for s in socks:
            s.close()
        if p.poll() is None:
            p.kill()
            p.communicate()
    san_check(err, "silent peers")
    check(p.returncode == 0, f"silent peers: the run failed: {err[-1500:]}")
    same(got.split(), m.reference(GREEDY, n=400), "silent peers: the run")
    # The bug this guards (the silent peers block the worker's loop) stalls the ring for a whole
    # handshake step, 5 s of real time, which a loaded host can only lengthen: a gap under 2.5 s
    # proves there was no such stall (margin 2.5 s against the bug), and leaves a loaded,
    # sanitized run 2.5 s for one token of this small model, whose healthy longest gap is tens
    # of milliseconds (printed below).
    check(gap < 2.5, f"silent peers: a token took {gap:.2f} s after they connected (a handshake step waits 5 s)")
    check(plain[0].wait_log("8 were under way and", since=mark),
          f"silent peers: the ninth did not cut the oldest handshake short: {plain[0].text()[mark:][-1500:]}")
    serves(fleet, m, "silent peers")
    print(f"  silent peers: longest wait for a token {gap * 1e3:.0f} ms")


def stale_worker(m, fleet, plain):
    def script(c, seen):
        _, ver, typ, _, payload, _ = recv_frame(c)
        seen["hello"] = (ver, typ)
        c.sendall(frame(MSG_HELLO_REPLY, b"\0" * 64, version=0))

    fake = FakeWorker(fleet, 2, script, handshake=False)
    addr = fake.addr
    try:
        f = write_fleet(fleet, [plain[0].addr, addr], "fleet-stale.json")
        p = pipeshard(["run", "--fleet", f] + m.prompt + GEN + GREEDY, 60)
    finally:
        fake.close()
    check(fake.seen.get("hello") == (VERSION, MSG_HELLO),
          f"fake worker: expected a version-{VERSION} HELLO, saw {fake.seen}")
    check(p.returncode != 0, "fake worker of version 0: run succeeded")
    check(f"stage 2 ({addr})" in p.stderr and "version 0" in p.stderr,
          f"fake worker of version 0: run's stderr does not name {addr} and version 0: {p.stderr[-1500:]}")
    serves(write_fleet(fleet, [w.addr for w in plain], "fleet-plain.json"), m, "fake worker of version 0")


class FakeWorker:
    """A fake worker (no key) for stage k of fleet on a port of its own: it passes the coordinator's
    handshake (unless handshake is False), then script(conn, seen) plays the rest; what it saw goes
    into .seen."""

    def __init__(self, fleet, k, script, handshake=True):
        self.srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.srv.settimeout(30)
        self.addr = f"127.0.0.1:{self.srv.getsockname()[1]}"
        self.seen = {}
        j = load_json(fleet)
        st = j["stages"][k]
        self.hello = (struct.pack("<Biiiii", 3, k, len(j["stages"]), st["layers"][0], st["layers"][1], j["n_layer"]) +
                      pstr(j["model_fingerprint"]) + pstr(st["fingerprint"]) + struct.pack("<QI", 0, 0))
        self.t = threading.Thread(target=self.serve, args=(script, handshake), daemon=True)
        self.t.start()

    def serve(self, script, handshake):
        try:
            c, _ = self.srv.accept()
            with c:
                c.settimeout(30)
                if handshake:
                    recv_frame(c)  # HELLO
                    c.sendall(frame(MSG_HELLO_REPLY, self.hello + os.urandom(32) + b"\0" + b"\0" * 32))
                    self.seen["auth"] = recv_frame(c)[2]
                    c.sendall(frame(MSG_WELCOME, b""))
                    self.seen["setup"] = recv_frame(c)[2]
                script(c, self.seen)
                c.recv(4096)  # until the coordinator hangs up
        except (OSError, ConnectionError) as e:
            self.seen["error"] = str(e)

    def close(self):
        self.t.join(30)
        self.srv.close()


def escaping_worker(m, fleet, plain):
    """A fake last stage that answers SETUP with an ERROR full of terminal escapes, a bidi override
    and a line break: run's error line shows them as '?'."""
    reason = "evil \x1b[2J\x1b]0;owned\x07 \u202e\nend"
    fake = FakeWorker(fleet, 2, lambda c, seen: c.sendall(frame(MSG_ERROR, b"\0" + pstr(reason))))
    try:
        p = pipeshard(["run", "--fleet", write_fleet(fleet, [plain[0].addr, fake.addr], "fleet-escaping.json")] +
                      m.prompt + GEN + GREEDY, 60)
    finally:
        fake.close()
    check(fake.seen.get("auth") == MSG_AUTH and fake.seen.get("setup") == MSG_SETUP,
          f"escaping worker: the coordinator did not authenticate and send SETUP: {fake.seen}")
    addr = fake.addr
    check(p.returncode != 0 and f"stage 2 ({addr}) could not start the session: evil ?[2J?]0;owned? ???" in p.stderr,
          f"escaping worker: run's stderr does not show the reason defused: {p.stderr!r}")
    check(not any(ch in p.stderr for ch in "\x1b\x07\u202e") and len(p.stderr.strip().splitlines()) == 1,
          f"escaping worker: control bytes reached run's stderr: {p.stderr!r}")


def dripping_worker(m):
    """A fake last stage of 2 that sends its first byte 0.9 T after the micro-batch came, then one
    byte every 0.5 s: the coordinator gives up within about T (--stage-timeout-ms), not 2 T."""
    fleet = split(m.path, 2, os.path.join(TMP, "drip-2"))
    T = 3.0
    times = {}

    def script(c, seen):
        c.sendall(frame(MSG_READY, b""))
        recv_frame(c)  # FORWARD
        times["forward"] = time.time()
        time.sleep(0.9 * T)
        for b in frame(MSG_TOKENS, bytes(40)):
            c.sendall(bytes([b]))
            time.sleep(0.5)

    fake = FakeWorker(fleet, 1, script)
    try:
        p = pipeshard(["run", "--fleet", write_fleet(fleet, [fake.addr], "fleet-drip.json"), "--stage-timeout-ms",
                       str(int(T * 1e3))] + m.prompt + GEN + GREEDY, 60)
        took = time.time() - times.get("forward", time.time())
    finally:
        fake.srv.close()
    check(p.returncode != 0 and f"stage 1 ({fake.addr}) failed: timed out after" in p.stderr,
          f"dripping worker: run's stderr: {p.stderr[-800:]}")
    check(took < T + 1.5, f"dripping worker: the coordinator gave up {took:.1f} s after the micro-batch (T = {T} s)")
    print(f"  dripping worker: given up after {took:.1f} s (T = {T} s)")


# ------------------------------------------------------------------------------ case 4: failures
def long_run(fleet, m, extra=()):
    """A generation of several seconds: 400 tokens, 10 ms emulated delay on the coordinator's hop."""
    args = [BIN, "run", "--fleet", fleet, "-n", "400", "--ignore-eos", "--print-ids", "-t", "1",
            "--sim-latency-ms", "10", "--stage-timeout-ms", str(TIMEOUT_MS)] + m.prompt + GREEDY + list(extra)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)


def read_ids(p, n, timeout=60):
    """What run p prints on stdout until it has printed n ids (it flushes each), closed stdout, or
    timeout s passed. Read raw from the pipe, so p.communicate() can take over after."""
    got, deadline = b"", time.time() + timeout
    while len(got.split()) < n and time.time() < deadline:
        if select.select([p.stdout], [], [], max(0.0, deadline - time.time()))[0]:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    return got.decode()


def interrupted(fleet, m, ws, k, sig, limit_s, what, extra=()):
    """Starts a long run (with extra flags), sends sig to worker k once 11 tokens have come; run
    must fail within limit_s naming it, the tokens printed before being the unsplit run's. Returns
    run's stderr."""
    p = long_run(fleet, m, extra)
    try:
        early = read_ids(p, 11)
        n = len(early.split())
        check(n >= 11 and p.poll() is None,
              f"{what}: the long run printed {n} tokens in 60 s (rc {p.poll()}): not 11 while running")
        ws[k - 1].p.send_signal(sig)
        t0 = time.time()
        try:
            out, err = p.communicate(timeout=limit_s + 20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += "\n(still running: killed by the test)"
        out = early + out
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    san_check(err, what)
    name = f"stage {k} ({ws[k - 1].addr})"
    check(p.returncode not in (0, None), f"{what}: run exited {p.returncode}")
    check(took < limit_s, f"{what}: run took {took:.1f} s to fail, more than {limit_s} s")
    check(name in err, f"{what}: run's stderr does not name '{name}': {err[-1500:]}")
    got, want = out.split(), m.reference(GREEDY, n=400)
    check(len(got) > 10, f"{what}: only {len(got)} tokens came before the failure")
    check(got == want[:len(got)], f"{what}: the {len(got)} tokens before the failure are not the unsplit run's")
    print(f"  {what}: run failed after {took:.1f} s: {err.strip()[-300:]}")
    return err


def resume(w, mark, what):
    """SIGCONT to a stalled worker, then waits until it has ended the failed run's session (logged
    after mark): until then it may still have that coordinator's frames to read, and would refuse
    the next one as busy."""
    w.p.send_signal(signal.SIGCONT)
    check(w.wait_log(" ended: ", since=mark),
          f"{what}: once resumed, worker {w.name} did not end the session: {w.text()[mark:][-1500:]}")


def case_failures(m):
    t0 = time.time()
    fleet = split(m.path, 3, os.path.join(TMP, "fail-3"))
    ws = []
    try:
        ws = start_workers(fleet, "fail")
        f = write_fleet(fleet, [w.addr for w in ws], "fleet-fail.json")
        serves(f, m, "before the failures")
        # SIGKILL the last stage's worker mid-generation: a closed connection, seen at once
        interrupted(f, m, ws, 2, signal.SIGKILL, TIMEOUT_MS / 1e3 + 2, "stage 2 killed")
        ws[1].p.wait(timeout=10)
        check(ws[0].alive(), f"stage 1's worker died with stage 2: {ws[0].text()[-1500:]}")
        p = pipeshard(["run", "--fleet", f] + m.prompt + GEN + GREEDY, 60)
        check(p.returncode != 0 and f"stage 2 ({ws[1].addr})" in p.stderr,
              f"with stage 2 down, run should fail naming it: rc {p.returncode}, {p.stderr[-800:]}")
        ws[1] = Worker(shard(fleet, 2), "fail-w2-restarted", port=ws[1].port)
        serves(f, m, "stage 2 restarted on the same port")
        # the same during speculative trips (guesses in flight): the same error
        interrupted(f, m, ws, 2, signal.SIGKILL, TIMEOUT_MS / 1e3 + 2, "stage 2 killed while speculating",
                    ["--spec", "ngram", "--spec-k", "4"])
        ws[1].p.wait(timeout=10)
        ws[1] = Worker(shard(fleet, 2), "fail-w2-restarted-2", port=ws[1].port)
        serves(f, m, "stage 2 restarted again")
        # SIGKILL stage 1, the coordinator's own next hop
        interrupted(f, m, ws, 1, signal.SIGKILL, TIMEOUT_MS / 1e3 + 2, "stage 1 killed")
        ws[0].p.wait(timeout=10)
        check(ws[1].alive(), f"stage 2's worker died with stage 1: {ws[1].text()[-1500:]}")
        ws[0] = Worker(shard(fleet, 1), "fail-w1-restarted", port=ws[0].port)
        serves(f, m, "stage 1 restarted on the same port")
        # SIGSTOP stage 2: nothing closes, the coordinator must notice the silence
        mark = len(ws[1].text())
        err = interrupted(f, m, ws, 2, signal.SIGSTOP, TIMEOUT_MS / 1e3 + 1 + 3, "stage 2 stalled")
        check("did not answer" in err, f"stage 2 stalled: run's stderr does not say it did not answer: {err[-800:]}")
        resume(ws[1], mark, "stage 2 stalled")
        serves(f, m, "stage 2 stalled then resumed")
        # SIGSTOP stage 1: the coordinator's own next hop falls silent
        mark = len(ws[0].text())
        err = interrupted(f, m, ws, 1, signal.SIGSTOP, TIMEOUT_MS / 1e3 + 1 + 3, "stage 1 stalled")
        resume(ws[0], mark, "stage 1 stalled")
        serves(f, m, "stage 1 stalled then resumed")
        for w in ws:
            check(w.alive(), f"worker {w.name} died: {w.text()[-1500:]}")
        print(f"  failures: ok in {time.time() - t0:.1f} s")
    finally:
        stop_all(ws)


# ------------------------------------------------------------------------------ case 5: start-up errors
def case_startup(m):
    fleet = split(m.path, 3, os.path.join(TMP, "startup-3"))
    for path, says in ((m.path, "is a whole model, not a shard"), (shard(fleet, 0), "is the stage-0 shard")):
        p = pipeshard(["worker", "--shard", path, "--listen", "127.0.0.1:0"], 30)
        check(p.returncode == 1 and says in p.stderr and path in p.stderr and len(p.stderr.splitlines()) == 1,
              f"worker --shard {path}: rc {p.returncode}, stderr {p.stderr!r}; expected exit 1 and '{says}'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        p = pipeshard(["worker", "--shard", shard(fleet, 1), "--listen", addr], 30)
    check(p.returncode == 1 and f"cannot listen on {addr}: address already in use" in p.stderr,
          f"worker --listen {addr} (in use): rc {p.returncode}, stderr {p.stderr!r}")
    # --max-ctx: a session asking for more positions is refused, naming the limit
    ws = start_workers(fleet, "maxctx", extra=["--max-ctx", "64"])
    try:
        f = write_fleet(fleet, [w.addr for w in ws], "fleet-maxctx.json")
        p = pipeshard(["run", "--fleet", f, "-c", "65"] + m.prompt + GEN + GREEDY, 60)
        says = f"stage 2 ({ws[1].addr}) could not start the session: SETUP asks for 65 positions; this worker serves at " \
               f"most 64 (--max-ctx)"
        check(p.returncode == 1 and says in p.stderr, f"--max-ctx 64, run -c 65: rc {p.returncode}, {p.stderr[-800:]}")
        p = pipeshard(["run", "--fleet", f, "-c", "64"] + m.prompt + GEN + GREEDY, 60)
        if check(p.returncode == 0, f"--max-ctx 64, run -c 64: rc {p.returncode}, {p.stderr[-800:]}"):
            same(p.stdout.split(), m.reference(GREEDY), "--max-ctx 64, run -c 64")
    finally:
        stop_all(ws)
    w1 = shard(fleet, 1)
    for flags, says in ((["-t", "0"], "-t must be between 1 and 1024"),
                        (["--timeout-ms", "0"], "--timeout-ms must be between 1 and"),
                        (["--sim-bandwidth-mbps", "1e-300"], "--sim-bandwidth-mbps must be 0 (no limit) or between 0.001"),
                        (["--sim-latency-ms", "nan"], "--sim-latency-ms expects a number")):
        p = pipeshard(["worker", "--shard", w1, "--listen", "127.0.0.1:0"] + flags, 30)
        check(p.returncode == 2 and says in p.stderr, f"worker {' '.join(flags)}: rc {p.returncode}, stderr {p.stderr!r}")
    print("  worker start-up errors: ok")


def thread_cpus(pid):
    """Each thread's allowed CPUs (a list of Cpus_allowed_list strings), main thread first."""
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=lambda t: (int(t) != pid, int(t))):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            out += [l.split()[1] for l in f if l.startswith("Cpus_allowed_list:")]
    return out


def case_placement(m):
    """--pin: thread i of a stage on the i-th CPU the process may use (taskset respected); with
    --local-stages, when the stages' threads fit the CPUs side by side, each stage on a block of
    its own; --mmap (the file mapped, not read into huge pages): the same tokens either way."""
    fleet = split(m.path, 2, os.path.join(TMP, "pin-2"))
    cpus = sorted(os.sched_getaffinity(0))
    for name, prefix, allowed in (("pin", [], cpus), ("pin-taskset", ["taskset", "-c", str(cpus[-1])], cpus[-1:])):
        w = Worker(shard(fleet, 1), name, threads=3, extra=["--pin"], prefix=prefix)
        try:
            want = [str(allowed[i % len(allowed)]) for i in range(3)]
            got = thread_cpus(w.p.pid)
            check(got == want, f"worker -t 3 --pin on CPUs {allowed}: threads on {got}, expected {want}")
        finally:
            w.stop()
    # --local-stages 2 -t 1 --pin: the coordinator on the first CPU, the worker on the second
    p = subprocess.Popen([BIN, "run", "-m", m.path, "--local-stages", "2", "-t", "1", "--pin", "-n", "200",
                          "--ignore-eos", "--print-ids", "--sim-latency-ms", "10"] + m.prompt + GREEDY,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         preexec_fn=die_with_parent)
    try:
        check(len(read_ids(p, 2).split()) >= 2, "--local-stages 2 -t 1 --pin: no tokens")
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
        want = str(cpus[1]) if len(cpus) >= 2 else str(cpus[0])
        got, coord = [thread_cpus(k) for k in kids], thread_cpus(p.pid)
        with open("/proc/self/status") as f:
            ours = [l.split()[1] for l in f if l.startswith("Cpus_allowed_list:")][0]
        check(len(got) == 1 and set(got[0]) == {want} and coord[0] == str(cpus[0]),
              f"--local-stages 2 -t 1 --pin on CPUs {cpus}: coordinator on {coord}, worker on {got}; "
              f"expected the worker on {want} alone")
        # the coordinator's sender thread, started by its pinned thread, has every CPU back
        check(len(coord) >= 2 and all(c == ours for c in coord[1:]),
              f"--pin: the coordinator's other threads are on {coord[1:]}, not on all of {ours}")
    finally:
        p.terminate()  # SIGTERM: the run stops its worker and removes its directory (SIGKILL would leave it)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
    for args in (["-m", m.path], ["-m", m.path, "--local-stages", "3"]):
        for flags in (["--pin", "-t", "2"], ["--mmap"], ["--mmap", "--pin"]):
            same(ids(args + flags + m.prompt + GEN + GREEDY, f"{m.name} {' '.join(flags)}"), m.reference(GREEDY),
                 f"{m.name}: {' '.join(args[2:] + flags)}")
    print("  --pin, --mmap: ok")


# ------------------------------------------------------------------------------ case 6: the split cache
def case_split_cache(m):
    """--local-stages keeps its split in $PIPESHARD_CACHE/splits/<model fingerprint>-<N> and reuses
    it while the model is unchanged (a copy of the file too: the key is its contents)."""
    cache = os.path.join(TMP, "split-cache")
    old = os.environ.get("PIPESHARD_CACHE")
    os.environ["PIPESHARD_CACHE"] = cache
    try:
        g = m.reference(GREEDY)
        run = ["--local-stages", "3"] + m.prompt + GEN + GREEDY
        same(ids(["-m", m.path] + run, "cached split, first run"), g, "split cache: first run")
        with open(m.path, "rb") as f:
            fp = xxhash.xxh3_128_hexdigest(f.read())
        d = os.path.join(cache, "splits", f"{fp}-3")
        fleet = os.path.join(d, "fleet.json")
        if not check(os.path.exists(fleet), f"split cache: {fleet} was not written"):
            return
        check(load_json(fleet)["model_fingerprint"] == fp, "split cache: fleet.json names another model")
        stamps = {f: os.stat(os.path.join(d, f)).st_mtime_ns for f in os.listdir(d)}
        copy = os.path.join(TMP, "copy-of-" + os.path.basename(m.path))
        shutil.copyfile(m.path, copy)
        same(ids(["-m", copy] + run, "cached split, second run"), g, "split cache: second run (a copy of the model)")
        check({f: os.stat(os.path.join(d, f)).st_mtime_ns for f in os.listdir(d)} == stamps,
              "split cache: the second run wrote the split again")
        check(os.listdir(os.path.join(cache, "splits")) == [f"{fp}-3"], "split cache: more than one split written")
        os.environ["PIPESHARD_CACHE"] = "off"
        same(ids(["-m", m.path] + run, "split cache off"), g, "split cache off")
        check(os.listdir(os.path.join(cache, "splits")) == [f"{fp}-3"], "PIPESHARD_CACHE=off wrote to the cache")
    finally:
        if old is None:
            os.environ.pop("PIPESHARD_CACHE", None)
        else:
            os.environ["PIPESHARD_CACHE"] = old


# ------------------------------------------------------------------------------ main
def main():
    global TMP, SANITIZED
    if not os.access(BIN, os.X_OK):
        print(f"PIPESHARD_BIN={BIN} is not executable")
        return 1
    TMP = tmpdir("pipeline-")
    SANITIZED = sanitized()
    t0 = time.time()
    try:
        ms = models()
        for m in ms:
            case_exact(m)
        case_netns(ms)
        case_refusals(ms[0])
        case_failures(ms[0])
        case_startup(ms[0])
        case_placement(ms[0])
        case_split_cache(ms[0])
    finally:
        stop_all(WORKERS)
    return conclude(TMP, t0)


if __name__ == "__main__":
    sys.exit(main())
