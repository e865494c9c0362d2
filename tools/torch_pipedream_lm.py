#!/usr/bin/python3
"""torch_pipedream_lm.py: an independent oracle of pipedream's pipelined training semantics in
PyTorch, for the language models: the twin of models/<model>.json (tools/torch_models.py) split
into the stages of a straight plan, trained on pipedream's exact minibatches (tools/pd_io.py)
with the weight versions each schedule kind reads (docs/explanation/schedules.md, "Weight versions"):

    kind          stage s of p computes minibatch m's forward and backward on its version
    seq, 1f1b-flush, gpipe   m                  (sequential training; micro-batches change only
                                                 the summation order, so they are not split here)
    1f1b          max(0, m - (p - 1 - s))       (weight stashing: forward i of a worker with
                                                 warm-up p - s follows backward i - (p - s))
    1f1b --vertical-sync    max(0, m - (p - 1)) (every stage uses the input stage's version)
    2bw           max(0, m - 1)                 (PipeDream-2BW: W(k+1) = W(k) - lr g(W(k-1)))
    1f1b --microbatches M: micro-batch i = M m + j reads max(0, floor((i - (p - 1 - s)) / M))
                                                (the newest version when its forward runs: a
                                                 stage steps once per minibatch, after its M-th
                                                 backward; its micro-batches i may then straddle
                                                 two versions)

and in every kind the stage's optimizer (Adam or SGD, one state per stage, one step per
minibatch) applies that gradient to the stage's newest weights, making version m + 1. This is
an ordinary autograd graph per minibatch whose stage parameters hold the versions above, so the
oracle shares no code with the runtime: it checks the runtime's versions, stashes, message
matching and optimizer, not just its kernels. (--no-stash is not modelled: its backward mixes
the forward's activations with newer weights inside each layer, which autograd cannot express.)

    /usr/bin/python3 tools/torch_pipedream_lm.py --text kjv.txt --plan plan.json --kind 1f1b \\
        --steps 200 --minibatch 32 --lr 1e-3 --init init.safetensors

--data DIR trains a CNN (--model a JSON path, --twin its PyTorch module, an nn.Sequential of the
JSON's top-level layers) on IDX images standardised as pipedream does (pd_io.Images), with
cross-entropy loss; batch norm's running statistics go into the start checkpoint's state.

--plan takes the stages (straight: one replica each) from a pipedream plan; --cuts
0,1:2:3:4,5,6 gives them by hand. --delays d0,d1,... sets every stage's delay by hand (an
experiment: which stage's staleness costs what). --warmup-steps W multiplies the learning rate
of step t (0-based) by min(1, (t + 1) / W) (a linear warm-up; pipedream's CLI has none: an
oracle-only experiment, for the sequential and pipelined kinds alike). Output: one JSON line
{"framework": "torch-oracle", "kind", "delays", "test_loss", "test_accuracy", "final_loss" (the
last minibatch's loss, as pipedream's pipelined summary), "mean_loss", "losses" (with --losses:
every minibatch's loss)}.
--save W.safetensors writes the final weights in pipedream's names (compare with a checkpoint);
--start-checkpoint DIR writes the initial ones as a step-0 checkpoint, so that `pipedream train
... --plan P --resume DIR` starts from the same weights (the pipelined command has no --init)."""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
ap.add_argument('--text', help='byte-level text (a language model)')
ap.add_argument('--data', help='a directory of IDX images (Fashion-MNIST\'s files; a CNN given by a JSON path and --twin)')
ap.add_argument('--model', default='gpt-mini', help='gpt-mini or lstm-lm, or a model JSON path with --twin')
ap.add_argument('--twin', help='FILE.py:FACTORY building the PyTorch twin of --model (a JSON path)')
ap.add_argument('--plan', help='pipedream plan (straight) whose stages to use')
ap.add_argument('--cuts', help='stages by hand: top-level layer indices, stages separated by ":", e.g. 0,1:2:3:4,5,6')
ap.add_argument('--kind', default='1f1b', choices=['seq', '1f1b', '1f1b-flush', 'gpipe', '2bw'])
ap.add_argument('--vertical-sync', action='store_true')
ap.add_argument('--microbatches', type=int, default=1,
                help='1f1b: M micro-batches per minibatch, one step per minibatch (pipedream train --microbatches)')
ap.add_argument('--delays', help='experiment: every stage\'s delay by hand (e.g. 1,0,0,0), overriding --kind\'s')
ap.add_argument('--steps', type=int, default=200)
ap.add_argument('--minibatch', type=int, default=32)
ap.add_argument('--optimizer', default='adam', choices=['adam', 'adamw', 'sgd'])
ap.add_argument('--lr', type=float, default=1e-3)
ap.add_argument('--momentum', type=float, default=0.9)
ap.add_argument('--weight-decay', type=float, default=0.0, help='sgd, adam: L2 in the gradient; adamw: decoupled')
ap.add_argument('--beta2', type=float, default=0.999, help='adam, adamw')
ap.add_argument('--warmup-steps', type=int, default=0, help='linear warm-up: step t at lr (t + 1) / N')
ap.add_argument('--lr-schedule', default='constant', choices=['constant', 'cosine', 'linear'],
                help='after the warm-up, decay to --min-lr at --decay-steps (pipedream train --lr-schedule)')
ap.add_argument('--decay-steps', type=int, default=0, help='default: --steps')
ap.add_argument('--min-lr', type=float, default=0.0)
ap.add_argument('--wire', default='fp32', choices=['fp32', 'bf16', 'int8', 'int4', 'delta'],
                help='every activation entering a stage through this codec (pipedream train --wire; '
                     'tools/pd_codec.py: bit for bit the runtime\'s)')
ap.add_argument('--wire-grad', choices=['fp32', 'bf16', 'int8', 'int4'],
                help='every gradient leaving a stage through this codec (default: as --wire, fp32 after delta)')
ap.add_argument('--error-feedback', action='store_true',
                help='gradients: the error of a message added to the next of its boundary and micro-batch position')
ap.add_argument('--clip-grad-norm', type=float, default=0.0,
                help='torch.nn.utils.clip_grad_norm_ over every stage before each step (kinds without delays only)')
ap.add_argument('--staleness', default='none',
                help='none, predict, lookahead, lr-warmup, or a +-joined combination (1f1b only; pipedream train --staleness)')
ap.add_argument('--staleness-warmup', type=int, default=500, help='lr-warmup: its steps K')
ap.add_argument('--seed', type=int, default=1)
ap.add_argument('--threads', type=int, default=1)
ap.add_argument('--init', help='start from this weights file (else PyTorch\'s init of the twin, seeded by --seed)')
ap.add_argument('--save', help='write the final weights here (pipedream names)')
ap.add_argument('--init-out', help='write the initial weights here (pipedream names; for one-worker train --init)')
ap.add_argument('--start-checkpoint', metavar='DIR',
                help='write the initial weights as a step-0 checkpoint in DIR (for pipelined train --resume DIR)')
ap.add_argument('--losses', action='store_true', help='include every minibatch\'s loss in the output')
args = ap.parse_args()
os.environ['OMP_NUM_THREADS'] = os.environ['OPENBLAS_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pd_io  # noqa: E402
import torch_models as tm  # noqa: E402


def fail(msg):
    sys.exit('torch_pipedream_lm: error: ' + msg)


torch.set_num_threads(args.threads)
if args.twin:
    import importlib.util
    f, _, fac = args.twin.partition(':')
    spec = importlib.util.spec_from_file_location('twin', f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model_json, factory = args.model, getattr(mod, fac)
else:
    if args.model not in tm.LM_MODELS:
        fail('unknown model %r (gpt-mini, lstm-lm, or a JSON path with --twin)' % args.model)
    model_json, factory = os.path.join(HERE, '..', 'models', args.model + '.json'), tm.LM_MODELS[args.model]
spec_json = json.load(open(model_json))
if (args.text is None) == (args.data is None):
    fail('give one of --text FILE (a language model) and --data DIR (images)')
if args.text:
    text = pd_io.Text(open(args.text, 'rb').read(), spec_json['input'][0])
    loss_of = tm.lm_loss
else:
    text = pd_io.Images(args.data)
    loss_of = torch.nn.functional.cross_entropy

torch.manual_seed(args.seed)
model = factory()
layers = tm.lm_top_layers(model)
if len(layers) != len(spec_json['layers']):
    fail('the twin has %d top-level modules, %s has %d layers' % (len(layers), model_json, len(spec_json['layers'])))
if args.init:
    tm.lm_load_weights(model, model_json, args.init)
init = [q.detach().numpy().copy() for q in model.parameters()]
if args.init_out:
    pd_io.write_weights(args.init_out, model_json, init)
# The model's state: per top-level layer with batch norm, its running means then variances (one
# pipedream state tensor per layer).
states = []
for L in layers:
    bns = [m for m in L.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        states.append(np.concatenate([t for m in bns for t in (m.running_mean.numpy(), m.running_var.numpy())]))
if args.start_checkpoint:
    pd_io.write_start_checkpoint(args.start_checkpoint, model_json, init, args.seed, args.optimizer, states=states)

# Stages: lists of top-level layer indices, in order, covering every layer once.
if args.plan and args.cuts:
    fail('--plan and --cuts exclude each other')
if args.plan:
    plan = json.load(open(args.plan))
    if any(s.get('replicas', 1) != 1 for s in plan['stages']):
        fail('%s: the oracle models straight plans only (one replica per stage)' % args.plan)
    stages = [list(s['layers']) for s in plan['stages']]
elif args.cuts:
    stages = [[int(i) for i in part.split(',')] for part in args.cuts.split(':')]
else:
    stages = [list(range(len(layers)))]
if [i for s in stages for i in s] != list(range(len(layers))):
    fail('stages %s do not cover layers 0..%d in order' % (stages, len(layers) - 1))
p = len(stages)
if args.vertical_sync and args.kind != '1f1b':
    fail('--vertical-sync applies only to 1f1b')
if args.kind == '1f1b':
    delays = [p - 1] * p if args.vertical_sync else [p - 1 - s for s in range(p)]
elif args.kind == '2bw':
    delays = [1] * p
else:
    delays = [0] * p
M = args.microbatches
if M < 1 or args.minibatch % M:
    fail('--microbatches %d: needs a divisor of --minibatch %d' % (M, args.minibatch))
if M > 1 and (args.kind == '2bw' or args.vertical_sync or args.delays):
    fail('--microbatches models 1f1b without vertical sync, and the flushing kinds (whose micro-batches change '
         'the summation order, and the units a codec sees)')
if M > 1 and args.kind == '1f1b':   # the most steps a stage's units cross: ceil((p - 1 - s) / M)
    delays = [-(-(p - 1 - s) // M) for s in range(p)]
wire_grad = args.wire_grad or ('fp32' if args.wire == 'delta' else args.wire)
if args.error_feedback and wire_grad == 'fp32':
    fail('--error-feedback needs a gradient codec that loses something')
# The wire: unit UNIT['i'] (global) of UNIT['pos'] (the samples' dataset positions, as the
# runtime's sampler orders them) crosses boundary b (stages b, b + 1) as its codecs make it,
# the gradient back likewise (int4: stochastic, keyed by (seed, unit * stages + b)).
UNIT = {'i': 0, 'pos': None, 'first': True, 'train': True}
if args.wire != 'fp32' or wire_grad != 'fp32':
    import pd_codec
    stores = [pd_codec.DeltaStore(0) for _ in range(p)]
    carried = [{} for _ in range(p)]

    class Wire(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            xn = x.detach().numpy()
            row = pd_codec.row_of(xn.shape[1:])
            ctx.b, ctx.row = b, row
            if args.wire == 'delta' and UNIT['train']:
                stores[b].row = row
                y = stores[b].send(xn, UNIT['pos'], UNIT['first'])
            else:   # evaluation: delta as int8 rows, no reference kept
                y = pd_codec.roundtrip('int8' if args.wire == 'delta' else args.wire, xn, row)
            return torch.from_numpy(np.ascontiguousarray(y))

        @staticmethod
        def backward(ctx, g):
            gn = g.detach().numpy()
            key = pd_codec.key_of(args.seed, UNIT['i'] * p + ctx.b) if wire_grad == 'int4' else None
            if args.error_feedback:
                e = carried[ctx.b].get(UNIT['i'] % M, np.zeros(gn.shape, dtype=np.float32))
                y, carried[ctx.b][UNIT['i'] % M] = pd_codec.error_feedback(wire_grad, gn, e, ctx.row, key)
            else:
                y = pd_codec.roundtrip(wire_grad, gn, ctx.row, key)
            return torch.from_numpy(np.ascontiguousarray(y)), None

    for k, st in enumerate(stages[1:]):
        layers[st[0]].register_forward_pre_hook(lambda mod, inp, b=k: tuple(Wire.apply(t, b) for t in inp))


def unit_positions(i, bs):
    # the dataset positions of unit i's bs samples, and whether it is in the data's first epoch
    # (data_batch_pos with the pipeline's drop_last sampler)
    nb = text.n_train // bs
    epoch, b = divmod(i, nb)
    return pd_io.epoch_order(text.n_train, args.seed, epoch)[b * bs:(b + 1) * bs], epoch == 0
if args.delays:
    delays = [int(d) for d in args.delays.split(',')]
    if len(delays) != p or min(delays) < 0:
        fail('--delays needs %d non-negative integers, one per stage' % p)
methods = set() if args.staleness == 'none' else set(args.staleness.split('+'))
if methods - {'predict', 'lookahead', 'lr-warmup'} or ('predict' in methods and 'lookahead' in methods):
    fail('--staleness %s: not a method (none, predict, lookahead, lr-warmup, joined with +)' % args.staleness)
if methods and (args.kind != '1f1b' or args.delays):
    fail('--staleness models 1f1b\'s weight versions only')
# Steps a stage has taken when unit i's forward reaches it: 1f1b admits p - s forwards before its
# first backward, so forward i follows backward i - (p - s), whatever version it reads; with M
# micro-batches a step follows every M-th backward.
lags = [p - 1 - s for s in range(p)]


def steps_at(s, i):
    return max(0, (i - lags[s]) // M)


def version(s, i):
    # The version unit i (minibatch i // M) reads on stage s.
    m = i // M
    if M > 1 and args.kind == '1f1b':
        return steps_at(s, i)
    return max(0, m - delays[s])

# Every stage's parameters and its weight versions (version v = after v steps at the stage).
params = [[q for i in s for q in layers[i].parameters()] for s in stages]
versions = [{0: [q.detach().clone() for q in ps]} for ps in params]
# One parameter group per stage: lr-warmup gives each stage its own learning rate.
groups = [{'params': ps} for ps in params]
if args.optimizer == 'adam':
    opt = torch.optim.Adam(groups, lr=args.lr, betas=(0.9, args.beta2), weight_decay=args.weight_decay)
elif args.optimizer == 'adamw':
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, args.beta2), weight_decay=args.weight_decay)
else:
    opt = torch.optim.SGD(groups, lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
if args.clip_grad_norm > 0 and any(delays):
    fail('--clip-grad-norm: this kind delays units (%s): no global gradient per step' % delays)
if args.optimizer == 'adamw' and methods & {'predict', 'lookahead'}:
    fail('--staleness predict/lookahead with adamw is not modelled')
# Staleness compensation: after k steps of stage s, the update direction a prediction follows
# (what one more step like the last would subtract, per unit of scale): dirs[s][k], kept while a
# forward may still read it. SGD: lr * momentum buffer; Adam: lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),
# the last step's learning rate and bias corrections, in float32 as pipedream computes them.
dirs = [{} for _ in range(p)]


def direction(s):
    out, lr = [], opt.param_groups[s]['lr']
    for q in params[s]:
        st = opt.state[q]
        if args.optimizer == 'adam':
            k = int(st['step'])
            b1, b2 = opt.param_groups[s]['betas']
            step_size = torch.tensor(lr / (1.0 - b1 ** k), dtype=torch.float32)
            sbc2 = torch.tensor((1.0 - b2 ** k) ** 0.5, dtype=torch.float32)
            out.append((step_size, st['exp_avg'] / (st['exp_avg_sq'].sqrt() / sbc2 + opt.param_groups[s]['eps'])))
        else:
            buf = st.get('momentum_buffer')   # None without momentum: the step's gradient is its direction
            out.append((torch.tensor(lr, dtype=torch.float32), (buf if buf is not None else q.grad).clone()))
    return out


def sched_lr(t):
    return pd_io.scheduled_lr(t, args.lr, args.lr_schedule, args.warmup_steps, args.decay_steps or args.steps,
                              args.min_lr)


def stage_lr(s, t):
    # lr-warmup (after PipeMare): step t of a stage whose units' most delay is D: lr / (D + 1)^(1 - min(t / K, 1))
    D = min(delays[s], args.steps - 1) + 1
    if 'lr-warmup' not in methods or D <= 1:
        return sched_lr(t)
    return sched_lr(t) * D ** -(1.0 - min(t / args.staleness_warmup, 1.0))


def predicted(s, v, i):
    # The weights unit i's forward and backward use on stage s: version v, moved ahead by
    # tau = m - v predicted updates (predict) or by the momentum (lookahead) when tau > 0 (m = i // M,
    # the minibatch whose step applies the gradient), along the direction after the steps the stage
    # has taken then.
    tau, k = i // M - v, steps_at(s, i)
    if tau <= 0 or k == 0 or not (methods & {'predict', 'lookahead'}):
        return versions[s][v]
    if 'predict' in methods:
        scale = float(tau)
    else:
        scale = opt.param_groups[s]['betas'][0] if args.optimizer == 'adam' else args.momentum
    out = []
    for w, (c, d) in zip(versions[s][v], dirs[s][k]):
        a = torch.tensor(scale, dtype=torch.float32) * c
        out.append(w - a * d)
    return out


def load(s, v, i=None):
    ws = versions[s][v] if i is None else predicted(s, v, i)
    with torch.no_grad():
        for q, w in zip(params[s], ws):
            q.copy_(w)


model.train()
losses = []
for m in range(args.steps):
    # Forward and backward of minibatch m's units: stage s holds version(s, i); each micro-batch's
    # loss is scaled by 1 / M and their gradients add up (pipedream's units are its sampler's
    # minibatches of minibatch / M samples).
    opt.zero_grad(set_to_none=True)
    mb_losses = []
    for i in range(m * M, (m + 1) * M):
        for s in range(p):
            load(s, version(s, i), i)
        x, y = text.minibatch(i, args.minibatch // M, args.seed)
        if args.wire == 'delta':
            UNIT['pos'], UNIT['first'] = unit_positions(i, args.minibatch // M)
        UNIT['i'] = i
        loss = loss_of(model(torch.from_numpy(x)), torch.from_numpy(y))
        (loss / M if M > 1 else loss).backward()
        mb_losses.append(loss.item())
    losses.append(sum(mb_losses) / M)
    # The step: that gradient applied to each stage's newest weights (version m), making m + 1.
    grads = [[q.grad for q in ps] for ps in params]
    for s in range(p):
        load(s, m)
        for q, g in zip(params[s], grads[s]):
            q.grad = g
    for s, group in enumerate(opt.param_groups):
        group['lr'] = stage_lr(s, m)
    if args.clip_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([q for ps in params for q in ps], args.clip_grad_norm)
    opt.step()
    for s in range(p):
        versions[s][m + 1] = [q.detach().clone() for q in params[s]]
        oldest = version(s, (m + 1) * M)   # versions and steps read from now on are no older
        for v in [v for v in versions[s] if v < oldest]:
            del versions[s][v]
        if methods & {'predict', 'lookahead'}:
            dirs[s][m + 1] = direction(s)
            for k in [k for k in dirs[s] if k < steps_at(s, (m + 1) * M)]:
                del dirs[s][k]

# The final weights are every stage's newest version (the parameters now hold them).
UNIT['train'] = False
if args.text:
    test_loss, test_acc = tm.lm_evaluate(model, text)
else:   # the test set in eval mode (batch norm's running statistics), weighted by samples
    model.eval()
    tot, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(text.y_test), 500):
            xb, yb = torch.from_numpy(text.x_test[i:i + 500]), torch.from_numpy(text.y_test[i:i + 500])
            out = model(xb)
            tot += torch.nn.functional.cross_entropy(out, yb, reduction='sum').item()
            hits += int((out.argmax(1) == yb).sum())
    test_loss, test_acc = tot / len(text.y_test), hits / len(text.y_test)
out = {'framework': 'torch-oracle', 'model': spec_json['name'], 'kind': args.kind, 'vertical_sync': args.vertical_sync,
       'microbatches': M,
       'stages': stages, 'delays': delays, 'steps': args.steps, 'minibatch': args.minibatch,
       'optimizer': args.optimizer, 'lr': args.lr, 'warmup_steps': args.warmup_steps, 'staleness': args.staleness,
       'lr_schedule': args.lr_schedule, 'clip_grad_norm': args.clip_grad_norm, 'wire': args.wire,
       'wire_grad': wire_grad, 'error_feedback': args.error_feedback,
       'final_loss': round(losses[-1], 6) if losses else None,
       'mean_loss': round(sum(losses) / len(losses), 6) if losses else None,
       'test_loss': round(test_loss, 6), 'test_accuracy': round(test_acc, 4)}
if args.losses:
    out['losses'] = [round(v, 6) for v in losses]
if args.save:
    pd_io.write_weights(args.save, model_json, [q.detach().numpy() for q in model.parameters()])
print(json.dumps(out), flush=True)
