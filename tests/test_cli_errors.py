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
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from ref.synth import write_model  # noqa: E402


def run(args, timeout=120):
    b = os.environ.get("PIPESHARD_BIN")
    if not b or not os.access(b, os.X_OK):
        raise AssertionError(f"PIPESHARD_BIN={b!r} is not an executable (run through ctest)")
    return subprocess.run([b, "run"] + args, capture_output=True, text=True, timeout=timeout)


def expect_error(args, keywords, one_line=True):
    """Run and check a clean failure whose first stderr line contains every keyword
    (case-insensitive). Returns that line."""
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
