#!/usr/bin/env bash
# bench/predict_table.sh: measured against predicted time per unit on the emulated cluster.
#
# vgg16 (models/vgg16.json), Fashion-MNIST, minibatch 64, 4 hosts of tools/cluster.sh sharing this
# machine's cores, one rank per host, 1 kernel thread per rank. One profile (minibatch 64); at
# every rate of RATES the network stack's CPU per byte (`tools/cluster.sh net-cpu`, 2.5 s of
# stream) and the straight 4-stage plan for that rate (`plan --straight --cores $(nproc)
# --net-cpu S --core-efficiency E`, E measured once by bench/core_efficiency.sh); every schedule of KINDS trained STEPS minibatches REPS times, the schedules taking
# turns. Each run's summary carries the simulator's prediction for the same plan and profile
# (`predicted_time_per_unit_ms`) beside what it measured (`time_per_unit_ms`). Prints a table
# (medians) and writes it with every run's figures to OUT/table.md. The kind `interleaved` runs
# on its own plan, `plan --chunks 2` with the same options (the planner chooses how many
# data-parallel pipelines, or IL_PIPELINES=D of them; with CALIBRATE, planned again on the
# fitted cluster).
#
# usage: bench/predict_table.sh [--out DIR] [--pd BINARY]    (as root: the cluster needs namespaces)
#   Environment: RATES ("1gbit 300mbit 100mbit"), KINDS ("dp 1f1b-flush 1f1b zb-h1"), REPS (3),
#   STEPS (80), NET_CPU (0: plan without the network's CPU), CORE_EFF (E instead of measuring it), PDC_NAME (cluster name, default pdpred). ~15 min with the defaults on 2 cores.
#   CALIBRATE (0): at every rate, first CALIBRATE minibatches of CAL_KIND (1f1b) on the plan with
#   `train --calibrated-cluster`; every schedule is then predicted on the fitted cluster (the
#   calibration run itself is not in the table). CAL_RUNS (1) such runs, and the one whose
#   fitted value is the median sets the cluster. CAL_FIT (core-efficiency): what the calibration
#   fits (`train --fit`): core-efficiency, or wake (the
#   cost of waking from a wait while the cores are busy; the core efficiency stays the cluster's).
#   CAL_STEPS ("KIND:FIT ...", default "CAL_KIND:CAL_FIT"): several such steps in turn, each on
#   the plan and cluster the one before left, e.g. "1f1b:core-efficiency 1f1b-flush:wake".
#   The fitted cluster replaces the plan's and its stages stay, so that every calibration step
#   and every schedule of the table run on the stages the calibration measured (a fit holds
#   for the plan it was made on: the wake cost above all). CAL_REPLAN=1: plan again on the
#   fitted cluster instead (`plan --cluster --straight`, which may move the cuts).
# The cluster is taken down on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. bench/lib/emulated.sh
emu_args out/predict-table "$@"
: "${RATES:=1gbit 300mbit 100mbit}" "${KINDS:=dp 1f1b-flush 1f1b zb-h1}" "${REPS:=3}" "${STEPS:=80}"
NAME=${PDC_NAME:-pdpred}
emu_setup predict_table.sh
emu_profile
emu_core_efficiency
: >"$OUT/runs.tsv"
for r in $RATES; do
    emu_up "$r"
    nc=$(emu_net_cpu "$r")   # the network stack's CPU per byte (NET_CPU=0: left out of the plans)
    log "$r: network CPU $nc s per byte"
    # the rate's cluster as the plans see it (the straight plan's, and interleaved's uncalibrated)
    cluster_opts=(--workers 4 --bandwidth "$(payload_bps "$r")" --cores "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
        --net-cpu "$nc" --core-efficiency "$CE")
    "$PD" plan "$PROF" "${cluster_opts[@]}" --straight -o "$OUT/straight-$r.json" >"$OUT/straight-$r.txt"
    if [ "${CALIBRATE:-0}" -gt 0 ]; then
        step=0
        for cs in ${CAL_STEPS:-${CAL_KIND:-1f1b}:${CAL_FIT:-core-efficiency}}; do
            step=$((step + 1))
            ck=${cs%%:*} cf=${cs#*:}
            emu_calibrate "$OUT/straight-$r.json" "$ck" "$cf" "$CALIBRATE" "${CAL_RUNS:-1}" "$OUT/cluster-$r-$step"
            cp "$OUT/cluster-$r-$step.json" "$OUT/cluster-$r.json"
            if [ "${CAL_REPLAN:-0}" = 1 ]; then
                "$PD" plan "$PROF" --cluster "$OUT/cluster-$r.json" --straight -o "$OUT/straight-$r.json" >"$OUT/straight-$r.txt"
            fi
        done
    fi
    case " $KINDS " in *" interleaved "*)
        [ "${CALIBRATE:-0}" -gt 0 ] && cluster_opts=(--cluster "$OUT/cluster-$r.json")
        "$PD" plan "$PROF" "${cluster_opts[@]}" --chunks 2 ${IL_PIPELINES:+--pipelines "$IL_PIPELINES"} \
            -o "$OUT/chunks-$r.json" >"$OUT/chunks-$r.txt"
        log "$r: interleaved plan: $(sed -n 2p "$OUT/chunks-$r.txt")" ;;
    esac
    for rep in $(seq "$REPS"); do
        for k in $KINDS; do
            id=$r-$k-$rep
            rc=0
            plan=$OUT/straight-$r.json
            [ "$k" = interleaved ] && plan=$OUT/chunks-$r.json
            timeout --kill-after=20 600 tools/cluster.sh run --name "$NAME" 4 "$PD" train models/vgg16.json \
                --plan "$plan" --schedule "$k" --steps "$STEPS" --minibatch 64 --threads 1 \
                --profile "$PROF" --data "$OUT/data" >"$OUT/raw/$id.json" 2>"$OUT/raw/$id.err" || rc=$?
            if [ $rc != 0 ]; then log "$id: rc $rc ($(tail -1 "$OUT/raw/$id.err" | cut -c1-160))"; continue; fi
            python3 - "$OUT/raw/$id.json" "$r" "$k" "$rep" >>"$OUT/runs.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("\t".join([sys.argv[2], sys.argv[3], sys.argv[4], str(d["unit_batch"]), "%.3f" % d["time_per_unit_ms"],
                 "%.3f" % d["predicted_time_per_unit_ms"], "%.1f" % d["samples_per_s"]]))
PY
            log "$id: $(tail -1 "$OUT/runs.tsv" | cut -f4-)"
        done
    done
    emu_down
done

python3 - "$OUT/runs.tsv" "$RATES" "$KINDS" <<'PY' | tee "$OUT/table.md"
import statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("| link | schedule | unit (samples) | measured ms/unit (runs) | median | predicted ms/unit | measured / predicted |")
print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
for r in sys.argv[2].split():
    for k in sys.argv[3].split():
        mine = [x for x in rows if x[0] == r and x[1] == k]
        if not mine:
            print(f"| {r} | `{k}` | | (no run finished) | | | |")
            continue
        m = st.median(float(x[4]) for x in mine)
        p = st.median(float(x[5]) for x in mine)
        print(f"| {r} | `{k}` | {mine[0][3]} | {', '.join(x[4] for x in mine)} | {m:.2f} | {p:.2f} | {m / p:.2f} |")
PY
