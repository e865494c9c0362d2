#!/usr/bin/env bash
# pipeline_bench.sh: the runtime's pipeline benchmark, on this machine (2 cores).
# vgg16, minibatch 64, 1 thread per rank, Fashion-MNIST, STEPS minibatches each:
#   one rank (one-stage plan)   vs   2 stages on 2 ranks (1f1b)   vs   dp on 2 ranks
# and the peer: PyTorch DDP (gloo, 2 processes x 1 thread, same per-process minibatch).
# Prints each run's summary line and a table: samples/s, ratio to one rank, measured vs
# simulated time per minibatch, and the runtime overhead (wall time neither in kernels nor
# waiting), and leaves them in bench/results/ (bench/lib/result.sh).
# Run on a quiet machine: `bash bench/pipeline_bench.sh [build/pipedream]`.
set -euo pipefail
. "$(dirname "$0")/lib/result.sh"
result_start pipeline-bench "$@"
PD=${1:-build/pipedream}
STEPS=${STEPS:-150}
MODEL=${MODEL:-vgg16}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$PD" profile models/$MODEL.json --minibatch 64 --threads 1 --iterations 20 -o "$OUT/prof.json" >/dev/null
"$PD" plan "$OUT/prof.json" --workers 1 --bandwidth 1e10 -o "$OUT/p1.json" >/dev/null
"$PD" plan "$OUT/prof.json" --workers 2 --bandwidth 1e10 --straight -o "$OUT/p2.json" | sed -n '4,6p'
run() {   # run NAME NP PLAN [args]
    local name=$1 np=$2 plan=$3; shift 3
    mpirun -np "$np" --oversubscribe --bind-to none "$PD" train models/$MODEL.json --plan "$plan" --steps "$STEPS" \
        --minibatch 64 --threads 1 --profile "$OUT/prof.json" --metrics "$OUT/$name.jsonl" "$@" \
        >"$OUT/$name.json" 2>"$OUT/$name.err" || { cat "$OUT/$name.err"; exit 1; }
    echo "$name: $(cat "$OUT/$name.json")"
}
run one 1 "$OUT/p1.json"
run pipe2 2 "$OUT/p2.json"
run dp2 2 "$OUT/p2.json" --schedule dp
peer=$(/usr/bin/python3 bench/ddp_peer.py "$MODEL" 2 64 "$STEPS" 2>/dev/null || echo '{"samples_per_s": 0}')
echo "ddp: $peer"
python3 - "$OUT" "$peer" <<'PY'
import json, sys
d = sys.argv[1]
runs = {n: json.loads(open(f"{d}/{n}.json").read()) for n in ("one", "pipe2", "dp2")}
peer = json.loads(sys.argv[2])
base = runs["one"]["samples_per_s"]
print(f"\n{'run':<22}{'samples/s':>11}{'x one rank':>12}{'ms/minibatch':>14}{'simulated':>11}{'overhead %':>12}")
for n, r in runs.items():
    print(f"{n:<22}{r['samples_per_s']:>11.1f}{r['samples_per_s'] / base:>12.2f}{r['time_per_unit_ms']:>14.2f}"
          f"{r['predicted_time_per_unit_ms'] or float('nan'):>11.2f}{r.get('overhead_pct', float('nan')):>12.2f}")
print(f"{'pytorch ddp (gloo) x2':<22}{peer['samples_per_s']:>11.1f}{peer['samples_per_s'] / base:>12.2f}")
PY
result_finish
