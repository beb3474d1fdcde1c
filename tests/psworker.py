"""psworker.py - what the tests that run `pipeshard worker` share: the process (started on a
free port learnt through --ready-fd, its stderr in a log, killed with the test), sanitizer
report checks, and the frame header of src/net/net.h.

    w = Worker(bin, shard, log_path, timeout_ms=5000)   # w.addr, w.text(), w.wait_log(...), w.stop()
    w = Worker(bin, None, log_path, name, key=KEY, cache=DIR)   # no --shard: the coordinator places it
    frame(type, payload)                                # a well-formed frame, or a bent one
"""
import ctypes
import os
import signal
import struct
import subprocess
import time

import xxhash

from pstest import check, read_ready_port

SAN_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")

# net.h: 24-byte little-endian header: magic u32, version u16, type u16, flags u32, len u32, XXH3-64 u64
MAGIC = 0x3144534E
VERSION = 8  # PS_NET_VERSION
HDR = struct.Struct("<IHHIIQ")

_prctl = ctypes.CDLL(None).prctl


def san_check(text, what):
    """A check that text holds no sanitizer report."""
    bad = [m for m in SAN_MARKS if m in text]
    return check(not bad, f"{what}: sanitizer report:\n{text[-3000:]}")


def die_with_parent():
    """preexec_fn of workers and background runs: SIGKILL (which a stopped worker obeys too)
    when the test dies, say killed by CTest's timeout."""
    _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def frame(typ, payload, version=VERSION, magic=MAGIC, flags=0, length=None, checksum=None):
    """A frame of type typ around payload; the other arguments bend its header."""
    if checksum is None:
        checksum = xxhash.xxh3_64_intdigest(payload)
    return HDR.pack(magic, version, typ, flags, len(payload) if length is None else length, checksum) + payload


def pstr(s):
    """A string as the C side's ps_wbuf_str writes it: u32 length, then the bytes."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<I", len(b)) + b


class Worker:
    """`pipeshard worker` on a shard (or, shard None, with --cache cache: the coordinator places
    it), listening on host:port (0: a free one, learnt through --ready-fd) or on the Unix socket at
    unix_path, its stderr appended to log; `ip netns exec NS` in front when netns is given, and
    prefix (say taskset) in front of all."""

    def __init__(self, bin_path, shard, log, name, host="127.0.0.1", port=0, threads=1, timeout_ms=5000, key=None,
                 netns=None, env=None, extra=(), prefix=(), unix_path=None, cache=None):
        self.name, self.log = name, log
        r, w = os.pipe()
        listen = f"unix:{unix_path}" if unix_path else f"{host}:{port}"
        cmd = [bin_path, "worker"] + (["--shard", shard] if shard else []) + (["--cache", cache] if cache else [])
        cmd += ["--listen", listen, "-t", str(threads), "--ready-fd", str(w), "--timeout-ms", str(timeout_ms)]
        if key:
            cmd += ["--key-file", key]
        cmd += list(extra)
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        cmd = list(prefix) + cmd
        with open(log, "ab") as lf:
            self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=lf,
                                      pass_fds=(w,), preexec_fn=die_with_parent, env=env)
        os.close(w)
        self.port = read_ready_port(r)  # read until the worker closes the pipe (its idle fds are then counted)
        if self.port is None or (unix_path and self.port != listen):
            self.stop()
            raise AssertionError(f"worker {name} did not start on {listen}: {self.text()}")
        self.addr = listen if unix_path else f"{host}:{self.port}"

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait_log(self, needle, timeout=30.0, since=0):
        """Whether needle shows up in the log (from character since on) within timeout: the worker
        may write its line just after its peer has gone."""
        deadline = time.time() + timeout
        while True:
            if needle in self.text()[since:]:
                return True
            if time.time() > deadline:
                return False
            time.sleep(0.02)

    def alive(self):
        return self.p.poll() is None

    def stop(self):
        """SIGTERM (after SIGCONT, in case the test stopped it), then SIGKILL after 20 s."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGCONT)
            self.p.terminate()
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
