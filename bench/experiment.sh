#!/usr/bin/env bash
# bench/experiment.sh: the PipeDream experiment on the emulated cluster (docs/explanation/experiments.md).
#
# vgg16 (models/vgg16.json), Fashion-MNIST, minibatch 64, 4 hosts of tools/cluster.sh, one rank
# per host, 1 kernel thread per rank, SGD lr 0.01 momentum 0.9 (the defaults), seed 1.
#
#  1. Throughput, at every rate of RATES: dp, asp, model-parallel, gpipe, 1f1b-flush, 2bw
#     (the straight 4-stage plan for that rate), 1f1b with the planner's plan for that rate,
#     1f1b on the straight plan; each run's summary carries the simulator's prediction for
#     the same plan and profile; PyTorch DDP (gloo, bench/ddp_peer.py) on the same links.
#  2. Time to accuracy, at the slowest rate: dp, asp, 1f1b (planner's plan), the ablation
#     1f1b --no-stash, and 1f1b-flush (PipeDream-Flush, synchronous), each evaluated on the
#     test set every EVAL_EVERY minibatches until TARGET or its cap: TTA_MAX_EPOCHS epochs, or
#     about TTA_BUDGET_S seconds of training at the throughput phase's rate for that schedule,
#     whichever is fewer minibatches (the same wall-clock budget for every schedule). A kind
#     of TTA_KINDS is SCHEDULE or SCHEDULE:VARIANT, the variant a train flag without its dashes
#     (no-stash) or FLAG=VALUE (microbatches=4); plain 1f1b and its no-stash ablation run on the
#     planner's plan, the V-shaped kinds (zb-v, v-half, v-min, dualpipe-v) on the straight
#     V-placed plan (plan --v-shape), every other kind on the straight plan. Each kind runs once
#     per seed of TTA_SEEDS (default 1); TTA_CAPS ("KIND=MINIBATCHES ...") sets a kind's cap.
#  3. bench/experiment_plot.py: OUT/results.json (every figure), OUT/table.md, OUT/tta.svg
#     (test accuracy against training wall-clock time, one line per schedule); the first two
#     are also copied to bench/results/<UTC date>-<time>-experiment-MODE.{json,md}
#     (PD_RESULTS=DIR elsewhere, PD_RESULTS= none).
#
# usage: bench/experiment.sh [--quick] [--out DIR] [--pd BINARY] [--only tput|tta|plot]
#   as root (the cluster needs network namespaces); ~6 min quick, ~60 min full on 2 cores.
#   Environment overrides: RATES ("1gbit 300mbit 100mbit"), STEPS, DDP_STEPS, TARGET,
#   TTA_BUDGET_S, TTA_MAX_EPOCHS, EVAL_EVERY, TEST_IMAGES, TTA_KINDS, TTA_SEEDS, TTA_CAPS, PDC_NAME (cluster name),
#   HOST_CPU (tools/cluster.sh up --cpu: each host capped at that many cores, so that a rank
#   idle in a bubble does not lend its core to the others; default none),
#   CORES (the cores the emulated hosts share: $(nproc); the plans tell the simulator, which
#   slows compute by workers / cores, so its predictions are for this machine), NET_CPU (0: leave
#   the network stack's CPU out of the plans; measured at each rate otherwise), CORE_EFF (the
#   cores' efficiency for the plans; bench/core_efficiency.sh measures it otherwise).
# The cluster is taken down on every exit (trap). Raw outputs: OUT/raw/<run>.{cmd,json,err,jsonl}.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=full OUT="" PD=build-exp/pipedream ONLY="" ARGS="$*"
while [ $# -gt 0 ]; do
    case $1 in
        --quick) MODE=quick; shift ;;
        --out) OUT=$2; shift 2 ;;
        --pd) PD=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "experiment.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
case $ONLY in ""|tput|tta|plot) ;; *) echo "experiment.sh: --only tput|tta|plot" >&2; exit 2 ;; esac

if [ $MODE = quick ]; then
    : "${STEPS:=12}" "${DDP_STEPS:=3}" "${TTA_BUDGET_S:=15}" "${TTA_MAX_EPOCHS:=1}" "${EVAL_EVERY:=20}"
else
    : "${STEPS:=60}" "${DDP_STEPS:=12}" "${TTA_BUDGET_S:=600}" "${TTA_MAX_EPOCHS:=4}" "${EVAL_EVERY:=100}"
fi
: "${OUT:=out/experiment-$MODE}" "${RATES:=1gbit 300mbit 100mbit}" "${TARGET:=0.85}" "${TEST_IMAGES:=2000}"
: "${TTA_KINDS:=dp asp 1f1b 1f1b:no-stash 1f1b-flush}" "${TTA_SEEDS:=1}" "${TTA_CAPS:=}"
NAME=${PDC_NAME:-pdexp}
CORES=${CORES:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)} HOST_CPU=${HOST_CPU:-}
WORKERS=4 MB=64 TRAIN_N=60000
MODEL=models/vgg16.json
FMNIST=/usr/share/datasets/fashion-mnist
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
RAW=$OUT/raw
mkdir -p "$RAW" "$OUT/plans" "$OUT/data"

if [ "$ONLY" = plot ]; then exec "$PY" bench/experiment_plot.py "$OUT"; fi
[ -x "$PD" ] || { echo "experiment.sh: $PD not found; build it: cmake -S . -B build-exp -DCMAKE_BUILD_TYPE=Release && cmake --build build-exp --target pipedream" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "experiment.sh: needs root (tools/cluster.sh)" >&2; exit 2; }

# payload_bps: link rate (tc notation) -> TCP payload bytes/s, the figure the plans get
. bench/lib/emulated.sh
rate_bits() { local v=${1%bit} m=1
    case $v in *k) v=${v%k}; m=1000 ;; *m) v=${v%m}; m=1000000 ;; *g) v=${v%g}; m=1000000000 ;; esac
    awk -v v="$v" -v m="$m" 'BEGIN { printf "%d", v * m }'; }
SLOWEST=$(for r in $RATES; do echo "$(rate_bits "$r") $r"; done | sort -n | head -1 | cut -d' ' -f2)

# --- the cluster, always taken down --------------------------------------------------------
CLUSTER_UP=0
cleanup() { if [ $CLUSTER_UP = 1 ]; then tools/cluster.sh down --name "$NAME" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM
cluster_rate() { log "cluster: $WORKERS hosts at $1${HOST_CPU:+, $HOST_CPU cores each}"; CLUSTER_UP=1
                 tools/cluster.sh up $WORKERS --rate "$1" ${HOST_CPU:+--cpu "$HOST_CPU"} --name "$NAME" >&2; }

# --- provenance -----------------------------------------------------------------------------
{
    echo "{\"mode\": \"$MODE\", \"started\": \"$(date -u +%FT%TZ)\", \"rates\": \"$RATES\", \"slowest\": \"$SLOWEST\","
    echo " \"steps\": $STEPS, \"ddp_steps\": $DDP_STEPS, \"target\": $TARGET, \"tta_budget_s\": $TTA_BUDGET_S,"
    echo " \"tta_max_epochs\": $TTA_MAX_EPOCHS, \"eval_every\": $EVAL_EVERY, \"test_images\": $TEST_IMAGES,"
    echo " \"tta_kinds\": \"$TTA_KINDS\", \"tta_seeds\": \"$TTA_SEEDS\", \"cores\": $CORES, \"host_cpu\": \"${HOST_CPU:-}\", \"workers\": $WORKERS, \"minibatch\": $MB, \"model\": \"$MODEL\","
    echo " \"binary\": \"$PD\", \"binary_mtime\": \"$(date -u -r "$PD" +%FT%TZ)\","
    echo " \"git_head\": \"$(git rev-parse --short HEAD 2>/dev/null || echo none)\","
    echo " \"git_head_subject\": $("$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$(git log -1 --format=%s 2>/dev/null | cut -c1-120)"),"
    echo " \"uncommitted_src_files\": $(git status --short -- src 2>/dev/null | wc -l),"
    echo " \"asp_in_binary\": $("$PD" train "$MODEL" --plan x --help 2>&1 | grep -q 'asp' && echo true || echo false),"
    echo " \"cpus\": $(getconf _NPROCESSORS_ONLN), \"kernel\": \"$(uname -r)\", \"mpirun\": \"$(mpirun --version 2>/dev/null | head -1)\","
    echo " \"torch\": \"$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)\","
    echo " \"command\": \"bench/experiment.sh$([ $MODE = quick ] && echo ' --quick')$([ -n "$ONLY" ] && echo " --only $ONLY")\"}"
} >"$OUT/meta-${ONLY:-all}.json"

# --- data: the full training set, the first TEST_IMAGES test images (evaluation crosses the
# links too; training time excludes it) ------------------------------------------------------
make_data() {   # DIR N
    mkdir -p "$1"
    for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz; do ln -sf "$FMNIST/$f" "$1/$f"; done
    "$PY" - "$FMNIST" "$1" "$2" <<'PY'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for f, item in (("t10k-images-idx3-ubyte.gz", 784), ("t10k-labels-idx1-ubyte.gz", 1)):
    b = gzip.open(f"{src}/{f}").read()
    hdr = 16 if item > 1 else 8
    out = bytearray(b[:hdr]); out[4:8] = struct.pack(">I", n)
    gzip.open(f"{dst}/{f}", "wb").write(bytes(out) + b[hdr:hdr + n * item])
PY
}
make_data "$OUT/data/eval" "$TEST_IMAGES"
make_data "$OUT/data/tput" 256       # throughput runs: only the final evaluation uses it

# --- profile and plans (one profile for every plan of this experiment) ----------------------
# (the median of 5 rounds, as the other emulated-cluster benches take it)
PROF=$OUT/plans/prof.json
if [ ! -f "$PROF" ] || [ "$ONLY" != tta ]; then
    log "profile $MODEL (minibatch $MB, 1 thread, the median of 5 rounds)"
    "$PD" profile "$MODEL" --minibatch $MB --threads 1 --iterations 20 --rounds 5 -o "$PROF" >"$OUT/plans/prof.txt" 2>&1
fi
# The plans of a rate, made with the cluster up at it: the network stack's CPU per byte measured
# there (emu_net_cpu) and the cores' efficiency measured once (emu_core_efficiency), as
# bench/predict_table.sh plans, so that the predictions are the simulator's best for this machine.
CE=""
make_plans() {   # make_plans RATE
    local r=$1 bw nc
    [ -n "$CE" ] || emu_core_efficiency
    bw=$(payload_bps "$r")
    nc=$(emu_net_cpu "$r")
    log "$r: network CPU $nc s per byte"
    "$PD" plan "$PROF" --workers $WORKERS --bandwidth "$bw" --cores "$CORES" --net-cpu "$nc" --core-efficiency "$CE" \
        -o "$OUT/plans/planner-$r.json" >"$OUT/plans/planner-$r.txt"
    "$PD" plan "$PROF" --workers $WORKERS --bandwidth "$bw" --cores "$CORES" --net-cpu "$nc" --core-efficiency "$CE" \
        --straight -o "$OUT/plans/straight-$r.json" >"$OUT/plans/straight-$r.txt"
    "$PD" plan "$PROF" --workers $WORKERS --bandwidth "$bw" --cores "$CORES" --net-cpu "$nc" --core-efficiency "$CE" \
        --straight --v-shape -o "$OUT/plans/v-$r.json" >"$OUT/plans/v-$r.txt"
}

MANIFEST=$OUT/manifest.tsv
[ -n "$ONLY" ] || rm -f "$MANIFEST"
[ -f "$MANIFEST" ] || printf 'id\tphase\trate\tschedule\tplan\tvariant\tsteps\trc\tload_before\tload_after\tcmd_s\n' >"$MANIFEST"
load1() { cut -d' ' -f1 /proc/loadavg; }

run() {   # run ID PHASE RATE SCHEDULE PLANKIND VARIANT STEPS TIMEOUT CMD...
    local id=$1 phase=$2 rate=$3 sched=$4 plan=$5 variant=$6 steps=$7 tmo=$8; shift 8
    printf '%q ' "$@" >"$RAW/$id.cmd"; echo >>"$RAW/$id.cmd"
    local lb t0 rc=0; lb=$(load1); t0=$(date +%s.%N)
    timeout --kill-after=20 "$tmo" "$@" >"$RAW/$id.json" 2>"$RAW/$id.err" || rc=$?
    local dt; dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$phase" "$rate" "$sched" "$plan" "$variant" "$steps" \
        "$rc" "$lb" "$(load1)" "$dt" >>"$MANIFEST"
    local sps; sps=$(grep -o '"samples_per_s":[ 0-9.e+-]*' "$RAW/$id.json" | tail -1 | cut -d: -f2 || true)
    log "$id: rc $rc, ${dt} s, samples/s ${sps:-?}$([ "$rc" = 0 ] || echo " ($(tail -1 "$RAW/$id.err" | cut -c1-160))")"
}

CMD=()
pd_train() {   # pd_train PLANFILE SCHEDULE STEPS DATA [extra...]: CMD = the cluster command line
    local plan=$1 sched=$2 steps=$3 data=$4; shift 4
    CMD=(tools/cluster.sh run --name "$NAME" "$WORKERS" "$PD" train "$MODEL" --plan "$plan" --schedule "$sched"
        --steps "$steps" --minibatch "$MB" --threads 1 --profile "$PROF" --data "$data" "$@")
}

# --- 1. throughput --------------------------------------------------------------------------
if [ -z "$ONLY" ] || [ "$ONLY" = tput ]; then
    for r in $RATES; do
        cluster_rate "$r"
        make_plans "$r"
        P=$OUT/plans/planner-$r.json S=$OUT/plans/straight-$r.json D=$OUT/data/tput
        for s in dp asp model-parallel gpipe 1f1b-flush 2bw; do
            pd_train "$S" "$s" "$STEPS" "$D" --metrics "$RAW/tput-$r-$s.jsonl"
            run "tput-$r-$s" tput "$r" "$s" straight "" "$STEPS" 600 "${CMD[@]}"
        done
        pd_train "$P" 1f1b "$STEPS" "$D" --metrics "$RAW/tput-$r-1f1b-planner.jsonl"
        run "tput-$r-1f1b-planner" tput "$r" 1f1b planner "" "$STEPS" 600 "${CMD[@]}"
        pd_train "$S" 1f1b "$STEPS" "$D" --metrics "$RAW/tput-$r-1f1b-straight.jsonl"
        run "tput-$r-1f1b-straight" tput "$r" 1f1b straight "" "$STEPS" 600 "${CMD[@]}"
        run "tput-$r-ddp" tput "$r" pytorch-ddp - "" "$DDP_STEPS" 600 \
            tools/cluster.sh run-torch --name "$NAME" $WORKERS "$PY" bench/ddp_peer.py vgg16 $WORKERS $MB "$DDP_STEPS"
    done
fi

# --- 2. time to accuracy at the slowest rate ------------------------------------------------
if [ -z "$ONLY" ] || [ "$ONLY" = tta ]; then
    r=$SLOWEST
    cluster_rate "$r"
    [ -f "$OUT/plans/planner-$r.json" ] && [ -f "$OUT/plans/straight-$r.json" ] || make_plans "$r"
    epoch_mb=$(( (TRAIN_N + MB - 1) / MB ))
    max_mb=$(( TTA_MAX_EPOCHS * epoch_mb ))
    for seed in $TTA_SEEDS; do
    for k in $TTA_KINDS; do
        s=${k%%:*} variant=""; [ "$k" = "$s" ] || variant=${k#*:}
        case $k in 1f1b|1f1b:no-stash) plankind=planner ;; zb-v*|v-half*|v-min*|dualpipe-v*) plankind=v ;; *) plankind=straight ;; esac
        # The cap: about TTA_BUDGET_S s of training at this schedule's measured rate (the
        # throughput phase's run of the same schedule and plan at this link rate; none when
        # there is none), at most TTA_MAX_EPOCHS epochs, rounded up to evaluations.
        tput=$RAW/tput-$r-$s.json; [ "$s" = 1f1b ] && tput=$RAW/tput-$r-1f1b-planner.json
        sps=$(grep -o '"samples_per_s":[ 0-9.e+-]*' "$tput" 2>/dev/null | tail -1 | cut -d: -f2 || true)
        if [ -n "$sps" ]; then cap=$(awk -v s="$sps" -v b="$TTA_BUDGET_S" -v mb=$MB 'BEGIN { printf "%d", s * b / mb + 1 }')
        else cap=$max_mb; fi
        [ "$cap" -le "$max_mb" ] || cap=$max_mb
        for c in $TTA_CAPS; do [ "${c%=*}" != "$k" ] || cap=${c##*=}; done
        cap=$(( (cap + EVAL_EVERY - 1) / EVAL_EVERY * EVAL_EVERY ))
        id="tta-$r-${s}${variant:+-$variant}"; [ "$seed" = 1 ] || id="$id-seed$seed"
        extra=(--eval-every "$EVAL_EVERY" --target-accuracy "$TARGET" --metrics "$RAW/$id.jsonl" --timeout 600
               --seed "$seed")
        case $variant in "") ;; *=*) extra+=("--${variant%%=*}" "${variant#*=}") ;; *) extra+=("--$variant") ;; esac
        label=$variant; [ "$seed" = 1 ] || label="${label:+$label }seed $seed"
        # a generous kill deadline: 3x the budget plus evaluations and start-up
        tmo=$(awk -v c="$cap" -v s="${sps:-20}" -v mb=$MB 'BEGIN { printf "%d", 3 * c * mb / s + 600 }')
        pd_train "$OUT/plans/$plankind-$r.json" "$s" "$cap" "$OUT/data/eval" "${extra[@]}"
        run "$id" tta "$r" "$s" "$plankind" "$label" "$cap" "$tmo" "${CMD[@]}"
    done
    done
fi

cleanup; CLUSTER_UP=0
"$PY" bench/experiment_plot.py "$OUT"
RES=${PD_RESULTS-bench/results}
if [ -n "$RES" ]; then
    mkdir -p "$RES"
    stem=$RES/$(date -u +%Y-%m-%d-%H%M)-experiment-$MODE
    cp "$OUT/results.json" "$stem.json"
    { echo "# experiment ($MODE)"; echo
      echo "- command: \`bench/experiment.sh${ARGS:+ $ARGS}\`; every run's command, date, load average and the"
      echo "  machine: $(basename "$stem").json"; echo
      cat "$OUT/table.md"; } >"$stem.md"
    echo "wrote $stem.md $stem.json" >&2
fi
