#!/usr/bin/env bash
# sched_v.sh: the V-shaped kinds (zb-v, v-half, v-min, dualpipe-v) from the command line.
#  - `plan --v-shape` writes the V placement (rank i holds stages i and 2P-1-i, "placement": "v"),
#    `simulate` runs it (zb-v by default) and shows the turn as no message between workers;
#    a V kind places a plain plan of 2 P stages itself; an interleaved plan is refused.
#  - `train` over MPI (mpirun -np 2 on mlp's 4 one-layer stages; -np 4 on the same stages with 2
#    replicas each), with and without --recompute, ends with weights bitwise equal (CRC-32 per
#    stage) to the same run on threads and to 1f1b-flush's on the straight plan with the same
#    micro-batches; a run stopped at a checkpoint half-way and resumed ends with the same bits.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
MODEL=$SRC/models/mlp.json

# plan --v-shape on a uniform 8-layer chain, 4 workers: 8 one-layer stages in a V
python3 - "$tmp/u8.json" <<'PY'
import json, sys
layers = [{"name": "l%d" % i, "type": "linear", "forward_s": 0.005, "backward_s": 0.010,
           "activation_bytes": 1e6, "parameter_bytes": 4e6} for i in range(8)]
json.dump({"format": "pipedream-profile", "version": 1, "model": "uniform8", "minibatch": 32,
           "input_bytes": 1e6, "layers": layers}, open(sys.argv[1], "w"))
PY
"$PD" plan "$tmp/u8.json" --workers 4 --straight --v-shape --bandwidth 1e15 -o "$tmp/v.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "plan --v-shape: $(cat "$tmp/err")"
grep -q "V placement" "$tmp/out" || fail "plan --v-shape: $(cat "$tmp/out")"
python3 - "$tmp/v.json" <<'PY' || fail "plan --v-shape: placement"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["placement"] == "v" and p["chunks"] == 2 and p["n_workers"] == 4, p
ranks = [s["ranks"][0] for s in p["stages"]]
assert ranks == [0, 1, 2, 3, 3, 2, 1, 0], ranks
PY
"$PD" simulate "$tmp/v.json" --profile "$tmp/u8.json" --microbatches 8 --minibatches 1 --json >"$tmp/sim.json" 2>"$tmp/err" ||
    fail "simulate the V plan: $(cat "$tmp/err")"
python3 - "$tmp/sim.json" <<'PY' || fail "simulate the V plan"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["schedule"] == "zb-v" and s["chunks"] == 2, (s["schedule"], s["chunks"])
# F = 5 ms, B = 10 ms per chunk (BI = BW = 5 ms), links too fast to matter: zb-v's bubble is the
# fill alone, p - 1 slots of 6 m + p - 1 (test_sim_v.c)
assert abs(s["bubble_fraction"] - 3 / 51) < 1e-6, s["bubble_fraction"]
PY
for k in v-half v-min dualpipe-v; do
    "$PD" simulate "$tmp/v.json" --profile "$tmp/u8.json" --schedule $k --microbatches 8 >"$tmp/out" 2>"$tmp/err" ||
        fail "simulate $k: $(cat "$tmp/err")"
done
"$PD" simulate "$tmp/v.json" --profile "$tmp/u8.json" --schedule interleaved >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] || fail "interleaved on a V plan: want a refusal"
grep -q "V-placed\|V placement" "$tmp/err" || fail "interleaved on a V plan: $(cat "$tmp/err")"
"$PD" plan "$tmp/u8.json" --workers 4 --straight --chunks 2 -o "$tmp/rr.json" >/dev/null 2>"$tmp/err" || fail "plan --chunks 2"
"$PD" simulate "$tmp/rr.json" --profile "$tmp/u8.json" --schedule zb-v >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] || fail "zb-v on a round-robin plan: want a refusal"
grep -q "round-robin" "$tmp/err" || fail "zb-v on a round-robin plan: $(cat "$tmp/err")"
"$PD" plan "$tmp/u8.json" --workers 8 --straight --bandwidth 1e15 -o "$tmp/p8.json" >/dev/null 2>"$tmp/err" ||
    fail "plan 8 stages"
"$PD" simulate "$tmp/p8.json" --profile "$tmp/u8.json" --schedule zb-v --microbatches 8 --minibatches 1 --json \
    >"$tmp/sim2.json" 2>"$tmp/err" || fail "zb-v on a plain plan: $(cat "$tmp/err")"
python3 - "$tmp/sim2.json" <<'PY' || fail "zb-v on a plain plan of 8 stages"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["schedule"] == "zb-v" and s["chunks"] == 2 and len(s["per_worker"]) == 4, (s["schedule"], s["chunks"])
assert abs(s["bubble_fraction"] - 3 / 51) < 1e-6, s["bubble_fraction"]
PY
echo "ok: plan --v-shape, simulate the V kinds, the placement a kind implies, refusals"

command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN="timeout 120 mpirun --oversubscribe"
crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }

# mlp's 4 layers as 4 one-layer stages, straight; a V kind places them itself (ranks 0 1 1 0)
cat >"$tmp/p4.json" <<JSON
{"format": "pipedream-plan", "version": 1, "model": "mlp", "profile_crc32": "00000000", "n_layers": 4,
 "cost_model": {"kind": "ours", "straight": true, "allow_idle": false, "memory_limit": 0,
                "activation_compression": 0, "overlap_allreduce": false},
 "cluster": {"levels": [{"workers": 4, "bandwidth": 1e10, "latency": 0}], "memory_per_worker": 0},
 "n_workers": 4, "noam": 4,
 "predicted": {"pipeline_s": 1, "single_worker_s": 1, "data_parallel_s": 1, "speedup_over_single": 1,
               "speedup_over_data_parallel": 1},
 "stages": [{"layers": [0], "replicas": 1, "ranks": [0], "compute_s": 1, "time_s": 1},
            {"layers": [1], "replicas": 1, "ranks": [1], "compute_s": 1, "time_s": 1},
            {"layers": [2], "replicas": 1, "ranks": [2], "compute_s": 1, "time_s": 1},
            {"layers": [3], "replicas": 1, "ranks": [3], "compute_s": 1, "time_s": 1}]}
JSON
args="$MODEL --plan $tmp/p4.json --microbatches 4 --steps 12 --minibatch 16 --timeout 60"
"$PD" train $args --workers 4 --schedule 1f1b-flush >"$tmp/flush.out" 2>"$tmp/err" || fail "1f1b-flush: $(tail -3 "$tmp/err")"
f=$(crc "$tmp/flush.out")
[ -n "$f" ] || fail "1f1b-flush: no weights_crc in $(cat "$tmp/flush.out")"
for k in zb-v v-half v-min dualpipe-v; do
    for extra in "" "--recompute"; do
        $MPIRUN -np 2 "$PD" train $args --schedule $k $extra >"$tmp/mpi.out" 2>"$tmp/mpi.err" ||
            fail "mpi $k $extra: $(tail -5 "$tmp/mpi.err")"
        "$PD" train $args --schedule $k $extra --workers 2 >"$tmp/thr.out" 2>"$tmp/thr.err" ||
            fail "threads $k $extra: $(tail -5 "$tmp/thr.err")"
        a=$(crc "$tmp/mpi.out"); b=$(crc "$tmp/thr.out")
        grep -q "\"schedule\":\"$k\"" "$tmp/mpi.out" || fail "mpi $k: schedule: $(cat "$tmp/mpi.out")"
        grep -q '"transport":"mpi"' "$tmp/mpi.out" || fail "mpi $k: transport"
        [ "$a" = "$b" ] || fail "$k $extra: MPI weights $a differ from threads $b"
        [ "$a" = "$f" ] || fail "$k $extra: weights $a differ from 1f1b-flush's $f"
    done
    # stopped at a checkpoint after 6 of the 12 minibatches and resumed over MPI: the same bits
    rm -rf "$tmp/ck"
    $MPIRUN -np 2 "$PD" train $args --schedule $k --steps 6 --checkpoint-every 6 --checkpoint-dir "$tmp/ck" \
        >/dev/null 2>"$tmp/err" || fail "$k to the checkpoint: $(tail -3 "$tmp/err")"
    $MPIRUN -np 2 "$PD" train $args --schedule $k --resume "$tmp/ck" >"$tmp/res.out" 2>"$tmp/err" ||
        fail "$k resumed: $(tail -3 "$tmp/err")"
    grep -q '"resumed_from":6' "$tmp/res.out" || fail "$k: not resumed: $(cat "$tmp/res.out")"
    [ "$(crc "$tmp/res.out")" = "$f" ] || fail "$k: resumed weights $(crc "$tmp/res.out") differ from $f"
    echo "ok: $k (and --recompute, and resumed): mpi = threads = 1f1b-flush ($f)"
done

# two whole V pipelines (every stage two replicas; replica j of each is pipeline j) on 4 ranks =
# 1f1b-flush on the same replicated stages on 8
sed -e 's/"workers": 4/"workers": 8/; s/"n_workers": 4, "noam": 4/"n_workers": 8, "noam": 4/' \
    -e 's/"straight": true/"straight": false/' \
    -e 's/"replicas": 1, "ranks": \[\([0-9]\)\]/"replicas": 2, "ranks": [R\1]/' "$tmp/p4.json" |
    sed -e 's/\[R0\]/[0, 1]/; s/\[R1\]/[2, 3]/; s/\[R2\]/[4, 5]/; s/\[R3\]/[6, 7]/' >"$tmp/p4r.json"
args="$MODEL --plan $tmp/p4r.json --microbatches 8 --steps 12 --minibatch 32 --timeout 60"
"$PD" train $args --workers 8 --schedule 1f1b-flush >"$tmp/flush.out" 2>"$tmp/err" ||
    fail "1f1b-flush on 8 replicated: $(tail -3 "$tmp/err")"
f=$(crc "$tmp/flush.out")
for k in zb-v dualpipe-v; do
    $MPIRUN -np 4 "$PD" train $args --schedule $k >"$tmp/mpi.out" 2>"$tmp/mpi.err" ||
        fail "mpi $k replicated: $(tail -5 "$tmp/mpi.err")"
    a=$(crc "$tmp/mpi.out")
    [ "$a" = "$f" ] || fail "$k replicated: MPI weights $a differ from 1f1b-flush's $f"
    echo "ok: $k on 2 pipelines over 4 ranks: mpi = 1f1b-flush ($a)"
done
