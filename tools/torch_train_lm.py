#!/usr/bin/python3
"""torch_train_lm.py: PyTorch's side of the language-model comparison: trains the PyTorch twin
of models/<model>.json (tools/torch_models.py) on a text file with pipedream's exact recipe and
data (the same held-out tail, the same sequences in the same shuffled order: tools/pd_io.py
ports pipedream's Philox streams), then evaluates the held-out tail in nats per byte.

    /usr/bin/python3 tools/torch_train_lm.py --text kjv.txt --steps 200 --minibatch 32 --lr 1e-3 \\
        --init-out /tmp/init.safetensors --pipedream build/pipedream

Both start from the same weights: PyTorch's default init of the twin (seeded by --seed),
written with --init-out in pipedream's names, or any weights file given by --init. With
--pipedream, the script then runs `pipedream train MODEL.json --text ... --init W` (same steps,
minibatch, Adam, lr, seed, threads) and prints both summaries and the difference of the final
held-out losses. Output: JSON lines {"framework": "pytorch" | "pipedream", "test_loss",
"test_accuracy", "final_loss", "samples_per_s", ...}, then {"compare": ...}.
Throughput counts training steps only (forward, loss, backward, Adam), as pipedream's
samples_per_s does; samples_per_cpu_s divides by the CPU time of the process instead of the
wall time (the fair measure on a shared machine: both runs are single-threaded)."""
import argparse
import json
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
ap.add_argument('--text', required=True)
ap.add_argument('--model', default='gpt-mini', help='gpt-mini, lstm-lm or gpt-small (models/<model>.json)')
ap.add_argument('--steps', type=int, default=200)
ap.add_argument('--minibatch', type=int, default=32)
ap.add_argument('--lr', type=float, default=1e-3)
ap.add_argument('--optimizer', default='adam', choices=['adam', 'adamw'])
ap.add_argument('--weight-decay', type=float, default=0.0, help='adam: L2 in the gradient; adamw: decoupled')
ap.add_argument('--beta2', type=float, default=0.999)
ap.add_argument('--lr-schedule', default='constant', choices=['constant', 'cosine', 'linear'],
                help='after --warmup-steps, decay to --min-lr at the last step (pipedream train --lr-schedule)')
ap.add_argument('--warmup-steps', type=int, default=0)
ap.add_argument('--min-lr', type=float, default=0.0)
ap.add_argument('--clip-grad-norm', type=float, default=0.0, help='torch.nn.utils.clip_grad_norm_ before each step')
ap.add_argument('--seed', type=int, default=1)
ap.add_argument('--threads', type=int, default=1)
ap.add_argument('--log-every', type=int, default=50)
ap.add_argument('--init', help='start from this weights file instead of PyTorch\'s init')
ap.add_argument('--init-out', help='write the initial weights here (pipedream names)')
ap.add_argument('--pipedream', help='also run this pipedream executable with the same init and recipe')
args = ap.parse_args()
os.environ['OMP_NUM_THREADS'] = os.environ['OPENBLAS_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = str(args.threads)

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pd_io  # noqa: E402
import torch_models as tm  # noqa: E402

torch.set_num_threads(args.threads)
model_json = os.path.join(HERE, '..', 'models', args.model + '.json')
ctx = json.load(open(model_json))['input'][0]
text = pd_io.Text(open(args.text, 'rb').read(), ctx)

torch.manual_seed(args.seed)
model = {**tm.LM_MODELS, **tm.LM_MODELS_TIED}[args.model]()
if args.init:
    tm.lm_load_weights(model, model_json, args.init)
init_path = args.init
if args.init_out:
    pd_io.write_weights(args.init_out, model_json, tm.lm_pd_params(model, model_json))
    init_path = init_path or args.init_out

Opt = torch.optim.AdamW if args.optimizer == 'adamw' else torch.optim.Adam
opt = Opt(model.parameters(), lr=args.lr, betas=(0.9, args.beta2), weight_decay=args.weight_decay)


def sched_lr(t):   # the decay ends at the run's last step, as pipedream's default
    return pd_io.scheduled_lr(t, args.lr, args.lr_schedule, args.warmup_steps, args.steps, args.min_lr)


model.train()
t_train, t_cpu, win, last_loss, samples = 0.0, 0.0, [], float('nan'), 0
for g in range(args.steps):
    x, y = text.minibatch(g, args.minibatch, args.seed)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    loss = tm.lm_loss(model(x), y)
    loss.backward()
    if args.clip_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
    for group in opt.param_groups:
        group['lr'] = sched_lr(g)
    opt.step()
    t_train += time.perf_counter() - t0
    t_cpu += time.process_time() - c0
    samples += x.shape[0]
    win.append(loss.item())
    if (g + 1) % args.log_every == 0 or g + 1 == args.steps:
        last_loss = sum(win) / len(win)
        print('step %d loss %.4f %.1f samples/s' % (g + 1, last_loss, samples / t_train), file=sys.stderr)
        win = []

test_loss, test_acc = tm.lm_evaluate(model, text)
ours = {'framework': 'pytorch', 'torch': torch.__version__, 'model': args.model, 'steps': args.steps,
        'minibatch': args.minibatch, 'threads': args.threads, 'optimizer': args.optimizer, 'lr': args.lr,
        'lr_schedule': args.lr_schedule, 'final_loss': round(last_loss, 6),
        'test_loss': round(test_loss, 6), 'test_accuracy': round(test_acc, 4),
        'samples_per_s': round(samples / t_train, 1), 'train_time_s': round(t_train, 3),
        'samples_per_cpu_s': round(samples / t_cpu, 1)}
print(json.dumps(ours), flush=True)

if args.pipedream:
    if not init_path:
        sys.exit('--pipedream needs --init or --init-out (both frameworks start from the same weights)')
    cmd = [args.pipedream, 'train', model_json, '--text', args.text, '--init', init_path, '--steps', str(args.steps),
           '--minibatch', str(args.minibatch), '--optimizer', args.optimizer, '--lr', str(args.lr), '--seed', str(args.seed),
           '--threads', str(args.threads), '--log-every', str(args.log_every), '--lr-schedule', args.lr_schedule,
           '--warmup-steps', str(args.warmup_steps), '--weight-decay', str(args.weight_decay)]
    if args.beta2 != 0.999:
        cmd += ['--beta2', str(args.beta2)]
    if args.lr_schedule != 'constant':
        cmd += ['--min-lr', str(args.min_lr)]
    if args.clip_grad_norm > 0:
        cmd += ['--clip-grad-norm', str(args.clip_grad_norm)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    pd = json.loads(out)
    pd['framework'] = 'pipedream'
    print(json.dumps(pd))
    print(json.dumps({'compare': {'test_loss_diff': round(pd['test_loss'] - ours['test_loss'], 4),
                                  'final_loss_diff': round(pd['final_loss'] - ours['final_loss'], 4),
                                  'throughput_ratio': round(pd['samples_per_s'] / ours['samples_per_s'], 3),
                                  'cpu_throughput_ratio': round(pd['samples_per_cpu_s'] / ours['samples_per_cpu_s'],
                                                                3)}}))
