"""test_gguf_inspect.py - `pipeshard inspect` on the real models and on bad input.

  * SmolLM2-135M-Instruct.Q4_1.gguf ($PS_MODEL_CACHE) and stories260K.gguf ($PS_SHARED_MODELS),
    each when present: the text report and --json agree with gguf.GGUFReader (hyper-parameters,
    tensor counts per type, bytes in total and per layer, tokenizer, every metadata key);
  * usage errors exit 2, other errors exit 1, each with one line on stderr that starts with
    "pipeshard inspect: " (missing file, non-GGUF file, truncated model, unknown tensor);
    --help exits 0 and prints the usage on stdout.
Exit 0 pass, 1 fail, 77 when a model file is absent (the rest ran).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, verdict, failures, skip  # noqa: E402

import numpy as np  # noqa: E402 - scripts/setup.sh installs numpy and gguf: no skip without them
import gguf  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN")
if not BIN or not os.path.exists(BIN):
    print("FAIL: PIPESHARD_BIN not set (run through ctest)")
    sys.exit(1)
TMP = tempfile.mkdtemp(prefix="gguf_inspect_", dir=os.environ.get("PS_TEST_TMP") or None)


def inspect(*args):
    return subprocess.run([BIN, "inspect", *args], capture_output=True, text=True, timeout=300)


def one_error_line(r, code, *words):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    ok = r.returncode == code and len(lines) == 1 and lines[0].startswith("pipeshard inspect: ")
    ok = ok and all(w in lines[0] for w in words)
    return check(ok, f"exit {r.returncode} (want {code}), stderr {r.stderr!r}, want words {words}")


def field_value(f):
    """A GGUFReader field as inspect --json shows it (scalars, short arrays, summaries)."""
    vt = gguf.GGUFValueType
    if f.types[0] == vt.ARRAY:
        n = int(f.parts[4][0])
        if n > 16:
            return {"type": f.types[1].name, "n": n}
        if f.types[1] == vt.ARRAY:
            return None  # nested: not in these models
        return list(f.contents())
    return f.contents()


def check_model(path, arch, layers, vocab):
    r = gguf.GGUFReader(path)
    out = inspect(path, "--json")
    if not check(out.returncode == 0, f"inspect --json {path}: {out.stderr}"):
        return
    j = json.loads(out.stdout)
    check(j["architecture"] == arch, "architecture")
    check(j["hparams"]["block_count"] == layers, "block_count")
    check(j["hparams"]["vocab_size"] == vocab and j["tokenizer"]["vocab_size"] == vocab, "vocab size")
    check(j["tokenizer"]["bos_token_id"] == r.fields["tokenizer.ggml.bos_token_id"].contents(), "bos id")
    check(j["tokenizer"]["eos_token_id"] == r.fields["tokenizer.ggml.eos_token_id"].contents(), "eos id")
    check(j["tokenizer"]["model"] == r.fields["tokenizer.ggml.model"].contents(), "tokenizer model")
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    check(list(j["metadata"]) == keys, "metadata keys, in file order")
    for k in keys:
        want = field_value(r.fields[k])
        got = j["metadata"][k]
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            check(np.array_equal(np.float32(got), np.float32(want)), f"metadata {k}: {got} vs {want}")
        else:
            check(got == want, f"metadata {k}: {got!r} vs {want!r}")
    counts, total, per = {}, 0, {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        total += int(t.n_bytes)
        if t.name.startswith("blk."):
            n = int(t.name.split(".")[1])
            per[n] = per.get(n, 0) + int(t.n_bytes)
    check(j["tensor_types"] == counts, f"tensor types {j['tensor_types']} vs {counts}")
    check(j["total_bytes"] == total and j["n_tensors"] == len(r.tensors), "total bytes, tensor count")
    check(j["layers"]["count"] == layers == len(per), "layer count")
    check([l["bytes"] for l in j["layers"]["per_layer"]] == [per[i] for i in sorted(per)], "bytes per layer")
    check(j["layers"]["min_bytes"] == min(per.values()) and j["layers"]["max_bytes"] == max(per.values()), "min/max")
    check(len(j["tensors"]) == len(r.tensors), "tensor list")
    for jt, t in zip(j["tensors"], r.tensors):
        check(jt["name"] == t.name and jt["shape"] == [int(x) for x in t.shape] and jt["bytes"] == int(t.n_bytes)
              and jt["file_offset"] == int(t.data_offset), f"tensor {t.name}")

    text = inspect(path)
    check(text.returncode == 0 and text.stderr == "", f"text report: {text.stderr}")
    for word in (f"architecture   {arch}", "block_count", "embedding_length", "tokenizer", f"vocab {vocab}",
                 f"layers         {layers} (blk.0 .. blk.{layers - 1})"):
        check(word in text.stdout, f"text report mentions {word!r}")

    # a copy cut in the middle of its tensor data is refused with one line
    cut = os.path.join(TMP, "cut.gguf")
    with open(path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(os.path.getsize(path) - 1000))
    one_error_line(inspect(cut), 1, cut, "runs past the end of the file")
    with open(path, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(3000))
    one_error_line(inspect(cut, "--json"), 1, cut)
    one_error_line(inspect(path, "--dump-tensor", "no.such.tensor", "-o", os.path.join(TMP, "x.f32")), 1,
                   "no tensor named 'no.such.tensor'")


def main():
    models = 0
    cache = os.environ.get("PS_MODEL_CACHE", ".cache/models")
    smol = os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(smol):
        models += 1
        check_model(smol, "llama", 30, 49152)
    else:
        skip(f"{smol} is absent (scripts/setup.sh fetches it)")
    stories = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
    if os.path.exists(stories):
        models += 1
        check_model(stories, "llama", 5, 512)
    else:
        skip(f"{stories} is absent (only CI has ../shared/models)")

    h = inspect("--help")
    check(h.returncode == 0 and h.stdout.startswith("usage: pipeshard inspect MODEL") and h.stderr == "", "--help")
    one_error_line(inspect(), 2, "missing MODEL")
    one_error_line(inspect("a.gguf", "b.gguf"), 2, "unexpected argument 'b.gguf'")
    one_error_line(inspect("a.gguf", "--frobnicate"), 2, "unknown option '--frobnicate'")
    one_error_line(inspect("a.gguf", "--dump-tensor", "x"), 2, "-o FILE")
    one_error_line(inspect("a.gguf", "-o"), 2, "-o needs a file name")
    missing = os.path.join(TMP, "missing.gguf")
    one_error_line(inspect(missing), 1, missing, "No such file or directory")
    text = os.path.join(TMP, "text.gguf")
    with open(text, "w") as f:
        f.write("hello, this is not a model\n")
    one_error_line(inspect(text), 1, "not a GGUF file")
    one_error_line(inspect(TMP), 1, "not a regular file")

    if not failures():
        shutil.rmtree(TMP, ignore_errors=True)
    return verdict(f" ({models} real models)")


if __name__ == "__main__":
    sys.exit(main())
