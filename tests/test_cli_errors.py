#!/usr/bin/env python3
"""test_cli_errors.py - `pipeshard run` turns bad input into a clear error, never a crash.

DESIGN.md invariant 4. Every case runs `$PIPESHARD_BIN run ...` and asserts:
  * the exit status is non-zero and not a signal (no crash, no abort, no sanitizer trap);
  * stderr's first non-empty line says what is wrong (the keywords listed per case);
  * for errors about the model or the prompt, that line is the only one on stderr; for errors
    about flags a usage hint may follow it.
Models are written into $PS_TEST_TMP with gguf.GGUFWriter (tests/ref/synth.py), so nothing here
needs a downloaded model. Exit 0 pass, 1 fail.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from pstest import require  # noqa: E402
from ref.synth import write_model  # noqa: E402


def pipeshard(args, timeout=120, **kw):
    """Runs $PIPESHARD_BIN with args (standard input: /dev/null unless kw gives input or stdin)."""
    b = os.environ.get("PIPESHARD_BIN")
    if not b or not os.access(b, os.X_OK):
        raise AssertionError(f"PIPESHARD_BIN={b!r} is not an executable (run through ctest)")
    if "input" not in kw and "stdin" not in kw:
        kw["stdin"] = subprocess.DEVNULL
    return subprocess.run([b] + args, capture_output=True, text=True, timeout=timeout, **kw)


def run(args, timeout=120, **kw):
    return pipeshard(["run"] + args, timeout, **kw)


def expect_error(args, keywords, one_line=True, status=None):
    """Run and check a clean failure whose first stderr line contains every keyword
    (case-insensitive), and with status given, that exit status. Returns that line."""
    p = run(args)
    shown = f"pipeshard run {' '.join(args)}"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if p.returncode == 0:
        raise AssertionError(f"{shown}: exit status 0, expected an error (stderr {p.stderr!r})")
    if p.returncode < 0 or p.returncode >= 128:
        raise AssertionError(f"{shown}: killed / crashed (status {p.returncode}); stderr tail:\n"
                             f"{p.stderr[-1500:]}")
    if not lines:
        raise AssertionError(f"{shown}: exit {p.returncode} with nothing on stderr")
    first = lines[0]
    missing = [k for k in keywords if k.lower() not in first.lower()]
    if missing:
        raise AssertionError(f"{shown}: first stderr line {first!r} lacks {missing}\n"
                             f"(whole stderr: {p.stderr[-1000:]!r})")
    if one_line and len(lines) != 1:
        raise AssertionError(f"{shown}: expected one line on stderr, got {len(lines)}:\n{p.stderr[-1500:]}")
    if status is not None and p.returncode != status:
        raise AssertionError(f"{shown}: exit status {p.returncode}, expected {status} ({first!r})")
    print(f"  ok (exit {p.returncode}): {first}")
    return first


TMP = None
GOOD = None        # a small valid llama model (context 256, vocab 320)


def case_missing_model():
    path = os.path.join(TMP, "no-such-dir", "missing-model.gguf")
    expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], [path])


def case_not_gguf():
    path = os.path.join(TMP, "not-a-model.gguf")
    with open(path, "w") as f:
        f.write("this is a text file, not a model\n" * 40)
    expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], ["not a GGUF file"])


def case_empty_file():
    path = os.path.join(TMP, "empty.gguf")
    open(path, "wb").close()
    expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], [path, "not a GGUF file", "0 bytes"])


def case_truncated_gguf():
    # a valid model cut in the middle of its tensor data, and one cut inside its metadata
    data = open(GOOD, "rb").read()
    # (the metadata cut: the header's key count cannot fit in 200 bytes)
    for name, cut, words in (("tensors", len(data) * 3 // 4, ["tensor '", "runs past the end of the file"]),
                             ("metadata", 200, ["metadata keys", "200 bytes"])):
        path = os.path.join(TMP, f"truncated-{name}.gguf")
        with open(path, "wb") as f:
            f.write(data[:cut])
        expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], [path] + words)


def case_unsupported_arch():
    path = os.path.join(TMP, "mamba.gguf")
    w = gguf.GGUFWriter(path, "mamba")
    w.add_name("synthetic-mamba")
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_block_count(1)
    w.add_ssm_conv_kernel(4)
    w.add_ssm_inner_size(64)
    w.add_ssm_state_size(16)
    w.add_ssm_time_step_rank(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i) for i in range(16)])
    w.add_token_types([1] * 16)
    w.add_token_merges([])
    w.add_tensor("token_embd.weight", np.zeros((16, 32), np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], ["unsupported architecture", "mamba"])


def case_prompt_longer_than_model_context():
    path = write_model(os.path.join(TMP, "ctx16.gguf"), "llama", n_ctx=16, n_layer=1)
    prompt = ",".join(str(10 + i) for i in range(20))
    expect_error(["-m", path, "--prompt-ids", prompt, "-n", "1"], ["context"])


def case_head_size_too_large():
    path = write_model(os.path.join(TMP, "hd512.gguf"), "llama", n_layer=1, n_embd=64, n_head=1, n_head_kv=1,
                       head_dim=512)
    expect_error(["-m", path, "--prompt-ids", "1,2", "-n", "1"], ["head size 512", "at most 256"])


def case_prompt_longer_than_ctx_size_flag():
    prompt = ",".join(str(10 + i) for i in range(12))
    expect_error(["-m", GOOD, "--prompt-ids", prompt, "-n", "1", "--ctx-size", "8"], ["context"])
    expect_error(["-m", GOOD, "--prompt-ids", prompt, "-n", "1", "-c", "8"], ["context"])


def case_token_id_out_of_range():
    expect_error(["-m", GOOD, "--prompt-ids", "1,99999", "-n", "1"], ["99999"])


def case_unknown_flag():
    expect_error(["-m", GOOD, "--prompt-ids", "1,2", "-n", "1", "--no-such-flag"],
                 ["--no-such-flag"], one_line=False)


def case_bad_numbers():
    base = ["-m", GOOD, "--prompt-ids", "1,2"]
    expect_error(base + ["-n", "abc"], ["abc"], one_line=False)
    expect_error(base + ["-n", "1", "--temp", "-1"], ["temp"], one_line=False)
    expect_error(base + ["-n", "1", "--ctx-size", "many"], ["many"], one_line=False)
    expect_error(["-m", GOOD, "--prompt-ids", "1,x,3", "-n", "1"], ["prompt-ids"], one_line=False)


def case_good_model_runs():
    # the control: the same model and flags without the fault succeed
    p = run(["-m", GOOD, "--prompt-ids", "1,5,6", "-n", "3", "--temp", "0", "--print-ids",
             "--ignore-eos"])
    if p.returncode != 0:
        raise AssertionError(f"the valid synthetic model fails: exit {p.returncode}: {p.stderr[-800:]}")
    ids = p.stdout.split()
    if len(ids) != 3:
        raise AssertionError(f"expected 3 ids on stdout, got {p.stdout!r}")
    print(f"  ok: valid model generates {ids}")


def case_prompt_fills_context():
    # regression: a prompt of exactly the context size leaves room for one sampled token, which
    # is printed but never fed back (it once overflowed the token buffer; ASan build catches it)
    p = run(["-m", GOOD, "--prompt-ids", ",".join(["5"] * 8), "-c", "8", "-n", "4", "--temp", "0",
             "--print-ids", "--ignore-eos"])
    if p.returncode != 0:
        raise AssertionError(f"prompt of exactly -c tokens fails: exit {p.returncode}: {p.stderr[-1500:]}")
    if len(p.stdout.split()) != 1:
        raise AssertionError(f"expected exactly 1 id when the prompt fills the context, got {p.stdout!r}")
    print(f"  ok: prompt filling the context gives one token {p.stdout.split()}")


def case_fleet_flags():
    # flags of the split pipeline, checked before anything starts
    ids = ["--prompt-ids", "1,2", "-n", "1"]
    fleet = os.path.join(TMP, "no-such-fleet.json")
    expect_error(["-m", GOOD, "--fleet", fleet] + ids, ["-m", "--fleet", "not both"])
    expect_error(["--fleet", fleet, "--local-stages", "2"] + ids, ["--local-stages"])
    expect_error(["-m", GOOD, "--local-stages", "2", "--dump-logits", os.path.join(TMP, "l.bin")] + ids,
                 ["--dump-logits", "network"])
    expect_error(["-m", GOOD, "--local-stages", "0"] + ids, ["--local-stages"], one_line=False)
    expect_error(["-m", GOOD, "--local-transport", "unix"] + ids, ["--local-transport applies to --local-stages"])
    expect_error(["-m", GOOD, "--local-stages", "2", "--local-transport", "udp"] + ids,
                 ["--local-transport must be tcp or unix, got 'udp'"])
    expect_error(["-m", GOOD, "--local-stages", "65"] + ids, ["--local-stages"], one_line=False)
    # a rate so low that a frame's emulated time would overflow
    expect_error(["-m", GOOD, "--local-stages", "2", "--sim-bandwidth-mbps", "1e-300"] + ids,
                 ["--sim-bandwidth-mbps", "0 (no limit) or between 0.001 and"], one_line=False)
    expect_error(["-m", GOOD, "--sim-latency-ms", "-1"] + ids, ["--sim-latency-ms"], one_line=False)
    expect_error(["-m", GOOD, "--prefill-chunk", "0"] + ids, ["--prefill-chunk"], one_line=False)
    expect_error(["--fleet", fleet] + ids, ["no-such-fleet.json"])
    with open(os.path.join(TMP, "bad-fleet.json"), "w") as f:
        f.write('{"pipeshard_fleet": 1, "stages": "x"}')
    expect_error(["--fleet", os.path.join(TMP, "bad-fleet.json")] + ids, ["bad-fleet.json"])
    # a model of 1 layer cannot be cut in 2
    expect_error(["-m", GOOD, "--local-stages", "2"] + ids, ["cannot cut 1 layer into 2 stages"])
    expect_error(["-m", GOOD, "--key-file", os.path.join(TMP, "no-such.key")] + ids, ["no-such.key"])


def case_shard_as_model():
    # issue 16 (1): a shard of `pipeshard split` given to -m says which shard it is and how its fleet runs
    model = write_model(os.path.join(TMP, "three.gguf"), "llama", n_layer=3)
    out = os.path.join(TMP, "three-fleet")
    p = pipeshard(["split", "-m", model, "--stages", "3", "-o", out])
    require(p.returncode == 0, lambda: f"split: exit {p.returncode}: {p.stderr[-800:]}")
    ids = ["--prompt-ids", "1,2", "-n", "1"]
    s1 = os.path.join(out, "stage-1.gguf")
    fleet = os.path.join(out, "fleet.json")
    expect_error(["-m", s1] + ids, [f"'{s1}' is shard 1 of 3 (layers 1..2)", f"pipeshard worker --shard {s1}",
                                    f"pipeshard run --fleet {fleet}"], status=1)
    s0 = os.path.join(out, "stage-0.gguf")
    expect_error(["-m", s0] + ids, [f"'{s0}' is shard 0 of 3", f"pipeshard run --fleet {fleet}"], status=1)
    # the same with --local-stages, before any split is tried
    expect_error(["-m", s1, "--local-stages", "2"] + ids, [f"'{s1}' is shard 1 of 3"], status=1)


def case_fleet_not_a_fleet_json():
    # issue 16 (7): --fleet given a directory or a GGUF file says that a fleet.json is expected
    ids = ["--prompt-ids", "1,2", "-n", "1"]
    d = os.path.join(TMP, "a-dir")
    os.makedirs(d, exist_ok=True)
    expect_error(["--fleet", d] + ids, [f"'{d}' is a directory", "--fleet takes the fleet.json"])
    with open(os.path.join(d, "fleet.json"), "w") as f:
        f.write("{}")
    expect_error(["--fleet", d] + ids, [f"'{d}' is a directory", f"({d}/fleet.json?)"])
    expect_error(["--fleet", GOOD] + ids, [f"'{GOOD}' is a GGUF file, not a fleet.json", "-m"])


def case_context_full_is_said():
    # issue 16 (3): a generation cut short by the context says so on stderr (exit 0), and
    # --stats names the stop reason
    p = run(["-m", GOOD, "--prompt-ids", "5,6,7", "-c", "8", "-n", "20", "--temp", "0", "--print-ids",
             "--ignore-eos", "--stats"])
    require(p.returncode == 0, lambda: f"context-filling run: exit {p.returncode}: {p.stderr[-800:]}")
    lines = p.stderr.strip().splitlines()
    require(len(p.stdout.split()) == 6, lambda: f"expected 6 ids (8 positions, 3 in the prompt), got {p.stdout!r}")
    require(len(lines) == 2 and lines[0] == "pipeshard run: stopped after 6 tokens: the context of 8 positions is "
            "full (-c/--ctx-size)", lambda: f"stderr lacks the context line: {p.stderr!r}")
    require(json.loads(lines[1]).get("stop") == "context", lambda: f"--stats lacks \"stop\": \"context\": {lines[1]}")
    p = run(["-m", GOOD, "--prompt-ids", "5,6,7", "-n", "2", "--temp", "0", "--print-ids", "--ignore-eos", "--stats"])
    lines = p.stderr.strip().splitlines()
    require(p.returncode == 0 and len(lines) == 1 and json.loads(lines[0]).get("stop") == "length",
            lambda: f"-n 2: expected only the stats line with \"stop\": \"length\": {p.stderr!r}")
    print("  ok: context stop said on stderr, stop reason in --stats")


def case_prompt_from_stdin():
    # issue 16 (4): no -p/-f/--prompt-ids and standard input not a terminal: the prompt is read
    # from it; -f - too; a terminal with no prompt is a usage error
    base = ["-m", GOOD, "-n", "3", "--temp", "0", "--print-ids", "--ignore-eos"]
    want = run(base + ["-p", "abc ab"])
    require(want.returncode == 0, lambda: f"-p: exit {want.returncode}: {want.stderr[-800:]}")
    for extra in ([], ["-f", "-"]):
        p = run(base + extra, input="abc ab")
        require(p.returncode == 0 and p.stdout == want.stdout,
                lambda: f"prompt on stdin {extra}: exit {p.returncode}, {p.stdout!r} != {want.stdout!r}: {p.stderr}")
    import pty
    master, slave = pty.openpty()
    try:
        p = run(base, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    require(p.returncode == 2 and "no prompt" in p.stderr,
            lambda: f"no prompt on a terminal: exit {p.returncode}, {p.stderr!r}; expected 2 and 'no prompt'")
    print("  ok: prompt read from standard input")


def case_flags_that_need_another():
    # issue 16 (6): --system / --chat-template only with --chat; -c beyond the model's context
    # and -t beyond the CPUs run, with one warning line
    ids = ["--prompt-ids", "1,2", "-n", "1"]
    expect_error(["-m", GOOD, "-p", "hi", "--system", "be brief"], ["--system", "--chat"], status=2)
    expect_error(["-m", GOOD, "-p", "hi", "--chat-template", "chatml"], ["--chat-template", "--chat"], status=2)
    p = run(["-m", GOOD, "-c", "512"] + ids)
    require(p.returncode == 0 and p.stderr.strip() == "pipeshard run: warning: -c 512 is more than the 256 positions "
            "the model was trained on; using 512 (text past 256 may degrade)", lambda: f"-c 512: {p.stderr!r}")
    n = len(os.sched_getaffinity(0))
    p = run(["-m", GOOD, "-t", str(n + 1)] + ids)
    require(p.returncode == 0 and p.stderr.strip() == f"pipeshard run: warning: -t {n + 1} is more than the {n} "
            f"CPUs this process may use; using {n + 1} threads (they share cores: slower)",
            lambda: f"-t {n + 1}: {p.stderr!r}")
    print("  ok: flags without effect are refused or warned about")


def case_usage_errors_exit_2():
    # issue 16 (9): every error in what the command line gives exits 2, runtime failures 1
    ids = ["--prompt-ids", "1,2", "-n", "1"]
    nobos = write_model(os.path.join(TMP, "qwen.gguf"), "qwen2", n_layer=1)
    expect_error(["-m", nobos, "-p", "", "-n", "1"], ["the prompt is empty"], status=2)
    expect_error(["-m", GOOD, "-p", "hi", "--chat", "--chat-template", "nope"], ["nope"], status=2)
    expect_error(["-m", GOOD, "--prompt-ids", "1,x", "-n", "1"], ["prompt-ids"], status=2)
    expect_error(["-m", GOOD, "--prompt-ids", "1,99999", "-n", "1"], ["99999"], status=2)
    expect_error(["-m", GOOD, "--prompt-ids", ",".join(["5"] * 12), "-c", "8", "-n", "1"], ["context"], status=2)
    expect_error(["-m", GOOD, "-p", "a", "-f", "b"] + ids[2:], ["only one"], status=2)
    expect_error(["-m", GOOD, "-n", "x"] + ids[:2], ["x"], one_line=False, status=2)
    expect_error(["-m", os.path.join(TMP, "absent.gguf")] + ids, ["absent.gguf"], status=1)


CASES = [
    case_good_model_runs,
    case_fleet_flags,
    case_prompt_fills_context,
    case_missing_model,
    case_not_gguf,
    case_empty_file,
    case_truncated_gguf,
    case_unsupported_arch,
    case_prompt_longer_than_model_context,
    case_head_size_too_large,
    case_prompt_longer_than_ctx_size_flag,
    case_token_id_out_of_range,
    case_unknown_flag,
    case_bad_numbers,
    case_shard_as_model,
    case_fleet_not_a_fleet_json,
    case_context_full_is_said,
    case_prompt_from_stdin,
    case_flags_that_need_another,
    case_usage_errors_exit_2,
]


def main():
    global TMP, GOOD
    base = os.environ.get("PS_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    TMP = tempfile.mkdtemp(prefix="cli_errors_", dir=base)
    GOOD = write_model(os.path.join(TMP, "good.gguf"), "llama", n_layer=1)
    failed = []
    for fn in CASES:
        name = fn.__name__[len("case_"):]
        print(f"[{name}]", flush=True)
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - run every case, fail at the end
            failed.append(name)
            print(f"  FAIL: {type(e).__name__}: {e}")
    print(f"summary: {len(CASES) - len(failed)} of {len(CASES)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
