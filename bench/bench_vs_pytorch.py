"""bench_vs_pytorch.py: training throughput of pipedream vs PyTorch on the five reference
models (run by hand, not in CI):

    /usr/bin/python3 bench/bench_vs_pytorch.py [--pd build/pipedream] [--threads 1,2]
        [--minibatch 64] [--models mlp,lenet5,...] [--steps 10] [--reps 5]

For each model and thread count: `pipedream bench` (full training steps on synthetic data,
median samples/s of --reps repetitions of --steps steps after warm-up), then the same model
(tools/torch_models.py) in PyTorch in a fresh process whose thread env vars are set before
torch is imported: forward, cross-entropy, backward, SGD momentum step; same warm-up,
repetitions and median. The two run one after the other, never at the same time. Prints a
table of samples/s and the ratio pipedream / PyTorch."""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TORCH_CHILD = r'''
import os, sys, time, json, statistics
sys.path.insert(0, os.path.join(sys.argv[1], 'tools'))
import torch, torch.nn as nn
import torch_models as tm
name, batch, steps, reps, warmup, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
torch.set_num_threads(threads)
torch.manual_seed(1)
m = tm.MODELS[name]()
m.train()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
lossf = nn.CrossEntropyLoss()
xs = [torch.rand(batch, 1, 28, 28) for _ in range(4)]
ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]
def step(i):
    opt.zero_grad()
    loss = lossf(m(xs[i % 4]), ys[i % 4])
    loss.backward()
    opt.step()
for i in range(warmup):
    step(i)
sps = []
for r in range(reps):
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    sps.append(steps * batch / (time.perf_counter() - t0))
print(json.dumps({"samples_per_s": statistics.median(sps)}))
'''


def run_pd(pd, model, batch, threads, steps, reps, warmup):
    out = subprocess.run([pd, 'bench', os.path.join(ROOT, 'models', model + '.json'), '--minibatch', str(batch),
                          '--threads', str(threads), '--steps', str(steps), '--reps', str(reps), '--warmup',
                          str(warmup)], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def run_torch(model, batch, threads, steps, reps, warmup):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    out = subprocess.run(['/usr/bin/python3', '-c', TORCH_CHILD, ROOT, model, str(batch), str(steps), str(reps),
                          str(warmup), str(threads)], check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--pd', default=os.path.join(ROOT, 'build', 'pipedream'))
    ap.add_argument('--threads', default='1,2')
    ap.add_argument('--minibatch', type=int, default=64)
    ap.add_argument('--models', default='mlp,lenet5,vgg16,resnet20,lstm')
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=3)
    a = ap.parse_args()
    print('%-9s %7s %14s %14s %7s %9s' % ('model', 'threads', 'pipedream/s', 'pytorch/s', 'ratio', 'pd GF/s'))
    for model in a.models.split(','):
        for t in [int(x) for x in a.threads.split(',')]:
            pd = run_pd(a.pd, model, a.minibatch, t, a.steps, a.reps, a.warmup)
            pt = run_torch(model, a.minibatch, t, a.steps, a.reps, a.warmup)
            print('%-9s %7d %14.1f %14.1f %6.2fx %9.2f' % (model, t, pd['samples_per_s'], pt['samples_per_s'],
                                                          pd['samples_per_s'] / pt['samples_per_s'], pd['gflops']),
                  flush=True)


if __name__ == '__main__':
    sys.exit(main())
