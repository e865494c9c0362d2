#!/usr/bin/env bash
# vshape.sh: the V-shaped pipeline schedules against the straight ones on an emulated cluster
# whose hosts each own half a core, so that a pipeline bubble is idle time, not time lent to
# another rank.
#
# 4 hosts of tools/cluster.sh at RATE (1gbit), each capped at HOST_CPU (0.5) cores, one rank per
# host, 1 kernel thread per rank, 8 micro-batches per minibatch. For each model of MODELS:
#  1. profile at the micro-batch size (the median of 5 rounds); the cluster as a pipedream-cluster
#     file (tools/cluster.sh cluster-file: the links' payload rate; each host's speed HOST_CPU x E,
#     E a capped host's speed while all compute, bench/core_efficiency.sh --cluster; the network stack's CPU
#     per byte, tools/cluster.sh net-cpu, which a capped host pays from its share);
#     three plans on it: straight (4 stages, for 1f1b-flush, zb-h1 and the other kinds of one
#     stage per worker), V (`plan --v-shape`: 8 stages, worker i holds stages i and 7-i, for
#     zb-v, v-half, v-min, dualpipe-v) and chosen (`plan --choose-schedule --memory-limit L
#     --kinds KINDS --microbatches 2`, i.e. 8, which records the kind it chose). L is the
#     simulated worst worker's peak memory of zb-v on the V plan (MEMORY_LIMIT=BYTES to give it):
#     zb-v fits, the kinds that hold more (dualpipe-v) do not. Prints the plans, the choice as plan printed it, and the simulator's time
#     per unit and worst worker's peak memory for each kind.
#  2. RUNS rounds; in each round every kind of KINDS and "chosen" (the chosen plan under its
#     recorded kind) train STEPS minibatches once, the order rotated by one each round (taking
#     turns, so that a slow minute of the machine does not fall on one kind). Raw outputs:
#     OUT/raw/<model>-<kind>-r<round>.{json (stdout; its last line the summary),err,jsonl (--metrics)}.
#  3. per model, a table: samples/s (median), ms per unit measured (median, and each run in
#     round order), the simulator's ms per unit for the same plan, profile and run length
#     (train's predicted_time_per_unit_ms), their ratio, and the worst worker's activation and
#     allocated memory, measured by the runtime's ledger (predicted by the simulator's); then,
#     computed from those figures, whether each bar was met:
#       - every kind's measured time per unit within 15% of the simulator's;
#       - zb-v beats zb-h1 (the median of the per-round time ratios zb-v / zb-h1 below 1);
#       - v-half's worst worker's activation memory <= 0.6x 1f1b-flush's;
#       - the chosen plan within 5% of the best measured kind whose simulated peak fits L, and
#         whether it chose a V-shaped kind where one measured fastest under L;
#       - the final weights (weights_crc) of the synchronous kinds on one stage split and
#         micro-batch count bitwise equal within each round.
#     The script asserts nothing: it reports.
#
# A worker's memory: a stage's metrics line carries its first rank's whole ledger (every stage a
# V worker holds reports the same figures, src/runtime/rt_report.c), so the worst worker is the
# largest stage line, not a sum over a worker's stages. The ledger counts allocated bytes (its
# pools' high water); the simulator's "peak memory" (plan --memory-limit, the phase 1 line) and
# its live activation peak (quoted beside the v-half bar) count live bytes, a smaller figure.
#
# Models: vgg16 (models/vgg16.json, Fashion-MNIST, the first 256 test images for the final
# evaluation; minibatch 128, 16 samples a unit) and gpt-mini-8: models/gpt-mini.json has only 7
# top-level layers, too few for 8 stages, so the script writes OUT/gpt-mini-8.json, the same
# model with 8 blocks (minibatch 64, 8 sequences of 64 bytes a unit; the first 400 kB of the King
# James Bible from tools/prepare_kjv.sh, its last 5% the held-out text).
#
# usage: bench/vshape.sh [--quick] [--out DIR] [--pd BINARY] [--models "vgg16 gpt-mini-8"]
#                        [--kinds "1f1b-flush zb-h1 zb-v v-half dualpipe-v"] [--runs 3] [--steps N]
#   --quick: 1 round, vgg16 only, 30 steps (~2 min on 2 cores; the full run ~17 min).
#   --steps N: every model's steps (default vgg16 80, gpt-mini-8 30; quick 30 and 8).
#   as root (network namespaces). Environment: PDC_NAME (the cluster's name, default pdvs),
#   RATE (1gbit), HOST_CPU (0.5), MEMORY_LIMIT (bytes; default as above). OUT defaults to
#   out/vshape-full or out/vshape-quick. The cluster is taken down on every exit.
# The figures also go to bench/results/<UTC date>-<time>-vshape[-quick].md (bench/lib/result.sh;
# PD_RESULTS= writes none).
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=full OUT="" PD=build/pipedream MODELS="" KINDS="1f1b-flush zb-h1 zb-v v-half dualpipe-v" RUNS="" STEPS=""
ARGS=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick; shift ;;
        --out) OUT=$2; shift 2 ;;
        --pd) PD=$2; shift 2 ;;
        --models) MODELS=$2; shift 2 ;;
        --kinds) KINDS=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "vshape.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
if [ $MODE = quick ]; then : "${MODELS:=vgg16}" "${RUNS:=1}"; else : "${MODELS:=vgg16 gpt-mini-8}" "${RUNS:=3}"; fi
: "${OUT:=out/vshape-$MODE}"
NAME=${PDC_NAME:-pdvs} RATE=${RATE:-1gbit} HOST_CPU=${HOST_CPU:-0.5} WORKERS=4 MICRO=8
V_KINDS=" zb-v v-half v-min dualpipe-v "
[ -x "$PD" ] || { echo "vshape.sh: $PD not found (cmake --build build --target pipedream)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "vshape.sh: needs root (tools/cluster.sh)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

. bench/lib/result.sh
result_start "vshape$([ $MODE = quick ] && echo -quick)" "${ARGS[@]}"
T0=$(date +%s)

# --- the cluster, always taken down ---------------------------------------------------------
CLUSTER_UP=0
cleanup() { if [ $CLUSTER_UP = 1 ]; then tools/cluster.sh down --name "$NAME" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$OUT/raw"
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)   # the ranks open the model and data files by these paths
log "cluster $NAME: $WORKERS hosts at $RATE, $HOST_CPU cores each"
CLUSTER_UP=1
tools/cluster.sh up $WORKERS --rate "$RATE" --cpu "$HOST_CPU" --name "$NAME" >"$OUT/cluster-up.txt" 2>&1 ||
    { cat "$OUT/cluster-up.txt" >&2; exit 1; }
PDC_NAME=$NAME tools/cluster.sh cluster-file >"$OUT/cluster.json"
# The CPU the network stack spends per byte (a 2.5 s TCP stream between two hosts): a capped
# host pays it from its own share, so the simulator needs it.
NET_CPU=$(tools/cluster.sh net-cpu --name "$NAME" --mb 300 | tee "$OUT/net-cpu.txt" | tail -1)
log "network CPU $NET_CPU s per byte"

# --- the models: file, minibatch, steps, data -----------------------------------------------
# model_setup NAME: sets MODEL_FILE, MB (minibatch), MSTEPS, DATA_ARGS (and makes the data once)
model_setup() {
    case $1 in
        vgg16)
            MODEL_FILE=models/vgg16.json MB=128 MSTEPS=${STEPS:-$([ $MODE = quick ] && echo 30 || echo 80)}
            DATA_ARGS=(--data "$OUT/data")
            [ -d "$OUT/data" ] || python3 - /usr/share/datasets/fashion-mnist "$OUT/data" 256 <<'PY'
# the training set as it is, the first N test images (only the final evaluation reads them)
import gzip, os, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst)
for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
    os.symlink(f"{src}/{f}", f"{dst}/{f}")
for f, item in (("t10k-images-idx3-ubyte.gz", 784), ("t10k-labels-idx1-ubyte.gz", 1)):
    b = gzip.open(f"{src}/{f}").read()
    hdr = 16 if item > 1 else 8
    out = bytearray(b[:hdr]); out[4:8] = struct.pack(">I", n)
    gzip.open(f"{dst}/{f}", "wb").write(bytes(out) + b[hdr:hdr + n * item])
PY
            ;;
        gpt-mini-8)
            MODEL_FILE=$OUT/gpt-mini-8.json MB=64 MSTEPS=${STEPS:-$([ $MODE = quick ] && echo 8 || echo 30)}
            DATA_ARGS=(--text "$OUT/kjv-400k.txt")
            if [ ! -s "$OUT/kjv-400k.txt" ]; then
                tools/prepare_kjv.sh out/kjv.txt >/dev/null
                head -c 400000 out/kjv.txt >"$OUT/kjv-400k.txt"
            fi
            [ -s "$MODEL_FILE" ] || python3 - models/gpt-mini.json "$MODEL_FILE" <<'PY'
# gpt-mini with 8 blocks: the first block copied in place of the 4
import copy, json, sys
m = json.load(open(sys.argv[1]))
blocks = [i for i, l in enumerate(m["layers"]) if l["type"] == "block"]
m["layers"] = (m["layers"][:blocks[0]] + [copy.deepcopy(m["layers"][blocks[0]]) for _ in range(8)]
               + m["layers"][blocks[-1] + 1:])
m["name"], m["comment"] = "gpt-mini-8", "models/gpt-mini.json with 8 blocks (bench/vshape.sh)"
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
            ;;
        *) echo "vshape.sh: unknown model $1 (vgg16, gpt-mini-8)" >&2; exit 2 ;;
    esac
}
is_v() { [[ $V_KINDS == *" $1 "* ]]; }
plan_of() { if is_v "$1"; then echo v; else echo straight; fi; }   # the plan a kind runs on
# jval FILE EXPR: EXPR of d, FILE's JSON (a plan, a simulation) or its last line's (a train summary)
jval() {
    python3 -c 'import json, sys
t = open(sys.argv[1]).read().strip()
try: d = json.loads(t)
except ValueError: d = json.loads(t.splitlines()[-1])
print(eval(sys.argv[2]))' "$@"
}
# read_chosen PLAN: "KIND MICROBATCHES RECOMPUTE(0|1)" as the chosen plan records them
read_chosen() { jval "$1" '"%s %d %d" % (d["schedule"]["kind"], d["schedule"]["microbatches"], bool(d["schedule"].get("recompute")))'; }
# sched_args LABEL DIR: the train/simulate flags of a kind (chosen: the chosen plan's own)
SCHED=()
sched_args() {
    local k m r
    if [ "$1" = chosen ]; then read -r k m r < <(read_chosen "$2/chosen.json")
    else k=$1 m=$MICRO r=0; fi
    SCHED=(--plan "$2/$( [ "$1" = chosen ] && echo chosen || plan_of "$1").json" --schedule "$k" --microbatches "$m")
    [ "$r" = 0 ] || SCHED+=(--recompute)
}

# --- 1. profile and plans ---------------------------------------------------------------------
echo "# V-shaped schedules on $WORKERS emulated hosts at $RATE, $HOST_CPU cores each ($MODE)"
echo
echo "kinds: $KINDS, and chosen; $MICRO micro-batches per minibatch; $RUNS round(s), order rotated each round"
for model in $MODELS; do
    model_setup "$model"
    D=$OUT/$model
    mkdir -p "$D"
    echo
    echo "## $model"
    echo
    [ "$model" != gpt-mini-8 ] ||
        echo "gpt-mini-8: models/gpt-mini.json with 8 blocks instead of 4 (written by this script; 7 layers are too few for 8 stages)"
    log "$model: profile at $((MB / MICRO)) samples (the median of 5 rounds)"
    "$PD" profile "$MODEL_FILE" --minibatch $((MB / MICRO)) --threads 1 --iterations 20 --rounds 5 \
        -o "$D/prof.json" >"$D/prof.txt" 2>&1
    # a capped host's speed while every host computes, for this model at the unit's size, against
    # one uncapped core alone: HOST_CPU x E (E measured in the cluster's hosts, under their quotas)
    # (uncapped hosts: each core's speed while both compute)
    CAPPED=(--cluster "$NAME"); awk -v c="$HOST_CPU" 'BEGIN { exit !(c >= 1) }' && CAPPED=()
    E=$(bench/core_efficiency.sh --pd "$PD" --model "$MODEL_FILE" --minibatch $((MB / MICRO)) --pairs 3 \
        "${CAPPED[@]}" 2>"$D/core-efficiency.txt" | tail -1)
    python3 - "$OUT/cluster.json" "$HOST_CPU" "$E" "$NET_CPU" "$D/cluster.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for h in c["hosts"]: h["speed"] = float(sys.argv[2]) * float(sys.argv[3])
c["net_cpu_per_byte"] = float(sys.argv[4])
json.dump(c, open(sys.argv[5], "w"))
PY
    echo "- the simulator's cluster: each host's speed $HOST_CPU x $E (bench/core_efficiency.sh${CAPPED[*]:+ --cluster: in the capped hosts}), the network's CPU $NET_CPU s per byte (tools/cluster.sh net-cpu)"
    "$PD" plan "$D/prof.json" --cluster "$D/cluster.json" --straight -o "$D/straight.json" >"$D/straight.txt"
    "$PD" plan "$D/prof.json" --cluster "$D/cluster.json" --straight --v-shape -o "$D/v.json" >"$D/v.txt"
    "$PD" simulate "$D/v.json" --profile "$D/prof.json" --schedule zb-v --microbatches $MICRO \
        --minibatches "$MSTEPS" --json >"$D/sim-limit.json"
    limit=${MEMORY_LIMIT:-$(jval "$D/sim-limit.json" 'max(w["peak_memory_bytes"] for w in d["per_worker"])')}
    echo "$limit" >"$D/limit"
    "$PD" plan "$D/prof.json" --cluster "$D/cluster.json" --choose-schedule --memory-limit "$limit" \
        --kinds "$(echo "$KINDS" | tr ' ' ',')" --microbatches $((MICRO / WORKERS)) -o "$D/chosen.json" >"$D/chosen.txt"
    python3 - "$D" "$MB" "$MSTEPS" <<'PY'
import json, sys
d, mb, steps = sys.argv[1], sys.argv[2], sys.argv[3]
for name in ("straight", "v", "chosen"):
    p = json.load(open(f"{d}/{name}.json"))
    split = "|".join(f"{s['layers'][0]}-{s['layers'][-1]}" + (f"x{s['replicas']}" if s["replicas"] > 1 else "")
                     for s in p["stages"])
    ranks = " ".join("+".join(str(i) for i, s in enumerate(p["stages"]) if r in s["ranks"]) for r in range(p["n_workers"]))
    print(f"- plan {name}: {len(p['stages'])} stages, layers {split}; worker 0..{p['n_workers'] - 1} holds stages {ranks}")
print(f"- minibatch {mb}, {steps} steps per run")
PY
    echo "- memory limit for --choose-schedule: $limit bytes ($(awk -v b="$limit" 'BEGIN { printf "%.2f", b / 1e6 }') MB;" \
        "$([ -n "${MEMORY_LIMIT:-}" ] && echo "MEMORY_LIMIT" || echo "the simulated worst worker's peak of zb-v on the V plan"))"
    echo "- plan --choose-schedule said:"
    grep -E '^(schedule search|choice|runner-up|gave up)' "$D/chosen.txt" | sed 's/^/    /'
    read -r ck cm cr < <(read_chosen "$D/chosen.json")
    echo "- chosen: $ck, $cm micro-batches$([ "$cr" = 1 ] && echo ", recompute")"
    line="- simulator, $MSTEPS steps, ms per unit (worst worker's peak MB):"
    for k in $KINDS chosen; do
        sched_args "$k" "$D"
        "$PD" simulate "${SCHED[@]:1}" --profile "$D/prof.json" --minibatches "$MSTEPS" --json >"$D/sim-$k.json"
        line+=" $k $(jval "$D/sim-$k.json" '("%.2f (%.1f)" % (1e3 * d["time_per_unit_s"],
            max(w["peak_memory_bytes"] for w in d["per_worker"]) / 1e6))'),"
    done
    echo "${line%,}"
done

# --- 2. the runs, taking turns ----------------------------------------------------------------
LABELS=($KINDS chosen)
N=${#LABELS[@]}
printf 'model\tround\tlabel\tid\trc\twall_s\n' >"$OUT/runs.tsv"
for r in $(seq "$RUNS"); do
    for model in $MODELS; do
        model_setup "$model"
        D=$OUT/$model
        for i in $(seq 0 $((N - 1))); do
            k=${LABELS[$(( (i + r - 1) % N ))]}
            id=$model-$k-r$r
            sched_args "$k" "$D"
            t0=$(date +%s.%N) rc=0
            timeout --kill-after=20 600 tools/cluster.sh run --name "$NAME" $WORKERS "$PD" train "$MODEL_FILE" \
                "${SCHED[@]}" --profile "$D/prof.json" --minibatch "$MB" --steps "$MSTEPS" --threads 1 \
                "${DATA_ARGS[@]}" --metrics "$OUT/raw/$id.jsonl" >"$OUT/raw/$id.json" 2>"$OUT/raw/$id.err" || rc=$?
            dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$model" "$r" "$k" "$id" "$rc" "$dt" >>"$OUT/runs.tsv"
            log "round $r/$RUNS $model $k: rc $rc, $dt s, $(jval "$OUT/raw/$id.json" '("%.1f samples/s, %.2f ms/unit (simulator %.2f)"
                % (d["samples_per_s"], d["time_per_unit_ms"], d["predicted_time_per_unit_ms"]))' 2>/dev/null || echo "no summary")"
        done
    done
done
cleanup; CLUSTER_UP=0

# --- 3. the tables and the bars ---------------------------------------------------------------
python3 - "$OUT" "$KINDS" "$V_KINDS" <<'PY'
import csv, json, statistics as st, sys
out, kinds, v_kinds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
yn = lambda b: "yes" if b else "no"
runs = list(csv.DictReader(open(f"{out}/runs.tsv"), delimiter="\t"))

def load(run):
    """the run's summary and stage lines, or None"""
    try:
        summary = json.loads(open(f"{out}/raw/{run['id']}.json").read().strip().splitlines()[-1])
        stages = [json.loads(l) for l in open(f"{out}/raw/{run['id']}.jsonl") if '"stage"' in l]
        stages = [s for s in stages if "stage" in s]
    except (OSError, ValueError, IndexError):
        return None
    if run["rc"] != "0" or "time_per_unit_ms" not in summary:
        return None
    return summary, stages

def split_of(plan):
    """what makes two runs' final weights comparable: the stages' layers and replicas"""
    p = json.load(open(plan))
    return tuple((tuple(s["layers"]), s["replicas"]) for s in p["stages"])

for model in dict.fromkeys(r["model"] for r in runs):
    d = f"{out}/{model}"
    limit = int(open(f"{d}/limit").read())
    chosen = json.load(open(f"{d}/chosen.json"))["schedule"]
    labels = kinds + ["chosen"]
    plan_file = {k: f"{d}/{'chosen' if k == 'chosen' else 'v' if k in v_kinds else 'straight'}.json" for k in labels}
    by = {k: {} for k in labels}            # label -> round -> (summary, stages)
    failed = {k: 0 for k in labels}
    for r in runs:
        if r["model"] == model:
            res = load(r)
            if res: by[r["label"]][int(r["round"])] = res
            else: failed[r["label"]] += 1
    sim = {k: json.load(open(f"{d}/sim-{k}.json")) for k in labels}
    row = {}
    for k in labels:
        rs = [by[k][i] for i in sorted(by[k])]
        if not rs:
            row[k] = None
            continue
        t = [s["time_per_unit_ms"] for s, _ in rs]
        worst = lambda key: max(max(g[key] for g in stages) for _, stages in rs)
        row[k] = dict(sps=st.median(s["samples_per_s"] for s, _ in rs), t=st.median(t), ts=t,
                      sim=st.median(s["predicted_time_per_unit_ms"] for s, _ in rs),
                      act=worst("activation_bytes"), act_p=worst("predicted_activation_bytes"),
                      alloc=worst("allocated_bytes"), alloc_p=worst("predicted_allocated_bytes"),
                      peak_sim=max(w["peak_memory_bytes"] for w in sim[k]["per_worker"]),
                      act_live=max(w["activations_bytes"] for w in sim[k]["per_worker"]))
    name = lambda k: (f"chosen ({chosen['kind']}, {chosen['microbatches']} micro-batches"
                      f"{', recompute' if chosen.get('recompute') else ''})" if k == "chosen" else k)
    print(f"\n## {model}: measured\n")
    print("| kind | plan | samples/s (median) | ms/unit measured: median (runs) | simulator ms/unit | measured / simulated "
          "| worst worker activation MB: measured (predicted) | worst worker allocated MB: measured (predicted) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in labels:
        x, plan = row[k], plan_file[k].rsplit("/", 1)[1][:-5]
        fails = f" ({failed[k]} failed)" if failed[k] else ""
        if x is None:
            print(f"| {name(k)} | {plan} | failed{fails} | | | | | |")
            continue
        print(f"| {name(k)} | {plan} | {x['sps']:.1f} | {x['t']:.2f} ({', '.join(f'{v:.2f}' for v in x['ts'])}){fails} "
              f"| {x['sim']:.2f} | {x['t'] / x['sim']:.3f} | {x['act'] / 1e6:.1f} ({x['act_p'] / 1e6:.1f}) "
              f"| {x['alloc'] / 1e6:.1f} ({x['alloc_p'] / 1e6:.1f}) |")
    ok = {k: x for k, x in row.items() if x}
    print(f"\n### {model}: the bars (computed from the table)\n")
    print("- within 15% of the simulator: " + ", ".join(
        f"{name(k)} {yn(abs(x['t'] / x['sim'] - 1) <= 0.15)} ({100 * (x['t'] / x['sim'] - 1):+.1f}%)" for k, x in ok.items())
        + f"; all: {yn(len(ok) == len(labels) and all(abs(x['t'] / x['sim'] - 1) <= 0.15 for x in ok.values()))}")
    if "zb-v" in ok and "zb-h1" in ok:
        ratios = [by["zb-v"][i][0]["time_per_unit_ms"] / by["zb-h1"][i][0]["time_per_unit_ms"]
                  for i in sorted(set(by["zb-v"]) & set(by["zb-h1"]))]
        print(f"- zb-v / zb-h1 time per unit: {st.median(ratios):.3f} (median of the rounds' "
              f"{', '.join(f'{v:.3f}' for v in ratios)}; simulator {ok['zb-v']['sim'] / ok['zb-h1']['sim']:.3f}); "
              f"zb-v beats zb-h1: {yn(st.median(ratios) < 1)}")
    if "v-half" in ok and "1f1b-flush" in ok:
        a = ok["v-half"]["act"] / ok["1f1b-flush"]["act"]
        print(f"- v-half / 1f1b-flush worst worker activation memory: {a:.3f} (the ledger's prediction "
              f"{ok['v-half']['act_p'] / ok['1f1b-flush']['act_p']:.3f}; the simulator's live peak "
              f"{ok['v-half']['act_live'] / ok['1f1b-flush']['act_live']:.3f}); <= 0.6: {yn(a <= 0.6)}")
    fit = {k: x for k, x in ok.items() if k != "chosen" and x["peak_sim"] <= limit}
    if "chosen" in ok and fit:
        best = min(fit, key=lambda k: fit[k]["t"])
        fastest = min((k for k in ok if k != "chosen"), key=lambda k: ok[k]["t"])
        c = ok["chosen"]["t"] / fit[best]["t"]
        v_best = best in v_kinds
        print(f"- memory limit {limit / 1e6:.2f} MB: kinds whose simulated peak fits: {', '.join(fit) or 'none'}; "
              f"the fastest of them measured: {best} ({fit[best]['t']:.2f} ms/unit; fastest of all kinds: {fastest})")
        print(f"- {name('chosen')}: {ok['chosen']['t']:.2f} ms/unit, {c:.3f}x the best measured candidate under "
              f"the limit; within 5% (at most 5% slower): {yn(c <= 1.05)}")
        twin = [k for k in fit if k == chosen["kind"] and split_of(plan_file[k]) == split_of(plan_file["chosen"])
                and chosen["microbatches"] == by[k][min(by[k])][0]["microbatches"] and not chosen.get("recompute")]
        if twin:
            print(f"- the chosen plan and kind are those of the {twin[0]} runs: their difference "
                  f"({100 * (ok['chosen']['t'] / ok[twin[0]]['t'] - 1):+.1f}%) is the runs' noise")
        print(f"- a V-shaped kind measured fastest under the limit: {yn(v_best)}; the chosen kind V-shaped: "
              f"{yn(chosen['kind'] in v_kinds)}; chooses a V-shaped kind where one is fastest: "
              + (yn(chosen["kind"] in v_kinds) if v_best else "not tested here (no V-shaped kind fastest)"))
    elif "chosen" in ok:
        print(f"- memory limit {limit / 1e6:.2f} MB: no kind run fits it by the simulator's peak; chosen vs best: not measured")
    # final weights: runs on one stage split with the same micro-batches should end bitwise equal
    groups = {}
    for k in ok:
        mbs = {s["microbatches"] for s, _ in by[k].values()}
        groups.setdefault((split_of(plan_file[k]), tuple(sorted(mbs))), []).append(k)
    for ks in (g for g in groups.values() if len(g) > 1):
        rounds = sorted(set.intersection(*(set(by[k]) for k in ks)))
        same = [len({tuple(by[k][i][0]["weights_crc"]) for k in ks}) == 1 for i in rounds]
        print(f"- final weights of {', '.join(name(k) for k in ks)} (one stage split): bitwise equal in "
              f"{sum(same)} of {len(rounds)} round(s)")
PY
echo
echo "wall time: $(( $(date +%s) - T0 )) s"
result_finish
