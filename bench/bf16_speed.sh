#!/usr/bin/env bash
# bf16_speed.sh: the bf16 / fp32 speed ratio at 1 thread, minibatch 64, of one or more builds.
# ROUNDS (3) times, for each model (MODELS: vgg16 resnet20 gpt-mini) and each build given, one
# `pipedream bench models/M.json --minibatch 64 --threads 1 --precision fp32,bf16 --reps 7`
# (fp32 and bf16 interleaved in one process, so a busy machine slows both alike); the builds
# take turns within a round. One line per run (samples/s of each precision and their ratio),
# then the median ratio per model and build; also into bench/results/ (bench/lib/result.sh).
# Usage: bash bench/bf16_speed.sh [PIPEDREAM ...]   (default build/pipedream)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/result.sh
result_start bf16-speed "$@"
ROUNDS=${ROUNDS:-3} MODELS=${MODELS:-"vgg16 resnet20 gpt-mini"} REPS=${REPS:-7}
[ $# -gt 0 ] || set -- build/pipedream
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT
for r in $(seq "$ROUNDS"); do
    for m in $MODELS; do
        for pd in "$@"; do
            "$pd" bench "models/$m.json" --minibatch 64 --threads 1 --precision fp32,bf16 --reps "$REPS" 2>/dev/null |
                python3 -c "
import json, sys
r = {j['precision']: j['samples_per_s'] for j in map(json.loads, [l for l in sys.stdin.read().splitlines() if l.startswith('{')])}
print('round %s %-8s %-28s fp32 %7.1f bf16 %7.1f ratio %.3f' % (sys.argv[1], sys.argv[2], sys.argv[3],
      r['fp32'], r['bf16'], r['bf16'] / r['fp32']))" "$r" "$m" "$pd"
        done
    done
done | tee "$runs"
python3 -c "
import collections, statistics, sys
g = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    g[(f[2], f[3])].append(float(f[-1]))
for (m, pd), v in g.items():
    print('median bf16/fp32 %-8s %-28s %.3f (%d runs: %s)' % (m, pd, statistics.median(v), len(v),
          ' '.join('%.2f' % x for x in v)))" "$runs"
result_finish
