#!/usr/bin/env python3
"""gpt_analytic.py: an analytic profile, cluster and plan of a GPT-style model trained with
tensor, pipeline and data parallelism, for `pipedream simulate`.

No measurement: every layer's time is its floating-point operations over the rate of one
tensor-parallel group (--tp devices at --peak FLOP/s each, times --efficiency). One simulated
worker is one tensor-parallel group (a server of --tp accelerators); the plan is the
straight split of the blocks into --pp equal stages (the embedding with the first, the head
with the last), each stage replicated --dp times. One profile minibatch is one micro-batch of
--micro-batch sequences.

The counts (per micro-batch of b sequences of s tokens, width h, vocabulary V):
  a block's forward   b s (24 h^2 + 4 s h)   (QKV, projection, 4h MLP; scores and values)
  the head's forward  2 b s h V              (the logits)
  a backward          twice its forward;     the embedding's lookup: none
the model FLOPs of one step are the sum over layers and micro-batches of forward + backward,
the count Megatron-LM reports (72 B s l h^2 (1 + s / 6h + V / 12 l h)).

Bytes: activations between stages b s h x --act-bytes (bf16: 2); a layer's parameter_bytes
is its parameters x --grad-bytes, the bytes one replica's ring all-reduce moves per parameter
(2 for gradients reduce-scattered in fp32, whose volume is half a ring all-reduce's of 4 bytes,
with the parameters' all-gather overlapped with the next forward).

Writes OUT/profile.json, OUT/cluster.json and OUT/plan.json (--chunks V: V x pp stages placed
round-robin on the pp positions, --dp replicas each, replica j of every stage one whole
pipeline, for `simulate --schedule interleaved`). Prints the model FLOPs of one
step of --global-batch sequences as JSON on stdout."""
import argparse
import json
import os
import sys
import zlib


def die(msg):
    sys.stderr.write('gpt_analytic.py: %s\n' % msg)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--layers', type=int, required=True, help='transformer blocks')
    ap.add_argument('--hidden', type=int, required=True, help='model width h')
    ap.add_argument('--seq', type=int, required=True, help='sequence length s')
    ap.add_argument('--vocab', type=int, required=True, help='vocabulary V')
    ap.add_argument('--tp', type=int, default=1, help='tensor-parallel devices per worker')
    ap.add_argument('--pp', type=int, required=True, help='pipeline stages')
    ap.add_argument('--dp', type=int, default=1, help='data-parallel replicas of every stage')
    ap.add_argument('--chunks', type=int, default=1, help='interleaved: model chunks per worker')
    ap.add_argument('--micro-batch', type=int, default=1, help='sequences per micro-batch')
    ap.add_argument('--global-batch', type=int, required=True, help='sequences per optimizer step')
    ap.add_argument('--peak', type=float, required=True, help='one device\'s peak FLOP/s')
    ap.add_argument('--efficiency', type=float, required=True,
                    help='the share of --peak a layer reaches, in (0, 1]')
    ap.add_argument('--bandwidth', type=float, required=True,
                    help='bytes/s between two workers (tensor-parallel groups), each way')
    ap.add_argument('--latency', type=float, default=5e-6, help='seconds per message')
    ap.add_argument('--act-bytes', type=float, default=2.0, help='bytes per activation element')
    ap.add_argument('--grad-bytes', type=float, default=2.0,
                    help='bytes the all-reduce moves per parameter (see above)')
    ap.add_argument('--out', required=True, help='folder to write the three files in')
    a = ap.parse_args()

    for name in ('layers', 'hidden', 'seq', 'vocab', 'tp', 'pp', 'dp', 'chunks', 'micro_batch',
                 'global_batch'):
        if getattr(a, name) < 1:
            die('--%s must be at least 1' % name.replace('_', '-'))
    if not 0 < a.efficiency <= 1:
        die('--efficiency must be in (0, 1]')
    if a.peak <= 0 or a.bandwidth <= 0 or a.latency < 0 or a.act_bytes <= 0 or a.grad_bytes < 0:
        die('--peak, --bandwidth, --act-bytes must be > 0; --latency, --grad-bytes >= 0')
    stages = a.pp * a.chunks
    if a.layers % stages:
        die('%d blocks do not split into %d equal stages (pp x chunks)' % (a.layers, stages))
    if a.global_batch % (a.dp * a.micro_batch):
        die('--global-batch %d is not a multiple of dp x micro-batch (%d)'
            % (a.global_batch, a.dp * a.micro_batch))
    if a.chunks > 1 and (a.global_batch // a.micro_batch) % (a.pp * a.dp):
        die('--chunks: %d micro-batches a step is not a multiple of pp x dp (%d), as the interleaved '
            'schedule needs' % (a.global_batch // a.micro_batch, a.pp * a.dp))

    b, s, h, V = a.micro_batch, a.seq, a.hidden, a.vocab
    rate = a.tp * a.peak * a.efficiency            # one worker's FLOP/s
    block_f = b * s * (24.0 * h * h + 4.0 * s * h)
    head_f = 2.0 * b * s * h * V
    act = b * s * h * a.act_bytes
    block_params = 12.0 * h * h + 13.0 * h        # QKV, projection, MLP, two LayerNorms, biases
    layers = [{'name': 'embed', 'type': 'embed', 'forward_s': 0.0, 'backward_s': 0.0,
               'activation_bytes': act, 'parameter_bytes': (V + s) * h * a.grad_bytes}]
    for i in range(a.layers):
        layers.append({'name': 'block%d' % i, 'type': 'block', 'forward_s': block_f / rate,
                       'backward_s': 2.0 * block_f / rate, 'activation_bytes': act,
                       'parameter_bytes': block_params * a.grad_bytes})
    layers.append({'name': 'head', 'type': 'linear', 'forward_s': head_f / rate,
                   'backward_s': 2.0 * head_f / rate, 'activation_bytes': b * s * V * 4.0,
                   'parameter_bytes': V * h * a.grad_bytes})
    model = 'gpt-l%d-h%d' % (a.layers, h)
    profile = {'format': 'pipedream-profile', 'version': 1, 'model': model, 'minibatch': b,
               'measured_on': 'analytic: %d x %.4g FLOP/s at %.4f' % (a.tp, a.peak, a.efficiency),
               'threads': 0, 'iterations': 0, 'input_bytes': b * s * 4, 'layers': layers}
    os.makedirs(a.out, exist_ok=True)
    ppath = os.path.join(a.out, 'profile.json')
    text = json.dumps(profile, indent=1).encode()
    with open(ppath, 'wb') as f:
        f.write(text)

    workers = a.pp * a.dp
    cluster = {'levels': [{'workers': workers, 'bandwidth': a.bandwidth, 'latency': a.latency}],
               'memory_per_worker': 0}
    with open(os.path.join(a.out, 'cluster.json'), 'w') as f:
        json.dump(dict({'format': 'pipedream-cluster', 'version': 1}, **cluster), f, indent=1)

    per = a.layers // stages
    plan_stages, rank = [], 0
    for k in range(stages):
        idx = list(range(1 + k * per, 1 + (k + 1) * per))
        if k == 0:
            idx = [0] + idx
        if k == stages - 1:
            idx = idx + [len(layers) - 1]
        reps = a.dp
        compute = sum(layers[i]['forward_s'] + layers[i]['backward_s'] for i in idx)
        # interleaved: replica j of stage k on rank (k mod pp) dp + j, replica j of every stage one pipeline
        ranks = [(k % a.pp) * reps + j for j in range(reps)] if a.chunks > 1 else list(range(rank, rank + reps))
        rank += reps
        plan_stages.append({'layers': idx, 'replicas': reps, 'ranks': ranks,
                            'compute_s': compute, 'time_s': compute / reps})
    single = sum(l['forward_s'] + l['backward_s'] for l in layers)
    slowest = max(st['time_s'] for st in plan_stages)
    plan = {'format': 'pipedream-plan', 'version': 1, 'model': model,
            'profile_crc32': '%08x' % zlib.crc32(text), 'n_layers': len(layers),
            'cost_model': {'kind': 'ours', 'straight': a.dp == 1, 'allow_idle': False,
                           'memory_limit': 0, 'activation_compression': 0,
                           'overlap_allreduce': True},
            'cluster': cluster, 'n_workers': workers,
            'noam': -(-workers // plan_stages[0]['replicas']),
            'predicted': {'pipeline_s': slowest, 'single_worker_s': single,
                          'data_parallel_s': single / workers}}
    if a.chunks > 1:
        plan['chunks'] = a.chunks
    plan['stages'] = plan_stages
    with open(os.path.join(a.out, 'plan.json'), 'w') as f:
        json.dump(plan, f, indent=1)

    micro = a.global_batch // a.micro_batch
    step_flops = micro * 3.0 * (a.layers * block_f + head_f)   # forward + backward, the embedding none
    json.dump({'model': model, 'devices': a.tp * workers, 'microbatches_per_step': micro,
               'step_flops': step_flops}, sys.stdout)
    sys.stdout.write('\n')


if __name__ == '__main__':
    main()
