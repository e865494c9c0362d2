"""pd_io.py: pipedream's files and conventions for Python tools (numpy only, no torch):

- safetensors weights files as pipedream reads them (src/runtime/rt_ckpt.c, docs/reference/formats.md):
  write_weights / read_safetensors;
- the global tensor names of a model JSON, in parameter-buffer order (src/nn/model.c and the
  layer_<kind>.c files): param_names(model) -> [(name, shape)], state_names(model) ->
  [(name, floats)];
- the data order: Philox4x32-10 streams (src/core/rng.c) and epoch permutations
  (data_epoch_order), so a PyTorch run can consume exactly pipedream's minibatches;
- byte-level text data (src/data/data_text.c): the split into training text and held-out tail
  and the sequences.

Used by tools/export_torch.py and tools/torch_train_lm.py."""
import json
import math
import struct
import zlib

import numpy as np

# ---- safetensors ---------------------------------------------------------------------------


def write_safetensors(path, tensors, metadata=None):
    """tensors: [(name, float32 array)] in order; metadata: {str: str}. Adds pipedream.format and
    pipedream.crc32 (CRC-32 of the data section) as pipedream's writer does."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(np.asarray(a, dtype='<f4'))
        b = a.tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(a.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    data = b''.join(blobs)
    meta = dict(metadata or {})
    meta['pipedream.format'] = '1'
    meta['pipedream.crc32'] = '%08x' % zlib.crc32(data)
    header = dict([('__metadata__', meta)] + list(header.items()))
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)) + h + data)


def read_safetensors(path):
    """Returns ({name: float32 array}, metadata). Only F32 tensors are returned."""
    raw = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop('__metadata__', {})
    out = {}
    for name, t in header.items():
        if t['dtype'] != 'F32':
            continue
        b, e = t['data_offsets']
        out[name] = np.frombuffer(data[b:e], dtype='<f4').reshape(t['shape']).copy()
    return out, meta

# ---- tensor names of a model JSON --------------------------------------------------------------


def _layer_params(o, path):
    """[(name, shape)] of one layer object (recursing into residual and block), as model.c."""
    t = o['type']
    bias = o.get('bias', True)
    if t in ('linear', 'dense'):
        r = [(path + '.weight', (o['out'], o['in']))]
        return r + ([(path + '.bias', (o['out'],))] if bias else [])
    if t == 'conv2d':
        k = o['kernel']
        r = [(path + '.weight', (o['out'], o['in'], k, k))]
        return r + ([(path + '.bias', (o['out'],))] if bias else [])
    if t in ('batchnorm', 'layernorm'):
        return [(path + '.weight', (o['features'],)), (path + '.bias', (o['features'],))]
    if t == 'lstm':
        h, i = o['hidden'], o['in']
        return [(path + '.weight_ih_l0', (4 * h, i)), (path + '.weight_hh_l0', (4 * h, h)),
                (path + '.bias_ih_l0', (4 * h,)), (path + '.bias_hh_l0', (4 * h,))]
    if t == 'embed':
        r = [(path + '.weight', (o['vocab'], o['dim']))]
        return r + ([(path + '.pos_weight', (o['positions'], o['dim']))] if o.get('positions') else [])
    if t == 'attention':
        d = o['dim']
        r = [(path + '.qkv.weight', (3 * d, d))] + ([(path + '.qkv.bias', (3 * d,))] if bias else [])
        r += [(path + '.proj.weight', (d, d))] + ([(path + '.proj.bias', (d,))] if bias else [])
        return r
    if t == 'residual':
        r = []
        for k, s in enumerate(o['body']):
            r += _layer_params(s, '%s.body.%d' % (path, k))
        for k, s in enumerate(o.get('shortcut', [])):
            r += _layer_params(s, '%s.shortcut.%d' % (path, k))
        return r
    if t == 'block':
        r = []
        for k, step in enumerate(o['steps']):
            for j, s in enumerate(step):
                r += _layer_params(s, '%s.steps.%d.%d' % (path, k, j))
        return r
    return []


def _layer_state(o):
    """Floats of non-trained state of one layer (batch norm: running mean then var)."""
    t = o['type']
    if t == 'batchnorm':
        return 2 * o['features']
    subs = o.get('body', []) + o.get('shortcut', []) if t == 'residual' else \
        [s for step in o['steps'] for s in step] if t == 'block' else []
    return sum(_layer_state(s) for s in subs)


def param_names(model):
    """[(name, shape)] of a model JSON (dict or path) in parameter-buffer order."""
    if isinstance(model, str):
        model = json.load(open(model))
    r = []
    for i, o in enumerate(model['layers']):
        r += _layer_params(o, 'layers.%d' % i)
    return r


def tie_mirrors(model):
    """{mirror name: source name} of a model JSON's top-level "tie"s ("layers.7.weight" holds a copy
    of "layers.0.weight"; pipedream keeps both in its buffers and files, PyTorch one tensor)."""
    if isinstance(model, str):
        model = json.load(open(model))
    return {'layers.%d.weight' % i: o['tie'] for i, o in enumerate(model['layers']) if 'tie' in o}


def state_names(model):
    """[(name, floats)]: "state.layers.<i>" of each top-level layer with state."""
    if isinstance(model, str):
        model = json.load(open(model))
    return [('state.layers.%d' % i, _layer_state(o)) for i, o in enumerate(model['layers']) if _layer_state(o)]


def write_weights(path, model, params, states=(), model_name=None):
    """params: float arrays in parameter order (torch: [p.detach().numpy() for p in
    module.parameters()]); states: per state.layers entry, the concatenated buffers. Shapes
    are checked against the model JSON."""
    names, snames = param_names(model), state_names(model)
    if len(names) != len(params):
        raise ValueError('%d parameter tensors, the model JSON has %d' % (len(params), len(names)))
    out = []
    for (name, shape), a in zip(names, params):
        a = np.asarray(a, dtype=np.float32)
        if tuple(a.shape) != tuple(shape):
            raise ValueError('%s: shape %s, the model JSON says %s' % (name, tuple(a.shape), tuple(shape)))
        out.append((name, a))
    if len(states) != len(snames):
        raise ValueError('%d state tensors, the model JSON has %d' % (len(states), len(snames)))
    for (name, cnt), a in zip(snames, states):
        a = np.asarray(a, dtype=np.float32).reshape(-1)
        if a.size != cnt:
            raise ValueError('%s: %d floats, the model JSON says %d' % (name, a.size, cnt))
        out.append((name, a))
    if isinstance(model, str):
        model = json.load(open(model))
    total = sum(int(np.prod(s)) for _, s in names)
    write_safetensors(path, out, {'pipedream.model': model_name or model['name'], 'pipedream.params': str(total)})

# ---- Philox4x32-10 and the data order (src/core/rng.c, src/data/data.c) --------------------------
M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
RNG_STREAM_SHUFFLE = 2


def _mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _philox(c, k):
    c0, c1, c2, c3 = c
    k0, k1 = k
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


class Rng:
    """rng_init / rng_u32 / rng_below of src/core/rng.c."""

    def __init__(self, seed, stream, substream):
        k = _mix64(seed ^ _mix64(stream))
        self.key = (k & M32, k >> 32)
        self.ctr = [0, 0, substream & M32, (substream >> 32) & M32]
        self.buf, self.pos = (), 4

    def u32(self):
        if self.pos == 4:
            self.buf = _philox(self.ctr, self.key)
            self.ctr[0] = (self.ctr[0] + 1) & M32
            if self.ctr[0] == 0:
                self.ctr[1] = (self.ctr[1] + 1) & M32
            self.pos = 0
        self.pos += 1
        return self.buf[self.pos - 1]

    def below(self, n):
        m = self.u32() * n
        lo = m & M32
        if lo < n:
            t = ((-n) & M32) % n
            while lo < t:
                m = self.u32() * n
                lo = m & M32
        return m >> 32


def permutation(seed, stream, substream, n):
    r = Rng(seed, stream, substream)
    perm = list(range(n))
    for i in range(n, 1, -1):
        j = r.below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return np.array(perm, dtype=np.int64)


def epoch_order(n, seed, epoch):
    """data_epoch_order(n, seed, epoch, shuffle = 1)."""
    return permutation(seed, RNG_STREAM_SHUFFLE, epoch, n)

# ---- byte-level text (src/data/data_text.c) ---------------------------------------------------------
TEXT_TEST_FRACTION = 0.05   # DATA_TEXT_TEST_FRACTION


class Text:
    """The split and sequences of data_text_load: x[i] = bytes[i*T : i*T+T], targets shifted by one."""

    def __init__(self, data, ctx, frac=TEXT_TEST_FRACTION):
        self.b = np.frombuffer(data, dtype=np.uint8)
        n = len(self.b)
        tail = max(int(n * frac), ctx + 1)
        if tail >= n:
            raise ValueError('text too short')
        self.ctx, self.split = ctx, n - tail
        self.n_train, self.n_test = (self.split - 1) // ctx, (tail - 1) // ctx

    def batch(self, test, idx):
        """(x, y) int64 arrays (len(idx), T) of sequences idx of the training part or the tail."""
        base = self.split if test else 0
        starts = base + np.asarray(idx, dtype=np.int64) * self.ctx
        win = starts[:, None] + np.arange(self.ctx + 1)[None, :]
        w = self.b[win].astype(np.int64)
        return w[:, :-1], w[:, 1:]

    def minibatch(self, g, batch, seed, cache={}):
        """Global training minibatch g, as data_text_sampler_get (last partial batch kept)."""
        nb = -(-self.n_train // batch)
        epoch, b = divmod(g, nb)
        key = (id(self), seed, epoch)
        if key not in cache:
            cache.clear()
            cache[key] = epoch_order(self.n_train, seed, epoch)
        order = cache[key]
        return self.batch(0, order[b * batch:min((b + 1) * batch, self.n_train)])

# ---- IDX images (src/data/data_idx.c, data_fit.c) ------------------------------------------------


def _idx(path):
    import gzip
    raw = (gzip.open if path.endswith('.gz') else open)(path, 'rb').read()
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(nd)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


class Images:
    """An IDX image set as a pipedream session reads it: pixels / 255 in float32, standardised
    with the training split's mean and std (population std, each rounded to 4 decimals:
    data_stats), (x - mean) * (1 / std) in float32 (data_normalize); minibatches as the
    pipelined runs' sampler gives them (shuffled per epoch, the partial last one dropped)."""

    def __init__(self, directory):
        import os

        def load(stem):
            for name in (stem + '.gz', stem):
                if os.path.exists(os.path.join(directory, name)):
                    return _idx(os.path.join(directory, name))
            raise FileNotFoundError('%s/%s(.gz)' % (directory, stem))
        xtr = load('train-images-idx3-ubyte').astype(np.float32) / np.float32(255)
        xte = load('t10k-images-idx3-ubyte').astype(np.float32) / np.float32(255)
        m = float(xtr.astype(np.float64).mean())
        sd = float(np.sqrt(((xtr.astype(np.float64) - m) ** 2).mean()))
        self.mean, self.std = round(m * 1e4) / 1e4, round(sd * 1e4) / 1e4
        mean, inv = np.float32(self.mean), np.float32(1) / np.float32(self.std)
        self.x = ((xtr - mean) * inv)[:, None, :, :]
        self.x_test = ((xte - mean) * inv)[:, None, :, :]
        self.y = load('train-labels-idx1-ubyte').astype(np.int64)
        self.y_test = load('t10k-labels-idx1-ubyte').astype(np.int64)
        self.n_train = len(self.y)

    def minibatch(self, g, batch, seed, cache={}):
        """Global training minibatch g of `batch` samples (data_sampler_get, drop_last)."""
        nb = self.n_train // batch
        epoch, b = divmod(g, nb)
        key = (id(self), seed, epoch)
        if key not in cache:
            cache.clear()
            cache[key] = epoch_order(self.n_train, seed, epoch)
        idx = cache[key][b * batch:(b + 1) * batch]
        return self.x[idx], self.y[idx]

# ---- a starting checkpoint (src/runtime/rt_ckpt.c) -------------------------------------------


def write_start_checkpoint(directory, model, params, seed, optimizer='adam', schedule='1f1b', states=()):
    """Writes DIRECTORY/ckpt-0000000000.safetensors: a checkpoint taken before any step (weights
    `params` in parameter order, zero optimizer moments, zero minibatches and steps done), so
    that `pipedream train ... --resume DIRECTORY` starts a pipelined run from given weights as
    one-worker `train --init` does (Adam's first step then sees zero moments and step 1, as a
    fresh optimizer). The metadata keys are those rt_ckpt_load requires; --seed must match."""
    import os
    if isinstance(model, str):
        model = json.load(open(model))
    names, snames = param_names(model), state_names(model)
    if len(names) != len(params):
        raise ValueError('%d parameter tensors, the model JSON has %d' % (len(params), len(names)))
    out, moments = [], []
    for (name, shape), a in zip(names, params):
        a = np.asarray(a, dtype=np.float32)
        if tuple(a.shape) != tuple(shape):
            raise ValueError('%s: shape %s, the model JSON says %s' % (name, tuple(a.shape), tuple(shape)))
        out.append((name, a))
        moments.append(('optim.m.' + name, np.zeros(shape, np.float32)))
        if optimizer in ('adam', 'adamw'):
            moments.append(('optim.v.' + name, np.zeros(shape, np.float32)))
    if len(states) != len(snames):
        raise ValueError('%d state tensors, the model JSON has %d' % (len(states), len(snames)))
    out += [(name, np.asarray(a, np.float32).reshape(cnt)) for (name, cnt), a in zip(snames, states)]
    total = sum(int(np.prod(s)) for _, s in names)
    meta = {'pipedream.model': model['name'], 'pipedream.params': str(total), 'pipedream.minibatches_done': '0',
            'pipedream.units_done': '0', 'pipedream.optimizer_step': '0', 'pipedream.seed': str(seed),
            'pipedream.schedule': schedule, 'pipedream.optimizer': optimizer}
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, 'ckpt-0000000000.safetensors')
    write_safetensors(path, out + moments, meta)
    return path


# ---- the learning-rate schedule ------------------------------------------------------------------


def scheduled_lr(t, lr, schedule='constant', warmup=0, decay_steps=0, min_lr=0.0):
    """pipedream's optim_lr: the learning rate of optimizer step t (from 0): a linear warm-up
    over `warmup` steps (lr (t + 1) / warmup), then, for 'cosine' or 'linear', a decay from lr
    to min_lr at step decay_steps, flat after it."""
    if t < warmup:
        return lr * (t + 1) / warmup
    if schedule == 'constant':
        return lr
    q = min((t - warmup) / (decay_steps - warmup), 1.0) if decay_steps > warmup else 1.0
    f = 0.5 * (1.0 + math.cos(math.pi * q)) if schedule == 'cosine' else 1.0 - q
    return min_lr + (lr - min_lr) * f
