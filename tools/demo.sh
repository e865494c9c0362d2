#!/usr/bin/env bash
# demo.sh: `make demo`: trains lenet5 for one epoch of Fashion-MNIST on one worker
# (MODELS.md's recipe: SGD lr 0.01, momentum 0.9, minibatch 64) and prints the summary.
# Usage: tools/demo.sh [path/to/pipedream]
set -euo pipefail
PD=${1:-build/pipedream}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
echo "pipedream demo: lenet5, 1 epoch of Fashion-MNIST, SGD lr 0.01 momentum 0.9, minibatch 64" >&2
"$PD" train "$ROOT/models/lenet5.json" --epochs 1 --minibatch 64 --lr 0.01 --momentum 0.9 --threads "${THREADS:-2}" \
    --metrics "${METRICS:-/tmp/pipedream-demo-metrics.jsonl}"
