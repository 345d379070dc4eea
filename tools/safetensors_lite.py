"""Minimal safetensors reader/writer on top of torch (Debian ships no `safetensors` package).

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian bytes.
"""
import json
import struct

import torch

_DT = {"F32": torch.float32, "BF16": torch.bfloat16, "I32": torch.int32, "I64": torch.int64, "F64": torch.float64}
_NAME = {v: k for k, v in _DT.items()}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        t = torch.frombuffer(buf, dtype=_DT[info["dtype"]]) if e > b else torch.empty(0, dtype=_DT[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out, meta


def save(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": _NAME[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
