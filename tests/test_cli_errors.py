#!/usr/bin/env python3
"""test_cli_errors.py - `pipeshard run` turns bad input into a clear error, never a crash.

DESIGN.md invariant 4. Every case runs `$PIPESHARD_BIN run ...` and asserts:
  * the exit status is non-zero and not a signal (no crash, no abort, no sanitizer trap);
  * stderr's first non-empty line says what is wrong (the keywords listed per case);
  * for errors about the model or the prompt, that line is the only one on stderr; for errors
    about flags a usage hint may follow it.
The command-line-wide cases (typos in any subcommand's options and in command names, worker
--listen, keygen, --version) run the other subcommands too, with pstest's require.
Models are written into $PS_TEST_TMP with gguf.GGUFWriter (tests/ref/synth.py), so nothing here
needs a downloaded model. Exit 0 pass, 1 fail.
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from pstest import require  # noqa: E402
from ref.synth import write_model  # noqa: E402
from psworker import Worker  # noqa: E402
from pstest import failures, require  # noqa: E402


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


def case_device():
    # --device: a word that is no device, and a GPU this machine lacks (or a build without CUDA)
    base = ["-m", GOOD, "--prompt-ids", "1,2", "-n", "1"]
    expect_error(base + ["--device", "gpu"], ["--device", "unknown device 'gpu'", "cpu, cuda or cuda:N"],
                 one_line=False, status=2)
    line = expect_error(base + ["--device", "cuda:63"], ["--device"], one_line=False, status=2)
    require("no CUDA device 63" in line or "built without CUDA" in line, f"--device cuda:63: {line!r}")
    # a list: one device a local stage, each checked; no more than the stages
    expect_error(base + ["--device", "cpu,gpu", "--local-stages", "2"], ["--device", "unknown device 'gpu'"],
                 one_line=False, status=2)
    expect_error(base + ["--device", "cpu,", "--local-stages", "2"], ["--device", "unknown device ''"],
                 one_line=False, status=2)
    expect_error(base + ["--device", "cpu,cpu"], ["--device with several devices gives one to each of --local-stages"],
                 status=2)
    expect_error(base + ["--device", "cpu,cpu,cpu", "--local-stages", "2"],
                 ["--device lists more devices than --local-stages has stages"], status=2)
    p = pipeshard(["bench", "-m", GOOD, "--device", "cpu,cpu"])
    require(p.returncode == 2 and "--device with several devices goes with --stages" in p.stderr,
            f"bench --device cpu,cpu: exit {p.returncode}, {p.stderr!r}")
    for cmd in (["worker", "--shard", GOOD, "--listen", "127.0.0.1:0"], ["bench", "-m", GOOD]):
        p = pipeshard(cmd + ["--device", "cuda:63"])
        first = (p.stderr.strip().splitlines() or [""])[0]
        require(p.returncode == 2 and ("no CUDA device 63" in first or "built without CUDA" in first),
                f"pipeshard {cmd[0]} --device cuda:63: exit {p.returncode}, {first!r}")
        print(f"  ok: {cmd[0]}: {first}")


def case_worker_max_mem():
    # --max-mem: a shard larger than the cap is refused at start; a session whose KV cache and
    # buffers would pass it, when it begins (the coordinator says which stage and why)
    d = os.path.join(TMP, "maxmem")
    two = write_model(os.path.join(TMP, "two-layers.gguf"), "llama", n_layer=2)
    p = pipeshard(["split", "-m", two, "--stages", "2", "-o", d, "--quiet"])
    require(p.returncode == 0, f"split: {p.stderr}")
    shard = os.path.join(d, "stage-1.gguf")
    size = os.path.getsize(shard)
    p = pipeshard(["worker", "--shard", shard, "--listen", "127.0.0.1:0", "--max-mem", "1K"], timeout=30)
    first = (p.stderr.strip().splitlines() or [""])[0]
    require(p.returncode == 1 and "the shard takes" in first and "more than --max-mem 1.0 KiB" in first,
            f"worker --max-mem 1K: exit {p.returncode}, {first!r}")
    p = pipeshard(["worker", "--shard", shard, "--listen", "127.0.0.1:0", "--max-mem", "12X"])
    require(p.returncode == 2 and "--max-mem" in p.stderr, f"--max-mem 12X: {p.stderr!r}")
    log = os.path.join(TMP, "maxmem-worker.log")
    w = Worker(bin_path(), shard, log, "maxmem", extra=["--max-mem", str(size + 4096)])
    try:
        with open(os.path.join(d, "fleet.json")) as f:
            fleet = json.load(f)
        fleet["stages"][1]["address"] = w.addr
        with open(os.path.join(d, "fleet.json"), "w") as f:
            json.dump(fleet, f)
        p = pipeshard(["run", "--fleet", os.path.join(d, "fleet.json"), "--prompt-ids", "1,2", "-n", "1"])
        first = (p.stderr.strip().splitlines() or [""])[0]
        require(p.returncode == 1 and "stage 1" in first and "more than this worker's --max-mem" in first,
                f"a session past --max-mem: exit {p.returncode}, {first!r}")
        print(f"  ok: {first}")
    finally:
        w.stop()


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


def bin_path():
    return os.environ["PIPESHARD_BIN"]


def cli(args, timeout=120):
    """`pipeshard args` (any subcommand); the CompletedProcess (text)."""
    return subprocess.run([bin_path()] + args, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def usage_error(args, keywords, absent=()):
    """`pipeshard args` exits 2 with a first stderr line holding every keyword and none of absent."""
    p = cli(args)
    first = next((line for line in p.stderr.splitlines() if line.strip()), "")
    shown = f"pipeshard {' '.join(args)}"
    require(p.returncode == 2, f"{shown}: exit {p.returncode}, expected 2 (stderr {p.stderr[-800:]!r})")
    missing = [k for k in keywords if k not in first]
    require(not missing, f"{shown}: first stderr line {first!r} lacks {missing}")
    present = [k for k in absent if k in first]
    require(not present, f"{shown}: first stderr line {first!r} should not say {present}")
    print(f"  ok: {first}")
    return first


COMMANDS = ["run", "serve", "bench", "split", "worker", "inspect", "synth", "keygen"]


def case_typos():
    # the examples: a transposition, a wrong dash, an underscore; the closest option is named
    usage_error(["run", "-m", GOOD, "--tmep", "0"],
                ["pipeshard run: unknown option '--tmep'; did you mean '--temp'? (see pipeshard run --help)"])
    usage_error(["run", "-m", GOOD, "-temp", "0"], ["'-temp'; did you mean '--temp'?"])
    usage_error(["run", "-m", GOOD, "--top_k", "4"], ["'--top_k'; did you mean '--top-k'?"])
    usage_error(["bench", "-m", GOOD, "--jsno"], ["pipeshard bench: unknown option '--jsno'; did you mean '--json'?"])
    usage_error(["split", "-m", GOOD, "--stagse", "2"], ["did you mean '--stages'?"])
    usage_error(["worker", "--shard", GOOD, "--lisen", "127.0.0.1:0"],
                ["pipeshard worker: unknown option '--lisen'; did you mean '--listen'?"])
    usage_error(["worker", "--nover"], ["unknown option '--nover'"], ["needs a value"])
    usage_error(["inspect", GOOD, "--jsn"], ["pipeshard inspect: unknown option '--jsn'; did you mean '--json'?"])
    usage_error(["synth", "--vocb", "3"], ["pipeshard synth: unknown option '--vocb'; did you mean '--vocab'?"])
    usage_error(["keygen", "--froce"], ["did you mean '--force'?"])
    # unrelated words get no suggestion
    for cmd in COMMANDS:
        usage_error([cmd, "--frobnicate"], [f"pipeshard {cmd}: unknown option '--frobnicate'", f"{cmd} --help"],
                    ["did you mean"])
    usage_error(["run", "-m", GOOD, "-x"], ["unknown option '-x'"], ["did you mean"])
    # a stray word: run's prompt goes after -p; the others name the word
    usage_error(["run", "-m", GOOD, "hello"],
                ["pipeshard run: unexpected argument 'hello': give the prompt with -p TEXT"])
    usage_error(["split", "-m", GOOD, "extra"], ["pipeshard split: unexpected argument 'extra'"])
    usage_error(["synth", "extra"], ["pipeshard synth: unexpected argument 'extra'"])
    usage_error(["keygen", "extra"], ["pipeshard keygen: unexpected argument 'extra': give the key file with -o FILE"])
    # commands
    usage_error(["rn"], ["pipeshard: unknown command 'rn'; did you mean 'run'?"])
    usage_error(["wroker"], ["did you mean 'worker'?"])
    usage_error(["--verison"], ["did you mean '--version'?"])
    usage_error(["banana"], ["pipeshard: unknown command 'banana'"], ["did you mean"])
    # every option a command's --help lists is suggested for a typo of it (so the lists the
    # suggestions come from keep up with the options)
    for cmd in COMMANDS:
        text = cli([cmd, "--help"]).stdout
        # the options a line of the help begins with ("  -t, --threads N  ...")
        flags = sorted(set(re.findall(r"(?m)^\s*(?:-\w,\s*)?(--[a-z][a-z0-9-]+)", text)) - {"--help"})
        require(flags, f"pipeshard {cmd} --help lists no options: {text!r}")
        tried = 0
        for flag in flags:
            core = flag[2:]
            if len(core) < 3 or core[1] == core[2]:
                continue
            typo = "--" + core[0] + core[2] + core[1] + core[3:]
            p = cli([cmd, typo])
            want = f"did you mean '{flag}'?"
            require(p.returncode == 2 and want in p.stderr,
                    f"pipeshard {cmd} {typo}: exit {p.returncode}, stderr {p.stderr.strip()!r} lacks {want!r}")
            tried += 1
        print(f"  ok: {cmd}: a typo of each of {tried} options of its --help names the option")


def case_worker_listen():
    usage_error(["worker", "--shard", GOOD, "--listen", "7720"],
                ["--listen expects HOST:PORT or unix:PATH, got '7720'", "0.0.0.0:7720", "127.0.0.1:7720"])
    usage_error(["worker", "--shard", GOOD, "--listen", "somehost"], ["--listen expects HOST:PORT or unix:PATH"])


def two_stage_fleet():
    """A 2-layer model split into 2 stages: (model, fleet.json, stage-1 shard)."""
    model = write_model(os.path.join(TMP, "two.gguf"), "llama", n_layer=2)
    out = os.path.join(TMP, "two-fleet")
    p = cli(["split", "-m", model, "--stages", "2", "-o", out, "--quiet"])
    require(p.returncode == 0, f"split: exit {p.returncode}: {p.stderr}")
    return model, os.path.join(out, "fleet.json"), os.path.join(out, "stage-1.gguf")


def case_worker_open_warning():
    _, _, shard = two_stage_fleet()
    key = os.path.join(TMP, "warn.key")
    with open(key, "wb") as f:
        f.write(os.urandom(32))
    for name, host, k, warns in (("open", "0.0.0.0", None, True), ("loopback", "127.0.0.1", None, False),
                                 ("keyed", "0.0.0.0", key, False)):
        w = Worker(bin_path(), shard, os.path.join(TMP, f"warn-{name}.log"), name, host=host, key=k)
        try:
            require(w.wait_log("listening on"), f"worker {name}: no 'listening on' line: {w.text()}")
            time.sleep(0.2)
            lines = [line for line in w.text().splitlines() if "warning" in line]
        finally:
            w.stop()
        if warns:
            require(len(lines) == 1 and "anyone who can reach" in lines[0] and "--key-file" in lines[0]
                    and "pipeshard keygen" in lines[0],
                    f"worker on {host} without a key: expected one warning line, got {lines}")
            print(f"  ok: {lines[0]}")
        else:
            require(not lines, f"worker {name} on {host}: unexpected warning {lines}")
            print(f"  ok: no warning on {host}{' with a key' if k else ''}")


def case_keygen():
    a, b = os.path.join(TMP, "a.key"), os.path.join(TMP, "b.key")
    p = cli(["keygen", "-o", a])
    require(p.returncode == 0 and a in p.stdout and "--key-file" in p.stdout,
            f"keygen -o {a}: exit {p.returncode}, stdout {p.stdout!r}, stderr {p.stderr!r}")
    st = os.stat(a)
    require(stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 32,
            f"keygen: mode {oct(stat.S_IMODE(st.st_mode))} size {st.st_size}, expected 0o600 and 32")
    require(cli(["keygen", "-o", b]).returncode == 0, "keygen -o b.key failed")
    ka, kb = open(a, "rb").read(), open(b, "rb").read()
    require(ka != kb, "two keys from keygen are the same")
    p = cli(["keygen", "-o", a])
    require(p.returncode == 1 and "exists" in p.stderr and "--force" in p.stderr and open(a, "rb").read() == ka,
            f"keygen over an existing file: exit {p.returncode}, stderr {p.stderr!r} (or the file changed)")
    os.chmod(a, 0o644)
    p = cli(["keygen", "-o", a, "--force"])
    st = os.stat(a)
    require(p.returncode == 0 and open(a, "rb").read() != ka and stat.S_IMODE(st.st_mode) == 0o600,
            f"keygen --force: exit {p.returncode}, mode {oct(stat.S_IMODE(st.st_mode))}, stderr {p.stderr!r}")
    usage_error(["keygen"], ["pipeshard keygen: no key file given (-o FILE)"])
    print("  ok: keys of 32 bytes, mode 0600, different, kept unless --force")
    # a 2-stage fleet where the worker and the run both use a keygen key
    model, fleet, shard = two_stage_fleet()
    gen = ["--prompt-ids", "1,5,6", "-n", "4", "--temp", "0", "--print-ids", "--ignore-eos", "-t", "1"]
    want = cli(["run", "-m", model] + gen)
    require(want.returncode == 0, f"unsplit run: {want.stderr[-800:]}")
    w = Worker(bin_path(), shard, os.path.join(TMP, "keygen-w1.log"), "keygen-w1", key=a)
    try:
        with open(fleet) as fh:
            j = json.load(fh)
        j["stages"][1]["address"] = w.addr
        f = os.path.join(os.path.dirname(fleet), "fleet-keygen.json")
        with open(f, "w") as fh:
            json.dump(j, fh)
        got = cli(["run", "--fleet", f, "--key-file", a] + gen)
        require(got.returncode == 0 and got.stdout.split() == want.stdout.split(),
                f"fleet with the keygen key: exit {got.returncode}, ids {got.stdout!r} vs {want.stdout!r}: "
                f"{got.stderr[-800:]}")
        require("shared key required" in w.text(), f"worker log lacks 'shared key required': {w.text()}")
        bad = cli(["run", "--fleet", f, "--key-file", b] + gen)
        require(bad.returncode != 0, f"a run with another keygen key was served: {bad.stdout!r}")
    finally:
        w.stop()
    print("  ok: a worker and a run with the keygen key serve the unsplit run's ids; another key is refused")


def case_version():
    p, q = cli(["--version"]), cli(["version"])
    require(p.returncode == 0 and q.returncode == 0 and p.stdout == q.stdout and not p.stderr,
            f"--version / version: exit {p.returncode}/{q.returncode}, {p.stdout!r} vs {q.stdout!r}, {p.stderr!r}")
    cmake = open(os.path.join(os.environ.get("PS_SOURCE_DIR", "."), "CMakeLists.txt")).read()
    ver = re.search(r"project\(pipeshard VERSION (\d+\.\d+\.\d+)", cmake)
    require(ver, "CMakeLists.txt has no project(pipeshard VERSION x.y.z)")
    lines = p.stdout.splitlines()
    require(len(lines) == 3, f"--version: expected 3 lines, got {p.stdout!r}")
    m = re.fullmatch(r"pipeshard (\S+) \(git (\S+)\)", lines[0])
    require(m and m.group(1) == ver.group(1) and re.fullmatch(r"unknown|[\w.-]*[0-9a-f]{7,}(-dirty)?", m.group(2)),
            f"--version line 1 {lines[0]!r}: expected 'pipeshard {ver.group(1)} (git COMMIT)'")
    k = re.match(r"kernels: (\S+)", lines[1])
    require(k and k.group(1) in ("ref", "avx2", "avx512", "avx512vnni", "avx512amx", "neon", "neondot"),
            f"--version line 2 {lines[1]!r}: no kernel family")
    forced = subprocess.run([bin_path(), "--version"], capture_output=True, text=True, timeout=30,
                            env=dict(os.environ, PS_ISA="ref"))
    require("kernels: ref" in forced.stdout, f"PS_ISA=ref pipeshard --version: {forced.stdout!r}")
    require(re.fullmatch(r"backends: cpu(, cuda \(\d+ GPUs? here\)| \(built without CUDA\))", lines[2]),
            f"--version line 3 {lines[2]!r}: expected 'backends: cpu, cuda (N GPUs here)' or 'cpu (built without CUDA)'")
    # the commit is the checkout's as built, not as configured (a build after a commit, no re-configure)
    head = shutil.which("git") and subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                                                  text=True, timeout=30, cwd=os.environ.get("PS_SOURCE_DIR", "."))
    if head and head.returncode == 0 and head.stdout.strip():
        clean = lambda c: re.sub(r"-dirty$", "", c)
        require(clean(m.group(2)) == clean(head.stdout.strip()),
                f"--version says git {m.group(2)}, the checkout is at {head.stdout.strip()}: a stale commit")
    print(f"  ok: {' | '.join(lines)}")


def case_install():
    # `cmake --install` of the build the test runs from puts a working bin/pipeshard under the prefix
    build = os.path.dirname(os.path.abspath(bin_path()))
    prefix = os.path.join(TMP, "prefix")
    p = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True, text=True, timeout=120)
    require(p.returncode == 0, f"cmake --install {build}: exit {p.returncode}: {p.stderr[-800:]}")
    installed = os.path.join(prefix, "bin", "pipeshard")
    require(os.access(installed, os.X_OK), f"cmake --install {build} --prefix {prefix}: no {installed}")
    q = subprocess.run([installed, "--version"], capture_output=True, text=True, timeout=30)
    require(q.returncode == 0 and q.stdout == cli(["--version"]).stdout,
            f"{installed} --version: exit {q.returncode}, {q.stdout!r}")
    completion = os.path.join(prefix, "share", "bash-completion", "completions", "pipeshard")
    require(os.path.isfile(completion), f"cmake --install put no {completion}")
    page = os.path.join(prefix, "share", "man", "man1", "pipeshard.1")
    require(os.path.isfile(page), f"cmake --install put no {page}")
    print(f"  ok: cmake --install put {installed}, {completion} and {page}")


def case_man_page():
    # the build's pipeshard(1): the version, a section per command with its options, valid roff
    page = os.path.join(os.path.dirname(os.path.abspath(bin_path())), "pipeshard.1")
    require(os.path.isfile(page), f"the build made no {page}")
    text = open(page).read()
    ver = cli(["--version"]).stdout.split()[1]
    require(text.startswith(f'.TH PIPESHARD 1 "" "pipeshard {ver}"'), f"{page}: first line {text[:80]!r}")
    for cmd in COMMANDS:
        require(f".SS pipeshard {cmd}\n" in text, f"{page} has no section for {cmd}")
    require("\\-\\-temp" in text and "\\-\\-listen" in text,
            f"{page} lacks run's --temp or worker's --listen")
    if shutil.which("groff"):
        p = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page], capture_output=True, text=True, timeout=60)
        require(p.returncode == 0 and not p.stderr.strip(), f"groff warns about {page}: {p.stderr[-800:]}")
    print(f"  ok: {page}: pipeshard {ver}, {len(COMMANDS)} command sections")


def complete(words):
    """What scripts/pipeshard-completion.bash offers for the command line words (the last one
    being completed), one a line."""
    script = os.path.join(os.environ.get("PS_SOURCE_DIR", "."), "scripts", "pipeshard-completion.bash")
    prog = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _pipeshard; '
            'printf "%s\\n" "${COMPREPLY[@]}"')
    p = subprocess.run(["bash", "-c", prog, "complete", script, bin_path()] + words, capture_output=True,
                       text=True, timeout=60)
    require(p.returncode == 0, f"completion of {words}: exit {p.returncode}: {p.stderr}")
    return [w for w in p.stdout.splitlines() if w]


def case_bash_completion():
    cmds = complete([""])
    require(set(COMMANDS + ["version", "--version"]) <= set(cmds), f"completion of the command: {cmds}")
    require(complete(["ke"]) == ["keygen"], f"completion of 'ke': {complete(['ke'])}")
    for cmd in COMMANDS:
        opts = complete([cmd, "-"])
        require(len(opts) >= 2, f"completion of pipeshard {cmd} -: {opts}")
        # every option offered is one the command takes (an unknown one would say so)
        for o in opts:
            p = cli([cmd, o])
            require("unknown option" not in p.stderr, f"completion offers pipeshard {cmd} {o}: {p.stderr.strip()}")
        print(f"  ok: {cmd}: {len(opts)} options, each one the command takes")
    require("--temp" in complete(["run", "--te"]), "completion of run --te lacks --temp")
    require("--listen" in complete(["worker", "--li"]), "completion of worker --li lacks --listen")


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
    case_device,
    case_shard_as_model,
    case_fleet_not_a_fleet_json,
    case_context_full_is_said,
    case_prompt_from_stdin,
    case_flags_that_need_another,
    case_usage_errors_exit_2,
    case_typos,
    case_worker_listen,
    case_worker_max_mem,
    case_worker_open_warning,
    case_keygen,
    case_version,
    case_install,
    case_bash_completion,
    case_man_page,
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
    return 1 if failed or failures() else 0


if __name__ == "__main__":
    sys.exit(main())
