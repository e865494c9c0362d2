"""pd_codec.py: the wire codecs of src/kernels/codec.c and src/runtime/rt_wire.c in numpy, bit
for bit, for the PyTorch oracle (tools/torch_pipedream_lm.py --wire): int8 with a scale per row,
int4 with a scale per group (nearest, or stochastic rounding from the same counter-based hash),
per-sample deltas against int8 references, and error feedback. Every operation is float32 as the
C does it; a fused multiply-add (fmaf) is computed exactly in float64 and rounded once
(fma32). Messages are decoded at once: what matters is what the receiver ends with."""
import numpy as np

F32 = np.float32
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
Q8, Q4 = F32(127.0), F32(7.0)
INT4_GROUP, ROW_MIN = 64, 64
M64 = (1 << 64) - 1


def row_of(sample_shape):
    """rt_wire.c's int8 row: the smallest run of trailing dimensions holding >= 64 values."""
    r = 1
    for d in reversed(sample_shape):
        r *= d
        if r >= ROW_MIN:
            break
    return r


# ---- the stochastic rounding's generator (codec.c, key_of, mix32, unif) ----
def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def key_of(seed, msg):
    k = _mix64((seed ^ _mix64((msg + 0x9e3779b97f4a7c15) & M64)) & M64)
    return np.uint32(k & 0xffffffff), np.uint32(k >> 32)


def _mix32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7feb352d)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846ca68b)
    return x ^ (x >> np.uint32(16))


def unif(key, idx):
    """u in [0, 1) for the counters idx (uint32)."""
    with np.errstate(over='ignore'):
        h = _mix32(_mix32(idx.astype(np.uint32) ^ key[0]) + key[1])
    return (h >> np.uint32(8)).astype(F32) * F32(2.0 ** -24)


def fma32(a, b, c):
    """fmaf elementwise: a * b + c rounded once to float32 (the product is exact in float64; the
    sum's float64 rounding is undone where it lands on a float32 tie)."""
    a, b, c = (np.asarray(v, dtype=F32) for v in (a, b, c))
    with np.errstate(all='ignore'):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)
        r = s.astype(F32)
        r64 = r.astype(np.float64)
        toward = np.where(s > r64, np.inf, -np.inf).astype(F32)
        other = np.nextafter(r, toward)
        mid = (r64 + other.astype(np.float64)) / 2
        tie = (s == mid) & (err != 0) & np.isfinite(s)
        hi, lo = np.maximum(r, other), np.minimum(r, other)
        return np.where(tie, np.where(err > 0, hi, lo), r).astype(F32)


# ---- one message (codec.c, kern_codec_encode then kern_codec_decode) ----
def _blocks(x, block):
    n = x.size
    nb = -(-n // block)
    pad = np.zeros(nb * block, dtype=F32)
    pad[:n] = x
    return pad.reshape(nb, block), n


def _scales(xb, qm):
    a = np.abs(xb)
    m = np.where(np.isfinite(a), a, F32(0)).max(axis=1).astype(F32)
    with np.errstate(all='ignore'):
        s = (m / qm).astype(F32)
        bad = ~np.isfinite((qm * s).astype(F32))
        s = np.where(bad, np.nextafter(s, F32(0)), s).astype(F32)
        small = s < FLT_MIN
        inv = np.where(small, F32(0), (qm / m).astype(F32)).astype(F32)
    return np.where(small, F32(0), s).astype(F32), inv


def quantize(x, four, block, key=None):
    """(q, s): the values (int) and per-block scales of codec int8 (four False) or int4 of the
    float32 message x (flat); key (stochastic rounding) from key_of, else nearest."""
    xb, n = _blocks(np.asarray(x, dtype=F32).ravel(), block)
    qm = Q4 if four else Q8
    s, inv = _scales(xb, qm)
    with np.errstate(all='ignore'):
        if key is None:
            t = (xb * inv[:, None]).astype(F32)
            t = np.where(np.isnan(t), F32(0), t)
            q = np.rint(np.clip(t, -qm, qm))
        else:
            u = unif(key, np.arange(xb.size, dtype=np.uint64).astype(np.uint32)).reshape(xb.shape)
            t = fma32(xb, np.broadcast_to(inv[:, None], xb.shape), u)
            t = np.where(np.isnan(t), F32(0), t)
            q = np.clip(np.floor(t), -qm, qm)
    return q.astype(np.int32).astype(F32), s, n   # through int: no -0, as the C's int8 and nibbles


def dequantize(q, s, n, r=None):
    """q * s, or fmaf(q, s, r) (r: the reference, n values)."""
    sb = np.broadcast_to(s[:, None], q.shape)
    y = (q * sb).astype(F32) if r is None else fma32(q, sb, _blocks(np.asarray(r, dtype=F32).ravel(), q.shape[1])[0])
    return y.ravel()[:n]


def roundtrip(codec, x, row, key=None):
    """What the receiver of x (float32, any shape) decodes under codec ("fp32", "bf16", "int8",
    "int4"); row: int8's row length; key: int4's stochastic rounding."""
    x = np.asarray(x, dtype=F32)
    if codec == 'fp32':
        return x.copy()
    if codec == 'bf16':
        import torch
        return torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    four = codec == 'int4'
    q, s, n = quantize(x, four, INT4_GROUP if four else row, key)
    return dequantize(q, s, n).reshape(x.shape)


class DeltaStore:
    """One end of a delta boundary: each sample's reference as int8 rows (zero before its first
    message); both ends are the same, so one store serves the oracle's boundary."""

    def __init__(self, row):
        self.row, self.refs = row, {}

    def send(self, x, pos, first):
        """The receiver's reconstruction of the samples x (B, ...) at dataset positions pos: the
        data's first epoch (first) int8 rows of x - r, later the int4 difference (nearest, groups
        of 64 within the sample); the references become the reconstruction's int8 rows."""
        x = np.asarray(x, dtype=F32)
        out = np.empty_like(x)
        for k, p in enumerate(pos):
            xs = x[k].ravel()
            r = self.refs.get(int(p), np.zeros(xs.size, dtype=F32))
            d = (xs - r).astype(F32)
            q, s, n = quantize(d, not first, self.row if first else INT4_GROUP)
            y = dequantize(q, s, n, r)
            self.refs[int(p)] = roundtrip('int8', y, self.row)
            out[k] = y.reshape(x.shape[1:])
        return out


def error_feedback(codec, g, e, row, key=None):
    """(sent, e'): v = g + e encoded, e' = v - decode(v)."""
    v = (np.asarray(g, dtype=F32) + e).astype(F32)
    y = roundtrip(codec, v, row, key)
    return y, (v - y).astype(F32)
