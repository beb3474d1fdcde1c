#!/usr/bin/env python3
"""test_worker_fuzz.py - hostile traffic against running `pipeshard worker`s: every malformed input
gets a clear error, loses nothing, and never crashes, hangs or leaks.

A 4-layer synthetic model (dim 64, vocab 512, Q8_0) is split into 3 stages; workers serve stage 1
(layers 1..3) and stage 2 (the last, layers 3..4) with --timeout-ms 2000 and no key, so this
script can complete the handshake itself: as the coordinator (HELLO role 1, stage 0, the fleet's
stage count, layer count and model fingerprint from fleet.json; HELLO_REPLY read; AUTH with the
all-zero proof; WELCOME), and as stage 1 towards stage 2 (role 2, the session of a live SETUP).
In Python it also drives whole sessions: SETUP both workers (stage 1's next = stage 2), FORWARD a
micro-batch of random activations into stage 1, read stage 2's TOKENS; the same micro-batch always
gives the same token. Then, each on a fresh connection:
  * handshake: random bytes, a wrong checksum, a len of 4 GB, an unknown type, another version, a
    truncated HELLO or one with trailing bytes, invalid hellos (role, stage, layers, fingerprints,
    another model or fleet shape, a worker's role, a previous stage of no session, key flags), a
    non-zero or short AUTH, HELLO instead of AUTH, silence, a header cut then silence, closes;
  * SETUP: random bytes, every truncation, trailing bytes, session 0, act 2 / 7 / 255, n_ctx 0 /
    -1 / 2^30 / -2^31, max_batch 0 / -5 / 2^20, max_mb -1 / 0 / n_ctx + 1 / 2^31-1, next strings of
    length 4 GB, with a NUL, too long, with control / space / non-ASCII bytes (no forged log lines),
    next addresses that are garbage, name a closed port, a listener that never answers, the worker
    itself, a peer answering garbage, a worker without the session; a next on the last stage / none
    on stage 1; SETUP twice; the largest SETUP allowed (2^24 positions) then a frame of 4 GB;
  * FORWARD before SETUP, n 0 / -1 / 2^31-1 / max_mb + 1, pos -1 / -2^31, pos + n beyond n_ctx,
    positions skipped (at the start, after a continuation, after a rewind: the context is reused
    across sessions, so a gap would attend to another session's keys and tokens), width dim + 1 /
    2^32-1, no activations, n_stats -1 / 64 / 2^31-1 / more than present, unknown flags, cuts at
    random lengths, trailing bytes, random bytes; into stage 1 and straight into the last stage,
    which also gets bad sampling parameters, out-of-range token ids under penalties and NaN / inf
    activations;
  * frames before and after SETUP: wrong checksums, a len of 4 GB or just over the limit, unknown
    types and types only workers send, another version, bad magic, closes in the middle of a header
    and of a payload, a header or payload cut then silence (dropped in about --timeout-ms, not a
    hang), a coordinator that never reads its answers (the worker's send times out);
  * a second coordinator while a session is live (refused as busy; the live session still gives
    the right tokens), a previous stage of another session, or before any SETUP;
  * 300 seeded random mutations of a valid SETUP (into the last stage, plus 50 of its numeric
    fields into stage 1) and 300 of a valid FORWARD (half into stage 1, half into the last stage,
    half continuing a session): field-aware boundary values, bit flips, cuts, insertions, deletions
    and a few header corruptions.
After every attack both workers are alive and their logs hold no sanitizer report; for most cases
the worker's log and the ERROR / REFUSE sent back name the problem. Before, a few times in between
and at the end, a real `pipeshard run --fleet ... --print-ids --temp 0` through the same workers
prints exactly the ids of the unsplit `run -m`; the idle workers hold as many file descriptors and
threads as at the start (no leaked connection or sender thread), and exit 0 on SIGTERM (no leak
report under the sanitizer build). Exit 0 pass, 1 fail.
"""
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import xxhash  # noqa: E402
from pstest import check, conclude, require, tmpdir, verdict  # noqa: E402
import psworker  # noqa: E402
from psworker import HDR, MAGIC, VERSION, frame, pstr, san_check  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
TMP = None
TIMEOUT_MS = 2000        # the workers' --timeout-ms
SEED = 20240611
N_MUTATIONS = 300        # of SETUP, and of FORWARD

# the model (synth flags) and its split
DIM, VOCAB, N_LAYER = 64, 512, 4
SYNTH = ["--like", "tiny", "--layers", str(N_LAYER), "--dim", str(DIM), "--ffn", "192", "--heads", "4",
         "--kv-heads", "2", "--vocab", str(VOCAB), "--type", "Q8_0", "--seed", "5"]
PROMPT = ["--prompt-ids", ",".join(str((i * 41 + 7) % VOCAB) for i in range(6))]
GEN = ["-n", "12", "--ignore-eos", "--print-ids", "-t", "1", "--temp", "0"]

HELLO, HELLO_REPLY, AUTH, WELCOME, REFUSE = 1, 2, 3, 4, 5
SETUP, READY, FORWARD, TOKENS, STATS, ERROR, BYE, PROBE = 16, 17, 18, 19, 20, 21, 22, 23
PLACE, PLACED, SEND_SHARD, SHARD_DATA, KV_SAVE, KV_LOAD, KV_DONE = 24, 25, 26, 27, 28, 29, 30
DHOP, DHOP_REPLY = 33, 34
MB_X_RING = 1  # a FORWARD header's flags: the activations are in the receiver's GPU memory
ROLE_COORD, ROLE_PREV, ROLE_WORKER = 1, 2, 3
MB_SAMPLE, MB_DRAFT_DIST = 1, 4
KV_BLOCK = 32  # PS_KV_BLOCK
# stage.c: a FORWARD's 24-byte header (mb, n_segs, n, xdim, n_stats, flags), then per segment 72 fixed
# bytes: seq, pos, n, flags, n_top, the sampling parameters temperature, top_k, top_p, min_p,
# repetition_penalty, penalty_last_n, presence, frequency, seed, then n_blocks, 0; its block table
MB_HDR = struct.Struct("<IiiIiI")
MB_SEG = struct.Struct("<QiiII" "fifffiff" "Q" "iI")
require(MB_HDR.size == 24 and MB_SEG.size == 72, 'MB_HDR.size == 24 and MB_SEG.size == 72')
STAT = struct.Struct("<iIdQQd")  # stage, pad, compute_ms, frames, bytes, send_ms
# (offset, struct code) of each field of a one-segment micro-batch, for field-aware mutations
MB_FIELDS = [(0, "I"), (4, "i"), (8, "i"), (12, "I"), (16, "i"), (24, "Q"), (32, "i"), (36, "i"), (40, "I"),
             (44, "I"), (48, "f"), (52, "i"), (56, "f"), (60, "f"), (64, "f"), (68, "i"), (72, "f"), (76, "f"),
             (80, "Q"), (88, "i"), (96, "i")]
SETUP_FIELDS = [(0, "Q"), (8, "i"), (12, "i"), (16, "i"), (20, "B"), (21, "I")]


# ------------------------------------------------------------------------------ processes
def pipeshard(args, timeout=120):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    san_check(p.stderr, f"pipeshard {' '.join(args)}")
    return p


class Worker(psworker.Worker):
    """A worker of this test: 127.0.0.1:<free port>, the workers' --timeout-ms, logs in TMP/<name>.log."""

    def __init__(self, shard, name):
        # a sanitizer build returns NULL for an allocation it cannot make, as malloc does, rather
        # than abort: a SETUP of 2^24 positions (allowed by --max-ctx) must be an "out of memory"
        # error on a small machine
        env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1")
        super().__init__(BIN, shard, os.path.join(TMP, f"{name}.log"), name, timeout_ms=TIMEOUT_MS, env=env,
                         extra=["--max-ctx", str(1 << 24)])
        self.scanned = 0

    def new_text(self):
        """The log written since the last call."""
        with open(self.log, "rb") as f:
            f.seek(self.scanned)
            b = f.read()
        self.scanned += len(b)
        return b.decode(errors="replace")

    def resources(self):
        """(open file descriptors, threads) of the process."""
        try:
            return len(os.listdir(f"/proc/{self.p.pid}/fd")), len(os.listdir(f"/proc/{self.p.pid}/task"))
        except OSError:
            return None


# ------------------------------------------------------------------------------ the protocol in Python
class Closed(Exception):
    pass


class Conn:
    def __init__(self, addr, timeout=10.0, rcvbuf=None):
        host, port = addr.rsplit(":", 1)
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connecting, so that the window stays small
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.settimeout(timeout)
        self.s.connect((host, int(port)))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_raw(self, b):
        self.s.sendall(b)

    def send(self, typ, payload=b"", **kw):
        self.s.sendall(frame(typ, payload, **kw))

    def _exact(self, n, deadline):
        b = b""
        while len(b) < n:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"timed out with {len(b)} of {n} bytes")
            self.s.settimeout(left)
            try:
                c = self.s.recv(n - len(b))
            except ConnectionResetError:
                c = b""
            if not c:
                raise Closed(f"closed after {len(b)} of {n} bytes")
            b += c
        return b

    def recv(self, timeout=10.0):
        """(type, payload) of the next frame, checked (the worker's frames must be well formed)."""
        deadline = time.time() + timeout
        magic, ver, typ, flags, n, ck = HDR.unpack(self._exact(HDR.size, deadline))
        check(magic == MAGIC and ver == VERSION, f"worker sent a frame with magic {magic:#x} version {ver}")
        payload = self._exact(n, deadline)
        check(ck == xxhash.xxh3_64_intdigest(payload), f"worker sent a frame of type {typ} with a bad checksum")
        return typ, payload

    def drain(self, timeout=10.0):
        """Frames until the worker closes (closed=True) or timeout: (frames, closed, seconds)."""
        t0, frames = time.time(), []
        while True:
            try:
                frames.append(self.recv(max(0.0, t0 + timeout - time.time())))
            except Closed:
                return frames, True, time.time() - t0
            except (TimeoutError, socket.timeout):
                return frames, False, time.time() - t0

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


class Fleet:
    def __init__(self, path):
        j = json.load(open(path))
        self.path, self.j = path, j
        self.model_fp, self.n_layer, self.n = j["model_fingerprint"], j["n_layer"], len(j["stages"])
        self.layers = [tuple(s["layers"]) for s in j["stages"]]
        self.fps = [s["fingerprint"] for s in j["stages"]]

    def hello(self, role=ROLE_COORD, stage=0, session=0, **over):
        k = stage if 0 <= stage < self.n else 0
        f = dict(role=role, stage=stage, stage_count=self.n, lb=self.layers[k][0], le=self.layers[k][1],
                 n_layer=self.n_layer, model_fp=self.model_fp, shard_fp=self.fps[k], session=session, flags=0)
        f.update(over)
        return (struct.pack("<Biiiii", f["role"], f["stage"], f["stage_count"], f["lb"], f["le"], f["n_layer"]) +
                pstr(f["model_fp"]) + pstr(f["shard_fp"]) + struct.pack("<QI", f["session"], f["flags"]))


FLEET = None


class Refused(Exception):
    pass


def handshake(addr, role=ROLE_COORD, stage=0, session=0, hello=None, retry_s=30, rcvbuf=None):
    """A connection through the whole handshake (no key), or Refused(reason). A refusal as busy is
    retried for up to retry_s seconds (0: not at all): the worker may not have seen the previous
    connection close yet."""
    deadline = time.time() + retry_s
    while True:
        c = Conn(addr, rcvbuf=rcvbuf)
        try:
            c.send(HELLO, (hello or FLEET.hello(role, stage, session)) + os.urandom(32) + b"\0")
            typ, p = c.recv()
            if typ == REFUSE:
                raise Refused(p.decode(errors="replace"))
            check(typ == HELLO_REPLY and len(p) == len(FLEET.hello()) + 65,
                  f"handshake: reply of type {typ}, {len(p)} bytes")
            check(p[0] == ROLE_WORKER and p[-33] == 0 and p[-32:] == bytes(32),
                  f"handshake: HELLO_REPLY of role {p[0]}, has_key {p[-33]}, proof {p[-32:].hex()}")
            c.send(AUTH, bytes(32))
            typ, p = c.recv()
            if typ == REFUSE:
                raise Refused(p.decode(errors="replace"))
            check(typ == WELCOME and p == b"", f"handshake: expected WELCOME, got type {typ}")
            return c
        except Refused as e:
            c.close()
            if "busy" not in str(e) or time.time() >= deadline:
                raise
            time.sleep(0.05)
        except BaseException:
            c.close()
            raise


def setup_payload(session, n_ctx=64, max_batch=8, max_mb=8, act=0, nxt="", n_blocks=4, max_segs=2, max_draft=0):
    return (struct.pack("<QiiiB", session, n_ctx, max_batch, max_mb, act) + pstr(nxt) +
            struct.pack("<iii", n_blocks, max_segs, max_draft))


def mb_max_bytes(dim, max_mb, max_segs, n_ctx):
    """stage.c's ps_mb_max_bytes: the frame limit of a session."""
    tables = max_segs * (72 + 4 * ((n_ctx + KV_BLOCK - 1) // KV_BLOCK))
    return min(4096 + max_mb * (4 + 4 * dim) + max(tables, max_segs * (24 + 8 * 20)), 0xFFFFFFFF)


def seg_bytes(seq=1, pos=0, n=4, flags=MB_SAMPLE, n_top=0, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, rep=1.0,
              last_n=64, presence=0.0, frequency=0.0, seed=7, blocks=None, n_blocks=None, n_draft=0, dists=b""):
    """One segment: its fixed fields and its block table (by default blocks 0, 1, ... as far as
    pos + n reaches, at most 4), then dists (the draft distributions' bytes, draft_dist)."""
    if blocks is None:
        blocks = list(range(max(1, min(4, (pos + n + KV_BLOCK - 1) // KV_BLOCK))))
    return (MB_SEG.pack(seq, pos, n, flags, n_top, temp, top_k, top_p, min_p, rep, last_n, presence, frequency, seed,
                        len(blocks) if n_blocks is None else n_blocks, n_draft) +
            struct.pack(f"<{len(blocks)}i", *blocks) + dists)


def draft_dist(ids, probs, n=None):
    """A ps_draft_dist as it travels: i32 n, 16 i32 ids, 16 f32 probabilities (unused ones 0)."""
    pad = 16 - len(ids)
    return struct.pack("<i16i16f", len(ids) if n is None else n, *ids, *[0] * pad, *probs, *[0.0] * pad)


def mb_payload(mb=0, n=4, xdim=DIM, n_stats=1, tokens=None, x=None, stats=None, rng=None, segs=None, n_segs=None,
               hflags=0, **seg):
    """A FORWARD payload: one segment of n positions (seg's fields: seq, pos, flags, sampling,
    blocks), or the segments segs (pairs of (bytes, n))."""
    seq, pos = seg.get("seq", 1), seg.get("pos", 0)
    rng = rng or random.Random(seq * 1000003 + pos)
    if segs is None:
        segs = [(seg_bytes(n=n, **seg), n)]
    rows = sum(k for _, k in segs)
    tokens = [(pos + i) * 37 % VOCAB for i in range(rows)] if tokens is None else tokens
    if x is None:
        x = [rng.gauss(0.0, 1.0) for _ in range(rows * xdim)] if xdim else []
    stats = [STAT.pack(0, 0, 0.5, 1, 1000, 0.1)] * n_stats if stats is None else stats
    return (MB_HDR.pack(mb, len(segs) if n_segs is None else n_segs, rows, xdim, n_stats, hflags) +
            b"".join(b for b, _ in segs) + struct.pack(f"<{len(tokens)}i", *tokens) + b"".join(stats) +
            struct.pack(f"<{len(x)}f", *x))


def parse_error(p):
    """(kind, reason) of an ERROR payload."""
    kind, n = struct.unpack_from("<BI", p)
    return kind, p[5:5 + n].decode(errors="replace")


def parse_tokens(p):
    """(seq, mb, pos, token) of a TOKENS payload's first result."""
    mb, n_res, n_stats = struct.unpack_from("<Iii", p)
    seq, pos, tok, _, n_top = struct.unpack_from("<QiifI", p, 12)
    check(n_res == 1 and len(p) == 12 + 24 + 8 * n_top + n_stats * STAT.size,
          f"TOKENS of {len(p)} bytes for {n_res} results and {n_stats} stats")
    return seq, mb, pos, tok


# ------------------------------------------------------------------------------ sessions
W1 = W2 = None
SESSIONS = random.Random(SEED ^ 0x5E55)


def new_session():
    return SESSIONS.getrandbits(64) | 1


def coord(w):
    return handshake(w.addr)


def expect_frame(c, want, what, timeout=10.0):
    """The next frame must be of type want; returns its payload (None after a check failure)."""
    try:
        typ, p = c.recv(timeout)
    except (Closed, TimeoutError, socket.timeout) as e:
        check(False, f"{what}: expected a frame of type {want}, got {e}")
        return None
    if typ == ERROR:
        check(typ == want, f"{what}: ERROR {parse_error(p)}")
        return None
    check(typ == want, f"{what}: expected a frame of type {want}, got type {typ}")
    return p if typ == want else None


def setup_last(session, **kw):
    """A coordinator connection to stage 2 with session set up (READY checked)."""
    c = coord(W2)
    c.send(SETUP, setup_payload(session, **kw))
    expect_frame(c, READY, "SETUP of stage 2")
    return c


def setup_chain(**kw):
    """Coordinator connections to stage 2 then stage 1 (next = stage 2), both set up: (c1, c2)."""
    s = new_session()
    c2 = setup_last(s, **kw)
    c1 = coord(W1)
    c1.send(SETUP, setup_payload(s, nxt=W2.addr, **kw))
    expect_frame(c1, READY, "SETUP of stage 1")
    return c1, c2, s


def sampled_token(sender, last, payload, what):
    """Sends a micro-batch on sender; the token the last stage answers on last (None on
    failure). Closes both connections."""
    try:
        sender.send(FORWARD, payload)
        p = expect_frame(last, TOKENS, what)
        return parse_tokens(p)[3] if p is not None else None
    finally:
        sender.close()
        last.close()


def chain_token(payload, what):
    """Runs a micro-batch through stage 1 and stage 2; the token stage 2 sampled (None on failure)."""
    c1, c2, _ = setup_chain()
    return sampled_token(c1, c2, payload, what)


def last_token(payload, what):
    """Runs a micro-batch straight into stage 2 (we play stage 1); the token it sampled."""
    s = new_session()
    c2 = setup_last(s)
    prev = handshake(W2.addr, ROLE_PREV, 1, s)
    return sampled_token(prev, c2, payload, what)


# ------------------------------------------------------------------------------ checks after attacks
def healthy(what):
    """Both workers alive, nothing alarming in what they logged since the last look."""
    for w in (W1, W2):
        san_check(w.new_text(), f"{what}: worker {w.name}")
        if not check(w.alive(), f"{what}: worker {w.name} died (exit {w.p.returncode}):\n{w.text()[-3000:]}"):
            raise SystemExit(verdict())


def dropped(c, what, says=None, within=TIMEOUT_MS / 1e3 + 3, seen=()):
    """The worker closes c within `within` s; an ERROR or REFUSE it sent on the way (or among the
    frames `seen` already) contains `says`. Returns (the reasons, seconds)."""
    frames, closed, took = c.drain(within)
    c.close()
    check(closed, f"{what}: the worker did not close the connection within {within:.1f} s")
    reasons = [parse_error(p)[1] if t == ERROR else p.decode(errors="replace") for t, p in list(seen) + frames
               if t in (ERROR, REFUSE)]
    if says:
        check(any(says in r for r in reasons), f"{what}: no ERROR/REFUSE saying '{says}' (got {reasons})")
    return reasons, took


def log_since(w, at):
    """The last 1500 characters worker w logged from byte at on."""
    with open(w.log, "rb") as f:
        f.seek(at)
        return f.read().decode(errors="replace")[-1500:]


def half_close(c, raw=b""):
    """Sends raw, then shuts our side for writing: the worker reads what came, then end of file."""
    try:
        if raw:
            c.send_raw(raw)
        c.s.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def logged(w, says, what, since):
    check(w.wait_log(says, since=since), f"{what}: worker {w.name}'s log lacks '{says}':\n{w.text()[since:][-2000:]}")


REF = None


def real_run(what):
    """`run --fleet` through the workers prints the unsplit run's ids."""
    p = pipeshard(["run", "--fleet", FLEET.path, "--stage-timeout-ms", "20000"] + PROMPT + GEN)
    if check(p.returncode == 0, f"real run {what}: exit {p.returncode}: {p.stderr[-1500:]}"):
        check(p.stdout.split() == REF, f"real run {what}: ids {p.stdout.split()} differ from the unsplit {REF}")
    healthy(f"real run {what}")


# ------------------------------------------------------------------------------ attacks
def attack(what, w, send, says=None, log=None, within=TIMEOUT_MS / 1e3 + 3, hs=True):
    """A fresh connection to w (through the handshake as the coordinator when hs), send(c) (which
    may return frames it read), then the worker must drop it, saying `says` to us and `log` in its
    log. Returns (the reasons it gave, seconds until it dropped us)."""
    mark = len(w.text())
    c = coord(w) if hs else Conn(w.addr)
    seen = []
    try:
        seen = send(c) or []
    except (OSError, Closed):
        pass  # the worker may drop us before we are done
    r = dropped(c, what, says, within, seen)
    if log:
        logged(w, log, what, mark)
    healthy(what)
    return r


def exchange(c, hello):
    """HELLO with this hello payload (no key), and AUTH with the zero proof if the worker answers;
    returns the frames read."""
    c.send(HELLO, hello + os.urandom(32) + b"\0")
    typ, p = c.recv()
    if typ == HELLO_REPLY:
        c.send(AUTH, bytes(32))
    return [(typ, p)]


def case_handshake():
    t0 = time.time()
    rng = random.Random(SEED + 1)
    for w in (W1, W2):
        attack(f"{w.name}: random bytes", w, lambda c: c.send_raw(bytes(rng.randrange(256) for _ in range(200))),
               log="bad magic", hs=False)
        attack(f"{w.name}: HELLO with a wrong checksum", w,
               lambda c: c.send(HELLO, FLEET.hello() + bytes(33), checksum=12345), log="checksum mismatch", hs=False)
        attack(f"{w.name}: HELLO of 4 GB", w, lambda c: c.send(HELLO, b"x" * 64, length=0xFFFFFFFF),
               log="frame of 4294967295 bytes exceeds the limit", hs=False)
        attack(f"{w.name}: a frame of type 99 first", w, lambda c: c.send(99, b"hi"), says="expected HELLO, got "
               "message type 99", log="expected HELLO, got message type 99", hs=False)
        attack(f"{w.name}: HELLO of another version", w,
               lambda c: c.send(HELLO, FLEET.hello() + bytes(33), version=9) or [c.recv()],
               says="protocol version 9 is not supported", hs=False)
        good = FLEET.hello() + bytes(33)
        for cut in (0, 1, 5, 20, len(good) - 40, len(good) - 1):
            attack(f"{w.name}: HELLO cut at {cut}", w, lambda c, cut=cut: c.send(HELLO, good[:cut]) or [c.recv()],
                   says="malformed HELLO", hs=False)
        attack(f"{w.name}: HELLO with trailing bytes", w, lambda c: c.send(HELLO, good + b"\0") or [c.recv()],
               says="malformed HELLO", hs=False)
        bad_hellos = [
            ({"role": 9}, "unknown role 9"), ({"role": 0}, "unknown role 0"),
            ({"stage": 3}, "stage 3 of 3 is out of range"), ({"stage": -1}, "is out of range"),
            ({"stage_count": 0}, "is out of range"), ({"lb": 3, "le": 1}, "does not fit"),
            ({"le": 9}, "does not fit"), ({"n_layer": -4}, "does not fit"),
            ({"model_fp": "xyz"}, "model fingerprint is not 32 hex digits"),
            ({"model_fp": "g" * 32}, "model fingerprint is not 32 hex digits"),
            ({"model_fp": "a" * 33}, "malformed HELLO"), ({"shard_fp": "0" * 31}, "shard fingerprint is not"),
            ({"model_fp": "0" * 32}, "does not match this shard's model"),
            ({"stage_count": 2, "stage": 0, "le": 1}, "does not match this shard"),
            ({"role": ROLE_WORKER}, "a peer of role 3 cannot connect"),
            ({"role": ROLE_PREV, "stage": 1, "session": 42}, "no session 000000000000002a here"),
            ({"flags": 2}, "unknown flags 0x2"), ({"flags": 0x80000000}, "unknown flags 0x80000000"),
            ({"flags": 1}, "only a worker takes shards"),
        ]
        for over, why in bad_hellos:
            attack(f"{w.name}: HELLO {over}", w, lambda c, over=over: exchange(c, FLEET.hello(**over)),
                   says=why, log=why, hs=False)
        attack(f"{w.name}: HELLO with has_key 3", w, lambda c: c.send(HELLO, good[:-1] + b"\3") or [c.recv()],
               says="has_key is 3", hs=False)
        attack(f"{w.name}: HELLO with a key", w, lambda c: c.send(HELLO, good[:-1] + b"\1") or [c.recv()],
               says="the peer has a shared key but we have none", hs=False)

        def auth(c, proof, typ=AUTH):
            c.send(HELLO, good)
            typ_r, _ = c.recv()
            check(typ_r == HELLO_REPLY, f"expected HELLO_REPLY, got {typ_r}")
            c.send(typ, proof)
        attack(f"{w.name}: AUTH with a non-zero proof", w, lambda c: auth(c, b"\1" + bytes(31)),
               says="a proof without a key", log="a proof without a key", hs=False)
        attack(f"{w.name}: AUTH of 31 bytes", w, lambda c: auth(c, bytes(31)), says="malformed AUTH", hs=False)
        attack(f"{w.name}: HELLO again instead of AUTH", w, lambda c: auth(c, good, HELLO),
               says="expected AUTH, got message type 1", hs=False)
        attack(f"{w.name}: close in the middle of HELLO", w, lambda c: half_close(c, frame(HELLO, good)[:40]),
               log="closed the connection in the middle of a frame (got 16 of", within=3, hs=False)
        attack(f"{w.name}: close after HELLO", w, lambda c: half_close(c, frame(HELLO, good)) or [c.recv()],
               log="closed the connection", within=3, hs=False)
    # silence: the handshake times out in --timeout-ms (the loop is blocked meanwhile, so do both
    # workers at once)
    marks = [len(w.text()) for w in (W1, W2)]
    cs = [Conn(w.addr) for w in (W1, W2)]
    cut = [Conn(w.addr) for w in (W1, W2)]
    for c in cut:
        c.send_raw(frame(HELLO, FLEET.hello() + bytes(33))[:10])
    for what, group in (("silent client", cs), ("HELLO header cut at 10 bytes", cut)):
        for w, c in zip((W1, W2), group):
            dropped(c, f"{w.name}: {what}", within=2 * TIMEOUT_MS / 1e3 + 3)
    for w, mark in zip((W1, W2), marks):
        logged(w, f"timed out after {TIMEOUT_MS} ms waiting for a frame from", "silent client", mark)
        logged(w, "(got 10 of 24 header bytes)", "HELLO header cut", mark)
    healthy("silent handshakes")
    # eight silent connections take every handshake slot: a coordinator connecting next cuts the
    # oldest short and is served at once (before, it was dropped until one timed out)
    for w in (W1, W2):
        mark = len(w.text())
        silent = [Conn(w.addr) for _ in range(8)]
        time.sleep(0.2)  # all eight accepted, in order
        t1 = time.time()
        try:
            c = handshake(w.addr, retry_s=0)
            took = time.time() - t1
            c.send(SETUP, setup_payload(new_session(), nxt="" if w is W2 else "127.0.0.1:1"))
            typ, p = c.recv()
            check(typ == READY or (w is W1 and typ == ERROR and "127.0.0.1:1" in parse_error(p)[1]),
                  f"{w.name}: a coordinator after eight silent peers: SETUP answered with type {typ}")
            c.close()
            # a sanity bound only (a healthy handshake takes milliseconds): the bug is caught by
            # the event checked below, which this limit cannot tell from a slow host
            print(f"  {w.name}: a coordinator after eight silent peers: handshake in {took * 1e3:.0f} ms")
            check(took < 2.0, f"{w.name}: a coordinator after eight silent peers waited {took:.1f} s for its handshake")
        except (Refused, Closed, TimeoutError, socket.timeout) as e:
            check(False, f"{w.name}: a coordinator after eight silent peers was not let in: {e!r}")
        finally:
            for s in silent:
                s.close()
        logged(w, "short after", "eight silent peers", mark)
        # The event, not a wall-clock limit: the worker says it cut the oldest handshake short, and
        # how old it was then. The bug this guards (the coordinator waits for a slot until the
        # oldest silent handshake times out) serves it only TIMEOUT_MS after the eight connected,
        # which no limit on `took` can tell from a slow host: with them 0.2 s ahead it takes
        # about 1.8 s, under the 2.0 s bound above. A cut at an age under TIMEOUT_MS proves the
        # slot was freed before any timeout.
        cut = re.search(r"cut the handshake with 127\.0\.0\.1:\d+ short after (\d+) ms: 8 were under way and "
                        r"127\.0\.0\.1:\d+ connected", w.text()[mark:])
        check(cut is not None,
              f"{w.name}: eight silent peers: no line saying which handshake was cut short: {w.text()[mark:][-800:]}")
        check(cut is None or int(cut.group(1)) < TIMEOUT_MS,
              f"{w.name}: eight silent peers: the oldest handshake was cut only after {cut and cut.group(1)} ms, "
              f"not before its {TIMEOUT_MS} ms timeout")
        healthy(f"{w.name}: eight silent peers")
    print(f"  handshake attacks: ok in {time.time() - t0:.1f} s")


def case_setup():
    t0 = time.time()
    rng = random.Random(SEED + 2)
    for w, nxt in ((W1, W2.addr), (W2, "")):
        good = setup_payload(new_session(), nxt="" if w is W2 else "127.0.0.1:1")  # stage 1: fails dialling only
        attack(f"{w.name}: SETUP of random bytes", w,
               lambda c: c.send(SETUP, bytes(rng.randrange(256) for _ in range(30))), says="malformed SETUP",
               log="malformed SETUP message")
        for cut in range(len(good)):
            attack(f"{w.name}: SETUP cut at {cut}", w, lambda c, cut=cut: c.send(SETUP, good[:cut]),
                   says="malformed SETUP")
        attack(f"{w.name}: SETUP with a trailing byte", w, lambda c: c.send(SETUP, good + b"\0"),
               says="malformed SETUP")
        s = new_session()
        for kw, why in [({"session": 0}, "malformed SETUP"), ({"act": 7}, "malformed SETUP"),
                        ({"act": 2}, "malformed SETUP"), ({"act": 255}, "malformed SETUP"),
                        ({"n_ctx": 0}, "SETUP asks for 0 positions"), ({"n_ctx": -1}, "SETUP asks for -1"),
                        ({"n_ctx": 1 << 30}, "SETUP asks for 1073741824"), ({"n_ctx": -(1 << 31)}, "SETUP asks"),
                        ({"max_batch": 0}, "in batches of 0"), ({"max_batch": 1 << 20}, "in batches of 1048576"),
                        ({"max_batch": -5}, "in batches of -5"), ({"max_mb": -1}, "micro-batch size -1"),
                        ({"max_mb": 0}, "micro-batch size 0"), ({"max_mb": 129}, "micro-batch size 129"),
                        ({"n_blocks": 0}, "SETUP asks for 0 KV blocks"), ({"n_blocks": -1}, "asks for -1 KV blocks"),
                        ({"n_blocks": (1 << 24) + 1}, "asks for 16777217 KV blocks"),
                        ({"max_segs": 0}, "and 0 sequences per micro-batch"),
                        ({"max_segs": 257}, "and 257 sequences per micro-batch"),
                        ({"max_draft": -1}, "-1 draft tokens per sequence"),
                        ({"max_draft": 17}, "17 draft tokens per sequence"),
                        ({"max_mb": (1 << 31) - 1}, "micro-batch size 2147483647")]:
            args = dict(session=s, nxt=nxt)
            args.update(kw)
            attack(f"{w.name}: SETUP {kw}", w, lambda c, a=args: c.send(SETUP, setup_payload(**a)), says=why,
                   log=why)
        attack(f"{w.name}: SETUP with a next of length 4 GB", w,
               lambda c: c.send(SETUP, setup_payload(s)[:-4] + struct.pack("<I", 0xFFFFFFFF) + b"abc"),
               says="malformed SETUP")
        attack(f"{w.name}: SETUP with a NUL in next", w, lambda c: c.send(SETUP, setup_payload(s, nxt="1\0x")),
               says="malformed SETUP")
        attack(f"{w.name}: SETUP with a 300-byte next", w, lambda c: c.send(SETUP, setup_payload(s, nxt="a" * 300)),
               says="malformed SETUP")
    s = new_session()
    attack("w2: SETUP naming a next stage", W2, lambda c: c.send(SETUP, setup_payload(s, nxt=W1.addr)),
           says="SETUP names a next stage, but this is the last stage")
    attack("w1: SETUP without a next stage", W1, lambda c: c.send(SETUP, setup_payload(s)),
           says="SETUP lacks a next stage, but this is not the last stage")
    # next addresses that cannot be a next stage
    with socket.socket() as closed_port:
        closed_port.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed_port.getsockname()[1]}"  # bound, not listening: connection refused
        for nxt, why in [("garbage", "bad address \"garbage\""), ("127.0.0.1:99999", "port must be a number"),
                         (":7701", "no host"), ("1:2:3", "an IPv6 host goes in brackets"), ("[::1", "bad address"),
                         (dead, f"cannot connect to {dead}: connection refused"),
                         (W2.addr, "no session"),  # stage 2 has no such session: it refuses stage 1
                         ("127.0.0.1:1\n" + "pipeshard worker: stage 1: forged line", "malformed SETUP"),
                         ("127.0.0.1:1 ", "malformed SETUP"), ("h\xe9te:1", "malformed SETUP")]:
            attack(f"w1: SETUP with next {nxt!r}", W1, lambda c, nxt=nxt: c.send(SETUP, setup_payload(s, nxt=nxt)),
                   says=why, log=why)
    # a next that accepts and never answers, and the worker itself (it cannot answer its own dial):
    # both time out in about --timeout-ms
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        for nxt in (f"127.0.0.1:{silent.getsockname()[1]}", W1.addr):
            attack(f"w1: SETUP with silent next {nxt}", W1, lambda c, nxt=nxt: c.send(SETUP, setup_payload(s, nxt=nxt)),
                   says=f"timed out after {TIMEOUT_MS} ms")
    # a next that answers HELLO with garbage
    with socket.socket() as liar:
        liar.bind(("127.0.0.1", 0))
        liar.listen(4)
        nxt = f"127.0.0.1:{liar.getsockname()[1]}"
        c = coord(W1)
        c.send(SETUP, setup_payload(s, nxt=nxt))
        liar.settimeout(5)
        peer, _ = liar.accept()
        peer.sendall(frame(HELLO_REPLY, b"\0" * 20))
        dropped(c, "w1: next answering garbage", says="malformed HELLO_REPLY")
        peer.close()
    healthy("bad next stages")
    # SETUP twice in one session (stage 1 would dial its next stage a second time)
    for w in (W1, W2):
        c1, c2, s = setup_chain()
        c = c1 if w is W1 else c2
        c.send(SETUP, setup_payload(s, nxt=W2.addr if w is W1 else ""))
        dropped(c, f"{w.name}: a second SETUP", says=f"a second SETUP in session {s:016x}")
        c1.close()
        c2.close()
        healthy(f"{w.name}: a second SETUP")
    # the largest session SETUP allows (2^24 positions, 65536-position micro-batches of 256
    # sequences): a frame announcing its whole frame limit (some 550 MB) is read into a buffer of that
    # size (untouched virtual memory) until the sender hangs up after 1 MB
    big, s = 1 << 24, new_session()
    limit = mb_max_bytes(DIM, 1 << 16, 256, big)

    def huge_frame(c):
        c.send(SETUP, setup_payload(s, n_ctx=big, max_batch=1, max_mb=1 << 16, n_blocks=1, max_segs=256))
        typ, p = c.recv()
        if typ == ERROR and "out of memory" in parse_error(p)[1]:
            print(f"    SETUP of 2^24 positions: {parse_error(p)[1]} (a frame of {limit} bytes not tried)")
            return
        check(typ == READY, f"w2: SETUP of 2^24 positions: answered {typ} {p}")
        half_close(c, HDR.pack(MAGIC, VERSION, FORWARD, 0, limit, 0) + bytes(1 << 20))
        huge_frame.sent = True
    huge_frame.sent = False
    mark = len(W2.text())
    attack(f"w2: a frame of {limit} bytes after a SETUP of 2^24 positions", W2, huge_frame)
    if huge_frame.sent:
        logged(W2, f"of {limit} payload bytes", "w2: a huge frame", mark)
    print(f"  SETUP attacks: ok in {time.time() - t0:.1f} s")


def forward_attacks():
    """(what, payload, ERROR text, valid micro-batches sent before it) of malformed micro-batches,
    valid in every other field."""
    def at(p, off, fmt, v):
        """p with the field at off replaced by v."""
        return p[:off] + struct.pack("<" + fmt, v) + p[off + struct.calcsize(fmt):]
    two = [(seg_bytes(seq=1, n=2), 2), (seg_bytes(seq=2, n=2, blocks=[1]), 2)]
    out = [("n 0", mb_payload(n=0, x=[]), "micro-batch of 0 positions"),
           ("n -1", at(mb_payload(n=0, x=[]), 8, "i", -1), "micro-batch of -1 positions"),
           ("n 2^31-1", MB_HDR.pack(0, 1, 0x7FFFFFFF, DIM, 0, 0), "micro-batch of 2147483647 positions"),
           ("n max_mb+1", mb_payload(n=9), "micro-batch of 9 positions"),
           ("n_segs 0", mb_payload(n_segs=0), "micro-batch of 0 sequences"),
           ("n_segs max_segs+1", mb_payload(n_segs=3), "micro-batch of 3 sequences"),
           ("n_segs 2^31-1", mb_payload(n_segs=0x7FFFFFFF), "micro-batch of 2147483647 sequences"),
           ("segments of fewer rows", at(mb_payload(segs=two), 8, "i", 3), "micro-batch of 3 positions has segments of 4"),
           ("segment n 0", mb_payload(segs=[(seg_bytes(n=0), 4)]), "segment 0: 0 positions at 0"),
           ("pos -1", mb_payload(pos=-1), "segment 0: 4 positions at -1"),
           ("pos -2^31", mb_payload(pos=-(1 << 31)), "at -2147483648"),
           ("pos 2^31-1", mb_payload(pos=(1 << 31) - 1, n=1), "1 positions at 2147483647 do not fit"),
           ("n_blocks -1", mb_payload(n_blocks=-1), "segment 0: 4 positions at 0, -1 blocks"),
           ("n_blocks 2^31-1", mb_payload(n_blocks=0x7FFFFFFF), "segment 0: 4 positions at 0, 2147483647 blocks"),
           ("n_blocks 2^24 with 1 present", mb_payload(n_blocks=1 << 24), "segment 0 truncated"),
           ("an empty table", mb_payload(blocks=[]), "a table of 0 blocks"),
           ("a block outside the pool", mb_payload(blocks=[4]), "KV block 4 is outside the pool (0..3)"),
           ("block -1", mb_payload(blocks=[-1]), "KV block -1 is outside the pool"),
           ("n_top 21", mb_payload(n_top=21), "asks for 21 top log-probabilities (at most 20)"),
           ("a gap at the start", mb_payload(pos=4), "at position 4 reads positions 0..3, never written"),
           ("width dim+1", mb_payload(xdim=DIM + 1), "micro-batch activations are 65 wide, this model's are 64"),
           ("width 2^32-1", at(mb_payload(xdim=DIM), 12, "I", 0xFFFFFFFF), "wide"),
           ("no activations", mb_payload(xdim=0), "micro-batch without activations"),
           ("n_stats -1", at(mb_payload(n_stats=0), 16, "i", -1), "micro-batch carries -1 stage stats"),
           ("n_stats 64", mb_payload(n_stats=64), "micro-batch carries 64 stage stats"),
           ("n_stats 2^31-1", at(mb_payload(n_stats=0), 16, "i", 0x7FFFFFFF), "stage stats"),
           ("n_stats 3 with 1 present", at(mb_payload(n_stats=1), 16, "i", 3), "expected"),
           ("flags 0x80", mb_payload(flags=0x80), "unknown flags 0x80"),
           ("header flags 0x2", mb_payload(hflags=2), "micro-batch header has unknown flags 0x2"),
           ("activations in a ring never offered", mb_payload(hflags=MB_X_RING, x=[]),
            "a micro-batch whose activations are in a ring never offered"),
           ("in the ring, 0 wide", mb_payload(hflags=MB_X_RING, xdim=0), "micro-batch in the ring with activations 0 wide"),
           ("empty", b"", "micro-batch header truncated"),
           ("header only", mb_payload()[:24], "segment 0 truncated"),
           ("a trailing byte", mb_payload() + b"\0", "expected"),
           ("a float missing", mb_payload()[:-4], "expected")]
    good = mb_payload()
    rng = random.Random(SEED + 3)
    for cut in sorted(rng.sample(range(1, len(good)), 12)):
        out.append((f"cut at {cut}", good[:cut], "micro-batch"))
    for i in range(4):
        out.append((f"random bytes {i}", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 1200))),
                    "micro-batch"))
    out = [(what, p, why, []) for what, p, why in out]
    # after valid micro-batches (not sampled) of the session: the context's end, gaps after a
    # continuation, after a rewind (writing at pos discards what came after it)
    full = [mb_payload(pos=k * 8, n=8, flags=0) for k in range(8)]
    out += [("pos + n beyond n_ctx", mb_payload(pos=62), "4 positions at 62 do not fit", full),
            ("pos 2^31-1 after 64", mb_payload(pos=(1 << 31) - 1, n=1), "do not fit", full),
            ("a gap after 8", mb_payload(pos=9), "reads positions 8..8, never written", full[:1]),
            ("a gap after a rewind", mb_payload(pos=8), "reads positions 4..7, never written",
             [full[0], mb_payload(flags=0)]),
            ("another block's gap", mb_payload(pos=36, blocks=[0, 2]), "reads positions 32..35, never written",
             full[:5])]
    return out


def case_forward():
    t0 = time.time()
    # before SETUP: stage 1 takes micro-batches from the coordinator only once set up
    attack("w1: FORWARD before SETUP", W1, lambda c: c.send(FORWARD, mb_payload()),
           says="unexpected message type 18", log="unexpected message type 18")
    attack("w2: FORWARD from the coordinator", W2, lambda c: c.send(FORWARD, mb_payload()),
           says="unexpected message type 18")
    # malformed micro-batches into stage 1 (the coordinator's connection)
    for what, payload, why, prefix in forward_attacks():
        c1, c2, _ = setup_chain()
        mark = len(W1.text())
        c1.send_raw(b"".join(frame(FORWARD, p) for p in prefix + [payload]))
        dropped(c1, f"w1: FORWARD {what}", says=why)
        logged(W1, why, f"w1: FORWARD {what}", mark)
        dropped(c2, f"w1: FORWARD {what}: stage 2's session")  # stage 1 hung up on stage 2: session over
        healthy(f"w1: FORWARD {what}")
    # and into the last stage (we play stage 1), plus what only the last stage checks
    last_only = [("temperature NaN", mb_payload(temp=float("nan")), "temperature nan"),
                 ("temperature -1", mb_payload(temp=-1.0), "temperature -1"),
                 ("top_k -3", mb_payload(top_k=-3), "top_k -3"),
                 ("top_p 0", mb_payload(top_p=0.0), "top_p 0"),
                 ("min_p 2", mb_payload(min_p=2.0), "min_p 2"),
                 ("repetition_penalty inf", mb_payload(rep=float("inf")), "repetition_penalty inf"),
                 ("penalty_last_n -5", mb_payload(last_n=-5), "penalty_last_n -5"),
                 ("presence NaN", mb_payload(presence=float("nan")), "presence_penalty"),
                 ("token -1 with penalties", mb_payload(rep=1.3, tokens=[1, 2, -1, 3]), "is not a token id"),
                 ("token 2^31-1 with penalties", mb_payload(rep=1.3, tokens=[1, 2, 0x7FFFFFFF, 3]),
                  "is not a token id"),
                 ("NaN activations", mb_payload(x=[float("nan")] * (4 * DIM)),
                  "the micro-batch from stage 1 carries a non-finite activation (nan at position 0, element 0, of sequence 1)"),
                 ("inf activations", mb_payload(x=[float("inf")] * (4 * DIM)),
                  "the micro-batch from stage 1 carries a non-finite activation (inf at position 0, element 0, of sequence 1)"),
                 ("huge activations", mb_payload(x=[3e38] * (4 * DIM)), "")]
    for what, payload, why, prefix in forward_attacks() + [t + ([],) for t in last_only]:
        s = new_session()
        c2 = setup_last(s)
        prev = handshake(W2.addr, ROLE_PREV, 1, s)
        mark = len(W2.text())
        # then end of file: the session ends either way
        half_close(prev, b"".join(frame(FORWARD, p) for p in prefix + [payload]))
        reasons, _ = dropped(c2, f"w2: FORWARD {what}")
        if why:
            check(any(why in r for r in reasons), f"w2: FORWARD {what}: no ERROR saying '{why}' (got {reasons})")
            logged(W2, why, f"w2: FORWARD {what}", mark)
        prev.close()
        healthy(f"w2: FORWARD {what}")
    # NaN / inf activations into stage 1: stage 1 refuses them, naming the stage that sent them
    for what, x in (("NaN", float("nan")), ("inf", float("inf")), ("-inf", float("-inf"))):
        c1, c2, _ = setup_chain()
        mark = len(W1.text())
        half_close(c1, frame(FORWARD, mb_payload(x=[x] * (4 * DIM))))
        reasons, _ = dropped(c1, f"w1: FORWARD of {what} activations")
        why = "the micro-batch from stage 0 carries a non-finite activation"
        check(any(why in r for r in reasons), f"w1: FORWARD of {what} activations: no ERROR saying '{why}' ({reasons})")
        logged(W1, why, f"w1: FORWARD of {what} activations", mark)
        c1.close()
        c2.close()
        healthy(f"w1: FORWARD of {what} activations")
    print(f"  FORWARD attacks: ok in {time.time() - t0:.1f} s")


def refused_by_last(typ, payload, what, why, **setup):
    """A frame of typ from stage 1 into the last stage of a fresh session (SETUP fields setup),
    then end of file: the session ends with an ERROR to the coordinator and a log line saying
    why."""
    s = new_session()
    c2 = setup_last(s, **setup)
    prev = handshake(W2.addr, ROLE_PREV, 1, s)
    mark = len(W2.text())
    half_close(prev, frame(typ, payload))
    reasons, _ = dropped(c2, f"w2: {what}")
    check(any(why in r for r in reasons), f"w2: {what}: no ERROR saying '{why}' ({reasons})")
    logged(W2, why, f"w2: {what}", mark)
    prev.close()
    healthy(f"w2: {what}")


def case_draft_dists():
    """Guesses drawn from a distribution the micro-batch carries, into the last stage of a session
    that takes 2 per segment: a valid one is answered, the rest end the session with an ERROR
    that names the problem."""
    t0 = time.time()
    toks = [7, 8, 9, 10]  # the last is the guess
    sampled = {"temp": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

    def seg(dists, n_draft=1, flags=MB_SAMPLE | MB_DRAFT_DIST, **kw):
        return mb_payload(tokens=toks, segs=[(seg_bytes(flags=flags, n_draft=n_draft, dists=dists, **{**sampled, **kw}), 4)])
    good = draft_dist([10, 11], [0.75, 0.25])
    s = new_session()
    c2 = setup_last(s, max_draft=2)
    prev = handshake(W2.addr, ROLE_PREV, 1, s)
    prev.send(FORWARD, seg(good))
    p = expect_frame(c2, TOKENS, "a valid guess with its distribution")
    if p is not None:
        _, n_res, _ = struct.unpack_from("<Iii", p)
        seq, pos, tok, _, _ = struct.unpack_from("<QiifI", p, 12)
        check(n_res in (1, 2) and pos == 3 and 0 <= tok < VOCAB and (n_res == 1 or tok == 10),
              f"a valid guess: {n_res} results, the first token {tok} at {pos}")
    prev.close(), c2.close()
    healthy("a valid guess with its distribution")
    bad = [("distributions without guesses", seg(b"", n_draft=0), "draft distributions without guesses"),
           ("a distribution cut short", seg(good[:100]), "has 1280 bytes, expected 1312"),
           ("3 guesses, the session takes 2", seg(good * 3, n_draft=3), "carries 3 draft tokens; the session allows 2"),
           ("17 tokens", seg(draft_dist([10, 11], [0.75, 0.25], n=17)), "a draft distribution of 17 tokens"),
           ("0 tokens", seg(draft_dist([10, 11], [0.75, 0.25], n=0)), "a draft distribution of 0 tokens"),
           ("a token outside the vocabulary", seg(draft_dist([10, VOCAB], [0.5, 0.5])),
            f"token {VOCAB} is not in [0, {VOCAB})"),
           ("a token twice", seg(draft_dist([10, 10], [0.5, 0.5])), "token 10 appears twice"),
           ("a NaN probability", seg(draft_dist([10, 11], [float("nan"), 0.5])), "has probability nan"),
           ("probabilities summing to 0.5", seg(draft_dist([10, 11], [0.25, 0.25])), "sums to 0.5"),
           ("the guess not in it", seg(draft_dist([11, 12], [0.5, 0.5])), "the guess 10 is not in its draft distribution")]
    for what, payload, why in bad:
        refused_by_last(FORWARD, payload, f"draft distribution: {what}", why, max_draft=2)
    print(f"  draft distributions: ok in {time.time() - t0:.1f} s")


def case_dhop():
    """Device hops (DHOP): a CPU stage declines the offer, saying why, and the session goes on
    with activations in the FORWARD messages; an offer before SETUP, from the wrong peer, or
    malformed ends the session with an ERROR that names it."""
    t0 = time.time()
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    for w in (W1, W2):
        if w is W1:
            c1, c2, _ = setup_chain()
            prev, out = c1, c2
        else:
            s = new_session()
            out = setup_last(s)
            prev = handshake(W2.addr, ROLE_PREV, 1, s)
        prev.send(DHOP, pstr(boot))
        p = expect_frame(prev, DHOP_REPLY, f"{w.name}: a device hop's offer")
        check(p == b"\0" + pstr("runs on the CPU"), f"{w.name}: DHOP_REPLY {p!r}, want a refusal: runs on the CPU")
        prev.send(FORWARD, mb_payload())
        p = expect_frame(out, TOKENS, f"{w.name}: the session after a declined device hop")
        check(p is not None and parse_tokens(p)[:3] == (1, 0, 4), f"{w.name}: after DHOP: {p and parse_tokens(p)}")
        prev.close(), out.close()
        healthy(f"{w.name}: a declined device hop")
    attack("w1: DHOP before SETUP", W1, lambda c: c.send(DHOP, pstr(boot)), says="unexpected message type 33",
           log="unexpected message type 33")
    refused_by_last(DHOP, b"\1\2", "a malformed DHOP", "malformed DHOP message")
    refused_by_last(DHOP, pstr(boot) + b"\0", "DHOP with a trailing byte", "malformed DHOP message")
    # the coordinator is not stage 2's previous stage: its DHOP is an unexpected message
    s = new_session()
    c2 = setup_last(s)
    half_close(c2, frame(DHOP, pstr(boot)))
    dropped(c2, "w2: DHOP from the coordinator", says="unexpected message type 33")
    healthy("w2: DHOP from the coordinator")
    print(f"  device hops: ok in {time.time() - t0:.1f} s")


def case_frames():
    t0 = time.time()
    for w in (W1, W2):
        nxt = W2.addr if w is W1 else ""

        def live(c, w=w, nxt=nxt):
            """c, set up (stage 1's next must then hold the session too)."""
            s = new_session()
            if w is W1:
                live.c2 = setup_last(s)
            c.send(SETUP, setup_payload(s, nxt=nxt))
            check(c.recv()[0] == READY, f"{w.name}: SETUP not READY")

        def run(what, send, says=None, log=None, within=TIMEOUT_MS / 1e3 + 3, setup=True):
            def go(c):
                if setup:
                    live(c)
                send(c)
            r = attack(f"{w.name}: {what}", w, go, says, log, within)
            if w is W1 and setup:
                live.c2.close()
            return r
        for setup in (False, True):
            tag = "after SETUP" if setup else "before SETUP"
            run(f"a wrong checksum {tag}", lambda c: c.send(PROBE, b"", checksum=1), "checksum mismatch",
                "checksum mismatch in a frame of type 23", setup=setup)
            run(f"a SETUP with a wrong checksum {tag}", lambda c: c.send(SETUP, setup_payload(3), checksum=0),
                "checksum mismatch", setup=setup)
            run(f"len 4 GB {tag}", lambda c: c.send(FORWARD, b"", length=0xFFFFFFFF),
                "frame of 4294967295 bytes exceeds the limit", "exceeds the limit", setup=setup)
            run(f"len 64 KiB + 1 {tag}", lambda c: c.send(SETUP, b"", length=(64 << 10) + 1) if not setup else
                c.send(FORWARD, b"", length=mb_max_bytes(DIM, 8, 2, 64) + 1), "exceeds the limit", setup=setup)
            for typ in (0, 2, 4, 5, 15, 31, 99, 0xFFFF, READY, TOKENS, STATS, ERROR, HELLO, AUTH, PLACED, SEND_SHARD,
                        KV_DONE):
                run(f"message type {typ} {tag}", lambda c, typ=typ: c.send(typ, b"abc"),
                    f"unexpected message type {typ}", f"unexpected message type {typ}", setup=setup)
            # a worker given its --shard takes no other (test_travel.py drives --cache workers)
            run(f"PLACE {tag}", lambda c: c.send(PLACE, b"abc"), "PLACE to a worker that serves its --shard",
                "PLACE to a worker that serves its --shard", setup=setup)
            run(f"SHARD_DATA {tag}", lambda c: c.send(SHARD_DATA, b"abc"), "SHARD_DATA while no shard is arriving",
                "SHARD_DATA while no shard is arriving", setup=setup)
            for typ in (KV_SAVE, KV_LOAD):  # prefixes: malformed (a well-formed one: below)
                why = "malformed prefix message" if setup else "prefix message before SETUP"
                run(f"message type {typ} {tag}", lambda c, typ=typ: c.send(typ, b"abc"), why, why, setup=setup)
                blocks_0 = struct.pack("<Qi", 7, 0)  # no blocks
                run(f"message type {typ} of 0 blocks {tag}", lambda c, typ=typ: c.send(typ, blocks_0),
                    "0 blocks" if setup else why, setup=setup)
            run(f"version {VERSION + 1} {tag}", lambda c: c.send(PROBE, b"", version=VERSION + 1),
                f"speaks protocol version {VERSION + 1}", setup=setup)
            run(f"bad magic {tag}", lambda c: c.send(PROBE, b"", magic=0x12345678), "bad magic 0x12345678",
                setup=setup)
            run(f"close in the middle of a header {tag}", lambda c: half_close(c, frame(PROBE, b"")[:7]),
                log="in the middle of a frame header (got 7 of 24 bytes)", within=3, setup=setup)
            run(f"close in the middle of a payload {tag}", lambda c: half_close(c, frame(SETUP, setup_payload(5))[:30]),
                log=f"in the middle of a frame (got 6 of {len(setup_payload(5))} payload bytes)", within=3, setup=setup)
        # PROBE before and after SETUP is fine: STATS comes back, the session goes on
        c = coord(w)
        c.send(PROBE)
        p = expect_frame(c, STATS, f"{w.name}: PROBE before SETUP")
        check(p is not None and struct.unpack("<iII", p) == (1 if w is W1 else 2, 0, 0),
              f"{w.name}: STATS before SETUP: {p}")
        # a well-formed KV_SAVE to a worker without --prefix-dir: refused in KV_DONE, the session
        # goes on (PROBE); KV_LOAD of a block never written: refused too
        live(c)
        for typ, says in ((KV_SAVE, b"keeps no prefixes (start it with --prefix-dir DIR)"),
                          (KV_LOAD, b"keeps no prefixes")):
            c.send(typ, struct.pack("<Qi", 7, 1) + struct.pack("<i", 0) + struct.pack(f"<{KV_BLOCK}i", *range(KV_BLOCK)))
            p = expect_frame(c, KV_DONE, f"{w.name}: KV message {typ} without --prefix-dir")
            check(p is not None and p[0] == 1 and says in p, f"{w.name}: KV_DONE {p!r}")
        c.send(PROBE)
        expect_frame(c, STATS, f"{w.name}: PROBE after a refused KV_SAVE")
        if w is W1:
            live.c2.close()
        c.send(BYE)
        frames, closed, _ = c.drain(3)
        check(closed and not frames, f"{w.name}: BYE: closed {closed}, frames {frames}")
        c.close()
        healthy(f"{w.name}: PROBE, BYE")
    # a header cut in the middle, then silence: the worker drops the connection in about
    # --timeout-ms (both workers at once: each one's loop waits meanwhile); the same for a payload
    for what, raw, says in (("a header cut at 10 bytes", frame(PROBE, b"")[:10], "(got 10 of 24 header bytes)"),
                            ("a payload cut at 6 bytes", frame(SETUP, setup_payload(5))[:30],
                             f"(got 6 of {len(setup_payload(5))} payload bytes)")):
        cs = []
        marks = [len(w.text()) for w in (W1, W2)]
        for w in (W1, W2):
            c = coord(w)
            c.send_raw(raw)
            cs.append(c)
        for w, c, mark in zip((W1, W2), cs, marks):
            dropped(c, f"{w.name}: {what} then silence", says=f"timed out after {TIMEOUT_MS} ms")
            logged(w, says, f"{w.name}: {what} then silence", mark)
        healthy(what)
    # a coordinator that never reads: SETUP (else the worker drops it for want of one), then PROBEs
    # until the STATS answers fill the socket and the last stage's send queue; queuing times out in
    # --timeout-ms and the worker drops the connection
    c = handshake(W2.addr, rcvbuf=2048)
    c.send(SETUP, setup_payload(new_session()))
    expect_frame(c, READY, "w2: SETUP of a coordinator that never reads")
    mark, blob, t = len(W2.text()), frame(PROBE, b"") * 20000, time.time()
    try:
        while time.time() - t < 60:
            c.s.sendall(blob)
    except OSError:
        pass
    took = time.time() - t
    c.close()
    check(took < 60, "w2: a coordinator that never reads: the worker never dropped it")
    logged(W2, f"ended: timed out after {TIMEOUT_MS} ms waiting for room in the send queue to",
           "w2: a coordinator that never reads", mark)
    healthy("a coordinator that never reads")
    print(f"  frame attacks: ok in {time.time() - t0:.1f} s (a coordinator that never reads: dropped after "
          f"{took:.1f} s)")


def case_sessions(want):
    t0 = time.time()
    # a second coordinator while a session is live: busy; the live session goes on unharmed
    for w in (W1, W2):
        c1, c2, s = setup_chain()
        mark = len(w.text())
        try:
            handshake(w.addr, retry_s=0).close()
            check(False, f"{w.name}: a second coordinator was let in while a session is live")
        except Refused as e:
            check("busy: serving a session of coordinator" in str(e), f"{w.name}: second coordinator: refused '{e}'")
        logged(w, "busy: serving a session of coordinator", f"{w.name}: second coordinator", mark)
        c1.send(FORWARD, mb_payload())
        p = expect_frame(c2, TOKENS, f"{w.name}: the live session after a second coordinator")
        check(p is not None and parse_tokens(p) == (1, 0, 4, want),
              f"{w.name}: the live session after a second coordinator: {p and parse_tokens(p)}, want token {want}")
        # and the session goes on to the next position
        c1.send(FORWARD, mb_payload(pos=4, n=1, mb=1))
        p = expect_frame(c2, TOKENS, f"{w.name}: the next micro-batch")
        check(p is not None and parse_tokens(p)[:3] == (1, 1, 5), f"{w.name}: next micro-batch: {p}")
        c1.close()
        c2.close()
        healthy(f"{w.name}: second coordinator")
    # two coordinators whose handshakes overlap (both pass the check before the loop adopts
    # either): one gets the session, the other an ERROR saying why in answer to its SETUP, not
    # a bare close. Whether they overlap is up to the threads' timing (else the second is refused
    # as busy in its handshake, also with the reason): tried until they have, at most 20 times
    for w in (W1, W2):
        overlaps = 0
        for attempt in range(20):
            s = new_session()
            last = setup_last(s) if w is W1 else None  # stage 1's session needs stage 2's
            cs = [Conn(w.addr) for _ in range(2)]
            for c in cs:
                c.send(HELLO, FLEET.hello() + os.urandom(32) + b"\0")
                check(c.recv()[0] == HELLO_REPLY, f"{w.name}: overlapping handshakes: HELLO_REPLY")
            for c in cs:  # both AUTHs at once: both checks run before the first WELCOME is adopted
                c.send(AUTH, bytes(32))
            answers = []
            for c in cs:
                typ, p = c.recv()
                if typ == WELCOME:
                    c.send(SETUP, setup_payload(s, nxt=W2.addr if w is W1 else ""))
                    frames, _, _ = c.drain(3.0)
                    answers.append([(t, parse_error(p)[1] if t == ERROR else p) for t, p in frames])
                else:
                    answers.append([(typ, p.decode(errors="replace"))])
                c.close()
            if last:
                last.close()
            ready = [a for a in answers if a and a[0][0] == READY]
            busy = [a for a in answers if a and a[0][0] in (ERROR, REFUSE) and
                    "busy: serving a session of coordinator 127.0.0.1:" in a[0][1]]
            if not check(len(ready) == 1 and len(busy) == 1,
                         f"{w.name}: overlapping handshakes: one READY and one saying busy, got {answers}"):
                break
            healthy(f"{w.name}: overlapping handshakes")
            overlaps += busy[0][0][0] == ERROR
            if overlaps:
                break
        check(overlaps == 1, f"{w.name}: the two handshakes never overlapped in {attempt + 1} tries")
        print(f"  {w.name}: overlapping handshakes after {attempt + 1} tries")
    # a coordinator that authenticates and then says nothing: dropped after --timeout-ms, so that
    # it cannot keep the worker busy; the next coordinator is served
    for w in (W1, W2):
        _, took = attack(f"{w.name}: a coordinator without SETUP", w, lambda c: None,
                         says=f"sent no SETUP within {TIMEOUT_MS} ms", log=f"sent no SETUP within {TIMEOUT_MS} ms")
        check(took >= TIMEOUT_MS / 1e3 - 0.1, f"{w.name}: a coordinator without SETUP was dropped after {took:.1f} s")
    real_run("after coordinators without SETUP")
    # while a session is live: its id is told to no one in HELLO_REPLY, and a second previous
    # stage of that session (on stage 1, one beside the coordinator) is refused
    c1, c2, s = setup_chain()
    probe = Conn(W2.addr)
    probe.send(HELLO, FLEET.hello() + os.urandom(32) + b"\0")
    typ, p = probe.recv()
    probe.close()
    check(typ == HELLO_REPLY and p[len(p) - 73:len(p) - 65] == bytes(8),
          f"w2: HELLO_REPLY during a session: type {typ}, session field {p[len(p) - 73:len(p) - 65].hex()}")
    # right after SETUP: stage 1's handshake with stage 2 has passed its check, and stage 2's loop
    # may not have taken the connection yet (a handshake ends on a thread of its own): the check
    # claims the slot, so a second previous stage is refused in its handshake all the same
    for w, stage in ((W2, 1), (W1, 0)):
        try:
            handshake(w.addr, ROLE_PREV, stage, s, retry_s=0).close()
            check(False, f"{w.name}: a second previous stage of the live session was let in")
        except Refused as e:
            check(f"session {s:016x} has its previous stage already" in str(e),
                  f"{w.name}: a second previous stage: refused '{e}'")
    c1.send(FORWARD, mb_payload())
    p = expect_frame(c2, TOKENS, "the live session after a second previous stage")
    check(p is not None and parse_tokens(p) == (1, 0, 4, want),
          f"the live session after a second previous stage: {p and parse_tokens(p)}, want token {want}")
    c1.close()
    c2.close()
    healthy("a second previous stage")
    # a previous stage with another session, and one before any SETUP (session 0)
    c2 = setup_last(new_session())
    try:
        handshake(W2.addr, ROLE_PREV, 1, 12345, retry_s=0).close()
        check(False, "w2: a previous stage of another session was let in")
    except Refused as e:
        check("no session 0000000000003039 here" in str(e), f"w2: previous stage of another session: '{e}'")
    c2.close()
    for w in (W1, W2):
        c = coord(w)
        try:
            prev = handshake(w.addr, ROLE_PREV, 0 if w is W1 else 1, 0, retry_s=0)
            prev.send(FORWARD, mb_payload())
            dropped(prev, f"{w.name}: a previous stage before SETUP")
            check(False, f"{w.name}: a previous stage was let in before any SETUP")
        except Refused as e:
            check("no session 0000000000000000 here" in str(e), f"{w.name}: previous stage before SETUP: '{e}'")
        c.close()
        healthy(f"{w.name}: previous stage before SETUP")
    print(f"  session attacks: ok in {time.time() - t0:.1f} s")


# ------------------------------------------------------------------------------ random mutations
INTS = [0, 1, -1, 2, 3, 4, 7, 8, 9, 63, 64, 65, 127, 128, 255, 256, 511, 512, 4096, 65535, 65536, 65537,
        1 << 24, (1 << 24) + 1, 1 << 30, (1 << 31) - 1, -(1 << 31), -2]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 3.4e38, -3.4e38, float("inf"), float("-inf"), float("nan")]
U64S = [0, 1, 2, (1 << 63), (1 << 64) - 1, 0x5EED]


def mutate(rng, data, fields):
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(10)
        if op < 4 and fields:  # a field gets a boundary value
            off, code = rng.choice(fields)
            if off + struct.calcsize("<" + code) > len(b):
                continue
            if code in "iI":
                v = rng.choice(INTS)
                b[off:off + 4] = struct.pack("<i", v) if -(1 << 31) <= v < (1 << 31) else struct.pack("<I", v)
            elif code == "f":
                b[off:off + 4] = struct.pack("<f", rng.choice(FLOATS))
            elif code == "Q":
                b[off:off + 8] = struct.pack("<Q", rng.choice(U64S))
            else:
                b[off] = rng.choice((0, 1, 2, 7, 0x7F, 0x80, 0xFF))
        elif op == 4 and b:  # a bit flip
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 5 and b:  # an interesting byte
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op == 6:  # cut
            del b[rng.randrange(len(b) + 1):]
        elif op == 7:  # insertion
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 8 and b:  # deletion
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 9)]
        elif b:  # a random 32-bit word anywhere
            i = rng.randrange(len(b))
            b[i:i + 4] = struct.pack("<I", rng.getrandbits(32))
    return bytes(b)


def mutated_frame(rng, typ, payload):
    """The frame of payload, its header corrupted one time in ten (never a len larger than the
    payload: we close right after, so that one only tests the close in the middle of a frame)."""
    r = rng.random()
    if r < 0.03:
        return frame(typ, payload, checksum=rng.getrandbits(64))
    if r < 0.05:
        return frame(typ, payload, length=rng.randrange(len(payload) + 1))
    if r < 0.07:
        return frame(rng.choice((0, SETUP, FORWARD, PROBE, BYE, 77)), payload)
    if r < 0.08:
        return frame(typ, payload, version=rng.choice((0, VERSION + 1)))
    if r < 0.1:
        return frame(typ, payload, length=len(payload) + rng.randrange(1, 100))
    return frame(typ, payload)


def finish(c, what, within=TIMEOUT_MS / 1e3 + 3):
    """Sends PROBE, half-closes, reads until the worker closes: every frame before was handled."""
    try:
        c.send(PROBE)
        c.s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    frames, closed, _ = c.drain(within)
    c.close()
    check(closed, f"{what}: the worker did not close the connection")
    return frames


def case_mutations(want_last):
    t0 = time.time()
    rng = random.Random(SEED + 4)
    outcomes = {}
    # SETUP, into the last stage (no dialling: a mutated address never leaves the worker)
    for i in range(N_MUTATIONS):
        payload = mutate(rng, setup_payload(new_session(), n_ctx=rng.choice((64, 256)), max_mb=8),
                         SETUP_FIELDS)
        c = coord(W2)
        c.send_raw(mutated_frame(rng, SETUP, payload))
        frames = finish(c, f"SETUP mutation {i}")
        kind = "READY" if frames and frames[0][0] == READY else "refused"
        outcomes[f"setup {kind}"] = outcomes.get(f"setup {kind}", 0) + 1
        healthy(f"SETUP mutation {i} ({payload.hex()})")
    # SETUP into stage 1: the 21 bytes before the address only (a mutated address could name a
    # host to resolve: DNS is no part of this test); stage 2 has no such session: it refuses
    for i in range(N_MUTATIONS // 6):
        payload = mutate(rng, setup_payload(new_session())[:21], SETUP_FIELDS[:5]) + pstr(W2.addr)
        c = coord(W1)
        c.send_raw(mutated_frame(rng, SETUP, payload))
        finish(c, f"w1 SETUP mutation {i}")
        healthy(f"w1 SETUP mutation {i} ({payload.hex()})")
    mid = time.time()
    # FORWARD, straight into the last stage and through stage 1
    for i in range(N_MUTATIONS):
        # half of them continue a session: after 4 valid positions (not sampled)
        prefix = [mb_payload(seq=3, n=4, flags=0, rng=rng)] if rng.random() < 0.5 else []
        base = mb_payload(seq=3, pos=4 if prefix else 0, n=rng.choice((1, 4, 8)), n_stats=rng.choice((0, 1, 2)),
                          rep=rng.choice((1.0, 1.1)), rng=rng)
        payload = mutate(rng, base, MB_FIELDS)
        into_last = i % 2 == 0
        since = (os.path.getsize(W1.log), os.path.getsize(W2.log))
        s = new_session()
        c2 = setup_last(s)
        if into_last:
            c = handshake(W2.addr, ROLE_PREV, 1, s)
        else:
            c = coord(W1)
            c.send(SETUP, setup_payload(s, nxt=W2.addr))
            expect_frame(c, READY, f"FORWARD mutation {i}: SETUP of stage 1")
        half_close(c, b"".join(frame(FORWARD, p) for p in prefix) + mutated_frame(rng, FORWARD, payload))
        frames, closed, _ = c2.drain(TIMEOUT_MS / 1e3 + 3)
        check(closed, lambda: f"FORWARD mutation {i}: stage 2 did not end the session once its input closed "
              f"({payload.hex()}); w1 since:\n{log_since(W1, since[0])}\nw2 since:\n{log_since(W2, since[1])}")
        types = [t for t, _ in frames]
        kind = "TOKENS" if TOKENS in types else "ERROR" if ERROR in types else "nothing"
        outcomes[f"forward {kind}"] = outcomes.get(f"forward {kind}", 0) + 1
        c.drain(3)
        c.close()
        c2.close()
        healthy(f"FORWARD mutation {i} ({'last stage' if into_last else 'stage 1'}: {payload[:80].hex()}...)")
        if i % 100 == 99:
            real_run(f"after {i + 1} FORWARD mutations")
    # the valid micro-batch still gives the same token
    check(last_token(mb_payload(), "after the mutations") == want_last, "the last stage's token changed")
    print(f"  mutations: SETUP {mid - t0:.1f} s, FORWARD {time.time() - mid:.1f} s: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}")


# ------------------------------------------------------------------------------ main
def case_log_flood(n=400):
    """n connections to W1 that close at once: each is one line about a failed or dropped
    connection, but the log takes a burst of 100 and then 10 a second; the rest are counted in
    "N more lines ... left out" lines. Shown + left out = n exactly; then a real run is served."""
    t0, mark = time.time(), len(W1.text())
    host, port = W1.addr.rsplit(":", 1)
    for _ in range(n):
        socket.create_connection((host, int(port)), timeout=10).close()
    pattern = re.compile(r"(\d+) more lines about failed or dropped connections left out")
    deadline, shown, left = time.time() + 30, 0, 0
    while time.time() < deadline:
        lines = W1.text()[mark:].splitlines()
        left = sum(int(m.group(1)) for m in map(pattern.search, lines) if m)
        shown = sum(1 for line in lines if ("closed the connection" in line or "were under way" in line))
        if shown + left >= n:
            break
        time.sleep(0.2)
    took = time.time() - t0
    check(shown + left == n, f"log flood: {shown} lines shown + {left} left out, not {n}")
    check(left > 0 and shown <= 100 + 10 * took + 2,
          f"log flood: {shown} lines shown in {took:.1f} s (a burst of 100, then 10 a second), {left} left out")
    real_run("after a log flood")
    print(f"  log flood: {n} connections, {shown} lines shown, {left} counted as left out ({took:.1f} s)")


def idle_resources(w, base, what):
    """The idle worker's fds and threads come back to base (the worker may still be ending a session)."""
    deadline = time.time() + 30
    while w.resources() != base and time.time() < deadline:
        time.sleep(0.05)
    check(w.resources() == base, f"{what}: idle worker {w.name} holds (fds, threads) {w.resources()}, "
          f"{base} at the start: a leaked connection or thread")


def main():
    global TMP, FLEET, W1, W2, REF
    if not os.access(BIN, os.X_OK):
        print(f"FAIL: PIPESHARD_BIN={BIN} is not executable (run through ctest)")
        return 1
    TMP = tmpdir("worker-fuzz-")
    t0 = time.time()
    workers = []
    try:
        model = os.path.join(TMP, "m.gguf")
        p = pipeshard(["synth"] + SYNTH + ["-o", model])
        if p.returncode != 0:
            raise AssertionError(f"synth: {p.stderr}")
        p = pipeshard(["split", "-m", model, "--stages", "3", "-o", os.path.join(TMP, "fleet"), "--quiet"])
        if p.returncode != 0:
            raise AssertionError(f"split: {p.stderr}")
        fleet_path = os.path.join(TMP, "fleet", "fleet.json")
        p = pipeshard(["run", "-m", model] + PROMPT + GEN)
        REF = p.stdout.split()
        if not check(p.returncode == 0 and len(REF) == 12, f"unsplit run: {p.returncode} {p.stdout} {p.stderr}"):
            return verdict()
        W1 = Worker(os.path.join(TMP, "fleet", "stage-1.gguf"), "w1")
        W2 = Worker(os.path.join(TMP, "fleet", "stage-2.gguf"), "w2")
        workers = [W1, W2]
        j = json.load(open(fleet_path))
        j["stages"][1]["address"], j["stages"][2]["address"] = W1.addr, W2.addr
        with open(fleet_path, "w") as f:
            json.dump(j, f)
        FLEET = Fleet(fleet_path)
        base_res = {w.name: w.resources() for w in workers}  # idle: listening, no session yet
        real_run("before the attacks")
        for w in workers:
            idle_resources(w, base_res[w.name], "after a real run")
        # the Python coordinator's own sessions: a micro-batch gives the same token every time
        want = chain_token(mb_payload(), "a valid session")
        check(want is not None and chain_token(mb_payload(), "the same again") == want,
              "two runs of the same micro-batch through stage 1 and 2 gave different tokens")
        want_last = last_token(mb_payload(), "a valid micro-batch into stage 2")
        check(want_last is not None and last_token(mb_payload(), "again") == want_last,
              "two runs of the same micro-batch into stage 2 gave different tokens")
        print(f"  valid sessions from Python: tokens {want} (stage 1 + 2), {want_last} (stage 2)")
        case_handshake()
        real_run("after the handshake attacks")
        case_setup()
        real_run("after the SETUP attacks")
        case_forward()
        case_draft_dists()
        case_dhop()
        case_frames()
        real_run("after the FORWARD and frame attacks")
        case_sessions(want)
        for w in workers:
            idle_resources(w, base_res[w.name], "after the attacks")
        case_mutations(want_last)
        check(chain_token(mb_payload(), "at the end") == want, "the token through stage 1 and 2 changed")
        real_run("at the end")
        for w in workers:
            idle_resources(w, base_res[w.name], "at the end")
        case_log_flood()  # last: it spends the worker's room for lines about connections
    finally:
        for w in workers:
            w.stop()
            san_check(w.text(), f"worker {w.name} at exit")
            check(w.p.returncode == 0, f"worker {w.name} exited {w.p.returncode} on SIGTERM")
    return conclude(TMP, t0)


if __name__ == "__main__":
    sys.exit(main())
