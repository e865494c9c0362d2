#!/usr/bin/env bash
# zb_pairs.sh: zb-h1 against 1f1b-flush on 2 MPI ranks x 2 straight stages of vgg16, the
# measurement quoted in docs/explanation/schedules.md. Profiles at 8 samples per micro-batch (the
# median of 5 rounds), plans 2 straight stages, then for each M in MICRO ("2 4") runs PAIRS
# (8) pairs of the two kinds, order alternating, STEPS (24) minibatches of 8 x M samples each,
# and prints per M: medians of ms per minibatch measured and predicted, the predicted gain,
# the median (quartiles) of the per-pair ratios zb-h1 / 1f1b-flush, how many pairs zb-h1 won,
# and in how many the two ended with the same weights (weights_crc).
# Usage: bash bench/zb_pairs.sh [build/pipedream] [DATA_DIR]   (DATA_DIR: Fashion-MNIST IDX;
# default the installed one; a small test set keeps the final evaluation short). The figures
# also go to bench/results/ (bench/lib/result.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/result.sh
result_start zb-pairs "$@"
PD=${1:-build/pipedream} DATA=${2:-} MICRO=${MICRO:-"2 4"} PAIRS=${PAIRS:-8} STEPS=${STEPS:-24}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$PD" profile models/vgg16.json --minibatch 8 --iterations 20 --rounds 5 -o "$OUT/prof.json" >/dev/null 2>&1
"$PD" plan "$OUT/prof.json" --workers 2 --bandwidth 1e10 --straight -o "$OUT/plan.json" | sed -n '4,6p'
for M in $MICRO; do
    for r in $(seq "$PAIRS"); do
        if [ $((r % 2)) = 1 ]; then ks="1f1b-flush zb-h1"; else ks="zb-h1 1f1b-flush"; fi
        for k in $ks; do
            mpirun --oversubscribe -np 2 --bind-to none "$PD" train models/vgg16.json --plan "$OUT/plan.json" \
                --profile "$OUT/prof.json" ${DATA:+--data "$DATA"} --schedule "$k" --microbatches "$M" \
                --minibatch $((8 * M)) --steps "$STEPS" 2>/dev/null | tail -1 |
                python3 -c "import json, sys; d = json.loads(sys.stdin.read()); print('$M $r $k', d['time_per_unit_ms'] * $M,
                    d['predicted_time_per_unit_ms'] * $M, ','.join(d['weights_crc']))"
        done
    done
done >"$OUT/runs.txt"
python3 - "$OUT/runs.txt" <<'PY'
import collections, statistics as st, sys
by = collections.defaultdict(dict)
for M, r, k, t, p, c in (l.split() for l in open(sys.argv[1]) if l.strip()):
    by[(M, r)][k] = (float(t), float(p), c)
for M in sorted({m for m, _ in by}, key=int):
    prs = [v for (m, _), v in by.items() if m == M and len(v) == 2]
    f, z = [v["1f1b-flush"] for v in prs], [v["zb-h1"] for v in prs]
    ratio = sorted(b[0] / a[0] for a, b in zip(f, z))
    q = lambda x: ratio[int(x * (len(ratio) - 1))]
    pf, pz = f[0][1], z[0][1]
    print(f"M={M}: {len(prs)} pairs; ms per minibatch 1f1b-flush {st.median(a[0] for a in f):.2f} (predicted {pf:.2f}), "
          f"zb-h1 {st.median(b[0] for b in z):.2f} (predicted {pz:.2f}); predicted gain {100 * (1 - pz / pf):.1f}%; "
          f"pair ratio zb-h1 / 1f1b-flush {st.median(ratio):.3f} ({q(.25):.3f}, {q(.75):.3f}); zb-h1 faster in "
          f"{sum(x < 1 for x in ratio)}; same weights in {sum(a[2] == b[2] for a, b in zip(f, z))}")
PY
result_finish
