#!/usr/bin/env python3
# gen_quant_golden.py: writes quant_golden.bin, random blocks of each GGML type
# with their dequantized values as computed by the `gguf` package (gguf-py).
#
# Run:  ~/.cache/dualpath/venv/bin/python tests/golden/gen_quant_golden.py
# (needs numpy and gguf; deterministic for a given seed and gguf version).
#
# Binary format (all little-endian):
#   header:  char magic[4] = "DPQG"; u32 version = 1; u32 n_records
#   record:  u32 type (GGML type id); u32 n_elems; u32 n_bytes;
#            u8 data[n_bytes]            (the encoded blocks)
#            f32 values[n_elems]         (gguf.quants.dequantize of data)
#
# Block scales (the fp16 / f32 `d`, `m`, `dmin` fields) are drawn from a sane
# range so that every value is finite; all other bytes are uniformly random,
# which exercises every nibble, high bit and packed 6-bit scale.
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# type -> (offsets of fp16 scale fields, offsets of f32 scale fields), per block
SCALES = {
    T.Q4_0: ([0], []),
    T.Q4_1: ([0, 2], []),
    T.Q5_0: ([0], []),
    T.Q5_1: ([0, 2], []),
    T.Q8_0: ([0], []),
    T.Q2_K: ([80, 82], []),
    T.Q3_K: ([108], []),
    T.Q4_K: ([0, 2], []),
    T.Q5_K: ([0, 2], []),
    T.Q6_K: ([208], []),
    T.IQ4_NL: ([0], []),
    T.IQ4_XS: ([0], []),
}


def blocks_for(rng, qt, n_blocks):
    block_elems, block_bytes = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    h_offs, f_offs = SCALES[qt]
    for off in h_offs:
        sc = (rng.uniform(-2.0, 2.0, size=n_blocks) * 10.0 ** rng.uniform(-3, 0, size=n_blocks))
        raw[:, off:off + 2] = sc.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    for off in f_offs:
        sc = rng.uniform(-2.0, 2.0, size=n_blocks).astype(np.float32)
        raw[:, off:off + 4] = sc.view(np.uint8).reshape(n_blocks, 4)
    return raw.reshape(-1), n_blocks * block_elems


def main():
    out = Path(__file__).with_name("quant_golden.bin")
    rng = np.random.default_rng(20240607)
    records = []
    # Plain types: random bit patterns (F16 / BF16 include inf, nan, subnormals).
    h = rng.integers(0, 65536, size=2048, dtype=np.uint16)
    h[:8] = [0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0xfc00]
    records.append((T.F16, h.view(np.uint8), h.view(np.float16).astype(np.float32)))
    b = rng.integers(0, 65536, size=1024, dtype=np.uint16)
    records.append((T.BF16, b.view(np.uint8), dequantize(b.view(np.uint8), T.BF16).astype(np.float32)))
    f = rng.standard_normal(256).astype(np.float32)
    records.append((T.F32, f.view(np.uint8), f))
    for qt in SCALES:
        block_elems, _ = GGML_QUANT_SIZES[qt]
        n_blocks = 48 if block_elems == 32 else 6
        data, n = blocks_for(rng, qt, n_blocks)
        vals = dequantize(data, qt).astype(np.float32).reshape(-1)
        assert vals.size == n, (qt, vals.size, n)
        records.append((qt, data, vals))
    with open(out, "wb") as fh:
        fh.write(b"DPQG" + struct.pack("<II", 1, len(records)))
        for qt, data, vals in records:
            data = np.ascontiguousarray(data, dtype=np.uint8)
            vals = np.ascontiguousarray(vals, dtype="<f4")
            fh.write(struct.pack("<III", int(qt), vals.size, data.size))
            fh.write(data.tobytes())
            fh.write(vals.tobytes())
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
