#!/usr/bin/env python3
"""Golden vectors for tests/test_quant.c, made with an independent implementation: the
numpy encoders/decoders of the `gguf` Python package (gguf.quants, llama.cpp's gguf-py;
made with gguf 0.19.0, numpy 2.4).

Writes, next to this script:

  quant_golden.dat  cases of (type, input f32 or none, encoded block bytes, decoded f32).
      For types gguf.quants can encode (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) the input
      vector is quantised by gguf.quants (has_input = 1), so test_quant can also check the
      C encoders of tests/support/gguf_writer.c bit-exactly. For K-quants (Q4_K, Q5_K,
      Q6_K), which gguf.quants only decodes, the blocks are random bytes with sane fp16
      scales (has_input = 0). The decoded values always come from gguf.quants.dequantize.
  model_rows.dat    (only with --model PATH) a few rows of blk.0.attn_q.weight (Q4_1)
      and token_embd.weight (Q8_0) of the real SmolLM2-135M-Instruct Q4_1 file, decoded by
      gguf.GGUFReader + gguf.quants.dequantize.

Binary layout (little-endian):
  quant_golden.dat: "KVQG", u32 version=1, u32 n_cases, then per case:
      char name[32] (NUL-padded), u32 ggml_type, u32 n_values, u32 has_input, u32 n_bytes,
      [f32 input[n_values] if has_input], u8 bytes[n_bytes], f32 decoded[n_values]
  model_rows.dat: "KVMR", u32 version=1, u32 n_rows, then per row:
      char tensor[64], u32 ggml_type, u32 row, u32 n_values, f32 values[n_values]

Run from the repository root:
  python3 tests/golden/quant/make_golden.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20261129


def f32(a):
    return np.asarray(a, dtype=np.float32)


def inputs(rng):
    """Named input vectors (f32). Lengths are multiples of 32; the long ones of 256."""
    v = {}
    v["ramp"] = f32(np.linspace(-1.0, 1.0, 64))
    v["ramp_pos"] = f32(np.arange(64) * 0.03125 + 0.5)
    v["const"] = f32(np.full(32, 0.375))
    v["const_neg"] = f32(np.full(32, -2.5))
    v["zero"] = f32(np.zeros(32))
    pm = np.empty(64, dtype=np.float32)
    pm[0::2] = 1000.0
    pm[1::2] = -1000.0
    pm[5] = 0.0
    pm[40] = 999.0
    v["plusminus_max"] = pm
    # exact .5 ties of x*id for Q8_0 (amax 127 gives d = 1): roundf rounds away from zero
    ties = np.zeros(32, dtype=np.float32)
    ties[0] = 127.0
    ties[1:9] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5]
    v["ties"] = ties
    v["normal"] = f32(rng.standard_normal(256))
    v["outlier"] = f32(np.concatenate([rng.standard_normal(31) * 0.01, [8.0]]))
    # tiny values: the scales become fp16 subnormals (< 6.1e-5)
    v["tiny_1e-4"] = f32(rng.standard_normal(64) * 1e-4)
    v["tiny_3e-3"] = f32(rng.standard_normal(32) * 3e-3)
    v["uniform_wide"] = f32(rng.uniform(-300, 300, 64))
    return v


def fp16_specials():
    bits = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0200, 0x0400, 0x3C00, 0xBC00,
            0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x3555, 0x1234, 0x4248, 0x0401, 0x83FF,
            0x5640, 0xC000, 0x2E66, 0x7E00, 0x7C01, 0x6A00, 0x0123, 0x8123, 0x3FFF,
            0x4000, 0x47FF, 0x0010, 0x8010, 0x1400]
    return np.array(bits, dtype=np.uint16)


def random_k_blocks(rng, qtype, n_blocks):
    """Random K-quant super-blocks with finite, moderate fp16 super-scales."""
    _, tsz = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, tsz), dtype=np.uint8)
    d = f32(rng.uniform(0.0005, 0.05, n_blocks)).astype(np.float16)
    dmin = f32(rng.uniform(0.0001, 0.02, n_blocks)).astype(np.float16)
    if qtype == T.Q6_K:
        b[:, 208:210] = d.view(np.uint8).reshape(n_blocks, 2)
    else:
        b[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
        b[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    # one block with a subnormal super-scale
    sub = np.array([0x0123], dtype=np.uint16).view(np.uint8)
    if qtype == T.Q6_K:
        b[-1, 208:210] = sub
    else:
        b[-1, 0:2] = sub
    return b.reshape(-1)


def case(name, qtype, n, inp, raw, deq):
    assert deq.dtype == np.float32 and deq.size == n, name
    nb = name.encode()[:31]
    out = struct.pack("<32sIIII", nb, int(qtype), n, 0 if inp is None else 1, raw.size)
    if inp is not None:
        out += f32(inp).tobytes()
    out += raw.astype(np.uint8).tobytes() + deq.tobytes()
    return out


def make_quant(path):
    rng = np.random.default_rng(SEED)
    vecs = inputs(rng)
    cases = []
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16):
        for name, x in vecs.items():
            if qtype in (T.BF16, T.F16) and name not in ("ramp", "normal", "tiny_1e-4",
                                                        "uniform_wide", "plusminus_max"):
                continue
            if qtype == T.F16:
                raw = x.astype(np.float16).view(np.uint8)
                deq = raw.view(np.float16).astype(np.float32)
            else:
                raw = quants.quantize(x, qtype).reshape(-1)
                deq = quants.dequantize(raw, qtype).reshape(-1).astype(np.float32)
            cases.append(case(f"{qtype.name}:{name}", qtype, x.size, x, raw, deq))
    # fp16 special bit patterns (subnormals, max, inf, NaN): decoder-only
    raw = fp16_specials().view(np.uint8)
    deq = raw.view(np.float16).astype(np.float32)
    cases.append(case("F16:specials", T.F16, deq.size, None, raw, deq))
    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        raw = random_k_blocks(rng, qtype, 3)
        deq = quants.dequantize(raw, qtype).reshape(-1).astype(np.float32)
        cases.append(case(f"{qtype.name}:random", qtype, deq.size, None, raw, deq))
    # random legacy blocks too (codes the encoder never produces, e.g. d < 0)
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        bs, tsz = gguf.GGML_QUANT_SIZES[qtype]
        b = rng.integers(0, 256, size=(4, tsz), dtype=np.uint8)
        sc = f32(rng.uniform(-0.1, 0.1, (4, 2))).astype(np.float16).view(np.uint8)
        b[:, 0:4 if qtype in (T.Q4_1, T.Q5_1) else 2] = sc[:, :4 if qtype in (T.Q4_1, T.Q5_1) else 2]
        raw = b.reshape(-1)
        deq = quants.dequantize(raw, qtype).reshape(-1).astype(np.float32)
        cases.append(case(f"{qtype.name}:random", qtype, deq.size, None, raw, deq))
    with open(path, "wb") as f:
        f.write(b"KVQG" + struct.pack("<II", 1, len(cases)))
        for c in cases:
            f.write(c)
    print(f"{path}: {len(cases)} cases, {os.path.getsize(path)} bytes")


def make_model_rows(model, path):
    r = gguf.GGUFReader(model)
    want = [("blk.0.attn_q.weight", [0, 1, 575]),
            ("token_embd.weight", [0, 1, 1000, 49151]),
            ("blk.29.ffn_down.weight", [7])]
    rows = []
    for name, idx in want:
        t = next(t for t in r.tensors if t.name == name)
        deq = quants.dequantize(t.data, t.tensor_type)
        for i in idx:
            v = deq[i].astype(np.float32)
            rows.append(struct.pack("<64sIII", name.encode(), int(t.tensor_type), i, v.size)
                        + v.tobytes())
    with open(path, "wb") as f:
        f.write(b"KVMR" + struct.pack("<II", 1, len(rows)))
        for row in rows:
            f.write(row)
    print(f"{path}: {len(rows)} rows, {os.path.getsize(path)} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="real model GGUF for model_rows.dat")
    a = ap.parse_args()
    make_quant(os.path.join(HERE, "quant_golden.dat"))
    if a.model:
        make_model_rows(a.model, os.path.join(HERE, "model_rows.dat"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
