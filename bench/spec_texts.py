#!/usr/bin/env python3
"""tests/test_spec.c's real texts: where the Qwen2.5-Coder 0.5B draft guesses the 1.5B target's
greedy answer, token by token (build/bench_agree), and how sure it was of each guess, for
bench/spec.py's two prompts and fourteen others, printed as the C lines of test_spec.c's
REAL_TEXTS: the guesses right (1) or wrong (0), then for each guess -100 log10 of the draft's
probability of it as two digits (99 for 0.1 or less: a trip stops there at once).

    bench/spec_texts.py [--model 1.5B.gguf] [--draft 0.5B.gguf] [--tokens 256] [--threads 2]

The lines depend on the kernel family (the families' greedy answers part on some tokens):
test_spec.c's were made with avx512vnni (the device machine's and this VM's).
"""
import argparse
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from spec import PROMPTS  # noqa: E402

MODELS = os.path.join(ROOT, ".cache", "models")
OTHERS = [  # (name, prompt): raw completions, as bench/spec.py's
    ("code: save_config", "import json\n\n\ndef load_config(path):\n    with open(path) as f:\n"
                          "        return json.load(f)\n\n\ndef save_config(path, config):\n"),
    ("code: Stack", "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"),
    ("code: C sum", "#include <stdio.h>\n#include <stdlib.h>\n\n/* Returns the sum of the n integers in a. */\n"
                    "int sum(const int *a, int n) {\n"),
    ("code: fibonacci", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("code: debounce", "function debounce(fn, ms) {\n  let timer = null;\n  return function (...args) {\n"),
    ("code: SQL", "SELECT customers.name, COUNT(orders.id) AS n_orders\nFROM customers\n"),
    ("code: argparse", "def parse_args():\n    import argparse\n"
                       "    p = argparse.ArgumentParser(description=\"Resize images.\")\n"
                       "    p.add_argument(\"--width\", type=int, default=640)\n"),
    ("prose: mill", "The old mill stood at the edge of the village. Every spring the river rose and the wheel "
                    "turned faster,"),
    ("prose: letter", "Dear Anna,\n\nI hope this letter finds you well. Since you left for the city,"),
    ("prose: photosynthesis", "Photosynthesis is the process by which plants"),
    ("prose: bicycle", "The history of the bicycle begins in the early nineteenth century, when"),
    ("prose: princess", "Once upon a time, in a kingdom by the sea, there lived a princess who"),
    ("prose: bread", "To bake a loaf of bread, first mix the flour and the water. Then"),
    ("prose: meeting", "The meeting began at nine. The manager opened her laptop and said that the quarterly figures"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(MODELS, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--draft", default=os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    tool = os.path.join(ROOT, "build", "bench_agree")
    for path in (tool, a.model, a.draft):
        if not os.path.exists(path):
            sys.exit(f"spec_texts: {path} is missing (cmake --build build; scripts/fetch_models.sh --qwen-coder)")
    for name, prompt in [("bench code", PROMPTS["code"]), ("bench prose", PROMPTS["prose"])] + OTHERS:
        p = subprocess.run([tool, "-m", a.model, "-d", a.draft, "-p", prompt, "-n", str(a.tokens), "-t",
                            str(a.threads)], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            sys.exit(f"spec_texts: bench_agree failed on {name!r}: {p.stderr.strip()}")
        lines = p.stdout.split("\n")
        right, sure = lines[1], "".join(f"{min(99, round(-100 * math.log10(float(x)))):02d}" for x in lines[2].split())
        print(f"    {{\"{name}\", \"{right}\",\n     \"{sure}\"}},")


if __name__ == "__main__":
    main()
