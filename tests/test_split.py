#!/usr/bin/env python3
"""test_split.py - `pipeshard split` cuts a model into shards that hold exactly the right bytes.

Models: several written by `$PIPESHARD_BIN synth` (tied and untied heads, Q8_0 / Q4_0 / F16 /
Q4_K_M with uneven layer sizes, qwen2 biases, a llama-3.2 shape with rope_freqs.weight) and
../shared/models/stories260K.gguf when present (skipped with a message when absent), so the test
never fully skips. Every split is checked with independent readers, never with engine code:
  * the `gguf` package (GGUFReader) opens each shard; it holds exactly the expected tensors
    (blk.L.* of its layers, token_embd on stage 0, output_norm and output on the last, a copy of
    token_embd named output.weight when the model ties them, rope_freqs everywhere), each with the
    original's type, shape and bytes; every original metadata key with the same type and value;
    the pipeshard.* keys with the right types and values;
  * fleet.json (the `json` module) names every stage, its layers, shard, size, fingerprint and
    address; the model fingerprint equals `xxhash.xxh3_128_hexdigest` of the model file, each
    shard fingerprint equals the definition in shard.h recomputed with `xxhash`;
  * the default plan is optimal: its largest shard equals a brute-force minimax over all cuts;
  * through ctypes on $PS_LIBPSCORE: ps_shard_plan on random layer sizes against brute force,
    ps_shard_meta_read + ps_shard_fingerprint on written shards (same value as the metadata),
    ps_fleet_load (paths resolved, and a clear message naming the field for each broken fleet),
    ps_shard_meta_read on malformed pipeshard.* keys;
  * bad command lines exit non-zero with one specific stderr line.
Exit 0 pass, 1 fail, 77 when a part was skipped (stories260K or the library absent) and the rest passed.
"""
import ctypes
import itertools
import json
import os
import random
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gguf  # noqa: E402
import xxhash  # noqa: E402
from pstest import exit_status, require, reexec_with_asan, skip, tmpdir  # noqa: E402

BIN = os.environ.get("PIPESHARD_BIN")
TMP = None
MODELS = {}   # name -> path, filled by case_models


# ------------------------------------------------------------------------------ helpers
def sh(cmd, args, expect=0, timeout=300):
    """Runs `pipeshard cmd args`; checks the exit status; returns the process."""
    p = subprocess.run([BIN, cmd] + args, capture_output=True, text=True, timeout=timeout)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{cmd} {' '.join(args)}: exit {p.returncode}, expected {expect}; "
                             f"stderr: {p.stderr[-1500:]}")
    return p


def synth(name, args):
    path = os.path.join(TMP, name)
    sh("synth", args + ["-o", path])
    return path


def split(model, out, args):
    return sh("split", ["-m", model, "-o", out, "--quiet"] + args)


def fields(r):
    return {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}


def raw(r, t):
    """The bytes of tensor t straight from the file (no dtype interpretation)."""
    return bytes(r.data[t.data_offset:t.data_offset + t.n_bytes])


def layer_of(name):
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def costs(r):
    """(layer bytes, embed bytes, head bytes) of a model as shard.h defines them."""
    t = {x.name: x for x in r.tensors}
    L = fields(r)[f"{fields(r)['general.architecture'].contents()}.block_count"].contents()
    lb = [0] * L
    for x in r.tensors:
        if layer_of(x.name) is not None:
            lb[layer_of(x.name)] += int(x.n_bytes)
    emb = int(t["token_embd.weight"].n_bytes)
    head = int(t["output_norm.weight"].n_bytes) + int((t.get("output.weight") or t["token_embd.weight"]).n_bytes)
    return lb, emb, head


def stage_cost(lb, emb, head, bounds, k):
    n = len(bounds) - 1
    return sum(lb[bounds[k]:bounds[k + 1]]) + (emb if k == 0 else 0) + (head if k == n - 1 else 0)


def brute_minimax(lb, emb, head, n):
    """The smallest possible largest stage over every cut of len(lb) layers into n stages."""
    L = len(lb)
    best = None
    for cuts in itertools.combinations(range(1, L), n - 1):
        b = [0, *cuts, L]
        m = max(stage_cost(lb, emb, head, b, k) for k in range(n))
        best = m if best is None else min(best, m)
    return best


def shard_fp(r, model_fp, k, n, b, e):
    """shard.h's shard fingerprint, recomputed from a GGUFReader of the shard."""
    h = xxhash.xxh3_128()
    h.update(model_fp.encode())
    h.update(struct.pack("<IIII", k, n, b, e))
    for t in r.tensors:
        name = t.name.encode()
        h.update(struct.pack("<I", len(name)) + name)
        h.update(struct.pack("<II", int(t.tensor_type), len(t.shape)))
        for d in t.shape:
            h.update(struct.pack("<Q", int(d)))
        h.update(raw(r, t))
    return h.hexdigest()


def expected_tensors(orig, k, bounds):
    """{name in the shard: name of the original tensor holding its bytes} for stage k."""
    n = len(bounds) - 1
    names = {}
    have = {t.name for t in orig.tensors}
    for t in orig.tensors:
        L = layer_of(t.name)
        if L is not None:
            keep = bounds[k] <= L < bounds[k + 1]
        elif t.name.startswith("token_embd."):
            keep = k == 0
        elif t.name.startswith(("output_norm.", "output.")):
            keep = k == n - 1
        else:
            require(t.name.startswith("rope_freqs."), lambda: f"test does not know where {t.name} goes")
            keep = True
        if keep:
            names[t.name] = t.name
    if k == n - 1 and "output.weight" not in have:
        names["output.weight"] = "token_embd.weight"
    return names


def verify_split(model, out, bounds, addresses=None):
    """Every check on one split of model into out with the given layer bounds."""
    n = len(bounds) - 1
    orig = gguf.GGUFReader(model)
    of = fields(orig)
    arch = of["general.architecture"].contents()
    L = of[f"{arch}.block_count"].contents()
    otens = {t.name: t for t in orig.tensors}
    model_fp = xxhash.xxh3_128_hexdigest(open(model, "rb").read())
    fleet = json.load(open(os.path.join(out, "fleet.json")))
    require(set(fleet) == {"pipeshard_fleet", "model", "model_fingerprint", "n_layer", "stages"},
            lambda: sorted(fleet))
    require(fleet["pipeshard_fleet"] == 1 and fleet["model"] == os.path.basename(model), lambda: fleet)
    require(fleet["model_fingerprint"] == model_fp,
            lambda: f"model fingerprint {fleet['model_fingerprint']} != {model_fp}")
    require(fleet["n_layer"] == L and len(fleet["stages"]) == n, lambda: (fleet["n_layer"], len(fleet["stages"])))
    addresses = addresses or [f"127.0.0.1:{7700 + k}" for k in range(1, n)]
    vocab = int(otens["token_embd.weight"].shape[1])
    for k, st in enumerate(fleet["stages"]):
        b, e = bounds[k], bounds[k + 1]
        path = os.path.join(out, st["shard"])
        want = {"stage": k, "shard": f"stage-{k}.gguf", "layers": [b, e], "bytes": os.path.getsize(path),
                "address": "local" if k == 0 else addresses[k - 1]}
        for key, v in want.items():
            require(st[key] == v, lambda: f"fleet stage {k}: {key} = {st[key]!r}, expected {v!r}")
        r = gguf.GGUFReader(path)
        require(r.fields["GGUF.version"].contents() == orig.fields["GGUF.version"].contents(),
                'r.fields["GGUF.version"].contents() == orig.fields["GGUF.version"].contents()')
        # tensors: exactly the expected ones, each the original's type, shape and bytes
        tens = {t.name: t for t in r.tensors}
        exp = expected_tensors(orig, k, bounds)
        require(set(tens) == set(exp), lambda: f"stage {k}: tensors {sorted(set(tens) ^ set(exp))} differ")
        require(len(r.tensors) == len(tens), lambda: f"stage {k}: duplicate tensor names")
        for name, src in exp.items():
            t, o = tens[name], otens[src]
            require(t.tensor_type == o.tensor_type and list(t.shape) == list(o.shape),
                    lambda: f"stage {k}: {name} differs")
            require(raw(r, t) == raw(orig, o), lambda: f"stage {k}: bytes of {name} differ from {src}")
        # metadata: every original key with its type and value, plus the pipeshard.* keys
        sf = fields(r)
        for key, f in of.items():
            require(key in sf, lambda: f"stage {k}: metadata {key} missing")
            require(sf[key].types == f.types, lambda: f"stage {k}: {key} types {sf[key].types} != {f.types}")
            require(sf[key].contents() == f.contents(), lambda: f"stage {k}: {key} value differs")
        ps = {"pipeshard.shard.version": 1, "pipeshard.stage.index": k, "pipeshard.stage.count": n,
              "pipeshard.layer_begin": b, "pipeshard.layer_end": e, "pipeshard.vocab_size": vocab,
              "pipeshard.model_fingerprint": model_fp, "pipeshard.shard_fingerprint": st["fingerprint"]}
        require(set(sf) == set(of) | set(ps), lambda: f"stage {k}: extra keys {sorted(set(sf) - set(of) - set(ps))}")
        for key, v in ps.items():
            typ = gguf.GGUFValueType.STRING if isinstance(v, str) else gguf.GGUFValueType.UINT32
            require(sf[key].types == [typ], lambda: f"stage {k}: {key} has type {sf[key].types}")
            require(sf[key].contents() == v, lambda: f"stage {k}: {key} = {sf[key].contents()!r}, expected {v!r}")
        fp = shard_fp(r, model_fp, k, n, b, e)
        require(fp == st["fingerprint"],
                lambda: f"stage {k}: recomputed shard fingerprint {fp} != {st['fingerprint']}")
        LIB.check_shard(path, k, n, b, e, vocab, model_fp, fp)
    return fleet


def bounds_of(fleet):
    return [s["layers"][0] for s in fleet["stages"]] + [fleet["stages"][-1]["layers"][1]]


def check_table(p, fleet, out):
    """The stdout table has a row per stage: stage, layers, bytes, address."""
    rows = [l.split() for l in p.stdout.splitlines()[1:] if l.strip()]
    require(p.stdout.splitlines()[0].split()[:4] == ["stage", "layers", "bytes", "MiB"], lambda: p.stdout)
    require(len(rows) == len(fleet["stages"]), lambda: p.stdout)
    for row, st in zip(rows, fleet["stages"]):
        require(row[0] == str(st["stage"]) and row[1] == "%d:%d" % tuple(st["layers"]), lambda: row)
        require(row[2] == str(st["bytes"]) and row[4] == st["address"], lambda: row)
        require(row[5] == os.path.join(out, st["shard"]), lambda: row)


# ------------------------------------------------------------------------------ library (ctypes)
class Stage(ctypes.Structure):
    _fields_ = [("index", ctypes.c_int), ("shard", ctypes.c_char * 4096), ("address", ctypes.c_char * 256),
                ("layer_begin", ctypes.c_int), ("layer_end", ctypes.c_int), ("fingerprint", ctypes.c_char * 33),
                ("bytes", ctypes.c_uint64)]


class Fleet(ctypes.Structure):
    _fields_ = [("model_fp", ctypes.c_char * 33), ("n_layer", ctypes.c_int), ("n_stages", ctypes.c_int),
                ("stages", Stage * 64)]


class Meta(ctypes.Structure):
    _fields_ = [("present", ctypes.c_bool), ("stage_index", ctypes.c_int), ("stage_count", ctypes.c_int),
                ("layer_begin", ctypes.c_int), ("layer_end", ctypes.c_int), ("vocab", ctypes.c_int),
                ("model_fp", ctypes.c_char * 33), ("shard_fp", ctypes.c_char * 33)]


class Lib:
    """The shard functions of libpscore through ctypes (None when the library is absent)."""

    def __init__(self, path):
        c = ctypes
        self.lib = lib = c.CDLL(path)
        E = [c.c_char_p, c.c_size_t]
        lib.ps_shard_plan.argtypes = [c.POINTER(c.c_uint64), c.c_int, c.c_uint64, c.c_uint64, c.c_int,
                                      c.POINTER(c.c_int)] + E
        lib.ps_fleet_load.argtypes = [c.c_char_p, c.POINTER(Fleet)] + E
        lib.ps_gguf_open.argtypes = [c.c_char_p, c.POINTER(c.c_void_p)] + E
        lib.ps_gguf_close.argtypes = [c.c_void_p]
        lib.ps_shard_meta_read.argtypes = [c.c_void_p, c.POINTER(Meta)] + E
        lib.ps_shard_fingerprint.argtypes = [c.c_void_p, c.POINTER(Meta), c.c_char_p] + E
        lib.ps_fingerprint_file.argtypes = [c.c_char_p, c.c_char_p] + E
        for f in ("ps_shard_plan", "ps_fleet_load", "ps_gguf_open", "ps_shard_meta_read", "ps_shard_fingerprint",
                  "ps_fingerprint_file"):
            getattr(lib, f).restype = c.c_int

    def plan(self, lb, emb, head, n):
        err = ctypes.create_string_buffer(512)
        bounds = (ctypes.c_int * (n + 1))()
        st = self.lib.ps_shard_plan((ctypes.c_uint64 * len(lb))(*lb), len(lb), emb, head, n, bounds, err, 512)
        return st, list(bounds), err.value.decode()

    def fleet(self, path):
        f = Fleet()
        err = ctypes.create_string_buffer(512)
        st = self.lib.ps_fleet_load(path.encode(), ctypes.byref(f), err, 512)
        return st, f, err.value.decode()

    def meta(self, path):
        """(status, Meta, our shard fingerprint or None, error text) of a GGUF file."""
        g = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        if self.lib.ps_gguf_open(path.encode(), ctypes.byref(g), err, 512):
            raise AssertionError(f"ps_gguf_open {path}: {err.value.decode()}")
        m = Meta()
        fp = None
        try:
            st = self.lib.ps_shard_meta_read(g, ctypes.byref(m), err, 512)
            if st == 0 and m.present:
                hx = ctypes.create_string_buffer(33)
                require(self.lib.ps_shard_fingerprint(g, ctypes.byref(m), hx, err, 512) == 0, lambda: err.value)
                fp = hx.value.decode()
        finally:
            self.lib.ps_gguf_close(g)
        return st, m, fp, err.value.decode()

    def check_shard(self, path, k, n, b, e, vocab, model_fp, fp):
        st, m, ours, err = self.meta(path)
        require(st == 0 and m.present, lambda: f"ps_shard_meta_read {path}: {st} {err}")
        got = (m.stage_index, m.stage_count, m.layer_begin, m.layer_end, m.vocab, m.model_fp.decode(),
               m.shard_fp.decode())
        require(got == (k, n, b, e, vocab, model_fp, fp), lambda: f"{path}: meta {got}")
        require(ours == fp, lambda: f"{path}: ps_shard_fingerprint {ours} != metadata {fp}")


class NoLib:
    def check_shard(self, *a):
        pass


LIB = NoLib()


# ------------------------------------------------------------------------------ cases
def case_models():
    """The synth models every later case uses."""
    MODELS["tied-q8"] = synth("tied-q8.gguf", ["--layers", "6", "--dim", "64", "--heads", "4", "--kv-heads", "2",
                                               "--ffn", "128", "--vocab", "512", "--type", "Q8_0"])
    MODELS["untied-q4"] = synth("untied-q4.gguf", ["--layers", "7", "--dim", "64", "--heads", "4", "--ffn", "96",
                                                   "--vocab", "600", "--type", "Q4_0", "--untied", "--seed", "3"])
    MODELS["q4km"] = synth("q4km.gguf", ["--layers", "8", "--dim", "256", "--heads", "4", "--kv-heads", "2",
                                         "--ffn", "512", "--vocab", "1000", "--type", "Q4_K_M", "--untied"])
    MODELS["qwen2-f16"] = synth("qwen2-f16.gguf", ["--arch", "qwen2", "--layers", "4", "--dim", "64", "--heads", "4",
                                                   "--kv-heads", "1", "--ffn", "128", "--vocab", "400", "--type",
                                                   "F16"])
    MODELS["l32-rope"] = synth("l32-rope.gguf", ["--like", "llama-3.2-1b", "--layers", "3", "--dim", "256",
                                                 "--heads", "4", "--kv-heads", "2", "--ffn", "512", "--vocab", "600",
                                                 "--type", "Q8_0"])
    require("rope_freqs.weight" in {t.name for t in gguf.GGUFReader(MODELS["l32-rope"]).tensors},
            '"rope_freqs.weight" in {t.name for t in gguf.GGUFReader(MODELS["l32-rope"]).tensors}')
    lb, _, _ = costs(gguf.GGUFReader(MODELS["q4km"]))
    require(len(set(lb)) > 1, lambda: f"Q4_K_M layers should differ in size: {lb}")
    print(f"  ok: {len(MODELS)} synth models")


def check_default_plans(model, max_stages=4, label=None):
    """--stages 1..max_stages: every shard checked, the plan's largest stage minimal."""
    r = gguf.GGUFReader(model)
    lb, emb, head = costs(r)
    for n in range(1, min(max_stages, len(lb)) + 1):
        out = os.path.join(TMP, f"{label}-s{n}")
        p = split(model, out, ["--stages", str(n)])
        fleet = verify_split(model, out, bounds_of(json.load(open(os.path.join(out, "fleet.json")))))
        check_table(p, fleet, out)
        b = bounds_of(fleet)
        got = max(stage_cost(lb, emb, head, b, k) for k in range(n))
        best = brute_minimax(lb, emb, head, n)
        require(got == best, lambda: f"{label} --stages {n}: largest stage {got} bytes (bounds {b}), optimum {best}")
        require(p.stderr == "", lambda: f"--quiet printed {p.stderr!r}")
    return lb


def case_default_plans():
    for name, path in MODELS.items():
        lb = check_default_plans(path, label=name)
        print(f"  ok: {name} ({len(lb)} layers), --stages 1..{min(4, len(lb))}: shards exact, plan optimal")


def case_stories():
    path = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
    if not os.path.exists(path):
        skip(f"stories260K: {path} is absent (a user's clone does not have it)")
        return
    check_default_plans(path, max_stages=5, label="stories")
    out = os.path.join(TMP, "stories-layers")
    split(path, out, ["--layers", "0:1,1:4,4:5", "--workers", "10.0.0.2:9000,[::1]:7777"])
    verify_split(path, out, [0, 1, 4, 5], ["10.0.0.2:9000", "[::1]:7777"])
    print("  ok: stories260K (untied F32), --stages 1..5 and --layers 0:1,1:4,4:5 with --workers")


def case_layers_workers():
    m = MODELS["tied-q8"]
    out = os.path.join(TMP, "tied-layers")
    p = sh("split", ["-m", m, "--layers", "0:1,1:5,5:6", "--workers", "gpu-box.local:7801,unix:/run/ps/w2.sock", "-o",
                     out])
    fleet = verify_split(m, out, [0, 1, 5, 6], ["gpu-box.local:7801", "unix:/run/ps/w2.sock"])
    check_table(p, fleet, out)
    require("wrote 3 shards" in p.stderr, lambda: p.stderr)
    # --stages and --layers that agree; an existing directory is rewritten in place
    split(m, out, ["--stages", "2", "--layers", "0:3,3:6"])
    verify_split(m, out, [0, 3, 6])
    # --stages 1: one shard with everything, and a copy of the tied embedding as output.weight
    out1 = os.path.join(TMP, "tied-one")
    split(m, out1, ["--stages", "1"])
    verify_split(m, out1, [0, 6])
    names = {t.name for t in gguf.GGUFReader(os.path.join(out1, "stage-0.gguf")).tensors}
    require({"token_embd.weight", "output.weight", "output_norm.weight"} <= names,
            '{"token_embd.weight", "output.weight", "output_norm.weight"} <= names')
    # a nested output directory is created
    deep = os.path.join(TMP, "a", "b", "c")
    split(m, deep, ["--stages", "6"])
    verify_split(m, deep, list(range(7)))
    # stage 0 with the embedding alone (0:0), the layers after it; also beside six one-layer stages
    lean = os.path.join(TMP, "tied-lean")
    split(m, lean, ["--layers", "0:0,0:4,4:6"])
    fleet = verify_split(m, lean, [0, 0, 4, 6])
    names = {t.name for t in gguf.GGUFReader(os.path.join(lean, "stage-0.gguf")).tensors}
    require(names == {"token_embd.weight"} and fleet["stages"][0]["layers"] == [0, 0],
            lambda: f"stage 0 with no layer holds {sorted(names)}: {fleet['stages'][0]}")
    split(m, lean, ["--stages", "7", "--layers", "0:0,0:1,1:2,2:3,3:4,4:5,5:6"])
    verify_split(m, lean, [0, 0, 1, 2, 3, 4, 5, 6])
    print("  ok: --layers with --workers, --stages + --layers, --stages 1 (tied copy), 6 one-layer stages, "
          "nested -o, an empty stage 0 (0:0)")


def write_odd_model(path, names, block_count=3, alignment=None):
    """A GGUF (llama metadata, block_count) with F32 tensors of the given names: 2-D [8, 5]
    for token_embd/output, 1-D of 3 floats otherwise (12 bytes: padding matters)."""
    import numpy as np
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(block_count)
    if alignment:
        w.add_custom_alignment(alignment)
    for i, n in enumerate(names):
        shape = (5, 8) if n in ("token_embd.weight", "output.weight") else (3,)
        w.add_tensor(n, np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def case_odd_models():
    """A 64-byte aligned model keeps its alignment; tensors without a place are refused."""
    layers = [f"blk.{i}.attn_norm.weight" for i in range(3)]
    path = write_odd_model(os.path.join(TMP, "align64.gguf"), ["token_embd.weight", *layers, "output_norm.weight"],
                           alignment=64)
    out = os.path.join(TMP, "align64")
    split(path, out, ["--stages", "3"])
    verify_split(path, out, [0, 1, 2, 3])
    for k in range(3):
        r = gguf.GGUFReader(os.path.join(out, f"stage-{k}.gguf"))
        require(r.fields["general.alignment"].contents() == 64, 'r.fields["general.alignment"].contents() == 64')
        require(all(t.data_offset % 64 == 0 for t in r.tensors), lambda: [t.data_offset for t in r.tensors])
    bad = [
        (["token_embd.weight", *layers, "output_norm.weight", "foo.weight"], 3,
         ["tensor 'foo.weight' belongs to no stage"]),
        (["token_embd.weight", *layers[:2], "output_norm.weight"], 3, ["no tensors for layer 2"]),
        (["token_embd.weight", *layers, "blk.5.attn_norm.weight", "output_norm.weight"], 3,
         ["'blk.5.attn_norm.weight' belongs to layer 5", "block_count is 3"]),
        (["token_embd.weight", *layers, "blk.x.attn_norm.weight"], 3, ["'blk.x.attn_norm.weight'", "layer number"]),
        ([*layers, "output.weight", "output_norm.weight"], 3, ["lacks tensor 'token_embd.weight'"]),
    ]
    for i, (names, bc, words) in enumerate(bad):
        m = write_odd_model(os.path.join(TMP, f"odd-{i}.gguf"), names, bc)
        p = sh("split", ["-m", m, "-o", os.path.join(TMP, f"odd-{i}"), "--stages", "2"], expect=1)
        require(p.stderr.count("\n") == 1 and p.stderr.startswith("pipeshard split: "), lambda: p.stderr)
        require(all(w in p.stderr for w in words), lambda: f"{names}: {p.stderr!r} lacks {words}")
        require(not os.path.exists(os.path.join(TMP, f"odd-{i}")), "a refused split left its output directory")
    print(f"  ok: alignment 64 kept; {len(bad)} models with misplaced tensors refused")


def case_help():
    p = sh("split", ["--help"])
    for w in ("usage: pipeshard split", "--stages", "--layers", "--workers", "--quiet", "-o, --output"):
        require(w in p.stdout, lambda: f"--help lacks {w}")
    p = subprocess.run([BIN, "--help"], capture_output=True, text=True)
    require("split" in p.stdout, lambda: p.stdout)
    print("  ok: --help, listed in pipeshard --help")


def bad_cases():
    m = MODELS["tied-q8"]   # 6 layers
    out = os.path.join(TMP, "bad-out")
    notgguf = os.path.join(TMP, "not-a-model.gguf")
    with open(notgguf, "w") as f:
        f.write("this is not a GGUF file\n")
    a_file = os.path.join(TMP, "a-file")
    open(a_file, "w").close()
    shard = os.path.join(TMP, "tied-q8-s2", "stage-1.gguf")
    B = ["-m", m, "-o", out]
    return [
        (B + ["--layers", "0:2,3:6"], 2, ["--layers", "must start at 2", "gap"]),
        (B + ["--layers", "0:3,2:6"], 2, ["--layers", "must start at 3", "overlap"]),
        (B + ["--layers", "1:3,3:6"], 2, ["--layers", "first range", "must start at 0"]),
        (B + ["--layers", "0:2,2:5"], 2, ["--layers", "ends at 5", "6 layers"]),
        (B + ["--layers", "0:2,2:7"], 2, ["--layers", "past", "6 layers"]),
        (B + ["--layers", "0:2,2:2,2:6"], 2, ["--layers", "'2:2' is empty", "only the first may be: 0:0"]),
        (B + ["--layers", "0:0"], 2, ["--layers", "ends at 0", "6 layers"]),
        (B + ["--layers", "0:0,0:0,0:6"], 2, ["--layers", "'0:0' is empty"]),
        (B + ["--stages", "3", "--layers", "0:3,3:6"], 2, ["2 ranges", "--stages is 3"]),
        (B + ["--stages", "2", "--layers", "0:2,2:4,4:6"], 2, ["more than the 2 ranges"]),
        (B + ["--layers", "0-3,3:6"], 2, ["--layers", "'0-3' is not BEGIN:END"]),
        (B + ["--layers", "garbage"], 2, ["--layers", "not BEGIN:END"]),
        (B + ["--layers", "0:3,,3:6"], 2, ["--layers", "range 2", "not BEGIN:END"]),
        (B + ["--layers", "0:3,3:6,"], 2, ["--layers", "range 3", "not BEGIN:END"]),
        (B + ["--layers", "0:3,3:6x"], 2, ["--layers", "not BEGIN:END"]),
        (B + ["--layers", "-1:3,3:6"], 2, ["--layers", "not BEGIN:END"]),
        (B + ["--stages", "0"], 2, ["--stages", "between 1 and 64", "got 0"]),
        (B + ["--stages", "65"], 2, ["--stages", "between 1 and 64"]),
        (B + ["--stages", "7"], 2, ["--stages 7", "6 layers"]),
        (B + ["--stages", "two"], 2, ["--stages", "integer", "two"]),
        (B + ["--stages", "2", "--stages", "3"], 2, ["'--stages' is given twice"]),
        (["-o", out, "--stages", "2"], 2, ["missing -m"]),
        (["-m", m, "--stages", "2"], 2, ["missing -o"]),
        (B, 2, ["missing --stages"]),
        (B + ["--stages", "2", "--bogus"], 2, ["unknown option", "--bogus"]),
        (B + ["--stages", "2", "extra"], 2, ["unexpected argument 'extra'", "see pipeshard split --help"]),
        (B + ["--stages"], 2, ["--stages", "needs a value"]),
        (B + ["--stages", "3", "--workers", "h:1"], 2, ["--workers gives 1 address", "2 stages"]),
        (B + ["--layers", "0:3,3:6", "--workers", "h:1,h:2"], 2, ["--workers gives 2 addresses", "1 stage needs"]),
        (B + ["--stages", "2", "--workers", "nohost"], 2, ["--workers", "'nohost' is not HOST:PORT"]),
        (B + ["--stages", "2", "--workers", "h:0"], 2, ["'h:0' is not HOST:PORT"]),
        (B + ["--stages", "2", "--workers", "h:65536"], 2, ["'h:65536' is not HOST:PORT"]),
        (B + ["--stages", "2", "--workers", "a b:80"], 2, ["'a b:80' is not HOST:PORT"]),
        (B + ["--stages", "2", "--workers", "unix:"], 2, ["'unix:' is not HOST:PORT or unix:PATH"]),
        (B + ["--stages", "2", "--workers", "unix:/" + "x" * 107], 2, ["is not HOST:PORT or unix:PATH"]),
        (B + ["--stages", "2", "--workers", "unix:/a b"], 2, ["'unix:/a b' is not HOST:PORT or unix:PATH"]),
        (B + ["--stages", "1", "--workers", "h:1"], 2, ["--workers", "only one stage"]),
        (["-m", os.path.join(TMP, "no-such-model.gguf"), "-o", out, "--stages", "2"], 1, ["no-such-model.gguf"]),
        (["-m", notgguf, "-o", out, "--stages", "2"], 1, ["not-a-model.gguf"]),
        (["-m", shard, "-o", out, "--stages", "2"], 1, ["is a shard", "stage 1 of 2"]),
        (["-m", m, "-o", os.path.join(a_file, "sub"), "--stages", "2"], 1, ["cannot create directory", "a-file"]),
    ]


def case_bad():
    cases = bad_cases()
    for args, code, words in cases:
        p = sh("split", args, expect=None)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        shown = "split " + " ".join(args)
        require(p.returncode == code, lambda: f"{shown}: exit {p.returncode}, expected {code}: {p.stderr!r}")
        require(len(lines) == 1, lambda: f"{shown}: {len(lines)} stderr lines: {p.stderr!r}")
        require(lines[0].startswith("pipeshard split: "), lambda: lines[0])
        require(all(w.lower() in lines[0].lower() for w in words), lambda: f"{shown}: {lines[0]!r} lacks {words}")
        require(p.stdout == "", lambda: f"{shown}: printed {p.stdout!r}")
    require(not os.path.exists(os.path.join(TMP, "bad-out")), "a refused split left its output directory behind")
    print(f"  ok: {len(cases)} bad command lines refused with one line each")


def case_plan_lib():
    """ps_shard_plan against brute force on random sizes, and its argument checks."""
    rnd = random.Random(5)
    n_cases = 0
    for _ in range(300):
        L = rnd.randint(1, 9)
        big = rnd.choice([10, 1000, 10 ** 12])
        lb = [rnd.randint(0 if rnd.random() < 0.1 else 1, big) for _ in range(L)]
        emb, head = rnd.randint(0, 3 * big), rnd.randint(0, 3 * big)
        for n in range(1, min(L, 5) + 1):
            st, b, err = LIB.plan(lb, emb, head, n)
            require(st == 0, lambda: err)
            require(b[0] == 0 and b[-1] == L and all(x < y for x, y in zip(b, b[1:])), lambda: f"bad bounds {b}")
            got = max(stage_cost(lb, emb, head, b, k) for k in range(n))
            require(got == brute_minimax(lb, emb, head, n), lambda: f"plan {lb} {emb} {head} n={n}: {b} gives {got}")
            n_cases += 1
    # equal layers with a heavy embedding: stage 0 gets fewer layers; among optimal cuts the most even
    st, b, _ = LIB.plan([10] * 12, 40, 0, 3)
    require(st == 0 and max(stage_cost([10] * 12, 40, 0, b, k) for k in range(3)) == 60 and b[1] < 4, lambda: b)
    st, b, _ = LIB.plan([10] * 6, 0, 0, 3)
    require(st == 0 and b == [0, 2, 4, 6], lambda: b)
    st, b, _ = LIB.plan([5] * 9, 0, 20, 3)
    require(st == 0 and max(stage_cost([5] * 9, 0, 20, b, k) for k in range(3)) == 25 and b[2] == 8, lambda: b)
    st, b, err = LIB.plan([1, 2, 3], 0, 0, 4)
    require(st != 0 and "3 layers into 4 stages" in err, lambda: err)
    st, b, err = LIB.plan([1, 2, 3], 0, 0, 0)
    require(st != 0 and "stage count 0" in err, lambda: err)
    print(f"  ok: ps_shard_plan optimal on {n_cases} random cases, refuses more stages than layers")


def case_fleet_lib():
    """ps_fleet_load: resolved paths, and one message naming the field per broken fleet."""
    out = os.path.join(TMP, "fleet-src")
    split(MODELS["tied-q8"], out, ["--layers", "0:2,2:4,4:6"])
    path = os.path.join(out, "fleet.json")
    good = json.load(open(path))
    st, f, err = LIB.fleet(path)
    require(st == 0, lambda: err)
    require((f.n_layer, f.n_stages, f.model_fp.decode()) == (6, 3, good["model_fingerprint"]),
            '(f.n_layer, f.n_stages, f.model_fp.decode()) == (6, 3, good["model_fingerprint"])')
    for k, s in enumerate(good["stages"]):
        g = f.stages[k]
        require(g.shard.decode() == os.path.join(out, s["shard"]), lambda: g.shard)
        require((g.index, g.layer_begin, g.layer_end, g.bytes) == (k, *s["layers"], s["bytes"]),
                '(g.index, g.layer_begin, g.layer_end, g.bytes) == (k, *s["layers"], s["bytes"])')
        require((g.fingerprint.decode(), g.address.decode()) == (s["fingerprint"], s["address"]),
                '(g.fingerprint.decode(), g.address.decode()) == (s["fingerprint"], s["address"])')
    bad = os.path.join(TMP, "fleet-bad.json")

    def broken(edit, words):
        doc = json.loads(json.dumps(good))
        text = edit(doc)
        with open(bad, "w") as fh:
            fh.write(text if isinstance(text, str) else json.dumps(doc))
        st, _, err = LIB.fleet(bad)
        require(st != 0, lambda: f"broken fleet accepted ({words})")
        require(err.startswith(bad + ": "), lambda: err)
        require(all(w in err for w in words), lambda: f"{err!r} lacks {words}")

    broken(lambda d: d["stages"][2].update(layers=[3, 6]), ["stages[2].layers must start at 4"])
    broken(lambda d: d["stages"][1].update(layers=[3, 3]), ["stages[1].layers must be [BEGIN, END]"])
    broken(lambda d: d.update(stages=[dict(d["stages"][0], layers=[0, 0])]), ["stages[0].layers must be [BEGIN, END]",
                                                                           "stage 0 of several may be [0, 0]"])
    broken(lambda d: d["stages"][1].update(layers=[2, 4.5]), ["stages[1].layers must be [BEGIN, END]"])
    broken(lambda d: d["stages"][2].update(layers=[4, 5]), ["stages[2].layers must end at n_layer (6), not 5"])
    broken(lambda d: d["stages"][0].update(address="127.0.0.1:7700"), ["stages[0].address must be \"local\""])
    broken(lambda d: d["stages"][1].update(address="no-port"), ["stages[1].address", "not HOST:PORT"])
    broken(lambda d: d["stages"][2].update(address=7702), ["stages[2].address must be a string"])
    broken(lambda d: d["stages"][1].update(fingerprint="abc"), ["stages[1].fingerprint must be 32 lowercase hex"])
    broken(lambda d: d["stages"][1].update(stage=2), ["stages[1].stage must be 1"])
    broken(lambda d: d["stages"][0].update(bytes=-1), ["stages[0].bytes must be an integer"])
    broken(lambda d: d["stages"][0].pop("shard") and None, ["stages[0].shard is missing"])
    broken(lambda d: d.pop("n_layer"), ["n_layer is missing"])
    broken(lambda d: d.update(model_fingerprint="X" * 32), ["model_fingerprint must be 32 lowercase hex"])
    broken(lambda d: d.update(pipeshard_fleet=2), ["pipeshard_fleet 2 is not supported"])
    broken(lambda d: d.update(stages=[]), ["stages must be an array"])
    broken(lambda d: d.update(stages={}), ["stages must be an array"])
    broken(lambda d: "{\"pipeshard_fleet\": 1,\n  \"stages\": [}", ["not valid JSON (line 2"])
    broken(lambda d: "[]", ["not a JSON object"])
    # an absolute shard path is kept; a relative one follows the fleet file
    doc = json.loads(json.dumps(good))
    doc["stages"][1]["shard"] = "/abs/where/stage-1.gguf"
    doc["stages"][2]["shard"] = "sub/stage-2.gguf"
    with open(bad, "w") as fh:
        json.dump(doc, fh)
    st, f, err = LIB.fleet(bad)
    require(st == 0, lambda: err)
    require(f.stages[1].shard == b"/abs/where/stage-1.gguf"
            and f.stages[2].shard.decode() == os.path.join(TMP, "sub/stage-2.gguf"),
            lambda: f"shard paths {f.stages[1].shard!r}, {f.stages[2].shard!r}")
    st, _, err = LIB.fleet(os.path.join(TMP, "no-such-fleet.json"))
    require(st != 0 and "no-such-fleet.json" in err, lambda: err)
    print("  ok: ps_fleet_load resolves paths; 18 broken fleets refused naming the field")


def write_meta_gguf(path, keys):
    """A GGUF with llama metadata (block_count 6), one tensor and the given extra keys:
    {key: (value, GGUFValueType)}."""
    import numpy as np
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(6)
    for k, (v, t) in keys.items():
        w.add_key_value(k, v, t)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def case_meta_lib():
    """ps_shard_meta_read on malformed pipeshard.* keys; the model fingerprint matches xxhash."""
    U, S, I = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32
    fp = "0123456789abcdef" * 2
    good = {"pipeshard.shard.version": (1, U), "pipeshard.stage.index": (1, U), "pipeshard.stage.count": (3, U),
            "pipeshard.layer_begin": (2, U), "pipeshard.layer_end": (4, U), "pipeshard.vocab_size": (500, U),
            "pipeshard.model_fingerprint": (fp, S), "pipeshard.shard_fingerprint": (fp, S)}
    path = os.path.join(TMP, "meta.gguf")
    write_meta_gguf(path, {})
    st, m, _, err = LIB.meta(path)
    require(st == 0 and not m.present, lambda: err)
    write_meta_gguf(path, good)
    st, m, _, err = LIB.meta(path)
    require(st == 0 and m.present and (m.stage_index, m.layer_begin, m.layer_end, m.vocab) == (1, 2, 4, 500),
            lambda: err)
    for k, (b, e) in ((0, (0, 0)), (1, (0, 4))):  # an empty stage 0, and the stage after it
        write_meta_gguf(path, {**good, "pipeshard.stage.index": (k, U), "pipeshard.layer_begin": (b, U),
                               "pipeshard.layer_end": (e, U)})
        st, m, _, err = LIB.meta(path)
        require(st == 0 and (m.stage_index, m.layer_begin, m.layer_end) == (k, b, e), lambda: f"stage {k}: {err}")
    bad = [
        ({"pipeshard.layer_begin": (4, U)}, ["layers 4:4"]),
        ({"pipeshard.layer_end": (7, U)}, ["layers 2:7", "0:6"]),
        ({"pipeshard.stage.index": (3, U)}, ["stage 3 of 3"]),
        ({"pipeshard.stage.count": (0, U)}, ["out of range"]),
        ({"pipeshard.stage.index": (0, U)}, ["cannot hold layers 2:4"]),
        ({"pipeshard.layer_end": (6, U)}, ["cannot hold layers 2:6"]),
        ({"pipeshard.shard.version": (2, U)}, ["version 2"]),
        ({"pipeshard.stage.index": (1, I)}, ["pipeshard.stage.index", "INT32", "UINT32"]),
        ({"pipeshard.model_fingerprint": (fp.upper(), S)}, ["pipeshard.model_fingerprint", "32 lowercase hex"]),
        ({"pipeshard.shard_fingerprint": (fp[:31], S)}, ["pipeshard.shard_fingerprint", "32 lowercase hex"]),
        ({"pipeshard.vocab_size": (0, U)}, ["vocab_size 0"]),
        # no layer: only stage 0 of several; a stage after an empty stage 0 starts at 0, none later
        ({"pipeshard.layer_begin": (0, U), "pipeshard.layer_end": (0, U)}, ["layers 0:0", "only stage 0"]),
        ({"pipeshard.stage.index": (0, U), "pipeshard.stage.count": (1, U), "pipeshard.layer_begin": (0, U),
          "pipeshard.layer_end": (0, U)}, ["layers 0:0", "only stage 0 of several"]),
        ({"pipeshard.stage.index": (2, U), "pipeshard.layer_begin": (0, U)}, ["stage 2 of 3 cannot hold layers 0:4"]),
    ]
    for change, words in bad:
        write_meta_gguf(path, {**good, **change})
        st, m, _, err = LIB.meta(path)
        require(st != 0 and not m.present, lambda: f"{change} accepted")
        require(all(w in err for w in words), lambda: f"{change}: {err!r} lacks {words}")
    write_meta_gguf(path, {"pipeshard.shard.version": (1, U)})
    st, _, _, err = LIB.meta(path)
    require(st != 0 and "lacks 'pipeshard.stage.index'" in err, lambda: err)
    hx = ctypes.create_string_buffer(33)
    e = ctypes.create_string_buffer(256)
    for name in MODELS.values():
        require(LIB.lib.ps_fingerprint_file(name.encode(), hx, e, 256) == 0, lambda: e.value)
        require(hx.value.decode() == xxhash.xxh3_128_hexdigest(open(name, "rb").read()),
                'hx.value.decode() == xxhash.xxh3_128_hexdigest(open(name, "rb").read())')
    print(f"  ok: ps_shard_meta_read refuses {len(bad) + 1} malformed shards; ps_fingerprint_file == xxhash")


CASES = [("models", case_models), ("default-plans", case_default_plans), ("stories260K", case_stories),
         ("layers-workers", case_layers_workers), ("odd-models", case_odd_models), ("help", case_help), ("bad", case_bad),
         ("plan-lib", case_plan_lib), ("fleet-lib", case_fleet_lib), ("meta-lib", case_meta_lib)]
LIB_CASES = {"plan-lib", "fleet-lib", "meta-lib"}


def main():
    global TMP, LIB
    if not BIN or not os.access(BIN, os.X_OK):
        print(f"FAIL: PIPESHARD_BIN={BIN!r} is not an executable (run through ctest)")
        return 1
    reexec_with_asan()
    libpath = os.environ.get("PS_LIBPSCORE", "")
    if libpath and os.path.exists(libpath):
        LIB = Lib(libpath)
    else:
        print(f"note: PS_LIBPSCORE={libpath!r} is absent: the library cases are skipped")
        skip(f"{', '.join(sorted(LIB_CASES))}: PS_LIBPSCORE={libpath!r} is absent")
    TMP = tmpdir("split-")
    failed = skipped = 0
    for name, fn in CASES:
        print(f"{name}:")
        if name in LIB_CASES and isinstance(LIB, NoLib):
            print("  skipped: no library")
            skipped += 1
            continue
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every case
            failed += 1
            print(f"  FAIL: {type(e).__name__}: {e}")
        if name == "models" and failed:
            break
    print(f"{len(CASES) - failed - skipped}/{len(CASES)} cases passed" + (f", {skipped} skipped" if skipped else ""))
    if not failed:
        shutil.rmtree(TMP, ignore_errors=True)   # kept for a look when something failed
    return exit_status(failed)


if __name__ == "__main__":
    sys.exit(main())
