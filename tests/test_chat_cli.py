"""test_chat_cli.py - `pipeshard chat` on SmolLM2-135M-Instruct (.cache/models, from scripts/setup.sh).

1. Lines on standard input, greedy, --stats: the answers ("Paris", then "Berlin" for a follow-up that
   only makes sense with the first turn), and turn 2 keeps turn 1's prompt and answer on the stages
   (reused_tokens = turn 1's prompt + answer tokens) so that only the new turn is prefilled; after
   /reset the same two turns give the same answers (kept keys and values change no token).
2. Through a pseudo-terminal (libedit): the "> " prompt, Ctrl-C stops an answer ("[stopped]") and
   the chat goes on, Ctrl-D ends it with status 0.
3. Options that belong to `run` are refused with status 2.
4. Speculation (the model drafting for itself, 2 stages, 20 ms a hop, --spec-k auto): the same
   answers as without it, every guess kept, and the --stats line of each turn carries it; turn 1
   starts with 2 guesses (where the stages report their compute, auto's first trip carries
   guesses and gives the hops' time; PS_SPEC_TRACE shows it), turn 2 from what turn 1 measured of
   the ring and the draft (its acceptance, its plain decoding's wait when it measured one).
"""
import json
import os
import pty
import select
import subprocess
import sys
import termios
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, require, spec_trace, verdict  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
MODEL = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
ARGS = ["-m", MODEL, "--temp", "0", "-t", "2", "-c", "512"]
Q1 = "What is the capital of France? Answer in one word."
Q2 = "And of Germany? Answer in one word."


def case_lines():
    p = subprocess.run([BIN, "chat", *ARGS, "--stats"], input=f"{Q1}\n{Q2}\n/reset\n{Q1}\n{Q2}\n", text=True,
                       capture_output=True, timeout=300)
    require(p.returncode == 0, lambda: f"chat exited {p.returncode}: {p.stderr}")
    answers = [line for line in p.stdout.splitlines() if line and not line.startswith("(")]
    turns = [json.loads(line) for line in p.stderr.splitlines() if line.startswith("{")]
    require(len(answers) == 4 and len(turns) == 4, lambda: f"4 answers and 4 stats lines expected: {p.stdout!r}")
    check("Paris" in answers[0], f"turn 1 answered {answers[0]!r}")
    check("Berlin" in answers[1], f"turn 2 answered {answers[1]!r}")
    check(turns[0]["reused_tokens"] == 0, f"turn 1 reused {turns[0]['reused_tokens']} tokens of nothing")
    kept = turns[0]["prompt_tokens"] + turns[0]["generated_tokens"]
    check(turns[1]["reused_tokens"] == kept,
          f"turn 2 kept {turns[1]['reused_tokens']} tokens, expected turn 1's {kept} (prompt and answer)")
    check(turns[1]["prompt_tokens"] - turns[1]["reused_tokens"] < turns[0]["prompt_tokens"],
          "turn 2 prefilled more than its own turn")
    check(answers[2:] == answers[:2], f"after /reset the same turns answered {answers[2:]} (first: {answers[:2]})")
    check(all(t["stop"] == "eos" for t in turns), f"stop reasons {[t['stop'] for t in turns]}")
    print(f"  ok: turn 2 prefilled {turns[1]['prompt_tokens'] - turns[1]['reused_tokens']} of "
          f"{turns[1]['prompt_tokens']} tokens (ttft {turns[1]['ttft_ms']:.0f} ms; turn 1: "
          f"{turns[0]['prompt_tokens']} tokens, {turns[0]['ttft_ms']:.0f} ms)")


def case_spec():
    plain = subprocess.run([BIN, "chat", *ARGS], input=f"{Q1}\n{Q2}\n", text=True, capture_output=True, timeout=300)
    # 100 ms hops: guesses pay clearly also in a sanitizer build, where the draft (the model itself) takes half
    # a second a guess and a trip at 20 ms hops not much longer (auto then rightly decodes plain at times)
    p = subprocess.run([BIN, "chat", *ARGS, "--local-stages", "2", "--sim-latency-ms", "100", "--draft", MODEL,
                        "--stats"], input=f"{Q1}\n{Q2}\n", text=True, capture_output=True, timeout=300,
                       env={**os.environ, "PS_SPEC_TRACE": "1"})
    require(plain.returncode == 0 and p.returncode == 0, lambda: f"chat exited {plain.returncode}, {p.returncode}: "
            f"{plain.stderr}{p.stderr}")
    check(p.stdout == plain.stdout, f"with speculation the answers were {p.stdout!r}, without {plain.stdout!r}")
    turns = [json.loads(line) for line in p.stderr.splitlines() if line.startswith("{")]
    require(len(turns) == 2 and all("spec" in t for t in turns), lambda: f"2 lines with 'spec' expected: {p.stderr}")
    spec = [t["spec"] for t in turns]
    check(all(s["k"] == "auto" and s["drafted"] > 0 and s["kept"] == s["drafted"] for s in spec),
          f"guesses kept: {[(s['kept'], s['drafted']) for s in spec]} (the draft is the model itself)")
    traces, turn = [[], []], 0  # each turn's PS_SPEC_TRACE lines as {field: value}, its --stats line after them
    for line in p.stderr.splitlines():
        if line.startswith("{"):
            turn += 1
        elif spec_trace(line) and turn < 2:
            traces[turn].append(spec_trace(line))
    require(traces[0] and traces[1], lambda: f"no PS_SPEC_TRACE lines for both turns: {p.stderr[-2000:]}")
    first = traces[0][0]
    check(first["k"] == 2 and first["compute_ms"] > 0 and first["wait_ms"] > first["compute_ms"] + 150,
          f"turn 1's first trip (2 guesses, its wait 200 ms of hops beyond the stages' compute): {first}")
    # turn 2 starts from turn 1's measures: the acceptance counts turn 1's kept guesses as eight (above
    # 0.95 after its first trip, where a fresh start's 2 kept guesses give 0.93), and a plain trip
    # measured in turn 1 counts as measured twice (AUTO_PROBE), so turn 2 does not measure it again: a plain
    # trip there is auto's choice (a sanitizer build's timings may rightly make it)
    check(traces[1][0]["accept"] > 0.95, f"turn 2's first trip: {traces[1][0]}, as if nothing was measured")
    measured = traces[0][-1]["plain_n"] > 0  # (where guesses pay clearly from the start, plain is never measured)
    check(not measured or traces[1][0]["plain_n"] >= 2,
          f"trips by K {spec[0]['trips_by_k']} then {spec[1]['trips_by_k']}; turn 2's first trip {traces[1][0]}: "
          "plain decoding's yardstick, measured in turn 1, not carried into turn 2")
    print(f"  ok: chat with a draft: the same answers, every guess kept; trips by K {spec[0]['trips_by_k']} "
          f"then {spec[1]['trips_by_k']}; plain decoding {'measured in turn 1 and carried' if measured else 'not measured'}")


class Pty:
    """pipeshard chat on a pseudo-terminal; read_until waits for bytes, never a fixed time."""

    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(BIN, [BIN, *argv])
        self.buf = b""

    def read_until(self, pat, timeout=120):
        end = time.time() + timeout
        while pat not in self.buf and time.time() < end:
            r, _, _ = select.select([self.fd], [], [], 0.5)
            if r:
                try:
                    self.buf += os.read(self.fd, 4096)
                except OSError:
                    break
        found = pat in self.buf
        if found:
            self.buf = self.buf[self.buf.index(pat) + len(pat):]
        return found

    def wait_editing(self, timeout=60):
        """Waits until libedit has the terminal in raw mode (reading a line): a Ctrl-D typed while
        the line discipline is still canonical is an end-of-file mark that the switch to raw mode
        drops, so a test must not type before it (a person never types that fast)."""
        end = time.time() + timeout
        while time.time() < end:
            if not termios.tcgetattr(self.fd)[3] & termios.ICANON:
                return True
            time.sleep(0.01)
        return False

    def read_bytes(self, n, timeout=120):
        """Waits until at least n bytes are buffered; whether they came."""
        end = time.time() + timeout
        while len(self.buf) < n and time.time() < end:
            self.read_until(b"\0", 0.2)
        return len(self.buf) >= n

    def wait(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(st)
            self.read_until(b"\0", 0.2)  # keep draining the terminal
        os.kill(self.pid, 9)
        return None


def case_terminal():
    t = Pty(["chat", *ARGS, "-n", "4000"])
    require(t.read_until(b"> ") and t.wait_editing(), "no prompt on the terminal")
    os.write(t.fd, b"Write a very long story about a dragon and a knight.\r")
    require(t.read_until(b"knight.\r\n", 60), "the line was not echoed")
    require(t.read_bytes(40), "the answer did not start")  # its first words: the session is answering
    os.write(t.fd, b"\x03")
    check(t.read_until(b"[stopped]", 60), "Ctrl-C did not stop the answer")
    require(t.read_until(b"> ") and t.wait_editing(), "no prompt after the stopped answer")
    os.write(t.fd, (Q1 + "\r").encode())
    check(t.read_until(b"Paris"), "no answer after Ctrl-C")
    require(t.read_until(b"> ") and t.wait_editing(), "no prompt after the answer")
    os.write(t.fd, b"\x04")
    rc = t.wait()
    check(rc == 0, f"Ctrl-D ended the chat with status {rc}")


def case_run_options():
    for extra in (["-p", "hi"], ["--print-ids"], ["--prompt-ids", "1,2"], ["--dump-logits", "/dev/null"]):
        p = subprocess.run([BIN, "chat", *ARGS, *extra], input="", text=True, capture_output=True, timeout=60)
        check(p.returncode == 2 and "options of `pipeshard run`" in p.stderr,
              f"chat {extra}: status {p.returncode}, {p.stderr!r}")


def main():
    require(os.path.exists(MODEL), f"{MODEL} is absent (scripts/setup.sh fetches it)")
    for case in (case_lines, case_terminal, case_run_options, case_spec):
        try:
            case()
        except AssertionError:
            pass
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
