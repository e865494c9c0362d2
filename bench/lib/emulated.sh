# emulated.sh: sourced by the bench scripts that train vgg16 on 4 hosts of tools/cluster.sh.
#
#   emu_args OUT_DEFAULT "$@"   the scripts' own options: --out DIR (sets OUT, default OUT_DEFAULT),
#                          --pd BINARY (sets PD, default build/pipedream), --help (the script's
#                          header comment)
#   payload_bps RATE       tc rate (100mbit, 1gbit, ...) -> TCP payload bytes/s: 1448 payload
#                          bytes per 1514-byte frame (95.6%, docs/reference/cluster-sh.md); the
#                          figure the plans and the simulator get
#   emu_setup SCRIPT       checks $PD and root, exports the thread and Open MPI variables, links
#                          Fashion-MNIST into $OUT/data, defines log, and takes the cluster $NAME
#                          down on every exit (after emu_up)
#   emu_up RATE / emu_down the 4 hosts at RATE
#   emu_net_cpu RATE       the network stack's CPU per byte at RATE (tools/cluster.sh net-cpu, 2.5 s
#                          of stream, appended to $OUT/net-cpu.txt); 0 when NET_CPU=0
#   emu_profile [PREC]     vgg16 at minibatch 64, 1 thread, the median of 5 rounds, compute precision PREC
#                          (default fp32), into $OUT/prof.json (sets PROF)
#   emu_core_efficiency    bench/core_efficiency.sh's E, or $CORE_EFF when given (sets CE, logs it)
#   emu_calibrate PLAN KIND FIT STEPS RUNS PRE
#                          RUNS runs of STEPS minibatches of KIND on PLAN with `train
#                          --calibrated-cluster PRE-<run>.json --fit FIT` (outputs PRE-<run>.out,
#                          .err); the run whose fitted value is the median writes PRE.json, and
#                          PLAN takes that cluster, keeping its stages

emu_args() {
    OUT=$1 PD=build/pipedream
    shift
    while [ $# -gt 0 ]; do
        case $1 in
            --out) OUT=$2; shift 2 ;;
            --pd) PD=$2; shift 2 ;;
            -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
            *) echo "$(basename "$0"): unknown argument $1 (--help)" >&2; exit 2 ;;
        esac
    done
}

payload_bps() {
    local v=${1%bit} m=1
    case $v in *k) v=${v%k}; m=1000 ;; *m) v=${v%m}; m=1000000 ;; *g) v=${v%g}; m=1000000000 ;; esac
    awk -v v="$v" -v m="$m" 'BEGIN { printf "%.6g", v * m / 8 * 1448 / 1514 }'
}

emu_setup() {
    local script=$1 f
    [ -x "$PD" ] || { echo "$script: $PD not found (cmake --build build)" >&2; exit 2; }
    [ "$(id -u)" = 0 ] || { echo "$script: needs root (tools/cluster.sh)" >&2; exit 2; }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    mkdir -p "$OUT/raw" "$OUT/data"
    for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
        ln -sf "/usr/share/datasets/fashion-mnist/$f" "$OUT/data/$f"
    done
    EMU_UP=0
    trap emu_cleanup EXIT
    trap 'exit 130' INT TERM
}
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
emu_cleanup() { if [ "${EMU_UP:-0}" = 1 ]; then tools/cluster.sh down --name "$NAME" >/dev/null 2>&1 || true; fi; }
emu_up() { log "cluster: 4 hosts at $1"; EMU_UP=1; tools/cluster.sh up 4 --rate "$1" --name "$NAME" >&2; }
emu_down() { tools/cluster.sh down --name "$NAME" >&2; EMU_UP=0; }

emu_net_cpu() {
    if [ "${NET_CPU:-}" = 0 ]; then echo 0; return; fi
    local mb
    mb=$(awk -v b="$(payload_bps "$1")" 'BEGIN { m = int(b * 2.5 / 1048576); print m < 10 ? 10 : m }')
    tools/cluster.sh net-cpu --name "$NAME" --mb "$mb" | tee -a "$OUT/net-cpu.txt" | tail -1
}

emu_profile() {
    local prec=${1:-fp32}
    PROF=$OUT/prof.json
    log "profile models/vgg16.json (minibatch 64, 1 thread, $prec, the median of 5 rounds)"
    "$PD" profile models/vgg16.json --minibatch 64 --threads 1 --iterations 20 --rounds 5 --precision "$prec" \
        -o "$PROF" >"$OUT/prof.txt" 2>&1
}

# each core's speed while all compute (bench/core_efficiency.sh; CORE_EFF= to give it)
emu_core_efficiency() {
    CE=${CORE_EFF:-$(bench/core_efficiency.sh --pd "$PD" --pairs 3 2>"$OUT/core-efficiency.txt")}
    log "core efficiency $CE"
}

emu_calibrate() {
    local plan=$1 kind=$2 fit=$3 steps=$4 runs=$5 pre=$6 c med
    for c in $(seq "$runs"); do
        timeout --kill-after=20 900 tools/cluster.sh run --name "$NAME" 4 "$PD" train models/vgg16.json \
            --plan "$plan" --schedule "$kind" --steps "$steps" --minibatch 64 --threads 1 --profile "$PROF" \
            --data "$OUT/data" --calibrated-cluster "$pre-$c.json" --fit "$fit" >"$pre-$c.out" 2>"$pre-$c.err" ||
            { log "calibration failed: $(tail -1 "$pre-$c.err")"; exit 1; }
        log "$kind: $(grep '^calibrated cluster:' "$pre-$c.err")"
    done
    # the run with the median fitted value: one slow or fast minute does not set the cluster
    med=$(python3 - "$pre" "$runs" "$fit" <<'PY'
import json, sys
pre, n = sys.argv[1], int(sys.argv[2])
key = {"core-efficiency": "fitted_core_efficiency", "wake": "fitted_wake_ms", "link-rate": "fitted_link_scale"}[sys.argv[3]]
v = sorted((json.loads(open(f"{pre}-{c}.out").read().strip().splitlines()[-1])[key], c) for c in range(1, n + 1))
print(v[(n - 1) // 2][1])
PY
)
    cp "$pre-$med.json" "$pre.json"
    log "calibration run $med of $runs ($kind) has the median fitted $fit"
    # the same stages on the fitted cluster; the planner's simulated figure, made on the cluster
    # before, is dropped (`train` predicts anew)
    python3 - "$plan" "$pre.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
plan["cluster"] = json.load(open(sys.argv[2]))
plan.get("predicted", {}).pop("simulated", None)
json.dump(plan, open(sys.argv[1], "w"), indent=1)
PY
}
