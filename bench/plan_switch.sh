#!/usr/bin/env bash
# bench/plan_switch.sh: how much a change of plan in the middle of a run moves the accuracy of
# asynchronous 1f1b, per training recipe: what an elastic run that loses a host (and goes on
# under another plan) should be compared with (docs/howto/elastic.md).
#
# On threads (no cluster needed): vgg16, 600 minibatches of 64, 4 micro-batches, launch's
# default schedule (1f1b with its default staleness compensation), for each recipe:
#   4        uninterrupted on the planner's plan for 4 workers at 1 Gbit/s (`pipedream plan
#            PROFILE --workers 4 --bandwidth 1.25e8`);
#   4 -> 3   resumed from that checkpoint on the plan for 3 workers (what launch does when a host
#            is lost after the checkpoint at 150);
#   3        uninterrupted on the 3-worker plan.
# Prints one table row per recipe: the three test accuracies and the switch's difference from
# the uninterrupted 4-worker run, in points.
#
# usage: bench/plan_switch.sh [--out DIR] [--pd BINARY] [RECIPE ...]
#   RECIPE: train flags in one argument (default: "--lr 0.01" "--optimizer adam --lr 3e-4"
#   "--optimizer adam --lr 1e-4"). Environment: STEPS (600), AT (150: a multiple of EVERY), SEED (1),
#   EVERY (50: every run checkpoints as often, as launch's do).
#   About 1.5 minutes per recipe on 2 cores. The result file goes to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="" PD=build/pipedream
while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=$2; shift 2 ;;
        --pd) PD=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;   # the recipes (train flags)
    esac
done
[ $# -gt 0 ] || set -- "--lr 0.01" "--optimizer adam --lr 3e-4" "--optimizer adam --lr 1e-4"
STEPS=${STEPS:-600} AT=${AT:-150} SEED=${SEED:-1} EVERY=${EVERY:-50}
[ -x "$PD" ] || { echo "bench/plan_switch.sh: no $PD (cmake --build build)" >&2; exit 1; }
KEEP=1
[ -n "$OUT" ] || { OUT=$(mktemp -d /tmp/pd-plan-switch.XXXXXX); KEEP=0; }
mkdir -p "$OUT"
cleanup() { [ "$KEEP" = 1 ] || rm -rf "$OUT"; }
trap cleanup EXIT

. bench/lib/result.sh
result_start plan-switch "$@"

"$PD" profile models/vgg16.json -o "$OUT/vgg16.prof.json" >/dev/null 2>&1
for w in 4 3; do
    "$PD" plan "$OUT/vgg16.prof.json" --workers $w --bandwidth 1.25e8 \
        -o "$OUT/plan$w.json" >/dev/null
done
stages() { python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(" ".join("%d-%d x%d" % (s["layers"][0], s["layers"][-1], s.get("replicas", 1)) for s in p["stages"]))' "$1"; }
acc() { grep -o '"test_accuracy":[0-9.]*' "$1" | tail -1 | cut -d: -f2; }
# every run checkpoints every EVERY minibatches, as launch's job does (a checkpoint drains the
# pipeline, which changes the weight versions an asynchronous schedule reads)
COMMON=(models/vgg16.json --minibatch 64 --microbatches 4 --seed "$SEED" --steps "$STEPS" --threads 1 --schedule 1f1b
        --checkpoint-every "$EVERY")
echo "vgg16, $STEPS minibatches of 64 (4 micro-batches), 1f1b (default staleness compensation), seed $SEED, threads;"
echo "plan for 4 workers: $(stages "$OUT/plan4.json"); for 3: $(stages "$OUT/plan3.json"); the switch at minibatch $AT"
echo
echo "| recipe | 4 workers | 4 -> 3 at $AT | 3 workers | 4 -> 3 minus 4 (points) |"
echo "| --- | ---: | ---: | ---: | ---: |"
i=0
for recipe in "$@"; do
    i=$((i + 1)); d=$OUT/r$i
    rm -rf "$d"; mkdir -p "$d/ck3"
    # shellcheck disable=SC2086  # RECIPE is a list of flags
    "$PD" train "${COMMON[@]}" --workers 4 --plan "$OUT/plan4.json" --checkpoint-dir "$d/ck4" $recipe \
        --metrics "$d/u4.jsonl" >"$d/u4.out" 2>&1
    cp "$d/ck4/ckpt-$(printf %010d "$AT").safetensors" "$d/ck3/"
    # shellcheck disable=SC2086
    "$PD" train "${COMMON[@]}" --workers 3 --plan "$OUT/plan3.json" --resume "$d/ck3" --checkpoint-dir "$d/ck3" \
        $recipe --metrics "$d/s.jsonl" >"$d/s.out" 2>&1
    # shellcheck disable=SC2086
    "$PD" train "${COMMON[@]}" --workers 3 --plan "$OUT/plan3.json" --checkpoint-dir "$d/ck3u" $recipe \
        --metrics "$d/u3.jsonl" >"$d/u3.out" 2>&1
    a4=$(acc "$d/u4.jsonl") as=$(acc "$d/s.jsonl") a3=$(acc "$d/u3.jsonl")
    echo "| \`$recipe\` | $a4 | $as | $a3 | $(awk -v a="$as" -v b="$a4" 'BEGIN {printf "%+.2f", 100 * (a - b)}') |"
done
result_finish
