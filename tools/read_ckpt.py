#!/usr/bin/env python3
"""read_ckpt.py FILE: prints each tensor of a pipedream checkpoint (safetensors layout) as
"name dtype shape sum crc32": sum in float64, element by element in order for float dtypes (%.17g), modulo
2**64 for integer dtypes; crc32 (zlib) of the tensor's bytes. Then the metadata, and checks
pipedream.crc32. Pure Python (no torch, no numpy): proof that outside tools can read our files."""
import functools, json, operator, struct, sys, zlib

FMT = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h", "I8": "b",
       "U64": "Q", "U32": "I", "U16": "H", "U8": "B", "BOOL": "?"}
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
meta = header.pop("__metadata__", {})
for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
    b, e = t["data_offsets"]
    f = FMT.get(t["dtype"])
    vals = struct.unpack("<%d%s" % ((e - b) // struct.calcsize(f), f), data[b:e]) if f else None
    s = "-" if f is None else "%.17g" % functools.reduce(operator.add, vals, 0.0) if f in "def" else "%d" % (sum(int(v) for v in vals) % 2**64)
    print("%s %s %s %s %08x" % (name, t["dtype"], json.dumps(t["shape"]).replace(" ", ""), s, zlib.crc32(data[b:e])))
for k in sorted(meta):
    print("meta %s=%s" % (k, meta[k]))
crc = meta.get("pipedream.crc32")
print("crc32", "ok" if crc is None or int(crc, 16) == zlib.crc32(data) else "MISMATCH")
