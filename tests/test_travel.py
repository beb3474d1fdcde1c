#!/usr/bin/env python3
"""test_travel.py - shards that travel (issue 16): a worker started with only --listen, --key-file
and --cache receives its shard from the coordinator, checks it, keeps it, and refuses what it must.

The small synthetic model (pstest.synth_small) is split into 3 stages; workers start with no
shard. Cases:
  1. received: `run --fleet ... --key-file`, its stderr on a pseudo-terminal, prints the unsplit
     model's greedy ids; the terminal showed "sending stage K's shard to ADDR: N%" for both
     workers; each cache holds <fingerprint>.gguf equal byte for byte to the split's file and no
     .part; the worker logs say "receiving stage K's shard".
  2. cached: a second run sends nothing (no new "receiving" line, the cached files untouched);
     a fleet with the workers' stages swapped makes each receive the other shard (two in each
     cache), and the first fleet again loads both from the cache ("from the cache", nothing
     received); a worker restarted on the same cache serves from it too. Every run: the unsplit ids.
  3. a wrong fingerprint: a copy of the split whose stage-1 file has one tensor byte changed
     (fleet.json's fingerprint and the file's metadata unchanged) sent to an empty worker: `run`
     fails naming "stage 1 (ADDR)", that the shard sent was refused, and the offered fingerprint
     beside the one computed; the worker logs "refused stage 1's shard"; its cache is empty; it
     then serves a correct run.
  4. --max-disk: smaller than the shard, refused with both sizes (run's stderr and the log), the
     cache left empty; room for one shard only: placing the second evicts the first.
  5. transfers cut short: a coordinator that stops after half the bytes leaves DIR/<fp>.part;
     the next run sends only the rest ("resuming after the N bytes"); a resumed file that fails
     its check is received again from the start, and the run still succeeds.
  6. hostile coordinators (the handshake and sealed frames through libpscore, ctypes): PLACE of
     stage 0, of stage 3 of 3, with a fingerprint that is a path or upper case, of 0 bytes,
     truncated, with trailing bytes, after another PLACE's transfer began; SHARD_DATA beyond the
     offered size, without PLACE, empty; SETUP before any shard; garbage of the offered size (not
     a shard). Each gets an ERROR that names the problem; nothing is left in the cache but what
     was there; the worker then serves a correct run.
  7. usage errors: --cache without --key-file, --shard with --cache, neither, a bad --max-disk,
     --max-disk without --cache: exit 2 with a clear line; a --cache that is a file: exit 1.
Every log and stderr is scanned for sanitizer reports. Exit 0 pass, 1 fail.
"""
import ctypes
import filecmp
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pstest import check, conclude, on_terminal, reexec_with_asan, require, synth_small, tmpdir  # noqa: E402
import psworker  # noqa: E402
from psworker import pstr, san_check  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
LIB = os.environ.get("PS_LIBPSCORE", "")
TMP = None
KEY = None
WORKERS = []
PROMPT = ["--prompt-ids", "5,17,300,42,9,611,2"]
GEN = ["-n", "12", "--ignore-eos", "--print-ids", "-t", "1", "--temp", "0"]
REF = None  # the unsplit model's ids

SETUP, READY, ERROR = 16, 17, 21
PLACE, PLACED, SEND_SHARD, SHARD_DATA = 24, 25, 26, 27


# ------------------------------------------------------------------------------ helpers
def pipeshard(args, timeout=120):
    p = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    san_check(p.stderr, "pipeshard " + " ".join(args))
    return p


class Worker(psworker.Worker):
    """A --cache worker of this test (the test's key), its log in TMP/<name>.log."""

    def __init__(self, name, cache, port=0, extra=()):
        self.cache = cache
        super().__init__(BIN, None, os.path.join(TMP, f"{name}.log"), name, port=port, key=KEY, cache=cache,
                         extra=list(extra))
        WORKERS.append(self)

    def stop(self):
        super().stop()
        san_check(self.text(), f"worker {self.name}")

    def files(self):
        return sorted(os.listdir(self.cache)) if os.path.isdir(self.cache) else []


def size_of(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def load_json(path):
    with open(path) as f:
        return json.load(f)


def write_fleet(fleet, addrs, name, out_dir=None):
    """A copy of fleet (in out_dir, default its own folder; shard paths made absolute) with stage k at addrs[k-1]."""
    j = load_json(fleet)
    base = os.path.dirname(os.path.abspath(fleet))
    for st in j["stages"]:
        st["shard"] = os.path.join(base, st["shard"])
    for k, a in enumerate(addrs, 1):
        j["stages"][k]["address"] = a
    path = os.path.join(out_dir or base, name)
    with open(path, "w") as f:
        json.dump(j, f)
    return path


def fleet_run(fleet, what, timeout=120):
    """`run --fleet fleet --key-file KEY`; a check that it printed the unsplit ids."""
    p = pipeshard(["run", "--fleet", fleet, "--key-file", KEY] + PROMPT + GEN, timeout)
    if check(p.returncode == 0, f"{what}: run exited {p.returncode}: {p.stderr[-1500:]}"):
        check(p.stdout.split() == REF, f"{what}: ids {p.stdout.split()} differ from the unsplit run's {REF}")
    return p


def cached(w, fleet, k):
    """Whether w's cache holds stage k's shard, byte for byte the split's file."""
    st = load_json(fleet)["stages"][k]
    path = os.path.join(w.cache, st["fingerprint"] + ".gguf")
    return os.path.isfile(path) and filecmp.cmp(path, os.path.join(os.path.dirname(fleet), st["shard"]),
                                                shallow=False)


# ------------------------------------------------------------------------------ a coordinator through libpscore
class Hello(ctypes.Structure):
    _fields_ = [("role", ctypes.c_uint8), ("stage", ctypes.c_int32), ("stage_count", ctypes.c_int32),
                ("layer_begin", ctypes.c_int32), ("layer_end", ctypes.c_int32), ("n_layer", ctypes.c_int32),
                ("model_fp", ctypes.c_char * 33), ("shard_fp", ctypes.c_char * 33), ("session", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("plain", ctypes.c_bool)]


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_lib = None


def lib():
    global _lib
    if _lib is None:
        L = ctypes.CDLL(LIB)
        P, E = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_size_t]
        L.ps_net_key_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p] + E
        L.ps_net_dial.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(P)] + E
        L.ps_net_handshake_client.argtypes = [P, ctypes.c_char_p, ctypes.POINTER(Hello), P, P, ctypes.c_uint32,
                                              ctypes.c_int, ctypes.POINTER(Hello)] + E
        L.ps_conn_send.argtypes = [P, ctypes.c_uint16, ctypes.POINTER(IoVec), ctypes.c_int, ctypes.c_int] + E
        L.ps_conn_recv.argtypes = [P, ctypes.c_int, ctypes.POINTER(ctypes.c_uint16),
                                   ctypes.POINTER(ctypes.POINTER(ctypes.c_uint8)), ctypes.POINTER(ctypes.c_uint32)] + E
        L.ps_conn_free.argtypes = [P]
        _lib = L
    return _lib


class Coord:
    """A coordinator of fleet's model connected to addr with the test's key (sealed frames)."""

    def __init__(self, addr, fleet):
        L, j = lib(), load_json(fleet)
        self.err = ctypes.create_string_buffer(1024)
        self.key = ctypes.create_string_buffer(32)
        require(L.ps_net_key_load(KEY.encode(), self.key, self.err, 1024) == 0, lambda: self.err.value)
        self.c = ctypes.c_void_p()
        require(L.ps_net_dial(addr.encode(), 5000, ctypes.byref(self.c), self.err, 1024) == 0, lambda: self.err.value)
        me = Hello(role=1, stage=0, stage_count=len(j["stages"]), layer_begin=0,
                   layer_end=j["stages"][0]["layers"][1], n_layer=j["n_layer"],
                   model_fp=j["model_fingerprint"].encode(), shard_fp=j["stages"][0]["fingerprint"].encode(),
                   session=4242)
        self.peer = Hello()
        s = L.ps_net_handshake_client(self.c, self.key, ctypes.byref(me), None, None, 1 << 20, 5000,
                                      ctypes.byref(self.peer), self.err, 1024)
        if s:
            L.ps_conn_free(self.c)
            self.c = None
        require(s == 0, lambda: f"handshake with {addr}: {self.err.value}")

    def send(self, typ, payload):
        buf = ctypes.create_string_buffer(payload, len(payload) or 1)
        iov = IoVec(ctypes.cast(buf, ctypes.c_void_p), len(payload))
        return lib().ps_conn_send(self.c, typ, ctypes.byref(iov), 1, 5000, self.err, 1024)

    def recv(self, timeout_ms=10000):
        """(type, payload), or (None, error line)."""
        typ, p, n = ctypes.c_uint16(), ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_uint32()
        if lib().ps_conn_recv(self.c, timeout_ms, ctypes.byref(typ), ctypes.byref(p), ctypes.byref(n), self.err, 1024):
            return None, self.err.value.decode(errors="replace")
        return typ.value, ctypes.string_at(p, n.value)

    def close(self):
        if self.c:
            lib().ps_conn_free(self.c)
            self.c = None


def place_payload(fleet, k, **over):
    j = load_json(fleet)
    st = j["stages"][k]
    f = dict(model_fp=j["model_fingerprint"], shard_fp=st["fingerprint"], stage=k, count=len(j["stages"]),
             lb=st["layers"][0], le=st["layers"][1], n_layer=j["n_layer"], bytes=st["bytes"])
    f.update(over)
    return (pstr(f["model_fp"]) + pstr(f["shard_fp"]) +
            struct.pack("<iiiiiQ", f["stage"], f["count"], f["lb"], f["le"], f["n_layer"], f["bytes"]))


def error_of(frame):
    """The reason of an ERROR frame (u8 kind, str reason), or a description of what came instead."""
    typ, p = frame
    if typ != ERROR or len(p) < 5:
        return f"<type {typ}: {p!r}>"
    n = struct.unpack_from("<I", p, 1)[0]
    return p[5:5 + n].decode(errors="replace")


# ------------------------------------------------------------------------------ cases
def case_received(fleet, w1, w2):
    rc, out, term = on_terminal([BIN, "run", "--fleet", fleet, "--key-file", KEY] + PROMPT + GEN, limit=120)
    out = out.decode(errors="replace")
    san_check(term, "run on a terminal")
    if check(rc == 0, f"first run: exit {rc}: {term[-1500:]}"):
        check(out.split() == REF, f"first run: ids {out.split()} differ from the unsplit run's {REF}")
    for k, w in ((1, w1), (2, w2)):
        check(f"sending stage {k}'s shard to {w.addr}: 100%" in term,
              f"the terminal showed no 'sending stage {k}'s shard to {w.addr}': {term[-800:]!r}")
        check(cached(w, fleet, k), f"{w.name}: its cache {w.files()} lacks stage {k}'s shard, byte for byte")
        check(len(w.files()) == 1, f"{w.name}: its cache holds {w.files()}")
        check(f"receiving stage {k}'s shard" in w.text() and "shard received" in w.text(),
              f"{w.name}: the log says nothing of receiving stage {k}'s shard: {w.text()[-800:]}")
    check(term.endswith("\r\033[K") or "\r\033[K" in term[-40:], f"the progress line was not cleared: {term[-200:]!r}")


def case_cached(fleet, w1, w2):
    marks = [len(w.text()) for w in (w1, w2)]
    stamps = {(w.name, f): os.stat(os.path.join(w.cache, f)).st_mtime_ns for w in (w1, w2) for f in w.files()}
    fleet_run(fleet, "second run")
    for w, mark in zip((w1, w2), marks):
        check("receiving" not in w.text()[mark:], f"{w.name}: the second run sent the shard again")
    check({(w.name, f): os.stat(os.path.join(w.cache, f)).st_mtime_ns for w in (w1, w2) for f in w.files()} == stamps,
          "the second run rewrote a cached shard")
    # swapped: each worker receives the other shard, then the first fleet comes from the caches
    swapped = write_fleet(fleet, [w2.addr, w1.addr], "fleet-swapped.json")
    marks = [len(w.text()) for w in (w1, w2)]
    fleet_run(swapped, "swapped fleet")
    for w, k, mark in ((w1, 2, marks[0]), (w2, 1, marks[1])):
        check(f"receiving stage {k}'s shard" in w.text()[mark:], f"{w.name}: did not receive stage {k}'s shard")
        check(cached(w, fleet, 1) and cached(w, fleet, 2), f"{w.name}: its cache holds {w.files()}, not both shards")
    marks = [len(w.text()) for w in (w1, w2)]
    fleet_run(fleet, "the first fleet again")
    for w, k, mark in ((w1, 1, marks[0]), (w2, 2, marks[1])):
        new = w.text()[mark:]
        check(f"stage {k}'s shard from the cache" in new and "receiving" not in new,
              f"{w.name}: stage {k}'s shard did not come from the cache: {new[-800:]}")
    # a worker restarted on the same cache and port serves without a transfer
    port = w1.port
    w1.stop()
    w1b = Worker("w1-restarted", w1.cache, port=port)
    fleet_run(fleet, "a worker restarted on its cache")
    check("stage 1's shard from the cache" in w1b.text() and "receiving" not in w1b.text(),
          f"restarted worker: {w1b.text()[-800:]}")
    return w1b


def tamper(fleet, out_dir):
    """A copy of the split in out_dir whose stage-1 file has one byte of a tensor's data changed; its
    fleet.json (same fingerprints) beside it."""
    from gguf import GGUFReader
    src = os.path.dirname(fleet)
    shutil.copytree(src, out_dir)
    path = os.path.join(out_dir, "stage-1.gguf")
    t = GGUFReader(path).tensors[1]
    with open(path, "r+b") as f:
        f.seek(t.data_offset + 5)
        b = f.read(1)
        f.seek(t.data_offset + 5)
        f.write(bytes([b[0] ^ 0x40]))
    return os.path.join(out_dir, "fleet.json")


def case_wrong_fingerprint(fleet, w2):
    w3 = Worker("w3", os.path.join(TMP, "cache-3"))
    bad = write_fleet(tamper(fleet, os.path.join(TMP, "tampered")), [w3.addr, w2.addr], "fleet.json")
    offered = load_json(bad)["stages"][1]["fingerprint"]
    p = pipeshard(["run", "--fleet", bad, "--key-file", KEY] + PROMPT + GEN)
    check(p.returncode == 1, f"tampered shard: run exited {p.returncode}")
    line = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    fps = [f for f in re.findall(r"\b[0-9a-f]{32}\b", line) if f != offered]
    check(f"stage 1 ({w3.addr}): the shard sent was refused" in line and offered in line and fps,
          f"tampered shard: run's error does not name stage 1 ({w3.addr}), the refusal and both fingerprints: {line}")
    check(w3.wait_log("refused stage 1's shard from") and offered in w3.text(),
          f"tampered shard: the worker's log: {w3.text()[-800:]}")
    check(w3.files() == [], f"tampered shard: the cache holds {w3.files()}")
    good = write_fleet(fleet, [w3.addr, w2.addr], "fleet-w3.json")
    fleet_run(good, "after a refused shard")
    check(cached(w3, fleet, 1), f"after a refused shard: the cache holds {w3.files()}")
    w3.stop()


def case_max_disk(fleet, w2):
    size = load_json(fleet)["stages"][1]["bytes"]
    w4 = Worker("w4", os.path.join(TMP, "cache-4"), extra=["--max-disk", "100K"])
    p = pipeshard(["run", "--fleet", write_fleet(fleet, [w4.addr, w2.addr], "fleet-w4.json"), "--key-file", KEY] +
                  PROMPT + GEN)
    check(p.returncode == 1, f"--max-disk 100K: run exited {p.returncode}")
    want = f"more than --max-disk 100.0 KiB (102400 bytes)"
    check(f"stage 1 ({w4.addr}) cannot take its shard" in p.stderr and f"({size} bytes)" in p.stderr and
          want in p.stderr, f"--max-disk 100K: run's stderr: {p.stderr[-800:]}")
    check(w4.wait_log("refused stage 1's shard from") and want in w4.text(), f"--max-disk: log: {w4.text()[-800:]}")
    check(w4.files() == [], f"--max-disk: the cache holds {w4.files()}")
    w4.stop()
    # room for one shard: the second evicts the first
    st = load_json(fleet)["stages"]
    room = max(st[1]["bytes"], st[2]["bytes"]) + 1000
    w5 = Worker("w5", os.path.join(TMP, "cache-5"), extra=["--max-disk", str(room)])
    fleet_run(write_fleet(fleet, [w5.addr, w2.addr], "fleet-w5a.json"), "--max-disk for one shard: stage 1")
    check(w5.files() == [st[1]["fingerprint"] + ".gguf"], f"--max-disk for one: the cache holds {w5.files()}")
    fleet_run(write_fleet(fleet, [w2.addr, w5.addr], "fleet-w5b.json"), "--max-disk for one shard: stage 2")
    check(w5.files() == [st[2]["fingerprint"] + ".gguf"], f"--max-disk for one: the cache holds {w5.files()}")
    check("1 older cached file removed" in w5.text(), f"--max-disk for one: the log: {w5.text()[-800:]}")
    w5.stop()


def case_resume(fleet, w2):
    st = load_json(fleet)["stages"][1]
    data = open(os.path.join(os.path.dirname(fleet), st["shard"]), "rb").read()
    half = len(data) // 2
    w6 = Worker("w6", os.path.join(TMP, "cache-6"))
    good = write_fleet(fleet, [w6.addr, w2.addr], "fleet-w6.json")
    for what, first in (("resumed", data[:half]), ("resumed from a bad part", bytes(half))):
        c = Coord(w6.addr, fleet)
        c.send(PLACE, place_payload(fleet, 1))
        typ, p = c.recv()
        check(typ == SEND_SHARD and p == struct.pack("<Q", 0), f"{what}: PLACE answered {typ} {p!r}")
        c.send(SHARD_DATA, first)
        time.sleep(0.3)
        c.close()
        part = st["fingerprint"] + ".part"
        deadline = time.time() + 10
        while time.time() < deadline and size_of(os.path.join(w6.cache, part)) < half:
            time.sleep(0.05)
        check(w6.files() == [part], f"{what}: the cache holds {w6.files()}")
        mark = len(w6.text())
        fleet_run(good, what)
        new = w6.text()[mark:]
        check(f"resuming after the {half} bytes of a transfer cut short" in new, f"{what}: the log: {new[-800:]}")
        if first != data[:half]:
            check("fails its check" in new and "receiving it again" in new, f"{what}: the log: {new[-800:]}")
        check(cached(w6, fleet, 1) and len(w6.files()) == 1, f"{what}: the cache holds {w6.files()}")
        os.unlink(os.path.join(w6.cache, st["fingerprint"] + ".gguf"))
        w6.stop()
        w6 = Worker("w6", w6.cache, port=w6.port)  # an empty worker again, its cache without the shard
    w6.stop()


def case_hostile(fleet, w2):
    w7 = Worker("w7", os.path.join(TMP, "cache-7"))
    j = load_json(fleet)
    fp1 = j["stages"][1]["fingerprint"]
    attacks = [
        ("PLACE of stage 0", [(PLACE, place_payload(fleet, 1, stage=0, lb=0))], "PLACE of stage 0 of 3"),
        ("PLACE of stage 3 of 3", [(PLACE, place_payload(fleet, 1, stage=3))], "PLACE of stage 3 of 3"),
        ("PLACE of a path", [(PLACE, place_payload(fleet, 1, shard_fp="../../../../../../../etc/passwd"))],
         "a fingerprint is not 32 lowercase hex digits"),
        ("PLACE of an upper-case fingerprint", [(PLACE, place_payload(fleet, 1, shard_fp=fp1.upper()))],
         "a fingerprint is not 32 lowercase hex digits"),
        ("PLACE of 0 bytes", [(PLACE, place_payload(fleet, 1, bytes=0))], "PLACE of a shard of 0 bytes"),
        ("PLACE of 2^63 bytes", [(PLACE, place_payload(fleet, 1, bytes=1 << 63))], "PLACE of a shard of"),
        ("PLACE of layers out of range", [(PLACE, place_payload(fleet, 1, le=99))], "are not its range"),
        ("PLACE cut short", [(PLACE, place_payload(fleet, 1)[:-3])], "malformed PLACE message"),
        ("PLACE with trailing bytes", [(PLACE, place_payload(fleet, 1) + b"x")], "malformed PLACE message"),
        ("SHARD_DATA without PLACE", [(SHARD_DATA, b"abc")], "SHARD_DATA while no shard is arriving"),
        ("SETUP before any shard", [(SETUP, struct.pack("<QiiiB", 7, 64, 8, 8, 0) + pstr(""))],
         "SETUP before any shard was placed here"),
        ("SHARD_DATA beyond the offer", [(PLACE, place_payload(fleet, 1, shard_fp="ab" * 16, bytes=10)),
                                         (SHARD_DATA, b"x" * 11)],
         "SHARD_DATA of 11 bytes at offset 0: the shard offered has 10 bytes"),
        ("SHARD_DATA beyond the offer, second frame", [(PLACE, place_payload(fleet, 1, shard_fp="ab" * 16, bytes=10)),
                                                       (SHARD_DATA, b"x" * 6), (SHARD_DATA, b"x" * 6)],
         "SHARD_DATA of 6 bytes at offset 6: the shard offered has 10 bytes"),
        ("empty SHARD_DATA", [(PLACE, place_payload(fleet, 1, shard_fp="ab" * 16, bytes=10)), (SHARD_DATA, b"")],
         "SHARD_DATA of 0 bytes at offset 0"),
        ("a second PLACE during a transfer", [(PLACE, place_payload(fleet, 1, shard_fp="ab" * 16, bytes=10)),
                                              (PLACE, place_payload(fleet, 1))], "PLACE while a shard is arriving"),
        ("garbage of the offered size", [(PLACE, place_payload(fleet, 1, shard_fp="cd" * 16, bytes=100)),
                                         (SHARD_DATA, os.urandom(100))], "it is not a shard"),
        ("the real shard's metadata, another fingerprint",
         [(PLACE, place_payload(fleet, 1, shard_fp="ef" * 16)),
          (SHARD_DATA, open(os.path.join(os.path.dirname(fleet), "stage-1.gguf"), "rb").read())],
         "the offer was stage 1 of 3"),
    ]
    for what, frames, says in attacks:
        c = Coord(w7.addr, fleet)
        check(c.peer.flags == 1 and c.peer.stage_count == 1 and c.peer.n_layer == 0,
              f"{what}: an empty --cache worker's hello: flags {c.peer.flags}, stage 0 of {c.peer.stage_count}, "
              f"{c.peer.n_layer} layers")
        got = []
        for typ, p in frames:
            if c.send(typ, p):
                break
            if typ == PLACE and p == frames[0][1] and len(frames) > 1:
                got.append(c.recv())  # SEND_SHARD {0}
        got.append(c.recv())
        c.close()
        reason = error_of(got[-1])
        check(says in reason, f"{what}: the worker answered {reason!r}, not '{says}'")
        check(w7.alive(), f"{what}: the worker died: {w7.text()[-800:]}")
        check(not [f for f in w7.files() if f.endswith(".gguf")], f"{what}: the cache holds {w7.files()}")
    check(w7.wait_log("refused stage 1's shard from") and "SHARD_DATA of 11 bytes" in w7.text(),
          f"hostile: the log: {w7.text()[-1500:]}")
    fleet_run(write_fleet(fleet, [w7.addr, w2.addr], "fleet-w7.json"), "after hostile coordinators")
    check(cached(w7, fleet, 1), f"after hostile coordinators: the cache holds {w7.files()}")
    w7.stop()


def case_usage():
    d = os.path.join(TMP, "usage-cache")
    cases = [
        (["--cache", d, "--listen", "127.0.0.1:0"], 2, "--cache needs --key-file"),
        (["--cache", d, "--shard", "x.gguf", "--key-file", KEY, "--listen", "127.0.0.1:0"], 2,
         "--shard and --cache are one or the other"),
        (["--listen", "127.0.0.1:0"], 2, "no shard given (--shard FILE, or --cache DIR"),
        (["--cache", d, "--key-file", KEY, "--max-disk", "12X", "--listen", "127.0.0.1:0"], 2,
         "--max-disk: expected a size such as 500M, 20G or a number of bytes, got '12X'"),
        (["--cache", d, "--key-file", KEY, "--max-disk", "0", "--listen", "127.0.0.1:0"], 2,
         "--max-disk: size '0' is less than one byte"),
        (["--shard", "x.gguf", "--max-disk", "1G", "--listen", "127.0.0.1:0"], 2, "--max-disk bounds the --cache"),
        (["--cache", KEY, "--key-file", KEY, "--listen", "127.0.0.1:0"], 1, "is not a directory"),
    ]
    for args, rc, says in cases:
        p = pipeshard(["worker"] + args, timeout=30)
        check(p.returncode == rc and says in p.stderr and len(p.stderr.strip().splitlines()) == 1,
              f"worker {' '.join(args)}: exit {p.returncode} (want {rc}), stderr {p.stderr!r} (want '{says}')")
    check(not os.path.exists(d), "a usage error created the cache directory")
    h = pipeshard(["worker", "--help"]).stdout
    check("--cache DIR" in h and "--max-disk SIZE" in h, f"worker --help lacks --cache or --max-disk: {h}")


# ------------------------------------------------------------------------------ main
def main():
    global TMP, KEY, REF
    reexec_with_asan()
    if not os.access(BIN, os.X_OK):
        print(f"PIPESHARD_BIN={BIN} is not executable")
        return 1
    TMP = tmpdir("travel-")
    t0 = time.time()
    try:
        model = synth_small(os.path.join(TMP, "small.gguf"))
        KEY = os.path.join(TMP, "key")
        p = pipeshard(["keygen", "-o", KEY])
        require(p.returncode == 0, f"keygen: {p.stderr}")
        p = pipeshard(["run", "-m", model] + PROMPT + GEN)
        require(p.returncode == 0, f"the unsplit run: {p.stderr}")
        REF = p.stdout.split()
        p = pipeshard(["split", "-m", model, "--stages", "3", "-o", os.path.join(TMP, "split"), "--quiet"])
        require(p.returncode == 0, f"split: {p.stderr}")
        w1 = Worker("w1", os.path.join(TMP, "cache-1"))
        w2 = Worker("w2", os.path.join(TMP, "cache-2"))
        fleet = write_fleet(os.path.join(TMP, "split", "fleet.json"), [w1.addr, w2.addr], "fleet-w.json")
        for name, case in (("received", lambda: case_received(fleet, w1, w2)),
                           ("cached", lambda: case_cached(fleet, w1, w2)),
                           ("wrong fingerprint", lambda: case_wrong_fingerprint(fleet, w2)),
                           ("max-disk", lambda: case_max_disk(fleet, w2)), ("resume", lambda: case_resume(fleet, w2)),
                           ("hostile", lambda: case_hostile(fleet, w2)), ("usage", case_usage)):
            t = time.time()
            case()
            print(f"  {name}: {time.time() - t:.1f} s")
    finally:
        for w in WORKERS:
            w.stop()
    return conclude(TMP, t0)


if __name__ == "__main__":
    sys.exit(main())
