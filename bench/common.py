"""common.py - what the Python bench scripts share: the repository's root, the binary they run
(PIPESHARD_BIN, else build/pipeshard), the tests' helpers on the import path, and a command
that must succeed."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("PIPESHARD_BIN", os.path.join(ROOT, "build", "pipeshard"))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def sh(args, **kw):
    """args' standard output; exits with their standard error when they fail."""
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode:
        sys.exit(f"{' '.join(args)}: {p.stderr}")
    return p.stdout

CACHE = os.path.join(ROOT, ".cache", "bench")  # models written by `synth` and their splits, reused


def synth_model(spec):
    """The path of `synth`'s preset SHAPE:TYPE in CACHE, written when absent."""
    shape, qtype = spec.split(":")
    os.makedirs(CACHE, exist_ok=True)
    model = os.path.join(CACHE, f"{shape}-{qtype}.gguf")
    if not os.path.exists(model):
        print(f"writing {model} (synth)", flush=True)
        sh([BIN, "synth", "--like", shape, "--type", qtype, "-o", model])
    return model
