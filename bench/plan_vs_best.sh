#!/usr/bin/env bash
# bench/plan_vs_best.sh: is the planner's plan the one to run? Measured against the alternatives.
#
# vgg16 (models/vgg16.json), Fashion-MNIST, minibatch 64, 4 hosts of tools/cluster.sh sharing this
# machine's cores, one rank per host, 1 kernel thread per rank. One profile (minibatch 64); at every
# rate of RATES, with the network stack's CPU per byte measured there (`tools/cluster.sh net-cpu`;
# NET_CPU=0 leaves it out), five plans from `pipedream plan --workers 4 --bandwidth B --cores
# $(nproc) --net-cpu S --core-efficiency E` (E measured once, bench/core_efficiency.sh):
#   choice    the plan it writes (candidate 1 of its list)
#   straight  the same with --straight (one worker per stage)
#   dp        data parallelism (`train --schedule dp`: every worker the whole model)
#   other-a   the dynamic program's own plan, when it is not the choice, else candidate 2 (--pick)
#   other-b   the next listed candidate not yet taken (--pick)
# (`plan` folds plans alike to a faster one into it, so the others differ from the choice in more
# than where a parameter-free layer runs.)
# Each trains STEPS minibatches under 1f1b (dp under dp), REPS times, the plans taking turns.
# Prints per rate the median samples/s of each plan, its prediction, and the choice over the best
# (within 5% is the aim); OUT/table.md keeps the table, OUT/raw every run's summary. Two names for
# the same plan (the straight split is often the choice) pool their runs, so that the best is
# not the luckier of two sets of runs of one plan.
#
# usage: bench/plan_vs_best.sh [--out DIR] [--pd BINARY]    (as root: the cluster needs namespaces)
#   Environment: RATES ("1gbit 300mbit 100mbit"), REPS (3), STEPS (80), NET_CPU (measured), CORE_EFF (measured),
#   PDC_NAME (cluster name, default pdbest). ~25 min with the defaults on 2 cores.
# The cluster is taken down on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib/emulated.sh
emu_args out/plan-vs-best "$@"
: "${RATES:=1gbit 300mbit 100mbit}" "${REPS:=3}" "${STEPS:=80}"
NAME=${PDC_NAME:-pdbest}
emu_setup plan_vs_best.sh
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mkdir -p "$OUT/plans"
emu_profile
emu_core_efficiency
: >"$OUT/runs.tsv"
for r in $RATES; do
    emu_up "$r"
    nc=$(emu_net_cpu "$r")
    log "$r: network CPU $nc s per byte"
    P=("$PROF" --workers 4 --bandwidth "$(payload_bps "$r")" --cores "$CORES" --net-cpu "$nc" --core-efficiency "$CE")
    "$PD" plan "${P[@]}" -o "$OUT/plans/choice-$r.json" >"$OUT/plans/choice-$r.txt"
    "$PD" plan "${P[@]}" --straight -o "$OUT/plans/straight-$r.json" >"$OUT/plans/straight-$r.txt"
    # the other two: rows of the printed list (number, source), the choice is row 1
    # (a row alike to another is the same plan for any run: not one of the others)
    mapfile -t rows < <(awk '/^candidates simulated/ { c = 1 } c && $1 ~ /^[*]?[0-9]+$/ && NF >= 4 && !/alike to/ {
        n = $1; sub(/^[*]/, "", n); print n, $2 }' "$OUT/plans/choice-$r.txt")
    a=""; b=""
    for row in "${rows[@]}"; do
        set -- $row
        [ "$1" = 1 ] && continue
        if [ "$2" = planner ]; then a=$1; fi
    done
    for row in "${rows[@]}"; do
        set -- $row
        [ "$1" = 1 ] || [ "$1" = "$a" ] && continue
        if [ -z "$a" ]; then a=$1; elif [ -z "$b" ]; then b=$1; fi
    done
    "$PD" plan "${P[@]}" --pick "$a" -o "$OUT/plans/other-a-$r.json" >"$OUT/plans/other-a-$r.txt"
    "$PD" plan "${P[@]}" --pick "$b" -o "$OUT/plans/other-b-$r.json" >"$OUT/plans/other-b-$r.txt"
    log "$r: choice $(grep -m1 '^  [*]1 ' "$OUT/plans/choice-$r.txt" | awk '{print $2, $NF}'); others: candidates $a and $b"
    for rep in $(seq "$REPS"); do
        for plan in choice straight dp other-a other-b; do
            id=$r-$plan-$rep kind=1f1b pf=$plan
            if [ $plan = dp ]; then kind=dp pf=straight; fi
            rc=0
            timeout --kill-after=20 600 tools/cluster.sh run --name "$NAME" 4 "$PD" train models/vgg16.json \
                --plan "$OUT/plans/$pf-$r.json" --schedule "$kind" --steps "$STEPS" --minibatch 64 --threads 1 \
                --profile "$PROF" --data "$OUT/data" >"$OUT/raw/$id.json" 2>"$OUT/raw/$id.err" || rc=$?
            if [ $rc != 0 ]; then log "$id: rc $rc ($(tail -1 "$OUT/raw/$id.err" | cut -c1-160))"; continue; fi
            python3 - "$OUT/raw/$id.json" "$r" "$plan" "$rep" >>"$OUT/runs.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
pred = d.get("predicted_time_per_unit_ms")
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], "%.1f" % d["samples_per_s"], "%.3f" % d["time_per_unit_ms"],
                 "%.3f" % pred if pred else "-", str(d["unit_batch"])]))
PY
            log "$id: $(tail -1 "$OUT/runs.tsv" | cut -f4-)"
        done
    done
    emu_down
done

python3 - "$OUT/runs.tsv" "$RATES" "$OUT/plans" <<'PY' | tee "$OUT/table.md"
import json, statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
plans = ["choice", "straight", "dp", "other-a", "other-b"]
def shape(r, k):
    """The plan as it runs (stages' layers and ranks): two names for one plan measure one plan."""
    if k == "dp":
        return "dp"
    d = json.load(open(f"{sys.argv[3]}/{k}-{r}.json"))
    return json.dumps([(s["layers"], s["ranks"]) for s in d["stages"]])
print("| link | plan | samples/s (runs) | median | predicted samples/s | of the best |")
print("| --- | --- | --- | ---: | ---: | ---: |")
for r in sys.argv[2].split():
    sh = {k: shape(r, k) for k in plans}
    runs = {k: [x for x in rows if x[0] == r and x[1] == k] for k in plans}
    # the runs of every name of a plan count for it: the best is not the luckier of two copies
    pooled = {k: [x for j in plans if sh[j] == sh[k] for x in runs[j]] for k in plans}
    med = {k: st.median(float(x[3]) for x in pooled[k]) for k in plans if pooled[k]}
    best = max(med.values()) if med else 0
    for k in plans:
        mine = pooled[k]
        if not mine:
            print(f"| {r} | {k} | (no run finished) | | | |")
            continue
        same = [j for j in plans if j != k and sh[j] == sh[k]]
        name = k + (f" (= {', '.join(same)}: runs pooled)" if same else "")
        pr = [float(x[5]) for x in mine if x[5] != "-"]
        ps = "%.1f" % (int(mine[0][6]) * 1e3 / st.median(pr)) if pr else "-"
        print(f"| {r} | {name} | {', '.join(x[3] for x in mine)} | {med[k]:.1f} | {ps} | {med[k] / best:.3f} |")
    if "choice" in med and best:
        print(f"| {r} | **choice / best** | | | | **{med['choice'] / best:.3f}** |")
PY
