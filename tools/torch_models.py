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
    ps = list(model.parameters())
    assert len(ps) == len(out) and all(a is b for a, (b, _, _) in zip(ps, out)), "parameter order"
    return out


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
