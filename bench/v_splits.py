#!/usr/bin/env python3
"""v_splits.py: how fast a V-shaped kind can be on a model, over the splits of its layers, by the
simulator: is the planner's V split the reason a V kind loses to a straight one, or the model?

From a `plan --v-shape` plan of a chain of layers (2P stages, worker i holding stages i and
2P-1-i), it simulates KIND (20 minibatches of M micro-batches) on the planner's split, then hill-climbs over the cut positions (each cut moved by 1 or 2 layers,
the best move taken until none helps) from the planner's split and from RESTARTS random ones
(seeded). Beside it: AGAINST on the straight plan, and the two splits' compute bounds by
exhaustive search (each worker's compute summed over its stages, the slowest worker: the least
any schedule can take per unit on that split), where the splits number at most 3 million.
Needs only the pipedream binary; prints a table and writes bench/results/<date>-v-splits.md
(bench/lib/result.py).

usage: bench/v_splits.py --v V.json --straight S.json --profile P.json [--cluster C.json]
                         [--kind zb-v] [--against zb-h1] [--microbatches 8] [--restarts 15]
                         [--seed 1] [--free-links] [--pd build/pipedream]
  --free-links: the cluster's links infinitely fast and free of CPU (compute and the schedule
  alone).
"""
import argparse
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lib'))
from result import write_result  # noqa: E402


def simulate(pd, plan, args, kind, tmp, cache, cuts=None):
    """KIND's simulated ms per unit on plan (its stages re-cut at cuts, if given)."""
    if cuts is not None and cuts in cache:
        return cache[cuts]
    p = json.loads(json.dumps(plan))
    for i, s in enumerate(p['stages'] if cuts is not None else []):
        s['layers'] = list(range(cuts[i], cuts[i + 1]))
    path = os.path.join(tmp, 'split.json')
    with open(path, 'w') as f:
        json.dump(p, f)
    cmd = [pd, 'simulate', path, '--profile', args.profile, '--schedule', kind, '--microbatches',
           str(args.microbatches), '--minibatches', '20', '--json']
    if args.cluster:
        cmd += ['--cluster', args.cluster]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit('v_splits.py: %s failed: %s' % (' '.join(cmd), out.stderr.strip()))
    t = json.loads(out.stdout)['time_per_unit_s'] * 1e3
    if cuts is not None:
        cache[cuts] = t
    return t


def cuts_of(plan):
    st = plan['stages']
    return tuple([st[0]['layers'][0]] + [s['layers'][-1] + 1 for s in st])


def climb(pd, plan, args, tmp, cache, cuts):
    """The local optimum of KIND's time per unit from cuts, moving one cut by 1 or 2 layers."""
    t = simulate(pd, plan, args, args.kind, tmp, cache, cuts)
    k = len(cuts) - 1
    while True:
        best = (t, cuts)
        for i in range(1, k):
            for d in (-2, -1, 1, 2):
                x = list(cuts)
                x[i] += d
                if all(x[j] < x[j + 1] for j in range(k)):
                    tx = simulate(pd, plan, args, args.kind, tmp, cache, tuple(x))
                    if tx < best[0]:
                        best = (tx, tuple(x))
        if best[1] == cuts:
            return t, cuts
        t, cuts = best


def bound(layer_ms, n_stages, worker_of):
    """The least slowest-worker compute over every split into n_stages (exhaustive), or None."""
    n = len(layer_ms)
    if math.comb(n - 1, n_stages - 1) > 3_000_000:
        return None
    pre = [0.0]
    for x in layer_ms:
        pre.append(pre[-1] + x)
    workers = max(worker_of) + 1
    best = None
    for inner in itertools.combinations(range(1, n), n_stages - 1):
        c = (0,) + inner + (n,)
        w = [0.0] * workers
        for i in range(n_stages):
            w[worker_of[i]] += pre[c[i + 1]] - pre[c[i]]
        m = max(w)
        if best is None or m < best[0]:
            best = (m, c)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--v', required=True, help='a plan --v-shape plan')
    ap.add_argument('--straight', required=True, help='a plan of one stage per worker')
    ap.add_argument('--profile', required=True)
    ap.add_argument('--cluster', help='a pipedream-cluster file (default: the plans\' own)')
    ap.add_argument('--kind', default='zb-v')
    ap.add_argument('--against', default='zb-h1')
    ap.add_argument('--microbatches', type=int, default=8)
    ap.add_argument('--restarts', type=int, default=15)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--free-links', action='store_true')
    ap.add_argument('--pd', default='build/pipedream')
    args = ap.parse_args()
    t0 = time.time()
    with open(args.v) as f:
        vplan = json.load(f)
    with open(args.straight) as f:
        splan = json.load(f)
    with open(args.profile) as f:
        prof = json.load(f)
    if vplan.get('placement') != 'v':
        sys.exit('v_splits.py: %s is not a V plan (plan --v-shape)' % args.v)
    n = vplan['n_layers']
    k = len(vplan['stages'])
    if k > n:
        sys.exit('v_splits.py: %d stages from %d layers' % (k, n))
    cache = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.free_links:
            if args.cluster:
                with open(args.cluster) as f:
                    cl = json.load(f)
            else:
                cl = dict(vplan['cluster'], format='pipedream-cluster', version=1)
            for lv in cl['levels']:
                lv['bandwidth'], lv['latency'] = 1e15, 0
            cl['net_cpu_per_byte'] = 0
            args.cluster = os.path.join(tmp, 'free-links.json')
            with open(args.cluster, 'w') as f:
                json.dump(cl, f)
        planner = cuts_of(vplan)
        t_planner = simulate(args.pd, vplan, args, args.kind, tmp, cache, planner)
        best = climb(args.pd, vplan, args, tmp, cache, planner)
        rng = random.Random(args.seed)
        for _ in range(args.restarts):
            start = tuple([0] + sorted(rng.sample(range(1, n), k - 1)) + [n])
            r = climb(args.pd, vplan, args, tmp, cache, start)
            if r[0] < best[0]:
                best = r
        t_against = simulate(args.pd, splan, args, args.against, tmp, {})
    layer_ms = [(x['forward_s'] + x['backward_s']) * 1e3 for x in prof['layers']]
    p = k // 2
    vb = bound(layer_ms, k, [i if i < p else k - 1 - i for i in range(k)])
    sb = bound(layer_ms, len(splan['stages']), list(range(len(splan['stages']))))
    fmt = lambda c: '|'.join('%d-%d' % (c[i], c[i + 1] - 1) for i in range(len(c) - 1))
    lines = ['%s on the V splits of %s (%d layers, %d stages on %d workers), %d micro-batches, by the simulator%s'
             % (args.kind, vplan['model'], n, k, p, args.microbatches,
                ' on free links' if args.free_links else ' on ' + args.cluster if args.cluster
                else ' on the plans\' cluster'), '',
             '| split | layers per stage | ms per unit |', '| --- | --- | ---: |',
             '| %s, the planner\'s | %s | %.2f |' % (args.kind, fmt(planner), t_planner),
             '| %s, the best of %d splits simulated | %s | %.2f |' % (args.kind, len(cache), fmt(best[1]), best[0]),
             '| %s, the straight plan | %s | %.2f |' % (args.against, fmt(cuts_of(splan)), t_against), '']
    if vb and sb:
        lines.append('compute bound (the slowest worker\'s layers at full speed, every split): V %.2f ms (%s), '
                     'straight %.2f ms (%s); the profile\'s largest layer %.2f ms of %.2f'
                     % (vb[0], fmt(vb[1]), sb[0], fmt(sb[1]), max(layer_ms), sum(layer_ms)))
    lines.append('%s %s %s on every split tried (best %.3fx its time)'
                 % (args.kind, 'beats' if best[0] < t_against else 'does not beat', args.against, best[0] / t_against))
    print('\n'.join(lines))
    write_result('v-splits', 'bench/v_splits.py ' + ' '.join(sys.argv[1:]), lines, t0,
                 ['seed %d, %d random starts' % (args.seed, args.restarts)])


if __name__ == '__main__':
    main()
