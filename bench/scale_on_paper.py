#!/usr/bin/env python3
"""scale_on_paper.py: the simulator against published transformer pipeline results it was not
built on, from analytic profiles (tools/gpt_analytic.py).

    bench/scale_on_paper.py [--pipedream build/pipedream] [--out DIR]

The published figures (Megatron-LM's README, as in the repository sail-sg/zero-bubble-pipeline-
parallelism, file Megatron.md and images/model_table.png):

* Megatron-Core r0.8.0, the 177B GPT (96 blocks, width 12288, sequence 4096, vocabulary
  131072) on H100s at a batch of 1152 sequences, strong-scaled from 96 to 4608 GPUs: model
  FLOPs utilisation (MFU) 47% at 96 GPUs and 42% at 4608; at 2304 GPUs (tensor 8, pipeline 6,
  data 48) 432.8 TFLOP/s per GPU, 44%.
* Megatron-LM's GPT-3 175B example (examples/gpt3/train_gpt3_175b_distributed.sh: 96 blocks,
  width 12288, sequence 2048, tensor 8, pipeline 16, micro-batch 1, batch 1536, 1F1B without
  interleaving) on 1024 A100s: about 32 s per step, 138 TFLOP/s per GPU, 44% of peak. Those
  138 TFLOP/s count the forward twice (32 s gives 138 only with 96 B s l h^2 FLOPs, the count
  with activation recomputation), so the runs recompute and the simulation does too.

One number is fitted: the share of the peak a block reaches (`--efficiency`), on the 96-GPU
point, where 576 micro-batches per pipeline leave almost no bubble. Everything else is
predicted: the bubble, the point-to-point transfers and the data-parallel all-reduce at 2304
and 4608 GPUs, and the A100 run with the same share of the A100's peak.

Assumed where the sources are silent (each a flag of gpt_analytic.py): tensor 8 and pipeline 6
at every point of the strong scaling (the table's row), data parallelism making up the rest;
micro-batches of one sequence; 400 GB/s between H100 servers (8 x 400 Gbit/s), 200 GB/s
between A100 servers (8 x 200 Gbit/s); gradients reduced in fp32 by reduce-scatter (2 bytes a
parameter of ring all-reduce volume); peaks 989 TFLOP/s (H100 SXM, dense bf16) and 312 (A100).
The H100 runs' schedule is not published; 1F1B and interleaved (2 and 4 chunks, over the same
data-parallel pipelines) are shown.

Last, VGG-16 on the authors' profile: the planner's plan at 1 GB/s (their optimizer's default)
for 4, 8 and 16 workers beside the configurations their repository publishes, each simulated
with 1f1b, as speedups over one worker."""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, '..'))
TOOL = os.path.join(ROOT, 'tools', 'gpt_analytic.py')
sys.path.insert(0, os.path.join(HERE, 'lib'))
import result  # noqa: E402  (bench/lib/result.py)

H100 = dict(peak=989e12, bandwidth=4e11)
A100 = dict(peak=312e12, bandwidth=2e11)
GPT177 = dict(layers=96, hidden=12288, seq=4096, vocab=131072, tp=8)
GPT175 = dict(layers=96, hidden=12288, seq=2048, vocab=51200, tp=8)   # GPT-2 BPE, padded


def simulate(pd, work, model, hw, pp, dp, batch, eff, chunks=1, recompute=False):
    """Seconds per optimizer step and the step's model FLOPs (3 passes)."""
    d = os.path.join(work, 'pp%d-dp%d-b%d-c%d' % (pp, dp, batch, chunks))
    args = [sys.executable, TOOL, '--pp', str(pp), '--dp', str(dp), '--global-batch', str(batch),
            '--chunks', str(chunks), '--efficiency', repr(eff), '--out', d]
    for k, v in list(model.items()) + list(hw.items()):
        args += ['--' + k, repr(v) if isinstance(v, float) else str(v)]
    info = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    kind = 'interleaved' if chunks > 1 else '1f1b-flush'
    cmd = [pd, 'simulate', os.path.join(d, 'plan.json'), '--profile', os.path.join(d, 'profile.json'),
           '--schedule', kind, '--microbatches', str(batch), '--minibatches', '3', '--json']
    if recompute:
        cmd.append('--recompute')
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r['time_per_minibatch_s'], info['step_flops']


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--pipedream', default=os.path.join(ROOT, 'build', 'pipedream'))
    ap.add_argument('--out', default=None, help='folder for the generated files and table.md')
    a = ap.parse_args()
    t0 = time.time()
    work = a.out or os.path.join('/tmp', 'scale_on_paper.%d' % os.getpid())
    os.makedirs(work, exist_ok=True)
    pd = a.pipedream

    def mfu(f, gpus, hw, t):
        return f / (gpus * hw['peak'] * t)

    # The fit: MFU 47% at 96 GPUs (tensor 8, pipeline 6, data 2).
    eff = 0.5
    for _ in range(4):
        t, f = simulate(pd, work, GPT177, H100, 6, 2, 1152, eff)
        eff *= 0.47 / mfu(f, 96, H100, t)
    rows = []
    for gpus, dp, pub in ((96, 2, 0.47), (2304, 48, 432.8e12 / H100["peak"]), (4608, 96, 0.42)):
        t, f = simulate(pd, work, GPT177, H100, 6, dp, 1152, eff)
        preds = [(mfu(f, gpus, H100, t), t)]
        if dp > 2:   # interleaved over dp pipelines
            for chunks in (2, 4):
                ti, _ = simulate(pd, work, GPT177, H100, 6, dp, 1152, eff, chunks)
                preds.append((mfu(f, gpus, H100, ti), ti))
        rows.append((gpus, dp, pub, preds))

    lines = ['efficiency fitted at 96 H100s: %.4f of the peak per block' % eff, '',
             '| run | GPUs | tensor x pipeline x data | published | predicted 1F1B | '
             'interleaved, 2 chunks | 4 chunks |', '| --- | ---: | --- | ---: | ---: | ---: | ---: |']

    for gpus, dp, pub, preds in rows:
        c = ['%.1f%% (%.2f s; %.2f)' % (100 * m, t, m / pub) for m, t in preds]
        if gpus == 96:
            c[0] = '%.1f%% (%.2f s, fitted)' % (100 * preds[0][0], preds[0][1])
        c += [''] * (3 - len(c))
        lines.append('| 177B, H100, batch 1152 | %d | 8 x 6 x %d | %s MFU | %s | %s | %s |'
                     % (gpus, dp, '%.1f%%' % (100 * pub) if gpus == 2304 else '%d%%' % (100 * pub),
                        c[0], c[1], c[2]))

    # GPT-3 175B on 1024 A100s, 1F1B, recomputation: time per step against ~32 s.
    t, f = simulate(pd, work, GPT175, A100, 16, 8, 1536, eff, recompute=True)
    tf = f * 4.0 / 3.0 / (1024 * t) / 1e12
    lines.append('| GPT-3 175B, A100, batch 1536 | 1024 | 8 x 16 x 8 | ~32 s, 138 TFLOP/s | '
                 '%.1f s, %.0f TFLOP/s (%.2f) | | |' % (t, tf, 32.0 / t))
    lines += [''] + vgg16_rows(pd, work)
    text = '\n'.join(lines) + '\n'
    sys.stdout.write(text)
    with open(os.path.join(work, 'table.md'), 'w') as f:
        f.write(text)
    # the figures depend on the binary only, not on the machine's speed
    result.write_result('scale-on-paper', 'bench/scale_on_paper.py ' + ' '.join(sys.argv[1:]), text, t0)


# PipeDream's own VGG-16 configurations (msr-fiddle/pipedream, runtime/image_classification/
# models/vgg16/gpus=N/hybrid_conf.json and stage0.py): n - 1 replicas of the first stage, which
# holds the first AUTHORS_CUT[n] modules, and one worker for the rest.
AUTHORS_CUT = {4: 17, 8: 22, 16: 31}


def vgg16_rows(pd, work):
    prof = os.path.join(ROOT, 'tests', 'data', 'pipedream-profiles', 'vgg16', 'graph.txt')

    def sim(plan):
        r = subprocess.run([pd, 'simulate', plan, '--profile', prof, '--minibatches', '200', '--json'],
                           check=True, capture_output=True, text=True)
        return json.loads(r.stdout)['time_per_minibatch_s']

    def shape(stages):
        return ' + '.join('%d x %d-%d' % (s['replicas'], s['layers'][0], s['layers'][-1]) for s in stages)
    out = ['| workers | the planner at 1 GB/s | simulated speedup | the authors\' configuration | '
           'simulated speedup |', '| ---: | --- | ---: | --- | ---: |']
    one = None
    for n in (1, 4, 8, 16):
        plan = os.path.join(work, 'vgg16-%d.json' % n)
        subprocess.run([pd, 'plan', prof, '--workers', str(n), '--bandwidth', '1e9', '-o', plan],
                       check=True, capture_output=True, text=True)
        t = sim(plan)
        if n == 1:
            one = t
            continue
        p = json.load(open(plan))
        cut, last = AUTHORS_CUT[n], p['n_layers'] - 1
        q = dict(p, noam=-(-n // (n - 1)),
                 predicted={k: v for k, v in p['predicted'].items() if k != 'simulated'},
                 stages=[{'layers': list(range(cut + 1)), 'replicas': n - 1, 'ranks': list(range(n - 1)),
                          'compute_s': 0, 'time_s': 0},
                         {'layers': list(range(cut + 1, last + 1)), 'replicas': 1, 'ranks': [n - 1],
                          'compute_s': 0, 'time_s': 0}])
        qpath = os.path.join(work, 'vgg16-%d-authors.json' % n)
        with open(qpath, 'w') as f:
            json.dump(q, f)
        out.append('| %d | %s | %.2fx | %s | %.2fx |' % (n, shape(p['stages']), one / t, shape(q['stages']),
                                                         one / sim(qpath)))
    return out


if __name__ == '__main__':
    main()
