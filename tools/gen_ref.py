"""gen_ref.py: writes the PyTorch reference values the nn tests compare against, in the format
of tests/testutil.h (magic "PDREF1\\0\\0", uint32 count, records of name, shape, float32 data).

Run once, from the repository root, and commit the output (the build never needs torch):
    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 /usr/bin/python3 tools/gen_ref.py [classic] [transformer] [export]
(no argument: both groups; the classic files are unchanged by regenerating them).

tests/ref/nn_layers.bin: one case per layer kind, names "<case>.<what>":
    x (input), w.<k> (k-th parameter tensor, pipedream's order), y (training-mode output), dy
    (a random output gradient), dx, dw.<k>, and for batch norm state0 (running mean ++ var
    before) and state (after). The C test (tests/test_nn_layers.c) holds the same cases as
    JSON.
tests/ref/nn_model_<name>.bin: the model of tools/torch_models.py with hash_fill weights
    (not stored: the C test computes the same values) on a batch of 4: x, labels, logits,
    loss, dx, grad.<k> (every stride-th element; grad.<k>.stride holds the stride), state (bn
    running stats after the step), then 10 SGD steps (momentum 0.9, lr 0.01; resnet20 0.05)
    from the same weights on steps.x[s], steps.labels[s]: steps.loss (computed in float64) and
    steps.rtol (the tolerance per step, see below). vgg16 runs in eval mode
    (dropout = identity, tested separately by mask); the others in training mode.
tests/ref/nn_transformer.bin: the transformer layer kinds (embed, layernorm, gelu, dense,
    attention, block), same record names as nn_layers.bin (embed: x are token ids, no dx).
tests/ref/nn_model_gpt-mini.bin, nn_model_lstm-lm.bin: the language models (gen_lm_model).
tests/ref/export_<case>.json + .bin: PyTorch modules exported by tools/export_torch.py (the CNN of
    tests/cli/export_cnn.py in eval and train mode, a small GPT, an LSTM language model) and
    PyTorch's forward, loss and gradients for their weights (gen_export_case)."""
import os
import struct
import sys

os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models as tm  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'ref')
MAX_GRAD = 16384   # elements stored per gradient tensor at most


def write_ref(path, recs):
    with open(path, 'wb') as f:
        f.write(b'PDREF1\0\0')
        f.write(struct.pack('<I', len(recs)))
        for name, t in recs:
            a = np.ascontiguousarray(np.asarray(t, dtype=np.float32))
            if a.ndim == 0:
                a = a.reshape(1)
            nb = name.encode()
            f.write(struct.pack('<I', len(nb)) + nb + struct.pack('<I', a.ndim))
            f.write(struct.pack('<%dI' % a.ndim, *a.shape))
            f.write(a.astype('<f4').tobytes())
    print('%s: %d tensors, %d bytes' % (os.path.relpath(path), len(recs), os.path.getsize(path)))


def np_(t):
    return t.detach().cpu().numpy().copy()   # a snapshot: later steps change grads in place


def bn_state(model):
    s = []
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            s += [np_(m.running_mean), np_(m.running_var)]
    return np.concatenate(s) if s else None


def layer_case(recs, name, mod, x, eval_mode=False, set_state=False):
    """Forward + backward of one module on x with a random dy; appends records."""
    if set_state:
        for m in mod.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    for m in mod.modules():   # non-trivial gamma/beta
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    s0 = bn_state(mod)
    mod.train(not eval_mode)
    x = x.clone().requires_grad_(True)
    params = list(mod.parameters())
    recs.append((name + '.x', np_(x)))
    for k, p in enumerate(params):
        recs.append(('%s.w.%d' % (name, k), np_(p)))
    if s0 is not None:
        recs.append((name + '.state0', s0))
    y = mod(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    recs += [(name + '.y', np_(y)), (name + '.dy', np_(dy)), (name + '.dx', np_(x.grad))]
    for k, p in enumerate(params):
        recs.append(('%s.dw.%d' % (name, k), np_(p.grad)))
    if s0 is not None:
        recs.append((name + '.state', bn_state(mod)))


def gen_layers():
    torch.manual_seed(1234)
    R = []
    r = torch.randn
    layer_case(R, 'linear', nn.Linear(20, 7), r(4, 20))
    layer_case(R, 'linear_relu_nobias', nn.Sequential(nn.Linear(20, 7, bias=False), nn.ReLU()), r(4, 20))
    layer_case(R, 'conv', nn.Conv2d(3, 5, 3, 1, 1), r(4, 3, 8, 8))
    layer_case(R, 'conv_relu_s2', nn.Sequential(nn.Conv2d(3, 4, 3, 2, 0, bias=False), nn.ReLU()), r(4, 3, 9, 9))
    layer_case(R, 'conv_5x5', nn.Conv2d(2, 3, 5, 1, 2), r(2, 2, 7, 7))
    layer_case(R, 'maxpool', nn.MaxPool2d(2, 2), r(4, 3, 8, 8))
    layer_case(R, 'maxpool_k3s2', nn.MaxPool2d(3, 2), r(2, 3, 9, 9))
    layer_case(R, 'gap', nn.AdaptiveAvgPool2d(1), r(4, 5, 6, 6))   # y reshaped in C
    layer_case(R, 'relu', nn.ReLU(), r(4, 3, 5, 5))
    layer_case(R, 'batchnorm', nn.BatchNorm2d(5), r(4, 5, 6, 6) * 2 + 0.5)
    layer_case(R, 'batchnorm_relu', nn.Sequential(nn.BatchNorm2d(3), nn.ReLU()), r(4, 3, 5, 5))
    layer_case(R, 'batchnorm_eval', nn.BatchNorm2d(3), r(4, 3, 5, 5), eval_mode=True, set_state=True)
    layer_case(R, 'batchnorm1d', nn.BatchNorm1d(6), r(8, 6))
    layer_case(R, 'lstm', tm.Lstm(6, 8), r(3, 5, 6))
    layer_case(R, 'flatten', nn.Flatten(), r(2, 3, 4, 4))
    layer_case(R, 'reshape', tm.Reshape(4, 12), r(2, 3, 4, 4))
    layer_case(R, 'pad', nn.ZeroPad2d(2), r(2, 3, 5, 5))
    layer_case(R, 'last_step', tm.LastStep(), r(3, 5, 8))
    layer_case(R, 'residual_identity', tm.basic_block(4, 4, 1), r(4, 4, 6, 6))
    layer_case(R, 'residual_conv', tm.basic_block(4, 8, 2), r(4, 4, 8, 8))
    write_ref(os.path.join(OUT, 'nn_layers.bin'), R)


def gen_model(name, batch=4, steps=10, sbatch=4):
    torch.manual_seed(100 + sorted(tm.MODELS).index(name))
    model = tm.MODELS[name]()
    tm.hash_fill(model)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    train = name != 'vgg16'
    model.train(train)
    lossf = nn.CrossEntropyLoss()
    x = torch.rand(batch, 1, 28, 28).requires_grad_(True)
    labels = torch.randint(0, 10, (batch,))
    logits = model(x)
    loss = lossf(logits, labels)
    loss.backward()
    R = [('x', np_(x)), ('labels', np_(labels.float())), ('logits', np_(logits)), ('loss', np_(loss)),
         ('dx', np_(x.grad))]
    for k, p in enumerate(model.parameters()):
        g = np_(p.grad).reshape(-1)
        stride = max(1, -(-g.size // MAX_GRAD))
        R += [('grad.%d' % k, g[::stride]), ('grad.%d.stride' % k, np.array([stride], np.float32))]
    st = bn_state(model)
    if st is not None:
        R.append(('state', st))
    # 10 SGD steps from the same weights and state, in float64 (the oracle) and float32:
    # where training is chaotic (resnet20 at lr 0.05 on tiny batches: BN statistics and relu
    # boundaries amplify rounding), PyTorch's own float32 run drifts from float64 by up to
    # ~1e-2 after 10 steps; the C test allows each step max(1e-4, 5x that drift).
    lr = 0.05 if name == 'resnet20' else 0.01
    sx = torch.rand(steps, sbatch, 1, 28, 28)
    sl = torch.randint(0, 10, (steps, sbatch))
    runs = {}
    for dt in (torch.float64, torch.float32):
        model.load_state_dict(init)
        model.to(dt)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        losses = []
        for s in range(steps):
            opt.zero_grad()
            loss = lossf(model(sx[s].to(dt)), sl[s])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[dt] = np.array(losses)
    l64, l32 = runs[torch.float64], runs[torch.float32]
    rtol = np.maximum(1e-4, 5 * np.abs(l32 - l64) / np.abs(l64))
    print('%s: 10-step loss rtol %s' % (name, ' '.join('%.0e' % t for t in rtol)))
    R += [('steps.x', np_(sx)), ('steps.labels', np_(sl.float())), ('steps.loss', l64.astype(np.float32)),
          ('steps.rtol', rtol.astype(np.float32)), ('steps.lr', np.array([lr], np.float32))]
    write_ref(os.path.join(OUT, 'nn_model_%s.bin' % name), R)


# ---- transformer / language-model references (tests/test_nn_transformer.c) ---------------------
def embed_case(recs, name, mod, n, t, vocab):
    """embed: x are token ids (written as floats); no input gradient."""
    x = torch.randint(0, vocab, (n, t))
    params = list(mod.parameters())
    recs.append((name + '.x', np_(x.float())))
    for k, p in enumerate(params):
        recs.append(('%s.w.%d' % (name, k), np_(p)))
    y = mod(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    recs += [(name + '.y', np_(y)), (name + '.dy', np_(dy))]
    for k, p in enumerate(params):
        recs.append(('%s.dw.%d' % (name, k), np_(p.grad)))


def gen_transformer_layers():
    """tests/ref/nn_transformer.bin: one case per transformer layer kind (as nn_layers.bin)."""
    torch.manual_seed(4321)
    R = []
    r = torch.randn
    embed_case(R, 'embed_pos', tm.Embed(11, 6, 5), 3, 5, 11)
    embed_case(R, 'embed', tm.Embed(11, 6), 3, 5, 11)
    ln = nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    layer_case(R, 'layernorm', ln, r(3, 5, 8) * 2 + 0.5)
    layer_case(R, 'layernorm_1d', nn.LayerNorm(7, eps=1e-3), r(4, 7))
    layer_case(R, 'gelu_tanh', nn.GELU(approximate='tanh'), r(3, 5, 8) * 3)
    layer_case(R, 'gelu', nn.GELU(), r(3, 5, 8) * 3)
    layer_case(R, 'dense', nn.Linear(8, 6), r(3, 5, 8))
    layer_case(R, 'dense_nobias', nn.Linear(8, 6, bias=False), r(3, 5, 8))
    layer_case(R, 'attention', tm.CausalSelfAttention(8, 2), r(3, 5, 8))
    layer_case(R, 'attention_full_nobias', tm.CausalSelfAttention(12, 3, causal=False, bias=False), r(2, 6, 12))
    layer_case(R, 'attention_1head', tm.CausalSelfAttention(8, 1), r(2, 7, 8))
    layer_case(R, 'block', tm.gpt_block(8, 2, 32), r(3, 5, 8))
    layer_case(R, 'block_erf', tm.gpt_block(8, 4, 16, approximate='none'), r(2, 6, 8))
    write_ref(os.path.join(OUT, 'nn_transformer.bin'), R)


def gen_lm_model(name, batch=2, steps=5, lr=1e-3):
    """tests/ref/nn_model_<name>.bin for a language model with lm_hash_fill weights: x (token
    ids as floats), targets, logits, loss, grad.<k> (strided as gen_model), then `steps` Adam
    steps (lr 1e-3) from the same weights on steps.x[s], steps.targets[s]: steps.loss (float64)
    and steps.rtol (5x PyTorch's own float32 drift, at least 1e-4)."""
    torch.manual_seed(200 + sorted(tm.LM_MODELS).index(name))
    model = tm.LM_MODELS[name]()
    tm.lm_hash_fill(model)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    t = 64
    x = torch.randint(0, 256, (batch, t))
    targets = torch.randint(0, 256, (batch, t))
    logits = model(x)
    loss = tm.lm_loss(logits, targets)
    loss.backward()
    R = [('x', np_(x.float())), ('targets', np_(targets.float())), ('logits', np_(logits)), ('loss', np_(loss))]
    for k, p in enumerate(model.parameters()):
        g = np_(p.grad).reshape(-1)
        stride = max(1, -(-g.size // MAX_GRAD))
        R += [('grad.%d' % k, g[::stride]), ('grad.%d.stride' % k, np.array([stride], np.float32))]
    sx = torch.randint(0, 256, (steps, batch, t))
    st = torch.randint(0, 256, (steps, batch, t))
    runs = {}
    for dt in (torch.float64, torch.float32):
        model.load_state_dict(init)
        model.to(dt)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for s in range(steps):
            opt.zero_grad()
            loss = tm.lm_loss(model(sx[s]), st[s])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs[dt] = np.array(losses)
    l64, l32 = runs[torch.float64], runs[torch.float32]
    rtol = np.maximum(1e-4, 5 * np.abs(l32 - l64) / np.abs(l64))
    print('%s: %d-step loss rtol %s' % (name, steps, ' '.join('%.0e' % v for v in rtol)))
    R += [('steps.x', np_(sx.float())), ('steps.targets', np_(st.float())), ('steps.loss', l64.astype(np.float32)),
          ('steps.rtol', rtol.astype(np.float32)), ('steps.lr', np.array([lr], np.float32))]
    write_ref(os.path.join(OUT, 'nn_model_%s.bin' % name), R)


# ---- export round trips (tests/test_nn_export.c) ---------------------------------------------------
def gen_export_case(name, module, shape, train, tokens=0, vocab=0, batch=4):
    """Exports module with tools/export_torch.py to tests/ref/export_<name>.json and writes
    tests/ref/export_<name>.bin: x, targets, train (1/0), w.<k> and grad.<k> (pipedream's
    order), state0 / state (batch-norm statistics before / after), logits, loss, dx."""
    import export_torch as ex
    model, params, states = ex.export(module, shape, name)
    with open(os.path.join(OUT, 'export_%s.json' % name), 'w') as f:
        f.write(ex.dumps(model))
    module.train(train)
    if tokens:
        x = torch.randint(0, vocab, (batch,) + tuple(shape))
        xin = x.float()
    else:
        x = torch.randn((batch,) + tuple(shape)).requires_grad_(True)
        xin = x
    R = [('x', np_(xin)), ('train', np.array([1.0 if train else 0.0], np.float32))]
    if states:
        R.append(('state0', np.concatenate(states)))
    for k, p in enumerate(params):
        R.append(('w.%d' % k, np_(p)))
    out = module(x)
    if tokens:
        targets = torch.randint(0, out.shape[-1], out.shape[:-1])
        loss = tm.lm_loss(out, targets)
    else:
        targets = torch.randint(0, out.shape[-1], (batch,))
        loss = nn.functional.cross_entropy(out, targets)
    loss.backward()
    R += [('targets', np_(targets.float())), ('logits', np_(out)), ('loss', np_(loss))]
    if not tokens:
        R.append(('dx', np_(x.grad)))
    for k, p in enumerate(params):
        R.append(('grad.%d' % k, np_(p.grad)))
    if states:
        R.append(('state', np.concatenate([np_(t).reshape(-1) for m in module.modules()
                                           if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d))
                                           for t in (m.running_mean, m.running_var)])))
    write_ref(os.path.join(OUT, 'export_%s.bin' % name), R)


def gen_export():
    import export_torch as ex
    net = ex.load_factory(os.path.join(os.path.dirname(OUT), 'cli', 'export_cnn.py') + ':Net')
    torch.manual_seed(777)
    m = net(c=6, hidden=16)   # small: the reference stores weights and gradients
    for b in m.modules():   # non-trivial batch-norm parameters and statistics
        if isinstance(b, nn.BatchNorm2d):
            with torch.no_grad():
                b.weight.uniform_(0.5, 1.5)
                b.bias.uniform_(-0.5, 0.5)
                b.running_mean.uniform_(-0.5, 0.5)
                b.running_var.uniform_(0.5, 1.5)
    gen_export_case('cnn_eval', m, (1, 28, 28), train=False)
    gen_export_case('cnn_train', net(dropout=0.0, c=6, hidden=16), (1, 28, 28), train=True)
    gen_export_case('gpt', tm.gpt(vocab=32, ctx=8, dim=16, layers=2, heads=2, hidden=64), (8,), train=True,
                    tokens=1, vocab=32)
    gen_export_case('lstm_lm', tm.LstmLm(vocab=32, dim=12, hidden=10), (6,), train=True, tokens=1, vocab=32)


if __name__ == '__main__':
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    which = sys.argv[1:] or ['classic', 'transformer', 'export']
    if 'classic' in which:
        gen_layers()
        for n in sorted(tm.MODELS):
            gen_model(n)
    if 'transformer' in which:
        gen_transformer_layers()
        for n in sorted(tm.LM_MODELS):
            gen_lm_model(n)
    if 'export' in which:
        gen_export()
