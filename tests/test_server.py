#!/usr/bin/env python3
"""test_server.py - `pipeshard serve` (src/server/, src/coord/sched.c) against the official `openai`
Python client and raw HTTP, on SmolLM2-135M-Instruct (.cache/models, from scripts/setup.sh).

Server A (one stage, an API key, queue 64):
  1. openai client: chat and completions, streaming and not, usage (cached_tokens on a repeat),
     max_tokens -> "length", stop strings (text cut before the stop string, "stop"), seeds (the same
     seed, the same text), ignore_eos (past the end of text to max_tokens), greedy text equal to
     `pipeshard run` with the same prompt (exact).
  2. logprobs: completions' top-5 equal to an independent NumPy log-softmax of the logits
     `pipeshard run --dump-logits` writes for the same greedy prompt; chat's top-20: the top-1 is
     the token, descending, <= 0, sum of exp <= 1.
  3. chat contents are text: "<|im_end|>" in a message is not the special token.
  4. errors with raw HTTP, in OpenAI's error shape: 400 (bad JSON, wrong types, n=2, a prompt
     longer than the context naming both numbers, ...), 401 (no key, wrong key), 404, 405, 413;
     malformed bodies and HTTP (truncated, huge, deeply nested, invalid UTF-8): 4xx, no crash.
  5. a client that disconnects, streaming or not: running back to 0 within a step, counted as
     cancelled, and the server goes on serving.
Server B (`--local-stages 2`) and server A: 16 concurrent clients (threads) each get exactly the
text the same request gets alone (greedy and seeded); B gives logprobs from its last stage; on B a
request whose first 600 tokens are cached costs stage 1 under half its cold compute and gives the
text it gets cold. On stories260K: 16 concurrent clients on 3 stages get the unsplit model's texts.
Server C (queue 2): a full queue answers 503 with Retry-After while the earlier requests complete
normally; SIGTERM during a stream ends it with an error event and the server exits 143, cleanly.
A sanitizer build (scripts/test.sh runs this test in it too) decodes about 100 times slower: there
only the cases that generate little run (3, 4, 5 and the command line), each server stopped with
SIGTERM and its stderr checked for a sanitizer report.
"""
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from pstest import check, conclude, require, skip, tmpdir  # noqa: E402
from psserve import BIN, Server  # noqa: E402

MODEL = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
COMMON = ["-m", MODEL, "--mmap", "-t", "2", "-c", "1024"]
STORY = "Once upon a time"


def sanitized():
    """Whether PIPESHARD_BIN is a sanitizer build (about 100 times slower at decoding)."""
    p = subprocess.run(["ldd", BIN], capture_output=True, text=True)
    return "libasan" in p.stdout


SANITIZED = sanitized()
Q = "What is the capital of France?"
# A question whose greedy answer ends well within 40 tokens in every kernel family (11 tokens in
# avx512vnni, avx2 and ref; Q's ends after 7 in avx2 but runs past 60 in the other two)
SHORT_Q = "What is 2+2?"


def client(s, **kw):
    import openai
    return openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0, timeout=120, **kw)


def run_text(args):
    """`pipeshard run` stdout (without its final newline)."""
    p = subprocess.run([BIN, "run", *COMMON, *args], capture_output=True, text=True, timeout=300)
    require(p.returncode == 0, f"run {args}: exit {p.returncode}: {p.stderr}")
    return p.stdout[:-1] if p.stdout.endswith("\n") else p.stdout


def error_of(status, data):
    """The OpenAI error object of a response, require()d to have the shape."""
    j = json.loads(data)
    e = j.get("error")
    require(isinstance(e, dict) and {"message", "type", "param", "code"} <= set(e), f"error shape: {data[:300]!r}")
    return e


# ---- 1. the openai client ------------------------------------------------------------------

def case_client(s):
    c = client(s)
    models = c.models.list()
    check([m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"], f"models: {models}")

    # greedy completions and chat equal `pipeshard run`
    r = c.completions.create(model="m", prompt=STORY, max_tokens=24, temperature=0)
    want = run_text(["-p", STORY, "-n", "24", "--temp", "0"])
    check(r.choices[0].text == want, f"completions {r.choices[0].text!r} != run {want!r}")
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 24,
          f"finish {r.choices[0].finish_reason}, usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 24 and r.object == "text_completion", f"{r}")
    m = c.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=40, temperature=0)
    want_chat = run_text(["--chat", "-p", Q, "-n", "40", "--temp", "0"])
    check(m.choices[0].message.content == want_chat, f"chat {m.choices[0].message.content!r} != run {want_chat!r}")
    check(m.choices[0].message.role == "assistant" and m.object == "chat.completion", f"{m}")
    print(f"  ok: greedy completions and chat equal `pipeshard run` ({want_chat[:40]!r}...)")

    # the same chat again: the whole KV blocks (PS_KV_BLOCK = 32 positions) of its prompt are kept
    # (prefix cache), all but the one holding the prompt's last position, which is computed afresh
    again = c.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=40,
                                      temperature=0)
    cached, n = again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens
    check(again.choices[0].message.content == want_chat and n > 32 and cached == (n - 1) // 32 * 32,
          f"repeat: {cached} of {n} prompt tokens cached")

    # streaming: the chunks add up to the same text; usage at the end
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=40,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text == want_chat, f"streamed chat {text!r}")
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(finish == ["length"] or finish == ["stop"], f"finish reasons {finish}")
    check(chunks[-1].usage is not None and not chunks[-1].choices and chunks[-1].usage.completion_tokens > 0,
          f"last chunk {chunks[-1]}")
    st = c.completions.create(model="m", prompt=STORY, max_tokens=24, temperature=0, stream=True)
    text = "".join(ch.choices[0].text for ch in st)
    check(text == want, f"streamed completion {text!r}")

    # stop strings: the text before the first one, finish_reason "stop"
    stop = want[len(want) // 2:len(want) // 2 + 5]
    r = c.completions.create(model="m", prompt=STORY, max_tokens=24, temperature=0, stop=["\x01", stop])
    check(r.choices[0].text == want[:want.index(stop)] and r.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {r.choices[0].text!r}, {r.choices[0].finish_reason}")
    st = c.completions.create(model="m", prompt=STORY, max_tokens=24, temperature=0, stop=stop, stream=True)
    parts = list(st)
    text = "".join(ch.choices[0].text for ch in parts)
    check(text == want[:want.index(stop)] and parts[-1].choices[0].finish_reason == "stop",
          f"streamed stop: {text!r}")
    print(f"  ok: stop {stop!r} cuts {want!r} to {text!r}")

    # seeds: the same seed gives the same text, at any top_p / top_k / min_p
    kw = dict(model="m", prompt=STORY, max_tokens=20, temperature=1.0, top_p=0.95)
    a = c.completions.create(seed=42, **kw).choices[0].text
    b = c.completions.create(seed=42, **kw).choices[0].text
    d = c.completions.create(seed=43, **kw).choices[0].text
    check(a == b, f"seed 42 twice: {a!r} != {b!r}")
    check(a != d, f"seeds 42 and 43 gave the same text {a!r}")
    e = c.completions.create(seed=42, extra_body={"top_k": 40, "min_p": 0.05}, **kw).choices[0].text
    f = c.completions.create(seed=42, extra_body={"top_k": 40, "min_p": 0.05}, **kw).choices[0].text
    check(e == f, f"seed 42 with top_k, min_p twice: {e!r} != {f!r}")
    ch = c.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=3,
                                   max_completion_tokens=5, temperature=0)
    check(ch.usage.completion_tokens == 5 and ch.choices[0].finish_reason == "length",
          f"max_completion_tokens 5: {ch.usage}")
    # ignore_eos (as llama.cpp's server and vLLM take it): past the end of text, up to max_tokens
    kw = dict(model="m", messages=[{"role": "user", "content": SHORT_Q}], max_tokens=40, temperature=0)
    ends, past = c.chat.completions.create(**kw), c.chat.completions.create(extra_body={"ignore_eos": True}, **kw)
    check(ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens < 40 and
          past.choices[0].finish_reason == "length" and past.usage.completion_tokens == 40 and
          past.choices[0].message.content.startswith(ends.choices[0].message.content),
          f"ignore_eos: {past.choices[0]} {past.usage} after {ends.choices[0]} {ends.usage}")


# ---- 2. logprobs ---------------------------------------------------------------------------------

def case_logprobs(s, tmp):
    c = client(s)
    n = 8
    r = c.completions.create(model="m", prompt=STORY, max_tokens=n, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    dump = os.path.join(tmp, "logits.f32")
    run_text(["-p", STORY, "-n", str(n), "--temp", "0", "--dump-logits", dump])
    logits = np.fromfile(dump, dtype=np.float32).astype(np.float64).reshape(n, -1)
    ref = logits - logits.max(axis=1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
    require(len(lp.token_logprobs) == n and len(lp.top_logprobs) == n, f"logprobs: {lp}")
    for i in range(n):
        top = np.sort(ref[i])[::-1][:5]
        got = sorted(lp.top_logprobs[i].values(), reverse=True)
        check(len(got) == 5 and np.allclose(got, top, atol=2e-4), f"step {i}: top-5 {got} != numpy {top}")
        check(abs(lp.token_logprobs[i] - top[0]) < 2e-4, f"step {i}: greedy token's {lp.token_logprobs[i]}")
    check(lp.text_offset[0] == 0 and "".join(lp.tokens) == r.choices[0].text, f"tokens {lp.tokens}")
    print(f"  ok: {n} steps' top-5 logprobs equal NumPy's log-softmax of the dumped logits")

    m = c.chat.completions.create(model="m", messages=[{"role": "user", "content": Q}], max_tokens=10,
                                  temperature=0, logprobs=True, top_logprobs=20)
    content = m.choices[0].logprobs.content
    check(len(content) == m.usage.completion_tokens, f"{len(content)} logprobs for {m.usage.completion_tokens}")
    for t in content:
        vals = [x.logprob for x in t.top_logprobs]
        check(len(vals) == 20 and t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob,
              f"top-1 {t.top_logprobs[0]} is not the greedy token {t.token!r}")
        check(all(v <= 0 for v in vals) and vals == sorted(vals, reverse=True), f"values {vals}")
        check(sum(np.exp(vals)) <= 1 + 1e-5 and bytes(t.bytes).decode(errors="replace") == t.token, f"{t}")
    check("".join(t.token for t in content) == m.choices[0].message.content, "tokens do not add up to the text")
    st, _, data = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": Q}],
                                                             "top_logprobs": 3}, AUTH)
    check(st == 400 and error_of(st, data)["param"] == "top_logprobs", f"top_logprobs without logprobs: {st}")


# ---- 3. special-token strings in chat contents ----------------------------------------------

def case_contents_are_text(s):
    c = client(s)
    plain = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "A B"}], max_tokens=1)
    trick = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "A<|im_end|>B"}],
                                      max_tokens=1)
    # as one special token "<|im_end|>" would add 1 token; as text it is several
    extra = trick.usage.prompt_tokens - plain.usage.prompt_tokens
    check(extra >= 4, f"'<|im_end|>' in a message took {extra} more tokens: parsed as the special token?")


# ---- 4. errors ----------------------------------------------------------------------------------

def expect(s, method, path, body, status, headers=AUTH, param=None, words=(), code=None):
    """One request that must fail with status, in OpenAI's error shape (param / code / words as given)."""
    st, h, data = s.request(method, path, body, headers)
    if not check(st == status, f"{method} {path} {str(body)[:80]}: status {st}, want {status}: {data[:300]!r}"):
        return h
    e = error_of(st, data)
    check(param is None or e["param"] == param, f"{path} {str(body)[:60]}: param {e['param']!r}, want {param!r}")
    check(code is None or e["code"] == code, f"{path} {str(body)[:60]}: code {e['code']!r}, want {code!r}")
    for w in words:
        check(w in e["message"], f"{path} {str(body)[:60]}: message {e['message']!r} lacks {w!r}")
    return h


def case_errors(s):
    msg = [{"role": "user", "content": "hi"}]
    chat, comp = "/v1/chat/completions", "/v1/completions"
    expect(s, "POST", chat, b"", 400, words=["empty"])
    expect(s, "POST", chat, b"{\"messages\": [", 400, code="invalid_json")  # truncated
    expect(s, "POST", chat, b"[" * 100000, 400, words=["deeper"])
    expect(s, "POST", chat, b"{\"messages\": \"\xff\xfe\"}", 400, words=["UTF-8"])
    expect(s, "POST", chat, b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xed\xa0\x80\"}]}", 400,
           words=["UTF-8"])  # a surrogate
    expect(s, "POST", chat, [1, 2], 400, words=["object"])
    expect(s, "POST", chat, {}, 400, param="messages")
    expect(s, "POST", chat, {"messages": "hi"}, 400, param="messages", code="invalid_type")
    expect(s, "POST", chat, {"messages": []}, 400, param="messages")
    expect(s, "POST", chat, {"messages": [{"role": "tool", "content": "x"}]}, 400, words=["role 'tool'"])
    expect(s, "POST", chat, {"messages": [{"role": "user", "content": 7}]}, 400, param="messages")
    expect(s, "POST", chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
           words=["text"])
    for field, value in (("temperature", "hot"), ("temperature", 3), ("top_p", True), ("top_k", 1.5),
                         ("min_p", [0.1]), ("seed", "x"), ("max_tokens", 0), ("max_tokens", "5"),
                         ("max_completion_tokens", -1), ("stream", "yes"), ("stop", 5), ("stop", ["a"] * 5),
                         ("n", 2), ("logprobs", 1), ("top_logprobs", 21), ("presence_penalty", 9),
                         ("model", 5), ("stream_options", 1), ("ignore_eos", "yes")):
        expect(s, "POST", chat, {"messages": msg, field: value}, 400, param=field)
    expect(s, "POST", comp, {"prompt": 5}, 400, param="prompt")
    expect(s, "POST", comp, {"prompt": ["a", "b"]}, 400, param="prompt")
    expect(s, "POST", comp, {"prompt": [1, 99999999]}, 400, param="prompt")
    expect(s, "POST", comp, {"prompt": "hi", "logprobs": True}, 400, param="logprobs")
    expect(s, "POST", comp, {"prompt": "hi", "echo": True}, 400, param="echo")
    expect(s, "POST", comp, {"prompt": "word " * 1100}, 400, code="context_length_exceeded",
           words=["1101 tokens", "context size of 1024"])
    # unknown fields are ignored, as OpenAI does
    st, _, data = s.request("POST", comp, {"prompt": "hi", "max_tokens": 1, "frobnicate": {"x": [1]}}, AUTH)
    check(st == 200, f"an unknown field: status {st}: {data[:200]!r}")
    # the key
    expect(s, "POST", chat, {"messages": msg}, 401, headers={}, code="missing_api_key")
    h = expect(s, "POST", chat, {"messages": msg}, 401, headers={"Authorization": "Bearer wrong"},
               code="invalid_api_key")
    check(h.get("www-authenticate") == "Bearer", f"401 without WWW-Authenticate: {h}")
    expect(s, "GET", "/v1/models", None, 401, headers={"Authorization": f"Bearer {KEY}x"})
    expect(s, "GET", "/metrics", None, 401, headers={})
    check(s.get("/health")[0] == 200 and s.get("/")[0] == 200, "/health and / need no key")
    # paths, methods, sizes
    expect(s, "GET", "/v2/nothing", None, 404, code="unknown_url")
    h = expect(s, "GET", chat, None, 405)
    check(h.get("allow") == "POST", f"405 Allow: {h.get('allow')}")
    expect(s, "DELETE", "/v1/models", None, 405)
    # 413: answered from the headers (Content-Length), before the body is read
    out = raw(s, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
              b"\r\nContent-Length: %d\r\n\r\n{\"messages\": \"xxxx" % (9 << 20))
    head, _, data = out.partition(b"\r\n\r\n")
    check(head.startswith(b"HTTP/1.1 413") and b"8388608" in data, f"9 MiB body: {out[:300]!r}")
    print("  ok: 400, 401, 404, 405, 413 in OpenAI's error shape")


def raw(s, data, read=True, half_close=True):
    """Sends raw bytes on a fresh connection (then, with half_close, shuts our side's writing: the
    server takes that as a client gone); returns what came back."""
    k = socket.create_connection(("127.0.0.1", s.port), timeout=30)
    try:
        k.sendall(data)
        if half_close:
            k.shutdown(socket.SHUT_WR)
    except OSError:  # the server answered and closed before all was sent
        pass
    out = b""
    while read:
        try:
            b = k.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not b:
            break
        out += b
    k.close()
    return out


def case_malformed_http(s):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
    for name, data in (("garbage", b"\x00\x01\x02 nonsense\r\n\r\n"),
                       ("no version", b"GET /health\r\n\r\n"),
                       ("bad header", b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n"),
                       ("truncated body", head + b"\r\nContent-Length: 100\r\n\r\n" + body),
                       ("truncated headers", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"),
                       ("bad length", head + b"\r\nContent-Length: -5\r\n\r\n" + body),
                       ("huge header", b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n"),
                       ("chunked too big", head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" +
                        (b"100000\r\n" + b"x" * 0x100000 + b"\r\n") * 9 + b"0\r\n\r\n")):
        out = raw(s, data)
        status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.") else None
        check(status is None or 400 <= status < 500, f"{name}: status {status}: {out[:200]!r}")
        check(s.alive(), f"{name}: the server died")
    out = raw(s, head + b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
              half_close=False)
    check(out.startswith(b"HTTP/1.1 200"), f"a well-formed raw request: {out[:200]!r}")
    print("  ok: malformed HTTP gets 4xx or a closed connection, and the server goes on")


# ---- 5. clients that go away ----------------------------------------------------------------------

def case_disconnect(s):
    before = s.metrics(AUTH)
    for stream in (True, False):
        body = json.dumps({"prompt": STORY, "max_tokens": 900, "temperature": 1, "seed": 1, "stream": stream})
        k = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        k.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
        if stream:
            check(k.recv(4096).startswith(b"HTTP/1.1 200"), "the stream did not start")
        v, _ = s.wait_metric("pipeshard_running_sequences", lambda v: v == 1, AUTH)
        require(v == 1, "the request is not running")
        time.sleep(0.2)
        k.close()
        v, waited = s.wait_metric("pipeshard_running_sequences", lambda v: v == 0, AUTH, limit=10)
        check(v == 0 and waited < (15 if SANITIZED else 2),
              f"stream={stream}: still running {waited:.2f} s after the client left")
        print(f"  ok: stream={stream}: the sequence ended {waited * 1e3:.0f} ms after its client left")
    after = s.metrics(AUTH)
    key = 'pipeshard_requests_total{outcome="cancelled"}'
    check(after[key] - before[key] == 2, f"cancelled {before[key]} -> {after[key]}")
    check(after["pipeshard_kv_blocks_used"] == 0, f"KV blocks used after: {after['pipeshard_kv_blocks_used']}")
    r = client(s).completions.create(model="m", prompt=STORY, max_tokens=4, temperature=0)
    check(r.usage.completion_tokens == 4, "no answer after the disconnects")
    for name in ("pipeshard_time_to_first_token_seconds_count", "pipeshard_generated_tokens_total",
                 'pipeshard_stage_compute_seconds_total{stage="0"}') + (() if SANITIZED else
                                                                      ("pipeshard_inter_token_seconds_count",)):
        check(after.get(name, 0) > 0, f"/metrics {name} = {after.get(name)}")


# ---- concurrency --------------------------------------------------------------------------------

PROMPTS = ["The sky is", "My favourite food is", "In the year 2050,", "The best way to learn is",
           "Dogs and cats", "A long time ago", "The ocean", "Mathematics is", "Yesterday I", "The moon",
           "Coffee or tea?", "The train left", "Music makes", "Winter is coming and", "A robot", "The forest"]


def case_concurrent(s, label, want=None):
    """16 clients at once; each text equal to the same request run alone. Returns the texts alone."""
    c = client(s)

    def ask(i):
        kw = dict(temperature=0) if i % 2 == 0 else dict(temperature=0.8, seed=100 + i)
        if i % 4 < 2:
            r = c.completions.create(model="m", prompt=PROMPTS[i], max_tokens=12, **kw)
            return r.choices[0].text
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=12,
                                      **kw)
        return r.choices[0].message.content

    alone = [ask(i) for i in range(16)]
    if want is not None:
        check(alone == want, f"{label}: texts alone differ from the other topology's: {alone} vs {want}")
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(ask, range(16)))
    for i in range(16):
        check(together[i] == alone[i], f"{label}: client {i}: {together[i]!r} != alone {alone[i]!r}")
    print(f"  ok: {label}: 16 concurrent clients got the texts they get alone")
    return alone


# ---- the prefix cache ----------------------------------------------------------------------------

SYSTEM = " ".join(["The harbor town kept its lanterns lit through every winter storm, and the keepers wrote each "
                   "night's weather in a copper-bound book."] * 24)


def prefix_request(q):
    return {"prompt": f"{SYSTEM}\nQuestion: {q}\nAnswer:", "max_tokens": 8, "temperature": 0}


def case_prefix(s, ref):
    """Two requests sharing a long first part (some 600 tokens) on a fleet: the second finds its
    whole blocks cached, the workers' compute for it drops to a fraction, and its text is the
    one it gets cold (ref, from another server)."""
    def ask(q):
        before = s.metrics(AUTH)['pipeshard_stage_compute_seconds_total{stage="1"}']
        st, _, data = s.request("POST", "/v1/completions", prefix_request(q), AUTH)
        require(st == 200, f"prefix: {st} {data[:300]!r}")
        after = s.metrics(AUTH)['pipeshard_stage_compute_seconds_total{stage="1"}']
        d = json.loads(data)
        return d["choices"][0]["text"], d["usage"], after - before
    _, cold, t_cold = ask("Who kept the lanterns lit?")
    text, usage, t_hit = ask("What did the keepers write?")
    n, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
    check(cold["prompt_tokens_details"]["cached_tokens"] == 0 and n > 512 and cached >= 512,
          f"prefix: cold {cold}, then {cached} of {n} prompt tokens cached")
    check(t_hit < 0.5 * t_cold, f"prefix: stage 1 computed {t_hit * 1e3:.0f} ms with the hit, {t_cold * 1e3:.0f} ms cold")
    check(text == ref, f"prefix: {text!r} with the hit, {ref!r} cold")
    print(f"  ok: a {cached}-token prefix hit: stage 1 computed {t_hit * 1e3:.0f} ms, cold {t_cold * 1e3:.0f} ms; "
          f"same text")


# ---- three stages --------------------------------------------------------------------------------

def case_three_stages(tmp):
    """16 concurrent clients on 3 stages (stories260K: a tiny model, so that 3 stages on 2 cores stay
    quick) each get the text the same request gets alone, and that text is the unsplit model's."""
    stories = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
    if not os.path.exists(stories):
        skip("16 concurrent clients on 3 stages: stories260K.gguf is absent (../shared/models)")
        return
    args = ["-m", stories, "--mmap", "-c", "256", "--parallel", "16"]

    def ask(s, i):
        kw = dict(temperature=0) if i % 2 == 0 else dict(temperature=0.9, seed=7 + i)
        r = client(s).completions.create(model="m", prompt=f"{STORY} {PROMPTS[i]}", max_tokens=24, **kw)
        return r.choices[0].text
    with Server(args + ["-t", "2"], "stories-1", tmp) as s:
        unsplit = [ask(s, i) for i in range(16)]
    with Server(args + ["--local-stages", "3", "-t", "1"], "stories-3", tmp) as s:
        alone = [ask(s, i) for i in range(16)]
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            together = list(ex.map(lambda i: ask(s, i), range(16)))
    check(alone == unsplit, f"3 stages alone differ from the unsplit model: {alone} vs {unsplit}")
    for i in range(16):
        check(together[i] == alone[i], f"3 stages: client {i}: {together[i]!r} != alone {alone[i]!r}")
    print("  ok: 3 stages: 16 concurrent clients got the texts they get alone, the unsplit model's")


# ---- server C: the queue and the shutdown --------------------------------------------------------

def case_queue(tmp):
    with Server([*COMMON, "--parallel", "1", "--kv-blocks", "40", "--queue-size", "2"], "queue", tmp) as s:
        m = s.metrics()
        check(m["pipeshard_kv_blocks_used"] + m["pipeshard_kv_blocks_cached"] + m["pipeshard_kv_blocks_free"] == 40,
              f"--kv-blocks 40: {m}")
        long = json.dumps({"prompt": STORY, "max_tokens": 900, "stream": True, "temperature": 1, "seed": 3})
        k = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        k.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(long)}\r\n\r\n{long}".encode())
        require(k.recv(4096).startswith(b"HTTP/1.1 200"), "the long request did not start")
        s.wait_metric("pipeshard_running_sequences", lambda v: v == 1)
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            queued = [ex.submit(s.request, "POST", "/v1/completions",
                                {"prompt": PROMPTS[i], "max_tokens": 6, "temperature": 0}) for i in range(2)]
            v, _ = s.wait_metric("pipeshard_queue_length", lambda v: v == 2)
            require(v == 2, f"queue length {v}, want 2")
            h = expect(s, "POST", "/v1/completions", {"prompt": "hi"}, 503, headers={}, code="server_overloaded",
                       words=["queue is full"])
            check(h.get("retry-after") == "1", f"503 without Retry-After: {h}")
            check(s.metrics()['pipeshard_requests_total{outcome="rejected"}'] == 1, "the rejection is not counted")
            k.close()  # the long one goes; the queued ones complete normally
            for i, f in enumerate(queued):
                st, _, data = f.result(60)
                check(st == 200 and json.loads(data)["usage"]["completion_tokens"] == 6,
                      f"queued request {i}: {st} {data[:200]!r}")
        print("  ok: a full queue answers 503 with Retry-After; the queued requests complete")

        # SIGTERM during a stream: an error event, [DONE], exit 143, quickly
        k = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        k.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(long)}\r\n\r\n{long}".encode())
        got = k.recv(65536)
        s.wait_metric("pipeshard_running_sequences", lambda v: v == 1)
        t0 = time.time()
        s.p.terminate()
        while True:
            b = k.recv(65536)
            if not b:
                break
            got += b
        k.close()
        s.p.wait(60)
        took = time.time() - t0
        check(b"shutting down" in got and got.rstrip().endswith(b"0") and b"data: [DONE]" in got,
              f"the stream's end at shutdown: {got[-400:]!r}")
        check(took < 10, f"SIGTERM took {took:.1f} s")
        print(f"  ok: SIGTERM ended a stream with an error event and the server in {took:.2f} s")


def case_cli(tmp):
    """serve's usage errors (status 2) and a port in use (status 1), each with a one-line reason."""
    for args, words in ((["-p", "hi"], "option of `pipeshard run`"), (["--temp", "0"], "option of `pipeshard run`"),
                        (["--prefix-cache", "maybe"], "must be on or off"), (["--port", "70000"], "--port"),
                        (["--prot", "1"], "did you mean '--port'?"), (["--queue-size", "-1"], "--queue-size"),
                        ([], None)):
        argv = [BIN, "serve", *args] + (["-m", MODEL] if args else [])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        check(p.returncode == 2 and (words or "no model given") in p.stderr,
              f"serve {args}: exit {p.returncode}, {p.stderr.strip()!r}")
    k = socket.socket()
    k.bind(("127.0.0.1", 0))
    k.listen(1)
    p = subprocess.run([BIN, "serve", *COMMON, "--port", str(k.getsockname()[1])], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    k.close()
    check(p.returncode == 1 and "cannot listen on 127.0.0.1:" in p.stderr and "in use" in p.stderr,
          f"a port in use: exit {p.returncode}, {p.stderr.strip()!r}")
    help_text = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--host", "--port", "--parallel", "--kv-blocks", "-c, --ctx-size", "--api-key-file", "--prefix-cache",
                 "--prefix-dir", "--queue-size", "--fleet", "--local-stages", "--key-file", "--mmap", "--pin", "-t, --threads"):
        check(flag in help_text, f"serve --help lacks {flag}")


def main():
    t0 = time.time()
    tmp = tmpdir("server-")
    if not os.path.exists(MODEL):
        skip(f"{MODEL} is absent (scripts/setup.sh fetches it): test_server did not run")
        return conclude(tmp, t0)
    try:
        import openai  # noqa: F401
    except ImportError:
        require(False, "the Python package openai is missing (scripts/setup.sh installs scripts/requirements.txt)")
    key = os.path.join(tmp, "api-key")
    with open(key, "w") as f:
        f.write(f"  {KEY}\n")
    try:
        case_cli(tmp)
    except AssertionError:
        pass
    alone = prefix_ref = None
    with Server([*COMMON, "--parallel", "16", "--api-key-file", key], "one-stage", tmp) as s:
        cases = [lambda: case_contents_are_text(s), lambda: case_errors(s), lambda: case_malformed_http(s),
                 lambda: case_disconnect(s)]
        if not SANITIZED:
            cases = [lambda: case_client(s), lambda: case_logprobs(s, tmp)] + cases
        for case in cases:
            try:
                case()
            except AssertionError:
                pass
        try:
            alone = None if SANITIZED else case_concurrent(s, "1 stage")
            if not SANITIZED:  # the prefix request's text cold, for server B's hit
                st, _, data = s.request("POST", "/v1/completions", prefix_request("What did the keepers write?"), AUTH)
                prefix_ref = json.loads(data)["choices"][0]["text"] if st == 200 else None
        except AssertionError:
            pass
        check(s.alive(), "server A died")
    if SANITIZED:  # bad input, the key, clients that go away, the shutdown: the rest decodes too slowly here
        print("  (a sanitizer build: the generating cases run in the release build's test_server)")
        return conclude(tmp, t0)
    with Server([*COMMON, "--parallel", "16", "--local-stages", "2", "-t", "1", "--api-key-file", key], "two-stages",
                tmp) as s:
        try:
            case_concurrent(s, "2 stages", alone)
            # log-probabilities from the last stage: only the top n cross the network
            st, _, data = s.request("POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 4,
                                                                "temperature": 0, "logprobs": 2}, AUTH)
            lp = json.loads(data)["choices"][0]["logprobs"] if st == 200 else None
            check(lp is not None and len(lp["top_logprobs"]) == 4 and
                  all(len(t) == 2 and max(t.values()) == l for t, l in zip(lp["top_logprobs"], lp["token_logprobs"])),
                  f"2 stages: logprobs {st} {data[:300]!r}")
            case_prefix(s, prefix_ref)
            m = s.metrics(AUTH)
            for name in ('pipeshard_hop_bytes_total{from="0",to="1"}', 'pipeshard_hop_seconds_total{from="1",'
                         'to="coordinator"}', 'pipeshard_stage_compute_seconds_total{stage="1"}'):
                check(m.get(name, 0) > 0, f"2 stages: /metrics {name} = {m.get(name)}")
        except AssertionError:
            pass
    for case in (case_queue, case_three_stages):
        try:
            case(tmp)
        except AssertionError:
            pass
    return conclude(tmp, t0)


if __name__ == "__main__":
    sys.exit(main())
