#!/usr/bin/env bash
# bench/replan.sh: `pipedream launch` with and without re-planning when a host's link slows
# mid-run (docs/howto/elastic.md, "Stragglers").
#
# vgg16 (models/vgg16.json, its built-in data), minibatch 64 in 4 micro-batches, seed 1, on 4
# hosts of tools/cluster.sh at 1 Gbit/s, one rank per host, checkpoints every 50 minibatches.
# Each run starts with every link at 1 Gbit/s; once the checkpoint at minibatch SLOW_AT exists,
# host 3's link is shaped to SLOW_RATE (`tools/cluster.sh up 4 --rate 1gbit --host-rate
# 3=SLOW_RATE`, which re-shapes the running cluster). "replan" is launch as it is, "keep" the
# same with --no-replan (the straggler is reported, the plan kept). RUNS runs of each, in
# alternating order; the figure is the rest of the run: from the slowdown to launch's end.
#
# usage: bench/replan.sh [--out DIR] [--pd BINARY]   as root; about 15 minutes on 2 cores.
#   Environment: RUNS (3), STEPS (400), SLOW_AT (150), SLOW_RATE (10mbit), FACTOR (launch's
#   --straggler-factor, 3: the 4 ranks share 2 cores here, so each computes up to twice
#   its profile's prediction), PDC_NAME (pdrp).
# Prints a markdown table (every run, then the medians), also written to bench/results/
# (bench/lib/result.sh); raw outputs in OUT (a temporary directory unless --out). The cluster
# is taken down on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/emulated.sh
emu_args "" "$@"
RUNS=${RUNS:-3} STEPS=${STEPS:-400} SLOW_AT=${SLOW_AT:-150} SLOW_RATE=${SLOW_RATE:-10mbit} FACTOR=${FACTOR:-3}
export PDC_NAME=${PDC_NAME:-pdrp}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$PD" ] || { echo "bench/replan.sh: no $PD (cmake --build build)" >&2; exit 1; }
PD=$(realpath "$PD")
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/pd-replan.XXXXXX)
mkdir -p "$OUT"
CL=tools/cluster.sh
cleanup() { bash "$CL" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
bash "$CL" up 4 --rate 1gbit >/dev/null
MPIARGS=$(bash "$CL" mpirun-args)
printf '198.18.0.1\n198.18.0.2\n198.18.0.3\n198.18.0.4\n' >"$OUT/hosts"
[ -s "$OUT/vgg16.prof.json" ] || "$PD" profile models/vgg16.json --iterations 10 -o "$OUT/vgg16.prof.json" >/dev/null 2>&1

# one RUN MODE: prints "seconds_after_slowdown total_seconds test_accuracy replans"
one() {
    local id=$1 mode=$2 flags=()
    [ "$mode" = keep ] && flags=(--no-replan)
    bash "$CL" up 4 --rate 1gbit >/dev/null
    rm -rf "$OUT/$id"
    local t0; t0=$(date +%s.%N)
    "$PD" launch --hosts "$OUT/hosts" --profile "$OUT/vgg16.prof.json" --run-dir "$OUT/$id" --checkpoint-every 50 \
        --events "$OUT/$id.jsonl" --mpirun-args "$MPIARGS" --straggler-factor "$FACTOR" "${flags[@]}" models/vgg16.json -- \
        --steps "$STEPS" --minibatch 64 --microbatches 4 --seed 1 --keep-last 2 --timeout 120 \
        >"$OUT/$id.out" 2>"$OUT/$id.err" &
    local pid=$! ck; ck=$(printf '%s/%s/ckpt/ckpt-%010d.safetensors' "$OUT" "$id" "$SLOW_AT")
    while [ ! -e "$ck" ] && kill -0 $pid 2>/dev/null; do sleep 0.2; done
    local ts; ts=$(date +%s.%N)
    bash "$CL" up 4 --rate 1gbit --host-rate 3="$SLOW_RATE" >/dev/null
    wait $pid || { echo "bench/replan.sh: $id failed: $(tail -3 "$OUT/$id.err")" >&2; return 1; }
    local te; te=$(date +%s.%N)
    python3 - "$OUT/$id.out" "$OUT/$id.jsonl" "$ts" "$te" "$t0" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ev = [json.loads(l) for l in open(sys.argv[2])]
acc = s.get("test_accuracy", s.get("eval", {}).get("test_accuracy", float("nan")))
rp = [e for e in ev if e["event"] == "replan"]
print("%.1f %.1f %s %d %s" % (float(sys.argv[4]) - float(sys.argv[3]), float(sys.argv[4]) - float(sys.argv[5]),
      acc if isinstance(acc, str) else "%.4f" % acc, len(rp), (rp[0]["reason"].replace(" ", "_") if rp else "-")))
PY
}

. bench/lib/result.sh
result_start replan "$@"
echo "| run | mode | after the slowdown (s) | whole run (s) | test accuracy | re-plans | how |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- |"
for r in $(seq "$RUNS"); do
    order="replan keep"; [ $((r % 2)) = 0 ] && order="keep replan"
    for m in $order; do
        read -r rest total acc n how < <(one "$m-$r" "$m")
        echo "$rest" >>"$OUT/$m.rest"
        echo "| $r | $m | $rest | $total | $acc | $n | ${how//_/ } |"
    done
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
a=$(med "$OUT/replan.rest") b=$(med "$OUT/keep.rest")
echo
echo "median after the slowdown: replan $a s, keep $b s: re-planning $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}')x faster (raw: $OUT)"
result_finish
