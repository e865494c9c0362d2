"""bench_vs_pytorch.py: training throughput and memory of pipedream against PyTorch, side by
side, on the five reference models (run by hand, not in CI):

    /usr/bin/python3 bench/bench_vs_pytorch.py [--pd build/pipedream] [--base OLD_PIPEDREAM [--base-models DIR]]
        [--threads 1,2] [--minibatch 64] [--models mlp,lenet5,vgg16,resnet20,lstm]
        [--steps 10] [--reps 5] [--warmup 3] [--layers auto|always|never] [--md FILE]
        [--precision fp32|bf16]

For each model and thread count, --reps rounds; in each round every side runs once, in a
fresh process, one after the other (never at the same time), the order rotating from round
to round so that drifts in the machine's load hit all sides alike:
  - pipedream: `pipedream bench MODEL --reps 1 --steps S --warmup W --threads T` (full
    training steps: forward, cross-entropy, backward, SGD momentum update, on synthetic data);
  - PyTorch 1.13 (tools/torch_models.py, the same modules): thread variables set before torch
    is imported, torch.set_num_threads(T), the same steps, warm-up and timing;
  - with --base, a second pipedream binary (e.g. the build before a change) likewise.
Each process reports samples/s over its S timed steps and its resident memory: before the
model is built (the runtime alone: `base`) and the high-water mark after the steps (`peak`,
/proc/self/status VmHWM). The table gives medians over the rounds of samples/s, the ratio of
medians pipedream / PyTorch, and memory as peak - base (what the model's training step adds:
parameters, gradients, optimizer state, activations, workspaces; PyTorch's own library
footprint, ~300 MB more than ours, excluded) with the total peak in parentheses.

Per-layer breakdown (--layers auto: for every row where pipedream is below 1.25x PyTorch):
pipedream's `bench --layers` times each top-level layer's forward and backward as a one-layer
range; the PyTorch child times the same groups of modules the same way (each group run on its
own input, forward, then backward from a random output gradient; a pipedream layer with a
fused relu is its module plus the following nn.ReLU; gap is AdaptiveAvgPool2d + Flatten).
Medians of --reps rounds, in ms.

--precision bf16: pipedream runs `bench --precision bf16`; PyTorch runs its forward and loss
under torch.autocast("cpu", dtype=torch.bfloat16) (its backward follows the forward's dtypes).
gpt-mini (and the other language models of tools/torch_models.py) run with token ids and a
target per position (no per-layer breakdown for them).

Set OPENBLAS_CORETYPE etc. as you like: both sides run under the same environment (only the
thread variables are set per run)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'bench', 'lib'))
import result  # noqa: E402  (bench/lib/result.py)

TORCH_CHILD = r'''
import os, sys, time, json, contextlib
def kb(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1])
    return 0
sys.path.insert(0, os.path.join(sys.argv[1], 'tools'))
import torch, torch.nn as nn
import torch_models as tm
name, batch, steps, warmup, threads, layers, prec = (sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                                     int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8])
cast = lambda: torch.autocast('cpu', dtype=torch.bfloat16) if prec == 'bf16' else contextlib.nullcontext()
torch.set_num_threads(threads)
torch.manual_seed(1)
x0 = torch.rand(1, 1, 28, 28)  # touch the allocator and the thread pool before the baseline
(x0 * 2).sum()
rss_start = kb('VmRSS:')
lm = name in tm.LM_MODELS
m = (tm.LM_MODELS if lm else tm.MODELS)[name]()
m.train()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
lossf = tm.lm_loss if lm else nn.CrossEntropyLoss()
xs = [torch.randint(0, 256, (batch, 64)) if lm else torch.rand(batch, 1, 28, 28) for _ in range(4)]
ys = [torch.randint(0, 256, (batch, 64)) if lm else torch.randint(0, 10, (batch,)) for _ in range(4)]
def step(i):
    opt.zero_grad()
    with cast():
        loss = lossf(m(xs[i % 4]), ys[i % 4])
    loss.backward()
    opt.step()
for i in range(warmup):
    step(i)
t0 = time.perf_counter()
for i in range(steps):
    step(i)
sps = steps * batch / (time.perf_counter() - t0)
out = {"samples_per_s": sps, "rss_start_kb": rss_start, "peak_rss_kb": kb('VmHWM:')}
if layers != '-':
    # groups of top-level modules matching pipedream's top-level layers
    spec = json.loads(layers)
    mods = list(m.children())
    groups, k = [], 0
    for lay in spec:
        g = [mods[k]]
        k += 1
        if lay.get('relu') and k < len(mods) and isinstance(mods[k], nn.ReLU):
            g.append(mods[k]); k += 1
        if lay['type'] == 'gap' and k < len(mods) and isinstance(mods[k], nn.Flatten):
            g.append(mods[k]); k += 1
        groups.append(nn.Sequential(*g))
    assert k == len(mods), "module grouping: %d of %d modules used" % (k, len(mods))
    fw = [[] for _ in groups]
    bw = [[] for _ in groups]
    for r in range(warmup + 3):
        x = xs[r % 4]
        for i, g in enumerate(groups):
            xi = x.detach().requires_grad_(i > 0 or not any(True for _ in g.parameters()))
            t0 = time.perf_counter()
            with cast():
                y = g(xi)
            t1 = time.perf_counter()
            dy = torch.rand_like(y)
            t2 = time.perf_counter()
            y.backward(dy)
            t3 = time.perf_counter()
            if r >= warmup:
                fw[i].append(t1 - t0)
                bw[i].append(t3 - t2)
            x = y.detach()
    med = lambda v: sorted(v)[len(v) // 2]
    out["layers"] = [{"fwd_ms": 1e3 * med(f), "bwd_ms": 1e3 * med(b)} for f, b in zip(fw, bw)]
print(json.dumps(out))
'''


def run_pd(pd, model, batch, threads, steps, warmup, layers=False, reps=1, models=None, prec='fp32'):
    cmd = [pd, 'bench', os.path.join(models or os.path.join(ROOT, 'models'), model + '.json'), '--minibatch', str(batch), '--threads',
           str(threads), '--steps', str(steps), '--reps', str(reps), '--warmup', str(warmup)]
    if prec != 'fp32':   # an older binary (--base) may not know the option
        cmd += ['--precision', prec]
    if layers:
        cmd.append('--layers')
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def run_torch(model, batch, threads, steps, warmup, layers='-', prec='fp32'):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    out = subprocess.run(['/usr/bin/python3', '-c', TORCH_CHILD, ROOT, model, str(batch), str(steps), str(warmup),
                          str(threads), layers, prec], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def med(v):
    return statistics.median(v)


def mem_mb(r):
    if 'peak_rss_kb' not in r:   # an older pipedream (--base) reports no memory
        return float('nan'), float('nan')
    return (r['peak_rss_kb'] - r['rss_start_kb']) / 1024.0, r['peak_rss_kb'] / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--pd', default=os.path.join(ROOT, 'build', 'pipedream'))
    ap.add_argument('--base', default=None, help='a second pipedream binary to compare (before/after)')
    ap.add_argument('--base-models', default=None, help="the --base binary's models/ folder (default: ours)")
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--minibatch', type=int, default=64)
    ap.add_argument('--models', default='mlp,lenet5,vgg16,resnet20,lstm')
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--layers', default='auto', choices=['auto', 'always', 'never'])
    ap.add_argument('--md', default=None, help='also append the tables (markdown) to this file')
    ap.add_argument('--precision', default='fp32', choices=['fp32', 'bf16'],
                    help='pipedream --precision; PyTorch under torch.autocast bf16')
    a = ap.parse_args()
    t0, load0 = time.time(), loadavg()
    md = []
    head = '| model | threads | pipedream samples/s | PyTorch samples/s | ratio |%s pd GFLOP/s | pd memory MB | PyTorch memory MB |' % (
        ' base samples/s | after/base |' if a.base else '')
    sep = '|' + '---|' * (head.count('|') - 1)
    print(head)
    print(sep, flush=True)
    md += [head, sep]
    losers = []
    for model in a.models.split(','):
        for t in [int(x) for x in a.threads.split(',')]:
            sides = ['pd', 'torch'] + (['base'] if a.base else [])
            res = {s: [] for s in sides}
            for r in range(a.reps):
                order = sides[r % len(sides):] + sides[:r % len(sides)]
                for s in order:
                    if s == 'pd':
                        res[s].append(run_pd(a.pd, model, a.minibatch, t, a.steps, a.warmup, prec=a.precision))
                    elif s == 'base':
                        res[s].append(run_pd(a.base, model, a.minibatch, t, a.steps, a.warmup, models=a.base_models,
                                             prec=a.precision))
                    else:
                        res[s].append(run_torch(model, a.minibatch, t, a.steps, a.warmup, prec=a.precision))
            sps = {s: med([x['samples_per_s'] for x in res[s]]) for s in sides}
            mem = {s: (med([mem_mb(x)[0] for x in res[s]]), med([mem_mb(x)[1] for x in res[s]])) for s in sides}
            ratio = sps['pd'] / sps['torch']
            row = '| %s | %d | %.1f | %.1f | %.2fx |' % (model, t, sps['pd'], sps['torch'], ratio)
            if a.base:
                row += ' %.1f | %.2fx |' % (sps['base'], sps['pd'] / sps['base'])
            row += ' %.1f | %.0f (%.0f) | %.0f (%.0f) |' % (res['pd'][0]['gflops'] * sps['pd'] / res['pd'][0]['samples_per_s'],
                                                          mem['pd'][0], mem['pd'][1], mem['torch'][0], mem['torch'][1])
            print(row, flush=True)
            md.append(row)
            lm_model = 'embed' in open(os.path.join(ROOT, 'models', model + '.json')).read()
            if not lm_model and (a.layers == 'always' or (a.layers == 'auto' and ratio < 1.25)):
                losers.append((model, t))
    for model, t in losers:
        spec = json.load(open(os.path.join(ROOT, 'models', model + '.json')))['layers']
        pl = run_pd(a.pd, model, a.minibatch, t, a.steps, a.warmup, layers=True, reps=a.reps, prec=a.precision)['layers']
        tl = [run_torch(model, a.minibatch, t, 1, a.warmup, json.dumps(spec), prec=a.precision)['layers']
              for _ in range(a.reps)]
        lines = ['', '%s, %d thread(s): per top-level layer, ms (median of %d)' % (model, t, a.reps), '',
                 '| # | layer | pd fwd | PyTorch fwd | pd bwd | PyTorch bwd |', '|---|---|---|---|---|---|']
        for i, lay in enumerate(spec):
            tf = med([x[i]['fwd_ms'] for x in tl])
            tb = med([x[i]['bwd_ms'] for x in tl])
            name = lay['type'] + (' ' + '%s->%s' % (lay.get('in', ''), lay.get('out', lay.get('hidden', ''))) if 'in' in lay else '')
            if lay['type'] == 'residual':
                name += ' ' + '/'.join(str(s.get('out', '')) for s in lay['body'] if s['type'] == 'conv2d')
            lines.append('| %d | %s | %.2f | %.2f | %.2f | %.2f |' % (i, name, pl[i]['fwd_ms'], tf, pl[i]['bwd_ms'], tb))
        lines.append('| | total | %.2f | %.2f | %.2f | %.2f |' % (
            sum(x['fwd_ms'] for x in pl), sum(med([x[i]['fwd_ms'] for x in tl]) for i in range(len(spec))),
            sum(x['bwd_ms'] for x in pl), sum(med([x[i]['bwd_ms'] for x in tl]) for i in range(len(spec)))))
        print('\n'.join(lines), flush=True)
        md += lines
    if a.md:
        with open(a.md, 'a') as f:
            f.write('\n'.join(md) + '\n')
    write_result(md, t0, load0)


def write_result(md, t0, load0):
    """The run's result file (bench/lib/result.py): bench/results/<UTC date>-<time>-bench-vs-pytorch.md."""
    sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    cpu = sh("sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1") or 'unknown CPU'
    result.write_result('bench-vs-pytorch', '/usr/bin/python3 bench/bench_vs_pytorch.py %s' % ' '.join(sys.argv[1:]),
                        md, t0, ['machine: %s; %s; %d cores; torch %s; OPENBLAS_CORETYPE=%s' % (
                            sh('uname -srm'), cpu, os.cpu_count(), torch_version(),
                            os.environ.get('OPENBLAS_CORETYPE', '')),
                            'load average: %s at the start, %s at the end' % (load0, loadavg())])


def loadavg():
    return ' '.join(open('/proc/loadavg').read().split()[:3])


def torch_version():
    r = subprocess.run(['/usr/bin/python3', '-c', 'import torch; print(torch.__version__)'],
                       capture_output=True, text=True)
    return r.stdout.strip() or 'unknown'


if __name__ == '__main__':
    sys.exit(main())
