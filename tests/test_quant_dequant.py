"""test_quant_dequant.py - our block formats against the NumPy `gguf` package.

For every supported type:
  1. random block bytes (every scale field a random *finite* f16, so values are finite;
     f16 subnormals, negative scales and large values included) -> ps_dequantize_row
     (ctypes, $PS_LIBPSCORE) must equal gguf.quants.dequantize bit for bit;
  2. ps_quantize_row output, dequantized by gguf, must equal our own dequantization
     bit for bit (so our quantizer writes blocks gguf reads the same way);
  3. where gguf has a quantizer (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) our bytes
     must equal its bytes (both follow ggml's reference quantizers).
gguf has no Q8_1 or Q8_K dequantizer (and its size table says 40 bytes for Q8_1 where
ggml's block_q8_1 is 36); for those two the reference is a NumPy transcription of
ggml's formula (d * q) in this file.

Exit 0 pass, 1 fail (a missing gguf package or $PS_LIBPSCORE included).
"""
import ctypes
import os
import sys

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import check, require, verdict  # noqa: E402

from gguf import quants  # noqa: E402 - scripts/setup.sh installs gguf: no skip without it
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

LIB = os.environ.get("PS_LIBPSCORE")
if not LIB:
    print("FAIL: PS_LIBPSCORE is not set (run through ctest)")
    sys.exit(1)

lib = ctypes.CDLL(LIB)
lib.ps_dequantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
lib.ps_dequantize_row.restype = ctypes.c_int
lib.ps_quantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
lib.ps_quantize_row.restype = ctypes.c_int

# type -> (block size, block bytes, byte offsets of f16 scale fields, offset of an f32 scale)
LAYOUT = {
    T.F32: (1, 4, [], None),
    T.F16: (1, 2, [0], None),
    T.BF16: (1, 2, [], None),
    T.Q4_0: (32, 18, [0], None),
    T.Q4_1: (32, 20, [0, 2], None),
    T.Q5_0: (32, 22, [0], None),
    T.Q5_1: (32, 24, [0, 2], None),
    T.Q8_0: (32, 34, [0], None),
    T.Q8_1: (32, 36, [0, 2], None),
    T.Q4_K: (256, 144, [0, 2], None),
    T.Q5_K: (256, 176, [0, 2], None),
    T.Q6_K: (256, 210, [208], None),
    T.Q8_K: (256, 292, [], 0),
}
GGUF_QUANTIZERS = {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}



def ours_dequant(t, raw, n):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty(n, dtype=np.float32)
    st = lib.ps_dequantize_row(int(t), raw.ctypes.data, out.ctypes.data, n)
    require(st == 0, lambda: f"ps_dequantize_row({t.name}) returned {st}")
    return out


def ours_quant(t, x):
    bs, ts, _, _ = LAYOUT[t]
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // bs * ts, dtype=np.uint8)
    st = lib.ps_quantize_row(int(t), x.ctypes.data, out.ctypes.data, x.size)
    require(st == 0, lambda: f"ps_quantize_row({t.name}) returned {st}")
    return out


def reference_dequant(t, raw):
    """gguf's dequantizer, or ggml's formula for the two types gguf lacks."""
    _, ts, _, _ = LAYOUT[t]
    blocks = raw.reshape(-1, ts)
    if t == T.Q8_1:
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 4:36].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if t == T.Q8_K:
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return np.asarray(quants.dequantize(raw, t), dtype=np.float32).reshape(-1)


def random_finite_f16(rng, size):
    bits = rng.integers(0, 1 << 16, size=size, dtype=np.uint32).astype(np.uint16)
    bad = (bits & 0x7C00) == 0x7C00  # inf / nan: clear an exponent bit
    bits[bad] &= np.uint16(0xBFFF)
    return bits


def random_blocks(rng, t, n_blocks):
    bs, ts, f16_offs, f32_off = LAYOUT[t]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint16).astype(np.uint8)
    if t == T.F16:
        raw = random_finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    elif t == T.F32:
        v = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(10.0) ** rng.integers(-40, 38, n_blocks)
        raw = v.astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    else:
        for off in f16_offs:
            raw[:, off:off + 2] = random_finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        if f32_off is not None:
            d = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-30, 30, n_blocks)).astype(np.float32)
            raw[:, f32_off:f32_off + 4] = d.view(np.uint8).reshape(n_blocks, 4)
    return raw.reshape(-1)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_dequant_random_bytes(rng):
    for t, (bs, ts, _, _) in LAYOUT.items():
        n_blocks = 4096 if bs > 1 else 1 << 16
        raw = random_blocks(rng, t, n_blocks)
        n = n_blocks * bs
        got = ours_dequant(t, raw, n)
        ref = reference_dequant(t, raw)
        same = np.array_equal(bits(got), bits(ref))
        if not same:
            k = int(np.flatnonzero(bits(got) != bits(ref))[0])
            print(f"  {t.name}: first difference at element {k} (block {k // bs}): ours {got[k]!r} ref {ref[k]!r}",
                  file=sys.stderr)
        check(same, f"{t.name}: dequantization of random blocks equals the reference bit for bit")
        if t not in (T.F32, T.BF16, T.Q8_K):  # these draw scale bits freely (may overflow / be nan)
            check(np.all(np.isfinite(ref)), f"{t.name}: random blocks give finite values")
    # every f16 / bf16 bit pattern, NaNs included
    allh = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for t in (T.F16, T.BF16):
        got = ours_dequant(t, allh.view(np.uint8), 1 << 16)
        ref = reference_dequant(t, allh.view(np.uint8))
        check(np.array_equal(bits(got), bits(ref)), f"{t.name}: all 65536 bit patterns convert as gguf does")


def quantizer_inputs(rng):
    n = 256 * 64
    x = rng.standard_normal(n).astype(np.float32)
    x[: n // 4] *= np.float32(0.01)  # some small-scale blocks
    x[n // 4: n // 2] += np.float32(3.0)  # some all-positive blocks (minimum clamping)
    x[n // 2: n // 2 + 256] = 0.0  # a zero block
    yield "gaussian", x
    # small integers and halves: many exact ties in the rounding steps
    yield "ties", (rng.integers(-16, 17, n) * 0.5).astype(np.float32)
    # blocks of widely different magnitude: f16 scales that underflow to subnormals or zero.
    # (Not below 1e-12 or above 1e4: there gguf's 1 / d or its f16 scale overflows and
    # its quantizers produce NaN, where ours clamp.)
    yield "magnitudes", (rng.standard_normal(n) * 10.0 ** rng.integers(-12, 5, n // 256).repeat(256)).astype(np.float32)


def test_quantizer(rng):
    for name, x in quantizer_inputs(rng):
        print(f" {name}:")
        test_quantizer_on(x)


def test_quantizer_on(x):
    n = x.size
    for t, (bs, ts, _, _) in LAYOUT.items():
        raw = ours_quant(t, x)
        ours = ours_dequant(t, raw, n)
        ref = reference_dequant(t, raw)
        check(np.array_equal(bits(ours), bits(ref), equal_nan=False) or np.array_equal(ours, ref, equal_nan=True),
              f"{t.name}: our quantizer's blocks dequantize the same in gguf")
        rel = float(np.sqrt(np.mean((ours - x) ** 2)) / np.sqrt(np.mean(x ** 2)))
        print(f"  {t.name:5s} relative RMS error {rel:.5f}")
        if t in GGUF_QUANTIZERS:
            theirs = np.asarray(quants.quantize(x, t)).view(np.uint8).reshape(-1)
            same = np.array_equal(theirs, raw)
            if not same:
                k = int(np.flatnonzero(theirs != raw)[0])
                print(f"  {t.name}: first differing byte {k} (block {k // ts})", file=sys.stderr)
            check(same, f"{t.name}: our quantized bytes equal gguf.quants.quantize's")


def main():
    rng = np.random.default_rng(20240611)
    test_dequant_random_bytes(rng)
    test_quantizer(rng)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
