#!/usr/bin/env bash
# bench/wire_bf16.sh: what `--wire bf16` buys on a slow link, measured against its prediction.
#
# vgg16 (models/vgg16.json), Fashion-MNIST, minibatch 64, 4 hosts of tools/cluster.sh at RATE sharing
# this machine's cores, one rank per host, 1 kernel thread per rank, compute in PRECISION. One
# profile in that precision (the median of 5 rounds); the network stack's CPU per byte measured at
# RATE (NET_CPU=0: left out) and the cores' efficiency (bench/core_efficiency.sh; CORE_EFF= to give
# it). Two plans from `pipedream plan --workers 4 --bandwidth B --cores $(nproc) --net-cpu S
# --core-efficiency E`: w_fp32 (the fp32 wire) and w_bf16 (`--wire bf16`). Three runs per round,
# taking turns, ROUNDS rounds, STEPS minibatches of `1f1b` each:
#   fp32 wire on w_fp32, bf16 wire on w_bf16, fp32 wire on w_bf16 (the same plan, the wire alone)
# Prints each run's time per unit, measured and predicted, and the ratios of the mean times:
# bf16 on its plan over fp32 on its own, and over fp32 on the same plan. OUT/table.md keeps them.
#
# usage: bench/wire_bf16.sh [--out DIR] [--pd BINARY]    (as root: the cluster needs namespaces)
#   Environment: RATE (100mbit), PRECISION (fp32), ROUNDS (2), STEPS (80), NET_CPU, CORE_EFF,
#   PDC_NAME (cluster name, default pdwire). ~6 min with the defaults on 2 cores.
# The cluster is taken down on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib/emulated.sh
emu_args out/wire-bf16 "$@"
: "${RATE:=100mbit}" "${PRECISION:=fp32}" "${ROUNDS:=2}" "${STEPS:=80}"
NAME=${PDC_NAME:-pdwire}
emu_setup wire_bf16.sh
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
emu_profile "$PRECISION"
emu_core_efficiency
emu_up "$RATE"
nc=$(emu_net_cpu "$RATE")
log "network CPU $nc s per byte"
P=("$PROF" --workers 4 --bandwidth "$(payload_bps "$RATE")" --cores "$CORES" --net-cpu "$nc" --core-efficiency "$CE")
"$PD" plan "${P[@]}" -o "$OUT/w_fp32.json" >"$OUT/w_fp32.txt"
"$PD" plan "${P[@]}" --wire bf16 -o "$OUT/w_bf16.json" >"$OUT/w_bf16.txt"
for p in w_fp32 w_bf16; do log "$p: $(grep -m1 '^  [*]1 ' "$OUT/$p.txt" | awk '{print $3, "ms,", $NF}')"; done
: >"$OUT/runs.tsv"
for round in $(seq "$ROUNDS"); do
    for run in "fp32 w_fp32" "bf16 w_bf16" "fp32 w_bf16"; do
        set -- $run
        id=$1-$2-$round rc=0
        timeout --kill-after=20 600 tools/cluster.sh run --name "$NAME" 4 "$PD" train models/vgg16.json \
            --plan "$OUT/$2.json" --schedule 1f1b --steps "$STEPS" --minibatch 64 --threads 1 \
            --precision "$PRECISION" --wire "$1" --profile "$PROF" --data "$OUT/data" \
            >"$OUT/raw/$id.json" 2>"$OUT/raw/$id.err" || rc=$?
        if [ $rc != 0 ]; then log "$id: rc $rc ($(tail -1 "$OUT/raw/$id.err" | cut -c1-160))"; continue; fi
        python3 - "$OUT/raw/$id.json" "$1" "$2" "$round" >>"$OUT/runs.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("\t".join(sys.argv[2:5] + ["%.3f" % d["time_per_unit_ms"], "%.3f" % d["predicted_time_per_unit_ms"]]))
PY
        log "$id: $(tail -1 "$OUT/runs.tsv" | cut -f4-)"
    done
done
emu_down
python3 - "$OUT/runs.tsv" "$RATE" "$PRECISION" <<'PY' | tee "$OUT/table.md"
import sys
from statistics import mean
runs = {}
for line in open(sys.argv[1]):
    wire, plan, rnd, t, pred = line.split()
    runs.setdefault((wire, plan), []).append((float(t), float(pred)))
print("| wire | plan | ms per unit (runs) | predicted | measured / predicted |")
print("| --- | --- | --- | ---: | --- |")
for key in [("fp32", "w_fp32"), ("bf16", "w_bf16"), ("fp32", "w_bf16")]:
    r = runs.get(key, [])
    print("| %s | %s | %s | %s | %s |" % (key + (", ".join("%.3f" % t for t, _ in r),
          "%.3f" % r[0][1] if r else "-", ", ".join("%.2f" % (t / p) for t, p in r))))
m = {k: mean(t for t, _ in v) for k, v in runs.items() if v}
b = m.get(("bf16", "w_bf16"))
if b:
    print()
    print("%s compute at %s: bf16 wire on its plan over fp32 on its own %.2fx, over fp32 on the same plan %.2fx"
          % (sys.argv[3], sys.argv[2], m.get(("fp32", "w_fp32"), float("nan")) / b,
             m.get(("fp32", "w_bf16"), float("nan")) / b))
PY
