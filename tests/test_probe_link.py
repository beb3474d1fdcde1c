#!/usr/bin/env python3
"""test_probe_link.py - `pipeshard probe --link HOST:PORT` against real workers (issue 15): the
link's round trip and rate, measured by a peer of role 4 (a link probe) that any worker lets in.

The small synthetic model (pstest.synth_small) is split into 3 stages. Cases:
  1. a worker without a key (and one with --cache, no shard yet): probe prints its table and a
     hosts.json "links" entry that parses, between --name and --to (by default this host's name and
     the one the worker reports, with a note when they are the same), rtt > 0, mbps > 0 and the
     smaller of the two rates; the worker logs what the probe did.
  2. a worker with --key-file, --sim-latency-ms 20 and --sim-bandwidth-mbps 100 (its outgoing hop,
     which the replies take): frames sealed, rtt >= 20 ms, mbps at most the emulated 100; the entry
     goes into a hosts.json of two hosts whose memory forces both onto the ring, and plan's table
     shows the link's hop times (half the round trip, plus the activations at the rate).
  3. refusals, each one line: a wrong key, no key for a keyed worker, a key for one without,
     nothing listening (fast), a listener that never answers (--timeout-ms), a key file that is not
     there (exit 1); bad flags (exit 2).
  4. garbage on a probe connection (a hand-made handshake of role 4): an ECHO asking for more
     than 64 MiB gets an ERROR naming the limit and the connection closes; a frame of another type
     likewise; a probe hello that claims a stage is refused; the worker serves the next probe.
  5. a session undisturbed: `run --fleet` over two keyed workers prints the same tokens while
     probes measure both workers' links over and over during the generation.
  6. the worker's own decode speed in its HOST_INFO: measured by an idle CPU worker on its shard
     (a --cache worker on synthetic matrices), printed with the worker's hosts.json entry; not
     measured where --max-mem leaves no room for it beside the shard.
Every log and stderr is scanned for sanitizer reports. Exit 0 pass, 1 fail.
"""
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pstest import check, conclude, require, synth_small, tmpdir  # noqa: E402
from psworker import HDR, MAGIC, VERSION, Worker, frame, pstr, san_check  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
HELLO, HELLO_REPLY, AUTH, WELCOME, REFUSE = 1, 2, 3, 4, 5
FORWARD, ERROR, ECHO, HOST_INFO = 18, 21, 31, 32
ECHO_MAX = 64 << 20


def probe(args, timeout=120):
    p = subprocess.run([BIN, "probe"] + args, capture_output=True, text=True, timeout=timeout)
    san_check(p.stderr, "probe " + " ".join(args))
    return p


def entry_of(p):
    """The table's figures and the "links" entry (the last line) of a probe --link that succeeded;
    the worker's host entry before it, when the worker measured its speed, is checked against the
    table."""
    require(p.returncode == 0, lambda: f"probe --link: exit {p.returncode}: {p.stderr}")
    lines = p.stdout.strip().splitlines()
    e = json.loads(lines[-1])
    speed = re.search(r"^decode\s+([\d.]+) ms per GB", p.stdout, re.M)
    if speed:
        h = json.loads(lines[-2])
        check(set(h) == {"name", "address", "mem", "ms_per_gb"} and h["name"] == e["between"][1]
              and abs(h["ms_per_gb"] - float(speed.group(1))) < 0.06 and h["ms_per_gb"] > 0
              and float(h["mem"].rstrip("G")) > 0, f"the worker's host entry {h} against the table:\n{p.stdout}")
    else:
        check(re.search(r"^decode\s+not measured by the worker", p.stdout, re.M), f"no decode line:\n{p.stdout}")
    require(set(e) == {"between", "rtt_ms", "mbps"} and len(e["between"]) == 2, f"entry {e}")
    fig = {k: float(re.search(rf"^{k}\s+([\d.]+)", p.stdout, re.M).group(1))
           for k in ("round trip", "upload", "download")}
    check(abs(fig["round trip"] - e["rtt_ms"]) < 1e-9, f"table's round trip {fig} vs entry {e}")
    check(abs(min(fig["upload"], fig["download"]) - e["mbps"]) < 1e-9, f"table {fig}: entry's mbps {e['mbps']}")
    return e, p.stdout


class Peer:
    """A raw connection to a worker that does a handshake of role 4 (a link probe) by hand, no key."""

    def __init__(self, addr, hello=None):
        host, port = addr.rsplit(":", 1)
        self.s = socket.create_connection((host, int(port)), timeout=10)
        self.hello = hello or struct.pack("<Biiiii", 4, 0, 1, 0, 0, 0) + pstr("") + pstr("") + struct.pack("<QI", 0, 0)

    def send(self, typ, payload):
        self.s.sendall(frame(typ, payload))

    def recv(self):
        """(type, payload), or None at the end of the stream."""
        h = self._exact(HDR.size)
        if h is None:
            return None
        magic, ver, typ, _, n, _ = HDR.unpack(h)
        require(magic == MAGIC and ver == VERSION, f"frame with magic {magic:#x} version {ver}")
        return typ, self._exact(n)

    def _exact(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                return None if not b else b
            b += chunk
        return b

    def handshake(self):
        """HELLO → HELLO_REPLY, AUTH (a zero proof) → WELCOME; returns the reply's type (REFUSE: its reason)."""
        self.send(HELLO, self.hello + os.urandom(32) + b"\0")
        typ, p = self.recv()
        if typ != HELLO_REPLY:
            return typ, p
        self.send(AUTH, bytes(32))
        return self.recv()

    def close(self):
        self.s.close()


def reason_of(payload):
    """The reason of an ERROR payload (u8 kind, str reason)."""
    (n,) = struct.unpack_from("<I", payload, 1)
    return payload[5:5 + n].decode(errors="replace")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def case_plain(w):
    e, out = entry_of(probe(["--link", w.addr, "--name", "here", "--to", "there"]))
    check(e["between"] == ["here", "there"] and e["rtt_ms"] > 0 and e["mbps"] > 0, f"entry {e}")
    check("frames in the clear" in out and "stage 1 of 3" in out and "1 thread, cpu" in out, f"table:\n{out}")
    check(re.search(r"^decode\s+[\d.]+ ms per GB of weights \(the worker's, timed on its shard\)", out, re.M),
          f"an idle CPU worker measures its speed:\n{out}")
    check(w.wait_log("link probe from 127.0.0.1:"), f"worker log: {w.text()}")
    line = [x for x in w.text().splitlines() if "link probe from" in x][-1]
    check(re.search(r"\d+ echoes, [\d.]+ MB in [\d.]+ s$", line), f"worker's line: {line}")
    # by default: this host's name and the worker's (the same host here: a note says so)
    p = probe(["--link", w.addr])
    e2, _ = entry_of(p)
    name = socket.gethostname()
    check(e2["between"] == [name, name], f"default names {e2['between']}, host name {name}")
    check("both ends are named" in p.stderr and "--to" in p.stderr, f"no note on the same names: {p.stderr!r}")
    print(f"  ok: loopback, no key: {e}; worker: {line.split(': ', 2)[-1]}")
    return e


def plan_hops(tmp, model, link):
    """plan's table for two hosts whose memory forces both onto the ring, the link between them
    as probe printed it: [(host, hop ms)] per stage."""
    size = os.path.getsize(model)
    for frac in (0.8, 1.0, 1.2, 1.5, 2.0):
        hosts = {"hosts": [{"name": n, "mem": int(size * frac), "ms_per_gb": 50} for n in link["between"]],
                 "links": [link], "default_link": {"rtt_ms": 0.5, "mbps": 1000}}
        hp = os.path.join(tmp, "hosts.json")
        with open(hp, "w") as f:
            json.dump(hosts, f)
        p = subprocess.run([BIN, "plan", "-m", model, "--hosts", hp, "--ctx", "64"], capture_output=True, text=True,
                           timeout=120)
        rows = re.findall(r"^\s+\d+\s+(\S+)\s+\d+:\d+\s+.*\s([\d.]+)\s*$", p.stdout, re.M)
        if p.returncode == 0 and len(rows) == 2:
            return [(h, float(ms)) for h, ms in rows], p.stdout
    require(False, f"no memory split the model over both hosts: {p.stdout}{p.stderr}")


def case_keyed_slow(tmp, model, key, w):
    e, out = entry_of(probe(["--link", w.addr, "--key-file", key, "--name", "near", "--to", "far"]))
    check("frames sealed" in out, f"table:\n{out}")
    check(e["rtt_ms"] >= 20, f"the worker delays its hop by 20 ms; round trip {e['rtt_ms']} ms")
    check(40 <= e["mbps"] <= 100 * 1.02, f"the worker's hop is limited to 100 Mbit/s; measured {e['mbps']}")
    rows, table = plan_hops(tmp, model, e)
    dim = 128
    want = {rows[0][0]: e["rtt_ms"] / 2 + dim * 4 * 8 / (e["mbps"] * 1e6) * 1e3, rows[1][0]: e["rtt_ms"] / 2}
    for h, ms in rows:
        check(abs(ms - want[h]) <= 0.006, f"plan's hop from {h}: {ms} ms, expected {want[h]:.3f}:\n{table}")
    print(f"  ok: key, 20 ms and 100 Mbit/s emulated: {e}; plan's hops {rows}")


def case_cache_worker(tmp, key):
    w = Worker(BIN, None, os.path.join(tmp, "cache.log"), "cache", key=key, cache=os.path.join(tmp, "cache"))
    try:
        e, out = entry_of(probe(["--link", w.addr, "--key-file", key, "--name", "a", "--to", "b"]))
        check("no shard yet" in out and e["rtt_ms"] > 0, f"a --cache worker with no shard:\n{out}")
        check("timed on synthetic Q4_0 matrices" in out, f"a --cache worker times synthetic matrices:\n{out}")
    finally:
        w.stop()
        san_check(w.text(), "worker cache")
    print(f"  ok: a --cache worker with no shard answers too: {e}")


def one_line_error(args, status, words, within=None):
    t0 = time.time()
    p = probe(args)
    took = time.time() - t0
    check(p.returncode == status and p.stderr.count("\n") == 1 and p.stderr.startswith("pipeshard probe: ")
          and all(w in p.stderr for w in words),
          f"probe {args}: exit {p.returncode} (expected {status}), stderr {p.stderr!r}, expected {words}")
    if within:
        check(took < within, f"probe {args} took {took:.1f} s")
    return p.stderr.strip()


def case_refusals(tmp, key, plain, keyed):
    other = os.path.join(tmp, "other.key")
    silent = socket.socket()  # accepts (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    subprocess.run([BIN, "keygen", "-o", other], capture_output=True, check=True)
    said = [one_line_error(["--link", keyed.addr, "--key-file", other], 1, ["wrong shared key", keyed.addr]),
            one_line_error(["--link", keyed.addr], 1, ["requires a shared key"]),
            one_line_error(["--link", plain.addr, "--key-file", key], 1, ["has a shared key but we have none"]),
            one_line_error(["--link", f"127.0.0.1:{free_port()}"], 1, ["cannot connect", "refused"], within=5),
            one_line_error(["--link", f"127.0.0.1:{silent.getsockname()[1]}", "--timeout-ms", "500"], 1,
                           ["timed out after 500 ms"], within=5),
            one_line_error(["--link", plain.addr, "--key-file", os.path.join(tmp, "nope")], 1,
                           ["cannot open key file"])]
    for args, words in ((["--link", "nowhere"], ["--link must be HOST:PORT"]),
                        (["--link"], ["--link"]),
                        (["--link", plain.addr, "-m", "x.gguf"], ["--link measures a link", "-m"]),
                        (["--link", plain.addr, "-t", "2"], ["--link measures a link", "-t"]),
                        (["--to", "x"], ["--to goes with --link"]),
                        (["--key-file", key], ["--key-file goes with --link"]),
                        (["--link", plain.addr, "--to", 'a"b'], ["--to must be 1 to 63 bytes"]),
                        (["--link", plain.addr, "--name", ""], ["--name must be 1 to 63 bytes"]),
                        (["--link", plain.addr, "--to", "x" * 64], ["--to must be"]),
                        (["--link", plain.addr, "--timeout-ms", "0"], ["--timeout-ms"]),
                        (["--link", plain.addr, "--timeout-ms", "soon"], ["--timeout-ms"]),
                        (["--lnk", plain.addr], ["did you mean '--link'"])):
        said.append(one_line_error(args, 2, words))
    silent.close()
    print("  ok: refusals, one line each:\n    " + "\n    ".join(said))


def case_garbage(w):
    # an ECHO asking for more than 64 MiB, then a frame of another type: an ERROR each, then the end
    for name, typ, payload, why in (("a reply too large", ECHO, struct.pack("<I", ECHO_MAX + 1) + b"pad",
                                     f"ECHO asks for a reply of {ECHO_MAX + 1} bytes (at most {ECHO_MAX})"),
                                    ("another type", FORWARD, b"x" * 10, "expected ECHO, got message type 18"),
                                    ("an ECHO of 2 bytes", ECHO, b"\1\2", "malformed ECHO (2 bytes)")):
        mark = len(w.text())
        c = Peer(w.addr)
        try:
            typ_w, _ = c.handshake()
            require(typ_w == WELCOME, f"{name}: handshake answered {typ_w}")
            typ_h, info = c.recv()
            check(typ_h == HOST_INFO and b"cpu" in info, f"{name}: first frame {typ_h} {info!r}")
            c.send(ECHO, struct.pack("<I", 100))  # a good one first
            got = c.recv()
            check(got == (ECHO, bytes(100)), f"{name}: ECHO of 100 bytes answered {got and (got[0], len(got[1]))}")
            c.send(typ, payload)
            got = c.recv()
            check(got is not None and got[0] == ERROR and reason_of(got[1]) == why,
                  f"{name}: answered {got}, expected ERROR {why!r}")
            check(c.recv() is None, f"{name}: the worker did not close the connection")
        finally:
            c.close()
        check(w.wait_log("1 echo, 0.0 MB in", since=mark) and w.wait_log(f"ended: {why}", since=mark),
              f"{name}: worker log: {w.text()[mark:]}")
    # a probe's hello that claims a stage
    bad = struct.pack("<Biiiii", 4, 1, 3, 0, 2, 6) + pstr("") + pstr("") + struct.pack("<QI", 0, 0)
    c = Peer(w.addr, hello=bad)
    try:
        typ, p = c.handshake()
        check(typ == REFUSE and b"a link probe claims no stage" in p, f"probe hello with a stage: {typ} {p!r}")
    finally:
        c.close()
    e, _ = entry_of(probe(["--link", w.addr, "--name", "a", "--to", "b"]))
    check(w.alive(), "the worker died")
    print(f"  ok: garbage on a probe connection: ERROR and close; the worker serves the next probe: {e}")


def case_session_undisturbed(tmp, split, key):
    with open(os.path.join(split, "fleet.json")) as f:
        fleet = json.load(f)
    ws = []
    try:
        for k in (1, 2):
            w = Worker(BIN, os.path.join(split, f"stage-{k}.gguf"), os.path.join(tmp, f"fleet-w{k}.log"), f"w{k}",
                       key=key)
            fleet["stages"][k]["address"] = w.addr
            ws.append(w)
        for k, st in enumerate(fleet["stages"]):
            st["shard"] = os.path.join(split, f"stage-{k}.gguf")
        path = os.path.join(tmp, "fleet-run.json")
        with open(path, "w") as f:
            json.dump(fleet, f)
        cmd = [BIN, "run", "--fleet", path, "--key-file", key, "--prompt-ids", "5,17,300,42", "-n", "300",
               "--ignore-eos", "--print-ids", "-t", "1", "--temp", "0.8", "--seed", "7", "--sim-latency-ms", "5"]
        ref = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        require(ref.returncode == 0 and ref.stdout.strip(), f"run --fleet: {ref.stderr}")
        san_check(ref.stderr, "run --fleet")
        done, spans = threading.Event(), []

        def hammer(w):
            while not done.is_set():
                t0 = time.time()
                p = probe(["--link", w.addr, "--key-file", key, "--name", "a", "--to", "b"])
                check(p.returncode == 0, f"probe during the run: {p.stderr}")
                spans.append((t0, time.time()))
        threads = [threading.Thread(target=hammer, args=(w,)) for w in ws]
        for t in threads:
            t.start()
        time.sleep(0.3)  # probes under way when the session starts
        t_run = time.time()
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        t_end = time.time()
        done.set()
        for t in threads:
            t.join()
        san_check(again.stderr, "run --fleet during probes")
        require(again.returncode == 0, f"run --fleet during probes: {again.stderr}")
        check(again.stdout == ref.stdout, f"tokens changed by probes:\n{ref.stdout}\nvs\n{again.stdout}")
        during = sum(1 for a, b in spans if a < t_end and b > t_run)
        check(during >= 1, f"no probe overlapped the run ({t_end - t_run:.1f} s)")
        for w in ws:
            check(w.text().count("link probe from") >= 1 and "ended:" not in w.text(), f"{w.name}: {w.text()}")
        print(f"  ok: {len(ref.stdout.split())} tokens unchanged while {during} probes ran during the "
              f"{t_end - t_run:.1f} s generation")
    finally:
        for w in ws:
            w.stop()
            san_check(w.text(), f"worker {w.name}")


def case_max_mem(tmp, shard):
    """A worker whose --max-mem leaves no room for the speed measure beside its shard does not
    take it (the probe says so); with room, it does."""
    size = os.path.getsize(shard)
    for cap, measured in ((size + (64 << 10), False), (size + (256 << 20), True)):
        w = Worker(BIN, shard, os.path.join(tmp, f"cap{cap}.log"), f"cap{cap}", extra=["--max-mem", str(cap)])
        try:
            _, out = entry_of(probe(["--link", w.addr, "--name", "a", "--to", "b"]))
        finally:
            w.stop()
            san_check(w.text(), w.name)
        line = re.search(r"^decode\s+(.*)$", out, re.M).group(1)
        check(("ms per GB" in line) == measured and (measured or "--max-mem" in line),
              f"--max-mem {cap} beside a shard of {size} bytes: {line}")
    print(f"  ok: --max-mem: no room beside the shard, no measure; room, a measure")


def main():
    if not os.access(BIN, os.X_OK):
        print("PIPESHARD_BIN is not set (run through ctest)")
        return 1
    t0 = time.time()
    tmp = tmpdir("probe_link_")
    model = synth_small(os.path.join(tmp, "m.gguf"))
    split = os.path.join(tmp, "split")
    p = subprocess.run([BIN, "split", "-m", model, "--stages", "3", "-o", split, "--quiet"], capture_output=True,
                       text=True, timeout=120)
    require(p.returncode == 0, f"split: {p.stderr}")
    key = os.path.join(tmp, "key")
    subprocess.run([BIN, "keygen", "-o", key], capture_output=True, check=True)
    shard = os.path.join(split, "stage-1.gguf")
    plain = Worker(BIN, shard, os.path.join(tmp, "plain.log"), "plain")
    keyed = Worker(BIN, shard, os.path.join(tmp, "keyed.log"), "keyed", key=key,
                   extra=["--sim-latency-ms", "20", "--sim-bandwidth-mbps", "100"])
    try:
        case_plain(plain)
        case_keyed_slow(tmp, model, key, keyed)
        case_refusals(tmp, key, plain, keyed)
        case_garbage(plain)
        case_cache_worker(tmp, key)
        case_max_mem(tmp, shard)
    finally:
        for w in (plain, keyed):
            w.stop()
            san_check(w.text(), f"worker {w.name}")
    case_session_undisturbed(tmp, split, key)
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
