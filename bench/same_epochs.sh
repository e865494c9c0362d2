#!/usr/bin/env bash
# same_epochs.sh: statistical efficiency of dp against 1f1b: both trained for the same number
# of epochs on 4 MPI ranks over shared memory (a schedule's accuracy does not depend on the
# link: tests/cli/cluster.sh checks a run over the emulated cluster bitwise equal to the same
# run over shared memory), evaluated on the whole test set after every epoch.
#
#   bench/same_epochs.sh [PLANS_DIR] [OUT_DIR]
#
# PLANS_DIR holds planner-100mbit.json (1f1b) and straight-100mbit.json (dp), as
# bench/experiment.sh writes them (default out/experiment-full/plans). EPOCHS (4), PD
# (build/pipedream), DP_MINIBATCH (64: each replica's minibatch, so dp's optimizer step
# averages 4 x 64 samples and an epoch has a quarter of 1f1b's steps; 16 gives dp 1f1b's
# 64 samples per step and its number of steps). Writes OUT_DIR/{1f1b,dp}.json (summaries) and .jsonl (one line per
# evaluation) and prints one line per evaluation, also into bench/results/ (bench/lib/result.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/result.sh
result_start same-epochs "$@"
PLANS=${1:-out/experiment-full/plans} OUT=${2:-out/same-epochs}
EPOCHS=${EPOCHS:-4} PD=${PD:-build/pipedream} DP_MINIBATCH=${DP_MINIBATCH:-64}
for f in "$PLANS/planner-100mbit.json" "$PLANS/straight-100mbit.json" "$PD"; do
    [ -e "$f" ] || { echo "same_epochs.sh: $f not found (run bench/experiment.sh, or give PLANS_DIR / PD)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "same_epochs.sh: mpirun not found (tools/install-deps.sh)" >&2; exit 2; }
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
for k in "1f1b planner 64" "dp straight $DP_MINIBATCH"; do
    set -- $k
    EPOCH_MB=$(( (60000 + $3 - 1) / $3 ))   # units of $3 samples per epoch (dp too: a unit per replica)
    echo "$(date +%T) $1: $EPOCHS epochs, minibatch $3" >&2
    mpirun --oversubscribe -np 4 "$PD" train models/vgg16.json --plan "$PLANS/$2-100mbit.json" --schedule "$1" \
        --epochs "$EPOCHS" --minibatch "$3" --threads 1 --eval-every "$EPOCH_MB" --metrics "$OUT/$1.jsonl" \
        --timeout 900 >"$OUT/$1.json" 2>"$OUT/$1.err" || { echo "same_epochs.sh: $1 failed: $(tail -1 "$OUT/$1.err")" >&2; exit 1; }
    grep '"eval_minibatches"' "$OUT/$1.jsonl" | sed "s/^/$1 /"
done
result_finish
