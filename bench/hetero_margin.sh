#!/usr/bin/env bash
# bench/hetero_margin.sh: the planner's plan against the straight split on a heterogeneous
# emulated cluster, measured and predicted.
#
# vgg16 (models/vgg16.json), Fashion-MNIST with its test set cut to the first 512 images (the
# test pass after training crosses the slow links too), minibatch 64, 1 kernel thread per rank,
# `1f1b`. 4 hosts of tools/cluster.sh at FAST, hosts 0 and 1 at SLOW (`--host-rate`). One
# profile; a cluster file saying the same (hosts 0 and 1 with links of their own); the
# planner's plan (`plan --cluster`, every placement) and the straight split in rank order
# (`plan --straight --no-simulate`). REPS runs of each, taking turns: the straight split
# STEPS_STRAIGHT minibatches, the planner's STEPS_PLAN. Each run's summary carries the
# simulator's prediction for the same plan, profile and number of minibatches. Prints a table
# (medians) and the margin (straight split over planner's plan) measured and predicted, also
# written to OUT/table.md.
#
# CALIBRATE=N first runs the straight split for N minibatches with `train --calibrated-cluster
# --fit link-rate` (CAL_RUNS runs, the median fit): the share of the links' nominal rates its
# transfers achieved. The straight split keeps its stages with the fitted cluster; the planner
# plans again on it; the rounds then run and predict both from the fitted cluster.
#
# usage: bench/hetero_margin.sh [--out DIR] [--pd BINARY]   (as root)
#   Environment: FAST (1gbit), SLOW (10mbit), REPS (3), STEPS_STRAIGHT (16), STEPS_PLAN (200),
#   CALIBRATE (0: none), CAL_RUNS (3), PDC_NAME (pdhet). About 5 minutes with the defaults on 2
#   cores, 2 more with CALIBRATE=16.
# The cluster is taken down on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib/emulated.sh
emu_args out/hetero-margin "$@"
: "${FAST:=1gbit}" "${SLOW:=10mbit}" "${REPS:=3}" "${STEPS_STRAIGHT:=16}" "${STEPS_PLAN:=200}"
: "${CALIBRATE:=0}" "${CAL_RUNS:=3}"
NAME=${PDC_NAME:-pdhet}
emu_setup hetero_margin.sh
# the test set cut to 512 images (idx files: a 16- or 8-byte header, then the records)
rm -f "$OUT/data/t10k-images-idx3-ubyte.gz" "$OUT/data/t10k-labels-idx1-ubyte.gz"
python3 - /usr/share/datasets/fashion-mnist "$OUT/data" <<'PY'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for name, head, rec in (("t10k-images-idx3-ubyte.gz", 16, 784), ("t10k-labels-idx1-ubyte.gz", 8, 1)):
    raw = gzip.open(f"{src}/{name}").read()
    out = bytearray(raw[:head + 512 * rec])
    out[4:8] = struct.pack(">I", 512)
    with gzip.open(f"{dst}/{name}", "wb") as f:
        f.write(bytes(out))
PY
emu_profile
fast=$(payload_bps "$FAST") slow=$(payload_bps "$SLOW")
cat >"$OUT/cluster.json" <<JSON
{"levels": [{"workers": 4, "bandwidth": $fast}], "cores_per_machine": $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc),
 "hosts": [{"bandwidth": $slow}, {"bandwidth": $slow}]}
JSON
"$PD" plan "$PROF" --cluster "$OUT/cluster.json" -o "$OUT/plan.json" >"$OUT/plan.txt"
"$PD" plan "$PROF" --cluster "$OUT/cluster.json" --straight --no-simulate -o "$OUT/straight.json" >"$OUT/straight.txt"
log "cluster: 4 hosts at $FAST, hosts 0 and 1 at $SLOW"
EMU_UP=1
tools/cluster.sh up 4 --rate "$FAST" --host-rate "0=$SLOW,1=$SLOW" --name "$NAME" >&2
if [ "$CALIBRATE" -gt 0 ]; then   # the straight split keeps its stages, the planner plans again
    emu_calibrate "$OUT/straight.json" 1f1b link-rate "$CALIBRATE" "$CAL_RUNS" "$OUT/cal"
    cp "$OUT/plan.json" "$OUT/plan-nominal.json"
    "$PD" plan "$PROF" --cluster "$OUT/cal.json" -o "$OUT/plan.json" >"$OUT/plan.txt"
    same=$(python3 -c 'import json,sys; a,b=(json.load(open(f))["stages"] for f in sys.argv[1:]); print("the same stages as" if [(s["layers"],s["ranks"]) for s in a]==[(s["layers"],s["ranks"]) for s in b] else "other stages than")' \
        "$OUT/plan-nominal.json" "$OUT/plan.json")
    log "calibrated: the straight split keeps its stages; the planner planned again on the fitted links: $same on the nominal ones"
fi
: >"$OUT/runs.tsv"
for rep in $(seq "$REPS"); do
    for p in straight plan; do
        steps=$STEPS_PLAN
        [ "$p" = straight ] && steps=$STEPS_STRAIGHT
        id=$p-$rep rc=0
        timeout --kill-after=20 900 tools/cluster.sh run --name "$NAME" 4 "$PD" train models/vgg16.json \
            --plan "$OUT/$p.json" --schedule 1f1b --steps "$steps" --minibatch 64 --threads 1 \
            --profile "$PROF" --data "$OUT/data" >"$OUT/raw/$id.json" 2>"$OUT/raw/$id.err" || rc=$?
        if [ $rc != 0 ]; then log "$id: rc $rc ($(tail -1 "$OUT/raw/$id.err" | cut -c1-160))"; continue; fi
        python3 - "$OUT/raw/$id.json" "$p" "$rep" >>"$OUT/runs.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("\t".join([sys.argv[2], sys.argv[3], "%.3f" % d["time_per_unit_ms"], "%.3f" % d["predicted_time_per_unit_ms"],
                 "%.3f" % d["predicted_steady_time_per_unit_ms"]]))
PY
        log "$id: $(tail -1 "$OUT/runs.tsv" | cut -f3-)"
    done
done
emu_down

python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, statistics as st, sys
out = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/runs.tsv") if l.strip()]
def shape(p):
    d = json.load(open(f"{out}/{p}.json"))
    return ", ".join(f"{s['layers'][0]}-{s['layers'][-1]} ({' '.join(map(str, s['ranks']))})" for s in d["stages"])
print("| plan | stages: layers (ranks) | measured ms/unit (runs) | median | predicted | measured / predicted |")
print("| --- | --- | --- | ---: | ---: | ---: |")
med = {}
for p in ("straight", "plan"):
    mine = [x for x in rows if x[0] == p]
    if not mine:
        print(f"| {p} | {shape(p)} | (no run finished) | | | |")
        continue
    m, pr = st.median(float(x[2]) for x in mine), st.median(float(x[3]) for x in mine)
    med[p] = (m, pr)
    print(f"| {p} | {shape(p)} | {', '.join(x[2] for x in mine)} | {m:.1f} | {pr:.1f} | {m / pr:.2f} |")
if len(med) == 2:
    mm, mp = med["straight"][0] / med["plan"][0], med["straight"][1] / med["plan"][1]
    print(f"\nmargin (straight split / planner's plan): measured {mm:.1f}x, predicted {mp:.1f}x, "
          f"measured / predicted {mm / mp:.2f}")
PY
