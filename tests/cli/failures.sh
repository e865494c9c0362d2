#!/usr/bin/env bash
# failures.sh: every failure of a 4-rank MPI training run, one by one (lenet5, one stage per
# rank). For each: every rank exits non-zero (on its own, not killed by the `timeout 120` hang
# guard), the first line of stderr names the rank, the stage and the cause, and the "last checkpoint" named exists and is the newest
# valid one (or "none"). Checks made before the first step fail fast.
#   1. checkpoint directory missing: created (mkdir -p), the run completes
#   2. checkpoint directory cannot be created: fails before the first step
#   3. training data truncated: fails before the first step, naming the file
#   4. a NaN loss: the last stage names itself and the minibatch
#   5. a peer that stops answering (SIGSTOP): its neighbour times out naming it
#   6. rank 0 stops answering: the others end the job from the control plane too
# (A rank killed outright: failure_resume.sh. A disk filling up mid-run: failure_disk.sh.)
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
tmp=$(mktemp -d)
trap 'pkill -CONT -f "$tmp/" 2>/dev/null; pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
MODEL=$SRC/models/lenet5.json
plan "$tmp/p4.json" 8 lenet5 "0, 1" "2, 3" "4, 5" "6, 7"
RUN="timeout 120 mpirun -np 4 --oversubscribe $PD train $MODEL --plan $tmp/p4.json --minibatch 32"

# first_line FILE: the first error line on stderr (progress and checkpoint lines come before)
first_line() { grep -m1 -E "^pipedream: (error|rank [0-9]+: abort|rank [0-9]+ \(stage)" "$1"; }
expect_stop() {   # expect_stop NAME RC T0 ERRFILE REGEX
    local name=$1 rc=$2 t0=$3 f=$4 re=$5
    [ "$rc" -ne 0 ] || fail "$name: the job exited 0"
    local dt; dt=$(elapsed "$t0")
    [ "$rc" -ne 124 ] || fail "$name: the job did not stop: killed by the hang guard after $dt s"
    pgrep -f "$tmp/p4.json" >/dev/null && fail "$name: ranks still running after the job ended"
    first_line "$f" | grep -Eq "$re" || fail "$name: first line does not match /$re/: $(first_line "$f")"
    echo "ok: $name: stopped in $dt s: $(first_line "$f")"
}

# 1. a checkpoint directory that does not exist yet is created
$RUN --steps 120 --checkpoint-every 50 --checkpoint-dir "$tmp/not/yet/there" >"$tmp/1.out" 2>"$tmp/1.err" ||
    fail "missing checkpoint dir: $(tail -3 "$tmp/1.err")"
for s in 50 100 120; do
    [ -f "$tmp/not/yet/there/ckpt-$(printf %010d $s).safetensors" ] || fail "checkpoint $s missing: $(ls -R "$tmp/not")"
done
grep -q '"test_accuracy"' "$tmp/1.out" || fail "no summary line"
echo "ok: missing checkpoint directory created, run completed"

# 2. a checkpoint directory that cannot be created: before the first step
touch "$tmp/file"
t0=$(now)
$RUN --steps 120 --checkpoint-every 50 --checkpoint-dir "$tmp/file/ck" >"$tmp/2.out" 2>"$tmp/2.err"
expect_stop "uncreatable checkpoint dir" $? "$t0" "$tmp/2.err" \
    "rank 0 \(stage 0\): cannot create the checkpoint directory $tmp/file.*; last checkpoint to resume from: none"
grep -q "unit 1/" "$tmp/2.err" && fail "trained before failing"

# 3. truncated training data: before the first step, naming the file
mkdir -p "$tmp/data"
for f in /usr/share/datasets/fashion-mnist/*; do ln -s "$f" "$tmp/data/"; done
rm "$tmp/data/train-images-idx3-ubyte.gz"
head -c 100000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz >"$tmp/data/train-images-idx3-ubyte.gz"
t0=$(now)
$RUN --steps 20 --data "$tmp/data" >"$tmp/3.out" 2>"$tmp/3.err"
expect_stop "truncated data" $? "$t0" "$tmp/3.err" "rank 0 \(stage 0\): .*train-images-idx3-ubyte"

# 4. NaN loss: the last stage stops the job
t0=$(now)
$RUN --steps 200 --lr 100 >"$tmp/4.out" 2>"$tmp/4.err"
expect_stop "NaN loss" $? "$t0" "$tmp/4.err" "rank 3 \(stage 3\).*the loss is .*nan at minibatch [0-9]+.*last checkpoint to resume from: none"

# stop_rank CASE R NAME REGEX: a 4-rank run with a checkpoint every 20 minibatches and
# --timeout 8; once checkpoint 40 exists, MPI rank R (found by OMPI_COMM_WORLD_RANK) is
# stopped (SIGSTOP); the job must end by that deadline, not the hang guard, its first error
# line matching REGEX.
stop_rank() {
    local c=$1 r=$2 name=$3 re=$4 job victim="" p rc t0
    rm -rf "$tmp/ck$c"; mkdir -p "$tmp/ck$c"
    $RUN --steps 100000 --checkpoint-every 20 --checkpoint-dir "$tmp/ck$c" --timeout 8 >"$tmp/$c.out" 2>"$tmp/$c.err" &
    job=$!
    for _ in $(seq 600); do [ -f "$tmp/ck$c/ckpt-0000000040.safetensors" ] && break; sleep 0.1; done
    [ -f "$tmp/ck$c/ckpt-0000000040.safetensors" ] || fail "$name: no checkpoint appeared: $(tail -5 "$tmp/$c.err")"
    for p in $(pgrep -f "^$PD train .*$tmp/p4.json"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$r" && victim=$p
    done
    [ -n "$victim" ] || fail "$name: rank $r not found"
    kill -STOP "$victim"
    t0=$(now)
    wait $job
    rc=$?
    expect_stop "$name" $rc "$t0" "$tmp/$c.err" "$re"
}

# 5. a rank that stops answering: a neighbour times out naming it; the last checkpoint is named.
stop_rank 5 2 "stopped peer" \
    "rank [0-9] \(stage [0-9]\).*timed out after 8(\.[0-9]+)? s.*rank [0-9].*last checkpoint to resume from: $tmp/ck5/ckpt-[0-9]+\.safetensors"
named=$(first_line "$tmp/5.err" | sed -n 's/.*last checkpoint to resume from: \([^ ;]*\).*/\1/p')
[ -f "$named" ] || fail "the named checkpoint $named does not exist"
newest=$(ls "$tmp/ck5"/ckpt-*.safetensors | sort | tail -1)
n_named=$(basename "$named" .safetensors | sed "s/ckpt-0*//"); n_newest=$(basename "$newest" .safetensors | sed "s/ckpt-0*//")
[ $((n_newest - n_named)) -le 20 ] || fail "named $named, but $newest was written and agreed before"

# 6. the same with rank 0 stopped: the others wait for it in the control plane too (the
# checkpoint's gather and agreement), where they must end the job as well: MPI_Finalize would
# wait for it forever.
stop_rank 6 0 "stopped rank 0" \
    "rank [1-3] \(stage [1-3]\).*timed out after 8(\.[0-9]+)? s.*rank [0-3].*last checkpoint to resume from: $tmp/ck6/ckpt-[0-9]+\.safetensors"
echo "all failure checks passed"
