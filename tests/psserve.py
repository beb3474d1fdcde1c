"""psserve.py - a `pipeshard serve` process for the server tests (test_server.py, test_chat_page.py).

    with Server(["-m", MODEL, "--mmap"], "name", tmp) as s:  # --port 0: the port it prints
        s.url, s.port, s.get("/health"), s.request("POST", "/v1/completions", body)
        s.metrics()["pipeshard_running_sequences"]
    # on leaving: SIGTERM, the exit status checked (143), no sanitizer report, no worker left
"""
import http.client
import json
import os
import re
import select
import signal
import subprocess
import time

from psworker import die_with_parent
from pstest import check, require

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
LIMIT = 120  # seconds for any awaited event


class Server:
    """`pipeshard serve ARGS --port 0` with TMPDIR a fresh folder under tmp; stderr to a file."""

    def __init__(self, args, name, tmp, env=None):
        self.name = name
        self.tmp = os.path.join(tmp, name)
        os.makedirs(self.tmp)
        self.err_path = os.path.join(tmp, f"{name}.err")
        e = dict(os.environ, TMPDIR=self.tmp, PIPESHARD_CACHE="off", **(env or {}))
        with open(self.err_path, "wb") as err:
            self.p = subprocess.Popen([BIN, "serve", "--port", "0", *args], stdout=subprocess.PIPE, stderr=err,
                                      env=e, preexec_fn=die_with_parent)
        line, deadline = b"", time.time() + LIMIT
        while b"\n" not in line and time.time() < deadline and self.p.poll() is None:
            if select.select([self.p.stdout], [], [], 0.1)[0]:
                line += os.read(self.p.stdout.fileno(), 4096)
        m = re.search(rb"listening on http://([^/]+):(\d+)/", line)
        if not m:
            self.p.kill()
            self.p.wait()
        require(m, lambda: f"serve {name}: no 'listening on' line: {line!r}; stderr: {self.stderr()[-1500:]}")
        self.line = line.decode().strip()
        self.port = int(m.group(2))
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        """Stops the server with sig; checks that it exits 128 + sig within LIMIT seconds, with no
        sanitizer report and no local worker left. Returns its stderr."""
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(LIMIT)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        err = self.stderr()
        check(self.p.returncode == 128 + sig, f"serve {self.name}: exit {self.p.returncode}, want {128 + sig}; "
              f"stderr: {err[-800:]}")
        check("Sanitizer" not in err, f"serve {self.name}: a sanitizer report: {err[-3000:]}")
        left = os.listdir(self.tmp)
        check(not left, f"serve {self.name}: left {left} in TMPDIR (local workers not cleaned up)")
        return err

    def alive(self):
        return self.p.poll() is None

    def request(self, method, path, body=None, headers=None, timeout=LIMIT):
        """One HTTP request; body a dict (sent as JSON), bytes or None. Returns (status, headers, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def metrics(self, headers=None):
        """GET /metrics as {name{labels}: value}."""
        status, _, data = self.get("/metrics", headers)
        require(status == 200, f"/metrics: status {status}: {data[:300]!r}")
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def wait_metric(self, name, cond, headers=None, limit=LIMIT):
        """Polls /metrics until cond(value of name) holds; returns (value, seconds waited)."""
        t0 = time.time()
        v = self.metrics(headers)[name]
        while not cond(v) and time.time() - t0 < limit:
            time.sleep(0.01)
            v = self.metrics(headers)[name]
        return v, time.time() - t0
