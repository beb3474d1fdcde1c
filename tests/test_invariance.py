#!/usr/bin/env python3
"""test_invariance.py - DESIGN.md invariants 1 and 2 at the command line, for every weight type.

For synthetic models (written by `pipeshard synth`) of every supported weight type and of the
llama, qwen2 and qwen3 architectures:
  * greedy ids and the logits of every step (--dump-logits) are bit-identical whether the prompt
    goes through in one forward pass (-b 128), token by token (-b 1) or in chunks of 7 (-b 7),
    and with 1, 2 or 3 threads;
  * seeded sampling (--temp 0.9 --seed S) gives the same ids under the same changes, and another
    seed gives other ids;
  * all of it for both matmul arithmetics (--activations q8 and f32), which differ from each other.
Exit 0 pass, 1 fail.
"""
import os
import subprocess
import sys

BIN = os.environ.get("PIPESHARD_BIN", "build/pipeshard")
TMP = os.environ.get("PS_TEST_TMP", "/tmp")
PROMPT = ",".join(str((i * 37 + 11) % 500) for i in range(40))
SPLITS = [("-b", "128", "-t", "1"), ("-b", "1", "-t", "2"), ("-b", "7", "-t", "3")]
failures = []


def sh(args):
    p = subprocess.run(args, capture_output=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    return p.stdout.decode()


def synth(name, *flags):
    path = os.path.join(TMP, f"inv-{name}.gguf")
    sh([BIN, "synth", "--layers", "2", "--dim", "256", "--heads", "4", "--kv-heads", "2", "--ffn", "512",
        "--vocab", "512", "-o", path, *flags])
    return path


def generate(model, split, sampling, tag, act):
    dump = os.path.join(TMP, f"inv-{tag}-{act}.f32")
    ids = sh([BIN, "run", "-m", model, "--prompt-ids", PROMPT, "-n", "12", "--ignore-eos", "--print-ids",
              "--dump-logits", dump, "--activations", act, *split, *sampling]).split()
    with open(dump, "rb") as f:
        return ids, f.read()


def check(name, model):
    q8 = f32 = None
    for act in ("q8", "f32"):
        check_act(f"{name}-{act}", model, act)
        logits = generate(model, SPLITS[0], ("--temp", "0"), f"{name}-act", act)[1]
        q8, f32 = (logits, f32) if act == "q8" else (q8, logits)
    if q8 == f32 and name not in ("llama-F32", "llama-F16", "llama-BF16"):  # float weights: f32 activations in both
        failures.append(f"{name}: --activations q8 and f32 gave bit-identical logits (is the flag ignored?)")


def check_act(name, model, act):
    for sampling in (("--temp", "0"), ("--temp", "0.9", "--seed", "1234")):
        base_ids, base_logits = generate(model, SPLITS[0], sampling, f"{name}-0", act)
        if len(base_ids) != 12 or len(base_logits) != 12 * 512 * 4:
            failures.append(f"{name}: expected 12 ids and 12 logit rows, got {len(base_ids)}, {len(base_logits)} bytes")
            continue
        for k, split in enumerate(SPLITS[1:], 1):
            ids, logits = generate(model, split, sampling, f"{name}-{k}", act)
            what = f"{name} {' '.join(sampling)} with {' '.join(split)}"
            if ids != base_ids:
                failures.append(f"{what}: ids {ids} differ from {base_ids}")
            elif logits != base_logits:
                failures.append(f"{what}: logits not bit-identical")
    other, _ = generate(model, SPLITS[0], ("--temp", "0.9", "--seed", "99"), f"{name}-seed", act)
    same, _ = generate(model, SPLITS[0], ("--temp", "0.9", "--seed", "1234"), f"{name}-seed2", act)
    if other == same:
        failures.append(f"{name}: seeds 99 and 1234 gave the same 12 ids {same}")
    print(f"  {name}: ok" if not [f for f in failures if f.startswith(name)] else f"  {name}: FAILED")


def main():
    if not os.access(BIN, os.X_OK):
        print(f"PIPESHARD_BIN={BIN} is not executable")
        return 1
    types = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"]
    for t in types:
        check(f"llama-{t}", synth(f"llama-{t}", "--type", t))
    check("qwen2-Q4_0", synth("qwen2", "--type", "Q4_0", "--arch", "qwen2"))
    check("qwen3-Q8_0", synth("qwen3", "--type", "Q8_0", "--arch", "qwen3", "--head-dim", "64"))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
