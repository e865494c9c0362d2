#!/usr/bin/env bash
# runtime_mpi.sh: pipelined training end to end, over MPI and over threads.
#  - 1f1b with a replicated stage, 1f1b with vertical sync and 2bw on 3 MPI ranks must end
#    with weights bitwise equal (CRC-32 per stage) to the same run on threads; the threads
#    run is checked against the serial emulation and an independent oracle in
#    test_runtime.c, so this closes the chain MPI = threads = emulation = oracle. So must
#    gpipe, dp, 1f1b-flush, zb-h1 and zb-h2 (the split backward); zb-h1's and zb-h2's weights
#    are also bitwise 1f1b-flush's (the same units, flushes and order of additions). So must
#    interleaved (2 stages per rank), with and without --recompute, also = 1f1b-flush, and
#    interleaved over two replicated pipelines = 1f1b-flush on the same replicated stages, and
#    resumed from a checkpoint half-way = uninterrupted.
#  - bad launches fail on every rank with a clear message and no hang: a plan for more
#    ranks than started, a plan made for another model, --plan missing under mpirun.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Under ASan: Open MPI's own allocations (its dlopened plugins) are never freed; our code's
# leaks are checked by the threads-transport tests (test_runtime), which run without MPI.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN="timeout 120 mpirun --oversubscribe"
MODEL=$SRC/models/mlp.json

# A hand-written 2-stage plan for mlp (layers 0-1 | 2-3), stage 0 on two replicas.
cat >"$tmp/plan.json" <<JSON
{"format": "pipedream-plan", "version": 1, "model": "mlp", "profile_crc32": "00000000", "n_layers": 4,
 "cost_model": {"kind": "ours", "straight": false, "allow_idle": false, "memory_limit": 0,
                "activation_compression": 0, "overlap_allreduce": false},
 "cluster": {"levels": [{"workers": 3, "bandwidth": 1e10, "latency": 0}], "memory_per_worker": 0},
 "n_workers": 3, "noam": 2,
 "predicted": {"pipeline_s": 1, "single_worker_s": 1, "data_parallel_s": 1, "speedup_over_single": 1,
               "speedup_over_data_parallel": 1},
 "stages": [{"layers": [0, 1], "replicas": 2, "ranks": [0, 1], "compute_s": 1, "time_s": 1},
            {"layers": [2, 3], "replicas": 1, "ranks": [2], "compute_s": 1, "time_s": 1}]}
JSON

crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }
declare -A CRC
for sched in "1f1b" "1f1b --vertical-sync" "2bw --microbatches 4" "gpipe --microbatches 2" "dp" \
    "1f1b-flush --microbatches 4" "zb-h1 --microbatches 4" "zb-h2 --microbatches 4"; do
    args="$MODEL --plan $tmp/plan.json --schedule $sched --steps 24 --minibatch 16 --timeout 60"
    $MPIRUN -np 3 "$PD" train $args >"$tmp/mpi.out" 2>"$tmp/mpi.err" || fail "mpi $sched: $(tail -5 "$tmp/mpi.err")"
    "$PD" train $args --workers 3 >"$tmp/thr.out" 2>"$tmp/thr.err" || fail "threads $sched: $(tail -5 "$tmp/thr.err")"
    [ "$(wc -l <"$tmp/mpi.out")" -eq 1 ] || fail "mpi $sched: summary printed $(wc -l <"$tmp/mpi.out") times"
    a=$(crc "$tmp/mpi.out"); b=$(crc "$tmp/thr.out")
    [ -n "$a" ] || fail "mpi $sched: no weights_crc in $(cat "$tmp/mpi.out")"
    [ "$a" = "$b" ] || fail "$sched: MPI weights $a differ from threads $b"
    grep -q '"transport":"mpi"' "$tmp/mpi.out" || fail "mpi $sched: transport"
    grep -q '"test_accuracy":0\.[0-9]' "$tmp/mpi.out" || fail "mpi $sched: no accuracy: $(cat "$tmp/mpi.out")"
    CRC[$sched]=$a
    echo "ok: $sched: mpi = threads ($a)"
done
# zb's split backward adds every gradient in 1f1b-flush's order: the same bits
for zb in zb-h1 zb-h2; do
    [ "${CRC[$zb --microbatches 4]}" = "${CRC[1f1b-flush --microbatches 4]}" ] ||
        fail "$zb weights ${CRC[$zb --microbatches 4]} differ from 1f1b-flush's ${CRC[1f1b-flush --microbatches 4]}"
done
echo "ok: zb-h1 = zb-h2 = 1f1b-flush bitwise"

# interleaved (two stages per rank, pipedream plan --chunks 2's placement: stage i on rank
# i mod 2) over MPI = threads, and = 1f1b-flush on the same 4 one-layer stages on 4 ranks:
# every stage adds its micro-batches' gradients in the same order. Rank 1 gets two
# activations per unit from rank 0 (stages 1 and 3), told apart by the stage in the message id.
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
"$PD" train $args --workers 4 --schedule 1f1b-flush >"$tmp/flush.out" 2>"$tmp/err" || fail "1f1b-flush on 4: $(tail -3 "$tmp/err")"
for extra in "" "--recompute"; do
    $MPIRUN -np 2 "$PD" train $args --chunks 2 $extra >"$tmp/mpi.out" 2>"$tmp/mpi.err" ||
        fail "mpi interleaved $extra: $(tail -5 "$tmp/mpi.err")"
    "$PD" train $args --chunks 2 $extra --workers 2 >"$tmp/thr.out" 2>"$tmp/thr.err" ||
        fail "threads interleaved $extra: $(tail -5 "$tmp/thr.err")"
    a=$(crc "$tmp/mpi.out"); b=$(crc "$tmp/thr.out"); f=$(crc "$tmp/flush.out")
    [ -n "$a" ] || fail "mpi interleaved: no weights_crc in $(cat "$tmp/mpi.out")"
    grep -q '"schedule":"interleaved"' "$tmp/mpi.out" || fail "mpi interleaved: schedule: $(cat "$tmp/mpi.out")"
    grep -q '"test_accuracy":0\.[0-9]' "$tmp/mpi.out" || fail "mpi interleaved: no accuracy: $(cat "$tmp/mpi.out")"
    [ "$a" = "$b" ] || fail "interleaved $extra: MPI weights $a differ from threads $b"
    [ "$a" = "$f" ] || fail "interleaved $extra: weights $a differ from 1f1b-flush's $f"
    echo "ok: interleaved $extra: mpi = threads = 1f1b-flush ($a)"
done
# interleaved over two whole pipelines (every stage two replicas: 4 ranks, replica j of each
# stage pipeline j) = threads = 1f1b-flush on the same replicated stages on 8 ranks: each
# replica adds its own micro-batches in order, then the replicas' sums are added in rank order.
sed -e 's/"workers": 4/"workers": 8/; s/"n_workers": 4, "noam": 4/"n_workers": 8, "noam": 4/' \
    -e 's/"straight": true/"straight": false/' \
    -e 's/"replicas": 1, "ranks": \[\([0-9]\)\]/"replicas": 2, "ranks": [R\1]/' "$tmp/p4.json" |
    sed -e 's/\[R0\]/[0, 1]/; s/\[R1\]/[2, 3]/; s/\[R2\]/[4, 5]/; s/\[R3\]/[6, 7]/' >"$tmp/p4r.json"
args="$MODEL --plan $tmp/p4r.json --microbatches 8 --steps 12 --minibatch 32 --timeout 60"
"$PD" train $args --workers 8 --schedule 1f1b-flush >"$tmp/flush.out" 2>"$tmp/err" ||
    fail "1f1b-flush on 8 replicated: $(tail -3 "$tmp/err")"
$MPIRUN -np 4 "$PD" train $args --chunks 2 >"$tmp/mpi.out" 2>"$tmp/mpi.err" ||
    fail "mpi interleaved replicated: $(tail -5 "$tmp/mpi.err")"
"$PD" train $args --chunks 2 --workers 4 >"$tmp/thr.out" 2>"$tmp/thr.err" ||
    fail "threads interleaved replicated: $(tail -5 "$tmp/thr.err")"
a=$(crc "$tmp/mpi.out"); b=$(crc "$tmp/thr.out"); f=$(crc "$tmp/flush.out")
[ -n "$a" ] || fail "mpi interleaved replicated: no weights_crc in $(cat "$tmp/mpi.out")"
[ "$a" = "$b" ] || fail "interleaved replicated: MPI weights $a differ from threads $b"
[ "$a" = "$f" ] || fail "interleaved replicated: weights $a differ from 1f1b-flush's $f"
echo "ok: interleaved on 2 pipelines: mpi = threads = 1f1b-flush ($a)"
# stopped at a checkpoint after 6 of the 12 minibatches and resumed: the same weights, bitwise
"$PD" train $args --chunks 2 --workers 4 --steps 6 --checkpoint-every 6 --checkpoint-dir "$tmp/ckr" >/dev/null 2>"$tmp/err" ||
    fail "interleaved replicated, first half: $(tail -3 "$tmp/err")"
"$PD" train $args --chunks 2 --workers 4 --resume "$tmp/ckr" >"$tmp/res.out" 2>"$tmp/err" ||
    fail "interleaved replicated, resumed: $(tail -3 "$tmp/err")"
grep -q '"resumed_from":6' "$tmp/res.out" || fail "interleaved replicated: not resumed: $(cat "$tmp/res.out")"
[ "$(crc "$tmp/res.out")" = "$b" ] || fail "interleaved replicated: resumed weights $(crc "$tmp/res.out") differ from $b"
echo "ok: interleaved on 2 pipelines: resumed from a checkpoint = uninterrupted"
args="$MODEL --plan $tmp/p4.json --microbatches 4 --steps 12 --minibatch 16 --timeout 60"
$MPIRUN -np 2 "$PD" train $args --chunks 2 --microbatches 3 --minibatch 12 >"$tmp/out" 2>"$tmp/err" &&
    fail "interleaved with 3 micro-batches on 2 workers succeeded"
grep -q "3 micro-batches per minibatch is not a multiple of the 2 workers" "$tmp/err" ||
    fail "interleaved micro-batch message: $(cat "$tmp/err")"

# Bad launches: every rank exits non-zero with a message, on its own (124: the hang guard
# `timeout 120` ended it).
bad_launch() {   # bad_launch WHAT REGEX NP ARGS...: the launch fails with REGEX on stderr
    local what=$1 re=$2 np=$3 rc
    shift 3
    $MPIRUN -np "$np" "$PD" train "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -ne 0 ] || fail "$what: the launch succeeded"
    [ $rc -ne 124 ] || fail "$what: the ranks hung until the hang guard"
    grep -q "$re" "$tmp/err" || fail "$what: message: $(cat "$tmp/err")"
}
bad_launch "np 2 for a 3-rank plan" "rank 0 (stage 0): the plan needs 3 workers but 2 were started" 2 \
    "$MODEL" --plan "$tmp/plan.json" --steps 4
bad_launch "a plan for another model" "made for a model of 4 layers" 3 \
    "$SRC/models/lenet5.json" --plan "$tmp/plan.json" --steps 4
bad_launch "mpirun without --plan" "under mpirun, give --plan" 2 "$MODEL" --steps 4
echo "ok: bad launches"
