"""torch_models.py: the five reference models of MODELS.md in PyTorch, module for module as
models/*.json builds them, so that model.parameters() is in pipedream's parameter-buffer order:
per layer weight then bias; nn.LSTM: weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0;
batch norm: weight (gamma), bias (beta); a residual block: body's parameters, then the
shortcut's. Batch-norm buffers (running_mean, running_var) are pipedream's state buffer in
module order. ReLUs are separate modules here; pipedream fuses them ("relu": true), which
changes no parameter.

Also: hash_fill(model), the deterministic weights both sides compute (tests/test_nn_models.c has
the C twin), so reference files need not store 21 MB of vgg16 weights.

Used by tools/gen_ref.py and bench/bench_vs_pytorch.py; import torch only after setting
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS."""
import numpy as np
import torch
import torch.nn as nn


class Residual(nn.Module):
    """relu(body(x) + shortcut(x)); an empty shortcut is the identity."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = nn.Sequential(*body)
        self.shortcut = nn.Sequential(*(shortcut or []))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class LastStep(nn.Module):
    def forward(self, x):
        return x[:, -1, :]


class Lstm(nn.Module):
    """nn.LSTM(batch_first) returning only the sequence of hidden states."""

    def __init__(self, i, h):
        super().__init__()
        self.lstm = nn.LSTM(i, h, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


class Reshape(nn.Module):
    def __init__(self, *shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.reshape(x.shape[0], *self.shape)


def pad2():
    return nn.ZeroPad2d(2)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def lenet5():
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def vgg16():
    cfg = [16, 16, 'P', 32, 32, 'P', 64, 64, 64, 'P', 128, 128, 128, 'P', 128, 128, 128, 'P']
    layers, c = [pad2()], 1
    for v in cfg:
        if v == 'P':
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    layers += [nn.Flatten(), nn.Linear(128, 2048), nn.ReLU(), nn.Dropout(0.5), nn.Linear(2048, 2048), nn.ReLU(),
               nn.Dropout(0.5), nn.Linear(2048, 10)]
    return nn.Sequential(*layers)


def basic_block(cin, c, stride):
    body = [nn.Conv2d(cin, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c)]
    sc = None
    if stride != 1 or cin != c:
        sc = [nn.Conv2d(cin, c, 1, stride, 0, bias=False), nn.BatchNorm2d(c)]
    return Residual(body, sc)


def resnet20():
    layers = [pad2(), nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for g, c in enumerate([16, 32, 64]):
        for b in range(3):
            layers.append(basic_block(cin, c, 2 if g > 0 and b == 0 else 1))
            cin = c
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def lstm():
    return nn.Sequential(Reshape(28, 28), Lstm(28, 256), Lstm(256, 256), LastStep(), nn.Linear(256, 10))


MODELS = {'mlp': mlp, 'lenet5': lenet5, 'vgg16': vgg16, 'resnet20': resnet20, 'lstm': lstm}

# ---- deterministic weights shared with the C tests ------------------------------------------
KIND_WEIGHT, KIND_BIAS, KIND_GAMMA, KIND_BETA = 0, 1, 2, 3


def param_kinds(model):
    """[(tensor, kind, fan_in)] in model.parameters() order."""
    out = []
    for mod in model.modules():
        if isinstance(mod, nn.Conv2d):
            fan = mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1]
            out.append((mod.weight, KIND_WEIGHT, fan))
            if mod.bias is not None:
                out.append((mod.bias, KIND_BIAS, fan))
        elif isinstance(mod, nn.Linear):
            out.append((mod.weight, KIND_WEIGHT, mod.in_features))
            if mod.bias is not None:
                out.append((mod.bias, KIND_BIAS, mod.in_features))
        elif isinstance(mod, (nn.BatchNorm2d, nn.BatchNorm1d)):
            out += [(mod.weight, KIND_GAMMA, 1), (mod.bias, KIND_BETA, 1)]
        elif isinstance(mod, nn.LSTM):
            h = mod.hidden_size
            out += [(mod.weight_ih_l0, KIND_WEIGHT, h), (mod.weight_hh_l0, KIND_WEIGHT, h),
                    (mod.bias_ih_l0, KIND_BIAS, h), (mod.bias_hh_l0, KIND_BIAS, h)]
    seen, uniq = set(), []
    for e in out:
        if id(e[0]) not in seen:
            seen.add(id(e[0]))
            uniq.append(e)
    ps = list(model.parameters())
    assert len(ps) == len(uniq) and all(a is b for a, (b, _, _) in zip(ps, uniq)), "parameter order"
    return uniq


def hash_uniform(j, n):
    """u in [0, 1) for elements 0..n-1 of parameter tensor j: an integer hash (exact in C)."""
    M = np.uint64(0xFFFFFFFF)
    i = np.arange(n, dtype=np.uint64)
    x = (i * np.uint64(0x9E3779B1) + np.uint64(j) * np.uint64(0x85EBCA77) + np.uint64(0x165667B1)) & M
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & M
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & M
    x ^= x >> np.uint64(15)
    return (x >> np.uint64(8)).astype(np.float64) / 16777216.0


def hash_values(j, n, kind, fan_in):
    u = hash_uniform(j, n)
    if kind == KIND_GAMMA:
        v = 1.0 + 0.1 * (2.0 * u - 1.0)
    elif kind == KIND_BETA:
        v = 0.1 * (2.0 * u - 1.0)
    else:
        v = (2.0 * u - 1.0) / np.sqrt(float(fan_in))
    return v.astype(np.float32)


def hash_fill(model):
    with torch.no_grad():
        for j, (p, kind, fan) in enumerate(param_kinds(model)):
            p.copy_(torch.from_numpy(hash_values(j, p.numel(), kind, fan)).reshape(p.shape))


# ---- transformer and language-model modules (models/gpt-mini.json, models/lstm-lm.json) ------
# Module for module as the "embed", "layernorm", "attention", "gelu", "dense" and "block"
# layer kinds compute, parameters in pipedream's order. Inputs are token ids (N, T) (floats
# holding integers, as pipedream's buffers, or longs); outputs of the language models are
# logits (N, T, vocab), the loss cross-entropy over every position.
import math  # noqa: E402


class Embed(nn.Module):
    """"embed": tok(vocab, dim)[x] + pos(T, dim)[arange(T)] (no position embedding if positions == 0)."""

    def __init__(self, vocab, dim, positions=0):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(positions, dim) if positions else None

    def forward(self, x):
        y = self.tok(x.long())
        if self.pos is not None:
            y = y + self.pos.weight[:x.shape[1]]
        return y


class CausalSelfAttention(nn.Module):
    """"attention": GPT-2's attention: one qkv projection, heads of dim/heads, causal mask, proj."""

    def __init__(self, dim, heads, causal=True, bias=True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x):
        n, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).view(n, t, 3, h, d // h).permute(2, 0, 3, 1, 4)   # (n, h, t, hd) each
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float('-inf'))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d)
        return self.proj(y)


class Step(nn.Module):
    """One residual step of a "block": x + body(x)."""

    def __init__(self, *layers):
        super().__init__()
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.body(x)


class Block(nn.Module):
    """"block": residual steps applied in order."""

    def __init__(self, *steps):
        super().__init__()
        self.steps = nn.Sequential(*steps)

    def forward(self, x):
        return self.steps(x)


def gpt_block(dim, heads, hidden, approximate='tanh'):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""
    return Block(Step(nn.LayerNorm(dim), CausalSelfAttention(dim, heads)),
                 Step(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(approximate=approximate),
                      nn.Linear(hidden, dim)))


def gpt(vocab=256, ctx=64, dim=128, layers=4, heads=4, hidden=512):
    return nn.Sequential(Embed(vocab, dim, ctx), *[gpt_block(dim, heads, hidden) for _ in range(layers)],
                         nn.LayerNorm(dim), nn.Linear(dim, vocab))


def gpt_mini():
    """models/gpt-mini.json: bytes, context 64, 4 pre-norm blocks of width 128, 4 heads, MLP 4x."""
    return gpt()


def gpt_small():
    """models/gpt-small.json: bytes, context 128, 6 pre-norm blocks of width 256, 8 heads, MLP 4x,
    output head tied to the token embedding (one parameter: head.weight is tok.weight)."""
    m = nn.Sequential(Embed(256, 256, 128), *[gpt_block(256, 8, 1024) for _ in range(6)], nn.LayerNorm(256),
                      nn.Linear(256, 256, bias=False))
    m[-1].weight = m[0].tok.weight
    return m


class LstmLm(nn.Module):
    """models/lstm-lm.json: embed(256, 256) -> LSTM 256 -> LSTM 256 -> per-position linear to 256."""

    def __init__(self, vocab=256, dim=256, hidden=256):
        super().__init__()
        self.embed = Embed(vocab, dim)
        self.l1 = Lstm(dim, hidden)
        self.l2 = Lstm(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.head(self.l2(self.l1(self.embed(x))))


def lstm_lm():
    return LstmLm()


LM_MODELS = {'gpt-mini': gpt_mini, 'lstm-lm': lstm_lm}
# models with tied parameters (kept apart: tools/gen_ref.py seeds its references by LM_MODELS' order)
LM_MODELS_TIED = {'gpt-small': gpt_small}


def lm_loss(logits, targets):
    """Cross-entropy over every position: mean over N * T (nats per token)."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())


def lm_param_kinds(model):
    """param_kinds for models with the modules above as well (embedding fan_in 1: pipedream's
    default init of an embedding is uniform(-1, 1)). A tensor shared by two modules (tied) is
    listed once, at its first module, as model.parameters() does."""
    out = []
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            out.append((mod.weight, KIND_WEIGHT, 1))
        elif isinstance(mod, nn.LayerNorm):
            out += [(mod.weight, KIND_GAMMA, 1), (mod.bias, KIND_BETA, 1)]
        elif isinstance(mod, nn.Linear):
            out.append((mod.weight, KIND_WEIGHT, mod.in_features))
            if mod.bias is not None:
                out.append((mod.bias, KIND_BIAS, mod.in_features))
        elif isinstance(mod, nn.LSTM):
            h = mod.hidden_size
            out += [(mod.weight_ih_l0, KIND_WEIGHT, h), (mod.weight_hh_l0, KIND_WEIGHT, h),
                    (mod.bias_ih_l0, KIND_BIAS, h), (mod.bias_hh_l0, KIND_BIAS, h)]
        elif isinstance(mod, (nn.Conv2d, nn.BatchNorm2d, nn.BatchNorm1d)):
            raise ValueError('lm_param_kinds: use param_kinds for %s' % type(mod).__name__)
    seen, uniq = set(), []
    for e in out:
        if id(e[0]) not in seen:
            seen.add(id(e[0]))
            uniq.append(e)
    ps = list(model.parameters())
    assert len(ps) == len(uniq) and all(a is b for a, (b, _, _) in zip(ps, uniq)), "parameter order"
    return uniq


def lm_hash_fill(model):
    with torch.no_grad():
        for j, (p, kind, fan) in enumerate(lm_param_kinds(model)):
            p.copy_(torch.from_numpy(hash_values(j, p.numel(), kind, fan)).reshape(p.shape))


def lm_top_layers(model):
    """The modules of a language-model twin that are the model JSON's top-level layers, in
    order (pipeline stages cut between them): an nn.Sequential's children; LstmLm's four."""
    if isinstance(model, nn.Sequential):
        return list(model)
    if isinstance(model, LstmLm):
        return [model.embed, model.l1, model.l2, model.head]
    raise ValueError('lm_top_layers: %s is neither nn.Sequential nor LstmLm' % type(model).__name__)


def lm_load_weights(model, model_json, path):
    """Copies a pipedream weights file (names of model_json, parameter order) into model."""
    import pd_io
    w, _ = pd_io.read_safetensors(path)
    mirrors = pd_io.tie_mirrors(model_json)   # tied copies: the twin holds the tensor once
    names = [(n, s) for n, s in pd_io.param_names(model_json) if n not in mirrors]
    ps = list(model.parameters())
    if len(ps) != len(names):
        raise ValueError('%s: the twin has %d parameter tensors, %s has %d' % (path, len(ps), model_json, len(names)))
    with torch.no_grad():
        for (name, shape), p in zip(names, ps):
            if name not in w:
                raise ValueError('%s: no tensor %s' % (path, name))
            p.copy_(torch.from_numpy(w[name]).reshape(p.shape))


def lm_pd_params(model, model_json):
    """The twin's parameters as float32 arrays in pipedream's buffer order (model_json's names), a
    tied tensor repeated at its mirror (for pd_io.write_weights)."""
    import pd_io
    mirrors = pd_io.tie_mirrors(model_json)
    ps, byname, out = iter(model.parameters()), {}, []
    for name, _ in pd_io.param_names(model_json):
        if name in mirrors:
            out.append(byname[mirrors[name]])
        else:
            byname[name] = next(ps).detach().numpy()
            out.append(byname[name])
    return out


def lm_evaluate(model, text, batch=256):
    """(test loss in nats per token, accuracy) over the held-out tail of a pd_io.Text, in eval
    mode, weighted by sequences as pipedream's evaluation."""
    model.eval()
    tot, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, text.n_test, batch):
            idx = np.arange(i, min(i + batch, text.n_test))
            x, y = text.batch(1, idx)
            logits = model(torch.from_numpy(x))
            tot += lm_loss(logits, torch.from_numpy(y)).item() * len(idx)
            hits += (logits.argmax(-1) == torch.from_numpy(y)).sum().item()
    model.train()
    return tot / text.n_test, hits / (text.n_test * text.ctx)
