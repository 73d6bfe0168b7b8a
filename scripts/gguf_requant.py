#!/usr/bin/env python3
"""Requantize a float GGUF's linear weights to Q4_0 or Q8_0 with llama.cpp's reference
quantizers (gguf-py's `gguf.quants`, the Python twin of `quantize_row_q4_0_ref` /
`quantize_row_q8_0_ref` that `llama-quantize` runs for these types without an
importance matrix), leaving the token embedding, the LM head and the norms as they
are. This is `llama-quantize --token-embedding-type bf16 --output-tensor-type bf16
IN OUT Q4_0` without a llama.cpp build, for comparing a GGUF format's speed with a
checkpoint whose embedding and head are also BF16.

    pip install gguf numpy
    python3 scripts/gguf_requant.py qwen-bf16.gguf qwen-Q4_0-bf16head.gguf Q4_0
"""

import sys

import gguf
import numpy as np
from gguf.quants import dequantize, quantize


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[3] not in ("Q4_0", "Q8_0"):
        sys.exit("usage: gguf_requant.py IN.gguf OUT.gguf Q4_0|Q8_0")
    src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    out = []
    for t in reader.tensors:
        keep = t.name in ("token_embd.weight", "output.weight") or len(t.shape) < 2
        if keep:
            out.append((t.name, t.data, t.tensor_type))
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        out.append((t.name, quantize(w, qtype), qtype))
    for name, data, ty in out:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=ty)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in out:
        writer.write_tensor_data(data)
    writer.close()
    print(f"wrote {dst}: {sum(1 for _, _, ty in out if ty == qtype)} tensors in {kind}")


if __name__ == "__main__":
    main()
