#!/usr/bin/env python3
"""Packs a float Hugging Face checkpoint into the quantized layouts other tools write,
independently of pagellm: every linear layer of the decoder is quantized to nearest and
packed the way the tools' own code packs it, and a float twin holding the very weights
the packed one encodes is written beside it.

The packing follows, line for line:
  * AutoAWQ `awq/modules/linear/gemm.py` (`WQLinear_GEMM.from_linear`): qweight
    [in, out/8] with `order_map = [0, 2, 4, 6, 1, 3, 5, 7]`, qzeros likewise, scales
    [in/group, out] f16.
  * AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py` (`QuantLinear.pack`):
    qweight [in/8, out] (input 8k+j at bits 4j), `zeros -= 1` then qzeros [groups, out/8],
    scales [groups, out] f16, g_idx [in].
  * compressed-tensors `compressors/quantized_compressors/pack_quantized.py`
    (`pack_to_int32`: values offset by 2^(bits-1), element 8j+k at bits 4k of word j;
    zero points packed along dim 0) and `naive_quantized.py` / `int_quantized.py`.

Usage: pack_reference.py SRC_DIR OUT_DIR FORMAT [--group 32] [--seed 0]
FORMAT: awq | gptq | gptq-act | ct-w4-sym | ct-w4-asym | ct-w8a16 | ct-w8a8 | ct-fp8
Writes OUT_DIR/packed and OUT_DIR/float (float32), each a complete model directory.
Needs numpy only.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64,
          "I8": np.int8, "U8": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        dt = info["dtype"]
        if dt == "BF16":
            v = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            arr = v.view(np.float32)
        else:
            arr = np.frombuffer(raw, DTYPES[dt]).astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array of the matching bytes)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f16_round(x):
    return x.astype(np.float16).astype(np.float32)


def e4m3_table():
    """All 256 E4M3FN values (OCP), NaN for 0x7F/0xFF."""
    vals = np.zeros(256, np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 0xF and m == 7:
            vals[b] = np.nan
        elif e == 0:
            vals[b] = s * m / 8.0 * 2.0 ** -6
        else:
            vals[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return vals


def to_e4m3(x, table):
    """Nearest E4M3 code of each value (ties to the even code), saturating at 448."""
    pos = table[:0x7F]  # codes 0x00..0x7E, increasing
    a = np.minimum(np.abs(x), 448.0).ravel()
    hi = np.clip(np.searchsorted(pos, a), 1, 0x7E)
    lo = hi - 1
    d_lo = a - pos[lo]
    d_hi = pos[hi] - a
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    codes = pick.astype(np.uint8) | np.where(x.ravel() < 0, 0x80, 0).astype(np.uint8)
    return codes.reshape(x.shape)


def rtn_groups(w, group, sym, keep_zero_storable=False):
    """Round-to-nearest per group along the input dimension; GPTQ's quantizer formulas
    (range widened to include 0). Returns codes [out, in], scales [out, groups],
    zeros [out, groups] (8 when symmetric). Scales are f16, as AWQ and GPTQ store them."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group, group)
    lo = np.minimum(g.min(axis=2), 0)
    hi = np.maximum(g.max(axis=2), 0)
    if sym:
        amax = np.maximum(-lo, hi)
        scale = f16_round(np.where(amax > 0, amax / 7.5, 1.0))
        zero = np.full_like(scale, 8.0)
    else:
        scale = f16_round(np.where(hi > lo, (hi - lo) / 15, 1.0))
        zero = np.clip(np.round(-lo / scale), 1 if keep_zero_storable else 0, 15)
    q = np.clip(np.round(g / scale[:, :, None]) + zero[:, :, None], 0, 15)
    return q.reshape(out_f, in_f).astype(np.int64), scale, zero.astype(np.int64)


def dequant(codes, scale, zero, group):
    out_f, in_f = codes.shape
    c = codes.reshape(out_f, in_f // group, group).astype(np.float32)
    return ((c - zero[:, :, None]) * scale[:, :, None]).reshape(out_f, in_f)


def pack_awq(codes, scale, zero, order_map=(0, 2, 4, 6, 1, 3, 5, 7)):
    """AutoAWQ WQLinear_GEMM.from_linear."""
    intweight = codes.T.astype(np.uint32)  # [in, out]
    pack_num = 8
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // 32 * 4), np.uint32)
    for col in range(intweight.shape[1] // pack_num):
        for i in range(pack_num):
            qweight[:, col] |= intweight[:, col * pack_num + order_map[i]] << (i * 4)
    zeros = zero.T.astype(np.uint32)  # [groups, out]
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * 4), np.uint32)
    for col in range(zeros.shape[1] // pack_num):
        for i in range(pack_num):
            qzeros[:, col] |= zeros[:, col * pack_num + order_map[i]] << (i * 4)
    return {
        "qweight": ("I32", qweight.view(np.int32)),
        "qzeros": ("I32", qzeros.view(np.int32)),
        "scales": ("F16", scale.T.astype(np.float16)),
    }


def pack_gptq(codes_by_input, scale, zero, g_idx):
    """AutoGPTQ QuantLinear.pack (v1 format: zeros - 1). codes_by_input: [out, in] in
    input order; scale/zero: [out, groups]; g_idx: [in]."""
    intweight = codes_by_input.T.astype(np.uint32)  # [in, out]
    qweight = np.zeros((intweight.shape[0] // 32 * 4, intweight.shape[1]), np.uint32)
    i = 0
    row = 0
    while row < qweight.shape[0]:
        for j in range(i, i + 8):
            qweight[row] |= intweight[j] << (4 * (j - i))
        i += 8
        row += 1
    zeros = (zero.T - 1).astype(np.uint32) & 0xF  # [groups, out]
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 32 * 4), np.uint32)
    i = 0
    col = 0
    while col < qzeros.shape[1]:
        for j in range(i, i + 8):
            qzeros[:, col] |= zeros[:, j] << (4 * (j - i))
        i += 8
        col += 1
    return {
        "qweight": ("I32", qweight.view(np.int32)),
        "qzeros": ("I32", qzeros.view(np.int32)),
        "scales": ("F16", scale.T.astype(np.float16)),
        "g_idx": ("I32", g_idx.astype(np.int32)),
    }


def pack_to_int32(values, bits, packed_dim=1):
    """compressed-tensors pack_to_int32: values already offset to unsigned."""
    v = values.astype(np.uint32)
    if packed_dim == 0:
        v = v.T
    per = 32 // bits
    rows, cols = v.shape
    pad = (-cols) % per
    if pad:
        v = np.concatenate([v, np.zeros((rows, pad), np.uint32)], axis=1)
    v = v.reshape(rows, -1, per)
    packed = np.zeros(v.shape[:2], np.uint32)
    for k in range(per):
        packed |= v[:, :, k] << (bits * k)
    if packed_dim == 0:
        packed = packed.T
    return np.ascontiguousarray(packed).view(np.int32)


def bf16_round(x):
    """Round to bfloat16 (nearest even), kept as f32 values."""
    b = x.astype(np.float32).view(np.uint32)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.view(np.float32)


def bf16_bytes(x):
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


def quantize_layer(fmt, w, group, perm, e4m3, awq_order=True):
    """Returns (packed tensors by suffix, dequantized float weight)."""
    out_f, in_f = w.shape
    if fmt == "awq":
        codes, scale, zero = rtn_groups(w, group, sym=False)
        order = (0, 2, 4, 6, 1, 3, 5, 7) if awq_order else tuple(range(8))
        return pack_awq(codes, scale, zero, order), dequant(codes, scale, zero, group)
    if fmt in ("gptq", "gptq-act"):
        sym = fmt == "gptq"
        if fmt != "gptq-act":
            perm = np.arange(in_f)
        codes_p, scale, zero = rtn_groups(w[:, perm], group, sym=sym, keep_zero_storable=True)
        deq_p = dequant(codes_p, scale, zero, group)
        codes = np.zeros_like(codes_p)
        codes[:, perm] = codes_p
        deq = np.zeros_like(deq_p)
        deq[:, perm] = deq_p
        g_idx = np.zeros(in_f, np.int64)
        g_idx[perm] = np.arange(in_f) // group
        return pack_gptq(codes, scale, zero, g_idx), deq
    if fmt in ("ct-w4-sym", "ct-w4-asym"):
        g = w.reshape(out_f, in_f // group, group)
        lo = np.minimum(g.min(axis=2), 0)
        hi = np.maximum(g.max(axis=2), 0)
        if fmt == "ct-w4-sym":
            scale = bf16_round(np.maximum(-lo, hi) / 7.5)
            scale = np.where(scale == 0, 1.0, scale)
            zp = np.zeros_like(scale)
        else:
            scale = bf16_round((hi - lo) / 15)
            scale = np.where(scale == 0, 1.0, scale)
            # calculate_qparams: zp = round(qmin - min / scale), qmin = -8.
            zp = np.round(np.clip(-8 - lo / scale, -8, 7))
        # _quantize: round(x / scale + zero_point), clamped.
        q = np.clip(np.round(g / scale[:, :, None] + zp[:, :, None]), -8, 7)
        deq = ((q - zp[:, :, None]) * scale[:, :, None]).reshape(out_f, in_f)
        t = {
            "weight_packed": ("I32", pack_to_int32(q.reshape(out_f, in_f) + 8, 4)),
            "weight_scale": ("BF16", bf16_bytes(scale)),
            "weight_shape": ("I64", np.array([out_f, in_f], np.int64)),
        }
        if fmt == "ct-w4-asym":
            t["weight_zero_point"] = ("I32", pack_to_int32(zp + 8, 4, packed_dim=0))
        return t, deq
    amax = np.abs(w).max(axis=1, keepdims=True)
    if fmt in ("ct-w8a16", "ct-w8a8"):
        scale = bf16_round(np.where(amax > 0, amax / 127.5, 1.0))
        q = np.clip(np.round(w / scale), -128, 127)
        deq = q * scale
        if fmt == "ct-w8a16":
            t = {"weight_packed": ("I32", pack_to_int32(q + 128, 8)),
                 "weight_shape": ("I64", np.array([out_f, in_f], np.int64))}
        else:
            t = {"weight": ("I8", q.astype(np.int8))}
        t["weight_scale"] = ("BF16", bf16_bytes(scale))
        return t, deq
    if fmt == "ct-fp8":
        scale = bf16_round(np.where(amax > 0, amax / 448.0, 1.0))
        codes = to_e4m3(w / scale, e4m3)
        deq = e4m3[codes] * scale
        return {"weight": ("F8_E4M3", codes), "weight_scale": ("BF16", bf16_bytes(scale))}, deq
    raise SystemExit(f"unknown format {fmt}")


def ct_config(fmt, group):
    def args(bits, typ, strategy, g, sym, dynamic):
        return {"num_bits": bits, "type": typ, "symmetric": sym, "group_size": g,
                "strategy": strategy, "dynamic": dynamic, "actorder": None,
                "block_structure": None, "observer": None if dynamic else "minmax",
                "observer_kwargs": {}}
    fmt_name, weights, inputs = {
        "ct-w4-sym": ("pack-quantized", args(4, "int", "group", group, True, False), None),
        "ct-w4-asym": ("pack-quantized", args(4, "int", "group", group, False, False), None),
        "ct-w8a16": ("pack-quantized", args(8, "int", "channel", None, True, False), None),
        "ct-w8a8": ("int-quantized", args(8, "int", "channel", None, True, False),
                    args(8, "int", "token", None, True, True)),
        "ct-fp8": ("naive-quantized", args(8, "float", "channel", None, True, False), None),
    }[fmt]
    return {"quant_method": "compressed-tensors", "format": fmt_name,
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs, "format": fmt_name}},
            "ignore": ["lm_head"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("format")
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-awq-order", action="store_true",
                    help="pack AWQ without its output interleaving (a broken file, to show "
                         "that the comparison catches it)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    e4m3 = e4m3_table()
    weights = read_safetensors(os.path.join(a.src, "model.safetensors"))
    config = json.load(open(os.path.join(a.src, "config.json")))
    packed, floats = {}, {}
    # Act order: groups contiguous in a permuted input order, one order per input (Q, K
    # and V share theirs, as do gate and up: GPTQ derives it from the input's Hessian).
    orders = {}
    for name in sorted(weights):
        w = weights[name]
        module = name.rsplit(".", 1)[0]
        kind = module.rsplit(".", 1)[-1]
        if name.endswith(".weight") and kind in LINEAR:
            shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(kind, kind)
            key = (module.rsplit(".", 1)[0], shared)
            if key not in orders:
                orders[key] = rng.permutation(w.shape[1])
            t, deq = quantize_layer(a.format, w, a.group, orders[key], e4m3, not a.no_awq_order)
            for suffix, v in t.items():
                packed[f"{module}.{suffix}"] = v
            floats[name] = ("F32", deq.astype(np.float32))
        else:
            # AutoAWQ and GPTQ checkpoints are float16 models.
            if a.format in ("awq", "gptq", "gptq-act"):
                w = f16_round(w)
                packed[name] = ("F16", w.astype(np.float16))
            else:
                packed[name] = ("F32", w.astype(np.float32))
            floats[name] = ("F32", w.astype(np.float32))
    if a.format == "awq":
        qc = {"quant_method": "awq", "bits": 4, "group_size": a.group, "zero_point": True,
              "version": "gemm", "modules_to_not_convert": None}
    elif a.format in ("gptq", "gptq-act"):
        qc = {"quant_method": "gptq", "bits": 4, "group_size": a.group,
              "desc_act": a.format == "gptq-act", "sym": a.format == "gptq",
              "checkpoint_format": "gptq", "damp_percent": 0.01, "static_groups": False,
              "true_sequential": True, "lm_head": False}
    else:
        qc = ct_config(a.format, a.group)
    for sub, tensors, q in (("packed", packed, qc), ("float", floats, None)):
        d = os.path.join(a.out, sub)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(a.src):
            if f.startswith("tokenizer") or f in ("generation_config.json", "special_tokens_map.json"):
                shutil.copy(os.path.join(a.src, f), d)
        c = dict(config)
        c["torch_dtype"] = "float16" if q and q["quant_method"] in ("awq", "gptq") else "float32"
        if q:
            c["quantization_config"] = q
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)


if __name__ == "__main__":
    main()
