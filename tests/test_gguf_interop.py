"""test_gguf_interop.py - our GGUF reader and writer against the Python `gguf` package.

(a) files written by gguf.GGUFWriter (every value type it can write, nested arrays, tensors
    of several types, default and custom alignment) are read by our reader, checked
    through ctypes on $PS_LIBPSCORE (every value, long arrays included) and through
    `$PIPESHARD_BIN inspect FILE --json` (summaries, tensor list) and --dump-tensor
    (against gguf.quants.dequantize, bit for bit);
(b) files written by our writer (driven through ctypes: every value type, nested arrays,
    tensors given directly and through the fill callback, versions 2 and 3, alignment
    32 and 64) are read by gguf.GGUFReader with identical contents.

Exit 0 pass, 1 fail (a missing gguf/numpy package or binary included).
"""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, verdict, failures, reexec_with_asan, require  # noqa: E402

import numpy as np  # noqa: E402 - scripts/setup.sh installs numpy and gguf: no skip without them
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

LIB = os.environ.get("PS_LIBPSCORE")
BIN = os.environ.get("PIPESHARD_BIN")
if not LIB or not os.path.exists(LIB) or not BIN or not os.path.exists(BIN):
    print("FAIL: PS_LIBPSCORE or PIPESHARD_BIN not set (run through ctest)")
    sys.exit(1)



reexec_with_asan(LIB)
TMP = tempfile.mkdtemp(prefix="gguf_interop_", dir=os.environ.get("PS_TEST_TMP") or None)





# ---------------------------------------------------------------------------------------------
# ctypes binding of src/gguf/gguf.h

class Str(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint64), ("data", ctypes.c_void_p)]


class Value(ctypes.Structure):
    pass


class Arr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("n", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("strs", ctypes.POINTER(Str)), ("elems", ctypes.POINTER(Value))]


class _U(ctypes.Union):
    _fields_ = [("u64", ctypes.c_uint64), ("i64", ctypes.c_int64), ("f64", ctypes.c_double),
                ("b", ctypes.c_bool), ("str", Str), ("arr", Arr)]


Value._anonymous_ = ("u",)
Value._fields_ = [("type", ctypes.c_int), ("u", _U)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("n_dims", ctypes.c_uint32), ("ne", ctypes.c_int64 * 4),
                ("type", ctypes.c_uint32), ("offset", ctypes.c_uint64), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_size_t)]


lib = ctypes.CDLL(LIB)
P = ctypes.c_void_p
lib.ps_gguf_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_size_t]
lib.ps_gguf_close.argtypes = [P]
for fn in ("ps_gguf_n_kv", "ps_gguf_n_tensors"):
    getattr(lib, fn).argtypes = [P]
    getattr(lib, fn).restype = ctypes.c_int64
for fn in ("ps_gguf_version", "ps_gguf_alignment"):
    getattr(lib, fn).argtypes = [P]
    getattr(lib, fn).restype = ctypes.c_uint32
lib.ps_gguf_kv_key.argtypes = [P, ctypes.c_int64]
lib.ps_gguf_kv_key.restype = ctypes.c_char_p
lib.ps_gguf_kv_value.argtypes = [P, ctypes.c_int64]
lib.ps_gguf_kv_value.restype = ctypes.POINTER(Value)
lib.ps_gguf_tensor_at.argtypes = [P, ctypes.c_int64]
lib.ps_gguf_tensor_at.restype = ctypes.POINTER(Tensor)
lib.ps_gguf_writer_create.argtypes = [ctypes.POINTER(P), ctypes.c_uint32, ctypes.c_uint32]
lib.ps_gguf_writer_free.argtypes = [P]
lib.ps_gguf_writer_set_value.argtypes = [P, ctypes.c_char_p, ctypes.POINTER(Value)]
lib.ps_gguf_writer_set_u32.argtypes = [P, ctypes.c_char_p, ctypes.c_uint32]
lib.ps_gguf_writer_set_f32.argtypes = [P, ctypes.c_char_p, ctypes.c_float]
lib.ps_gguf_writer_set_str.argtypes = [P, ctypes.c_char_p, ctypes.c_char_p]
lib.ps_gguf_writer_set_arr.argtypes = [P, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64]
lib.ps_gguf_writer_set_arr_str.argtypes = [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_uint64]
FILL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t,
                        ctypes.c_char_p, ctypes.c_size_t)
PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64)
lib.ps_gguf_writer_add_tensor.argtypes = [P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p, FILL, ctypes.c_void_p]
lib.ps_gguf_writer_write.argtypes = [P, ctypes.c_char_p, PROGRESS, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.ps_quantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
lib.ps_row_bytes.argtypes = [ctypes.c_uint32, ctypes.c_int64]
lib.ps_row_bytes.restype = ctypes.c_size_t
require(ctypes.sizeof(Value) == 48 and ctypes.sizeof(Tensor) == 80,
        'ctypes.sizeof(Value) == 48 and ctypes.sizeof(Tensor) == 80')

# ---------------------------------------------------------------------------------------------
# Canonical values: ("UINT8", 5), ("STRING", b"..."), ("ARRAY", "INT32", [canonical, ...]).
# Floats are Python floats holding the exact stored value (a FLOAT32 widened).

NP_OF = {VT.UINT8: np.uint8, VT.INT8: np.int8, VT.UINT16: np.uint16, VT.INT16: np.int16,
         VT.UINT32: np.uint32, VT.INT32: np.int32, VT.FLOAT32: np.float32, VT.UINT64: np.uint64,
         VT.INT64: np.int64, VT.FLOAT64: np.float64, VT.BOOL: np.uint8}


def canon(vtype, val, sub=None):
    """Canonical form of a Python value written as vtype (sub: element type of arrays)."""
    if vtype == VT.ARRAY:
        if sub is None:
            sub = VT.get_type(val[0])
        return ("ARRAY", sub.name, [canon(sub, x) for x in val])
    if vtype == VT.STRING:
        return ("STRING", val.encode() if isinstance(val, str) else bytes(val))
    if vtype == VT.BOOL:
        return ("BOOL", bool(val))
    return (vtype.name, NP_OF[vtype](val).item())


def from_c(v):
    """Canonical form of a ps_gguf_value read by our reader."""
    t = VT(v.type)
    if t == VT.STRING:
        return ("STRING", ctypes.string_at(v.str.data, v.str.len) if v.str.len else b"")
    if t == VT.BOOL:
        return ("BOOL", bool(v.b))
    if t in (VT.FLOAT32, VT.FLOAT64):
        return (t.name, v.f64)
    if t in (VT.INT8, VT.INT16, VT.INT32, VT.INT64):
        return (t.name, v.i64)
    if t != VT.ARRAY:
        return (t.name, v.u64)
    et, n = VT(v.arr.type), v.arr.n
    if et == VT.STRING:
        items = [("STRING", ctypes.string_at(v.arr.strs[i].data, v.arr.strs[i].len) if v.arr.strs[i].len else b"")
                 for i in range(n)]
    elif et == VT.ARRAY:
        items = [from_c(v.arr.elems[i]) for i in range(n)]
    else:
        raw = np.frombuffer(ctypes.string_at(v.arr.data, n * np.dtype(NP_OF[et]).itemsize), dtype=NP_OF[et]) \
            if n else np.zeros(0, NP_OF[et])
        items = [canon(et, x) for x in raw]
    return ("ARRAY", et.name, items)


def to_json(c):
    """What `inspect --json` should print for a canonical value."""
    if c[0] == "ARRAY":
        if len(c[2]) > 16:
            return {"type": c[1], "n": len(c[2])}
        return [to_json(x) for x in c[2]]
    if c[0] == "STRING":
        return c[1].decode("utf-8")
    return c[1]


def read_ours(path):
    """(version, alignment, {key: canonical}, [tensor dicts]) through ctypes, or raises."""
    g = P()
    err = ctypes.create_string_buffer(512)
    st = lib.ps_gguf_open(path.encode(), ctypes.byref(g), err, 512)
    if st != 0:
        raise RuntimeError(f"ps_gguf_open: status {st}: {err.value.decode()}")
    try:
        kv = {}
        for i in range(lib.ps_gguf_n_kv(g)):
            kv[lib.ps_gguf_kv_key(g, i).decode()] = from_c(lib.ps_gguf_kv_value(g, i).contents)
        tensors = []
        for i in range(lib.ps_gguf_n_tensors(g)):
            t = lib.ps_gguf_tensor_at(g, i).contents
            tensors.append({"name": t.name.decode(), "type": t.type, "ne": list(t.ne[:t.n_dims]),
                            "data": ctypes.string_at(t.data, t.nbytes)})
        return lib.ps_gguf_version(g), lib.ps_gguf_alignment(g), kv, tensors
    finally:
        lib.ps_gguf_close(g)


def decode_parts(parts, i, vtype):
    """Canonical value from a GGUFReader field's parts, starting at parts[i]."""
    vtype = VT(int(vtype))
    if vtype == VT.STRING:
        return ("STRING", bytes(parts[i + 1])), i + 2
    if vtype == VT.ARRAY:
        et, n = VT(int(parts[i][0])), int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            x, i = decode_parts(parts, i, et)
            items.append(x)
        return ("ARRAY", et.name, items), i
    if vtype == VT.BOOL:
        return ("BOOL", bool(parts[i][0])), i + 1
    return (vtype.name, parts[i][0].item()), i + 1


def read_theirs(path):
    r = gguf.GGUFReader(path)
    kv = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        kv[name], end = decode_parts(f.parts, 3, f.types[0])
        check(end == len(f.parts), f"{name}: all parts decoded")
    tensors = [{"name": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape],
                "data": np.asarray(t.data).tobytes()} for t in r.tensors]
    return r, kv, tensors


# ---------------------------------------------------------------------------------------------
# Metadata used by both directions: (key, vtype, python value, element type)

LONG = list(range(40))
METADATA = [
    ("t.u8", VT.UINT8, 250, None),
    ("t.i8", VT.INT8, -120, None),
    ("t.u16", VT.UINT16, 65000, None),
    ("t.i16", VT.INT16, -32000, None),
    ("t.u32", VT.UINT32, 4000000000, None),
    ("t.i32", VT.INT32, -2000000000, None),
    ("t.f32", VT.FLOAT32, 0.1, None),
    ("t.u64", VT.UINT64, 2**64 - 1, None),
    ("t.i64", VT.INT64, -2**63, None),
    ("t.f64", VT.FLOAT64, 1 / 3, None),
    ("t.bool_t", VT.BOOL, True, None),
    ("t.bool_f", VT.BOOL, False, None),
    ("t.str", VT.STRING, "caf\u00e9 \u2581tok \"q\" \\ \n\t end", None),
    ("t.str_empty", VT.STRING, "", None),
    ("a.u8", VT.ARRAY, [0, 7, 255], VT.UINT8),
    ("a.i8", VT.ARRAY, [-128, 127], VT.INT8),
    ("a.u16", VT.ARRAY, [1, 65535], VT.UINT16),
    ("a.i16", VT.ARRAY, [-32768, 5], VT.INT16),
    ("a.u32", VT.ARRAY, [3, 4294967295], VT.UINT32),
    ("a.i32", VT.ARRAY, [-1, 2, -3], VT.INT32),
    ("a.f32", VT.ARRAY, [0.5, -1e-5, 3.4e38], VT.FLOAT32),
    ("a.u64", VT.ARRAY, [2**64 - 1, 0], VT.UINT64),
    ("a.i64", VT.ARRAY, [-2**63, 2**63 - 1], VT.INT64),
    ("a.f64", VT.ARRAY, [1e300, -0.25], VT.FLOAT64),
    ("a.bool", VT.ARRAY, [True, False, True], VT.BOOL),
    ("a.str", VT.ARRAY, ["<s>", "", "\u2581hello", "w\u00f6rld"], VT.STRING),
    ("a.long_i32", VT.ARRAY, LONG, VT.INT32),
    ("a.long_str", VT.ARRAY, [f"tok{i}" for i in LONG], VT.STRING),
    ("a.arr_str", VT.ARRAY, [["a", "bc"], ["", "d\u00e9f", "g"]], VT.ARRAY),
    ("a.arr_i32", VT.ARRAY, [[1, -2, 3], [4]], VT.ARRAY),
    ("a.arr_arr_f32", VT.ARRAY, [[[0.5, 1.5]], [[2.5], [-3.5, 4.5]]], VT.ARRAY),
    ("a.arr_bool", VT.ARRAY, [[True], [False, True]], VT.ARRAY),
    ("a.arr_long", VT.ARRAY, [[i] for i in LONG], VT.ARRAY),
]
EXPECTED = {k: canon(t, v, s) for k, t, v, s in METADATA}

rng = np.random.default_rng(1234)


def quantized(qtype, rows, cols):
    """Valid data of qtype for a (rows, cols) tensor: gguf.quants where it can, else our quantizer."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    try:
        return np.asarray(gguf.quants.quantize(x, qtype))
    except NotImplementedError:
        rb = lib.ps_row_bytes(int(qtype), cols)
        out = np.zeros((rows, rb), dtype=np.uint8)
        for r in range(rows):
            row = np.ascontiguousarray(x[r])
            st = lib.ps_quantize_row(int(qtype), row.ctypes.data, out[r].ctypes.data, cols)
            require(st == 0, lambda: f"ps_quantize_row({qtype.name}) -> {st}")
        return out


# ---------------------------------------------------------------------------------------------
# (a) Python writes, we read


def python_writes(path, alignment=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, vtype, val, sub in METADATA:
        w.add_key_value(key, val, vtype, sub_type=sub)
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(20)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    tensors = {
        "token_embd.weight": (rng.standard_normal((20, 64)).astype(np.float32), None),
        "blk.0.attn_q.weight": (quantized(Q.Q8_0, 64, 64), Q.Q8_0),
        "blk.0.ffn_up.weight": (rng.standard_normal((3, 5, 64)).astype(np.float16), None),
        "blk.1.attn_q.weight": (quantized(Q.Q4_0, 64, 64), Q.Q4_0),
        "blk.1.attn_k.weight": (quantized(Q.Q4_K, 8, 256), Q.Q4_K),
        "blk.1.ffn_down.weight": (quantized(Q.Q6_K, 4, 512), Q.Q6_K),
        "blk.1.ffn_gate.weight": (quantized(Q.BF16, 3, 32), Q.BF16),
        "blk.1.attn_v.weight": (quantized(Q.Q5_1, 2, 64), Q.Q5_1),
        "output_norm.weight": (rng.standard_normal(64).astype(np.float32), None),
        "rope_freqs.idx": (np.arange(10, dtype=np.int32), None),
    }
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_python_to_ours(alignment):
    path = os.path.join(TMP, f"py_a{alignment or 32}.gguf")
    python_writes(path, alignment)
    r, their_kv, their_tensors = read_theirs(path)
    version, align, kv, tensors = read_ours(path)
    check(version == 3, f"version {version}")
    check(align == (alignment or 32), f"alignment {align}")
    for key, want in EXPECTED.items():
        check(kv.get(key) == want, f"{key}: ours {kv.get(key)!r} != written {want!r}")
    check(kv == their_kv, "all metadata equals what GGUFReader reads")
    check(list(kv) == list(their_kv), "metadata order")
    check(len(tensors) == len(their_tensors), "tensor count")
    for a, b in zip(tensors, their_tensors):
        check(a == b, f"tensor {a['name']} (ours) vs {b['name']} (GGUFReader): name, type, shape, bytes")

    # inspect --json
    out = subprocess.run([BIN, "inspect", path, "--json"], capture_output=True, text=True)
    check(out.returncode == 0, f"inspect --json exit {out.returncode}: {out.stderr}")
    j = json.loads(out.stdout)
    check(j["version"] == 3 and j["alignment"] == (alignment or 32), "json version/alignment")
    check(j["architecture"] == "llama", "json architecture")
    check(list(j["metadata"]) == list(kv), "json metadata keys in file order")
    for key, c in kv.items():
        check(j["metadata"].get(key) == to_json(c), f"json metadata {key}: {j['metadata'].get(key)!r} vs {to_json(c)!r}")
    check(j["hparams"]["block_count"] == 2 and j["hparams"]["embedding_length"] == 64, "json hparams")
    check(j["hparams"]["rope.freq_base"] == 10000.0, "json rope.freq_base")
    check(j["hparams"]["attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5)), "json rms eps exact")
    check(j["hparams"]["vocab_size"] == 20, "json vocab size from the token list")
    check(j["tokenizer"] == {"model": "gpt2", "vocab_size": 20, "bos_token_id": 1, "eos_token_id": 2,
                             "chat_template": False}, f"json tokenizer {j['tokenizer']}")
    check(j["n_tensors"] == len(r.tensors), "json n_tensors")
    names = {int(t.tensor_type): t.tensor_type.name for t in r.tensors}
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    check(j["tensor_types"] == counts, f"json tensor_types {j['tensor_types']} vs {counts}")
    check(j["total_bytes"] == sum(int(t.n_bytes) for t in r.tensors), "json total bytes")
    check(j["layers"]["count"] == 2, "json layer count")
    per = {l["index"]: l for l in j["layers"]["per_layer"]}
    for layer in (0, 1):
        ts = [t for t in r.tensors if t.name.startswith(f"blk.{layer}.")]
        check(per[layer]["n_tensors"] == len(ts) and per[layer]["bytes"] == sum(int(t.n_bytes) for t in ts),
              f"json layer {layer}")
    check(sorted(j["non_layer_tensors"]) == sorted(["token_embd.weight", "output_norm.weight", "rope_freqs.idx"]),
          "json non-layer tensors")
    for jt, t in zip(j["tensors"], r.tensors):
        check(jt["name"] == t.name and jt["type"] == names[int(t.tensor_type)] and jt["type_id"] == int(t.tensor_type)
              and jt["shape"] == [int(x) for x in t.shape] and jt["bytes"] == int(t.n_bytes)
              and jt["file_offset"] == int(t.data_offset), f"json tensor {t.name}")

    # text report mentions the essentials
    out = subprocess.run([BIN, "inspect", path], capture_output=True, text=True)
    check(out.returncode == 0 and "llama" in out.stdout and "block_count" in out.stdout
          and "Q4_K x1" in out.stdout, f"text report: {out.stdout[:400]} {out.stderr}")

    # --dump-tensor equals gguf.quants.dequantize bit for bit
    for t in r.tensors:
        if t.tensor_type == Q.I32:
            continue
        dump = os.path.join(TMP, "dump.f32")
        out = subprocess.run([BIN, "inspect", path, "--dump-tensor", t.name, "-o", dump], capture_output=True, text=True)
        if not check(out.returncode == 0, f"dump {t.name}: {out.stderr}"):
            continue
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).ravel()
        got = np.fromfile(dump, dtype="<f4")
        check(got.shape == ref.shape and np.array_equal(got.view(np.uint32), ref.view(np.uint32)),
              f"dump {t.name} ({t.tensor_type.name}) equals gguf.quants.dequantize")
    out = subprocess.run([BIN, "inspect", path, "--dump-tensor", "rope_freqs.idx", "-o", os.path.join(TMP, "x.f32")],
                         capture_output=True, text=True)
    check(out.returncode == 1 and out.stderr.startswith("pipeshard inspect: ") and "I32" in out.stderr,
          f"dump of an I32 tensor is refused: {out.stderr}")
    check(not os.path.exists(os.path.join(TMP, "x.f32")), "no output file after a refused dump")


# ---------------------------------------------------------------------------------------------
# (b) we write, Python reads

keep = []  # ctypes objects that must outlive the writer


def c_value(c):
    """A ps_gguf_value for a canonical value (its buffers kept alive in `keep`)."""
    v = Value()
    v.type = int(VT[c[0]])
    if c[0] == "STRING":
        buf = ctypes.create_string_buffer(c[1], len(c[1]) + 1)
        keep.append(buf)
        v.str.len, v.str.data = len(c[1]), ctypes.cast(buf, ctypes.c_void_p)
    elif c[0] == "BOOL":
        v.b = c[1]
    elif c[0] in ("FLOAT32", "FLOAT64"):
        v.f64 = c[1]
    elif c[0].startswith("INT"):
        v.i64 = c[1]
    elif c[0] != "ARRAY":
        v.u64 = c[1]
    else:
        et, items = VT[c[1]], c[2]
        v.arr.type, v.arr.n = int(et), len(items)
        if et == VT.STRING:
            strs = (Str * max(1, len(items)))()
            for i, s in enumerate(items):
                buf = ctypes.create_string_buffer(s[1], len(s[1]) + 1)
                keep.append(buf)
                strs[i].len, strs[i].data = len(s[1]), ctypes.cast(buf, ctypes.c_void_p)
            keep.append(strs)
            v.arr.strs = strs
        elif et == VT.ARRAY:
            elems = (Value * max(1, len(items)))()
            for i, e in enumerate(items):
                elems[i] = c_value(e)
            keep.append(elems)
            v.arr.elems = elems
        else:
            data = np.array([x[1] for x in items], dtype=NP_OF[et])
            keep.append(data)
            v.arr.data = data.ctypes.data
    return v


def test_ours_to_python(version, alignment):
    path = os.path.join(TMP, f"ours_v{version}_a{alignment}.gguf")
    w = P()
    check(lib.ps_gguf_writer_create(ctypes.byref(w), version, alignment) == 0, "writer create")
    expected = dict(EXPECTED)
    for key, c in EXPECTED.items():
        check(lib.ps_gguf_writer_set_value(w, key.encode(), ctypes.byref(c_value(c))) == 0, f"set {key}")
    check(lib.ps_gguf_writer_set_u32(w, b"s.u32", 77) == 0, "set_u32")
    check(lib.ps_gguf_writer_set_f32(w, b"s.f32", 0.3) == 0, "set_f32")
    check(lib.ps_gguf_writer_set_str(w, b"s.str", "\u00e9t\u00e9".encode()) == 0, "set_str")
    arr = np.array([1.5, -2.5], dtype=np.float32)
    check(lib.ps_gguf_writer_set_arr(w, b"s.arr", int(VT.FLOAT32), arr.ctypes.data, 2) == 0, "set_arr")
    toks = (ctypes.c_char_p * 3)(b"<s>", b"</s>", "\u2581a".encode())
    check(lib.ps_gguf_writer_set_arr_str(w, b"s.toks", toks, 3) == 0, "set_arr_str")
    expected["s.u32"] = ("UINT32", 77)
    expected["s.f32"] = ("FLOAT32", float(np.float32(0.3)))
    expected["s.str"] = ("STRING", "\u00e9t\u00e9".encode())
    expected["s.arr"] = canon(VT.ARRAY, [1.5, -2.5], VT.FLOAT32)
    expected["s.toks"] = canon(VT.ARRAY, ["<s>", "</s>", "\u2581a"], VT.STRING)
    if alignment != 32:
        expected = {"general.alignment": ("UINT32", alignment), **expected}

    specs = [("token_embd.weight", Q.F32, (20, 64), False), ("blk.0.attn_q.weight", Q.Q8_0, (64, 64), True),
             ("blk.0.ffn_up.weight", Q.F16, (6, 5, 96), False), ("blk.0.attn_k.weight", Q.Q4_K, (8, 256), True),
             ("output.weight", Q.Q4_1, (3, 64), False), ("blk.0.norm", Q.F32, (7,), True)]
    payloads = []
    for name, qt, shape, _ in specs:
        if qt == Q.F32:
            payloads.append(rng.standard_normal(shape).astype(np.float32).view(np.uint8).reshape(-1))
        elif qt == Q.F16:
            payloads.append(rng.standard_normal(shape).astype(np.float16).view(np.uint8).reshape(-1))
        else:
            payloads.append(quantized(qt, shape[0], shape[-1]).reshape(-1))

    def fill(ctx, index, buf, nbytes, err, errlen):
        data = payloads[index]
        if nbytes != data.nbytes:
            return 5
        ctypes.memmove(buf, data.ctypes.data, nbytes)
        return 0

    fill_cb = FILL(fill)
    progress = []
    progress_cb = PROGRESS(lambda ctx, done, total: progress.append((done, total)))
    for (name, qt, shape, use_fill), data in zip(specs, payloads):
        ne = (ctypes.c_int64 * 4)(*reversed(shape))
        st = lib.ps_gguf_writer_add_tensor(w, name.encode(), int(qt), len(shape), ne,
                                           None if use_fill else data.ctypes.data,
                                           fill_cb if use_fill else FILL(), None)
        check(st == 0, f"add tensor {name}: status {st}")
    err = ctypes.create_string_buffer(512)
    st = lib.ps_gguf_writer_write(w, path.encode(), progress_cb, None, err, 512)
    check(st == 0, f"write: status {st} {err.value.decode()}")
    lib.ps_gguf_writer_free(w)
    check(len(progress) == len(specs) and progress[-1][0] == progress[-1][1] == sum(p.nbytes for p in payloads),
          f"progress {progress}")

    r, kv, tensors = read_theirs(path)
    check(int(r.fields["GGUF.version"].parts[0][0]) == version, "GGUFReader sees our version")
    check(r.alignment == alignment, f"GGUFReader alignment {r.alignment}")
    check(list(kv) == list(expected), f"keys: {list(kv)} vs {list(expected)}")
    for key, want in expected.items():
        check(kv.get(key) == want, f"{key}: GGUFReader {kv.get(key)!r} != written {want!r}")
    # flat views through the package's own accessor too
    check(r.fields["a.str"].contents() == ["<s>", "", "\u2581hello", "w\u00f6rld"], "contents() of a string array")
    check(r.fields["t.str"].contents() == METADATA[12][2], "contents() of a string")
    check(len(tensors) == len(specs), "tensor count")
    for t, (name, qt, shape, _), data in zip(tensors, specs, payloads):
        check(t["name"] == name and t["type"] == int(qt) and t["ne"] == list(reversed(shape)), f"tensor info {name}: {t}")
        check(t["data"] == data.tobytes(), f"tensor data {name}")
    for t in r.tensors:
        check(int(t.data_offset) % alignment == 0, f"{t.name} aligned")
    # and our reader agrees with itself on the same file
    _, _, ours_kv, ours_tensors = read_ours(path)
    check(ours_kv == kv and [x["data"] for x in ours_tensors] == [x["data"] for x in tensors], "our reader agrees")


def main():
    for alignment in (None, 64):
        test_python_to_ours(alignment)
    for version, alignment in ((3, 32), (2, 64), (3, 128)):
        test_ours_to_python(version, alignment)
    if not failures():
        shutil.rmtree(TMP, ignore_errors=True)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
