#!/usr/bin/env bash
# asp.sh: `pipedream train --schedule asp` end to end (docs/explanation/asp.md), on threads and over MPI.
#  - one worker: asp is sequential SGD, so its weights equal dp's bit for bit (CRC-32), on
#    threads and over MPI (-np 1);
#  - 4 MPI ranks and 4 threads (mlp: 1.9 M parameters, so the pushes and pulls are large
#    messages): the run ends, one summary line, "schedule":"asp", every shard applied every
#    gradient once (the asp line on stderr), staleness reported (around R - 1 = 3 on
#    average), the loss falls (plain SGD, lr 0.05: docs/explanation/asp.md on momentum);
#  - checkpoint segments on 3 threads: checkpoints written, a resumed run continues from the
#    newest;
#  - usage: --microbatches with asp is exit 2; the pipelined --help names asp.
# The replay oracle and the one-rank bitwise check are in tests/test_runtime_asp.c.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$SRC/tests/cli/lib/common.sh"
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "SKIP: no Fashion-MNIST"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN="timeout 300 mpirun --oversubscribe"
MODEL=$SRC/models/lenet5.json
# asp (like dp) runs every layer on every rank of the plan: a plan of R one-rank stages
plan "$tmp/p1.json" 8 lenet5 "0, 1, 2, 3, 4, 5, 6, 7"
plan "$tmp/p3.json" 8 lenet5 "0, 1, 2" "3, 4, 5" "6, 7"
plan "$tmp/m4.json" 4 mlp "0" "1" "2" "3"
have_mpi=1
command -v mpirun >/dev/null || { have_mpi=0; echo "note: no mpirun: the MPI runs are skipped"; }
# json KEY FILE: a number of the summary line
json() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" "$2"; }

"$PD" train --schedule asp --help | grep -A2 -e "--schedule KIND" | grep -qw asp || fail "--help does not name asp"
"$PD" train "$MODEL" --workers 2 --schedule asp --microbatches 2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "asp --microbatches 2: want exit 2"
grep -q "microbatches applies only to" "$tmp/err" || fail "asp --microbatches: $(cat "$tmp/err")"
for m in predict lr-warmup; do   # they need delays known in advance; asp takes lookahead
    "$PD" train "$MODEL" --workers 2 --schedule asp --staleness $m --steps 4 >"$tmp/out" 2>"$tmp/err" &&
        fail "asp --staleness $m ran"
    grep -q "asp takes --staleness lookahead or none" "$tmp/err" || fail "asp --staleness $m: $(cat "$tmp/err")"
done

# One worker: asp = dp bitwise (threads; MPI -np 1).
args="$MODEL --plan $tmp/p1.json --steps 30 --minibatch 32 --timeout 60"
"$PD" train $args --workers 1 --schedule dp >"$tmp/dp.out" 2>"$tmp/dp.err" || fail "dp: $(tail -3 "$tmp/dp.err")"
"$PD" train $args --workers 1 --schedule asp >"$tmp/asp.out" 2>"$tmp/asp.err" || fail "asp: $(tail -3 "$tmp/asp.err")"
a=$(crc "$tmp/asp.out"); d=$(crc "$tmp/dp.out")
[ -n "$a" ] && [ "$a" = "$d" ] || fail "one worker: asp weights $a, dp $d"
grep -q "staleness mean 0.00, max 0" "$tmp/asp.err" || fail "one worker: staleness: $(grep asp: "$tmp/asp.err")"
echo "ok: one worker: asp = dp ($a)"
if [ $have_mpi = 1 ]; then
    $MPIRUN -np 1 "$PD" train $args --schedule asp >"$tmp/m1.out" 2>"$tmp/m1.err" || fail "mpi -np 1: $(tail -3 "$tmp/m1.err")"
    [ "$(crc "$tmp/m1.out")" = "$a" ] || fail "mpi -np 1: weights $(crc "$tmp/m1.out"), threads $a"
    echo "ok: one MPI rank: asp = dp ($a)"
fi

# Four workers, MPI and threads.
check4() {   # check4 NAME OUT ERR
    [ "$(wc -l <"$2")" -eq 1 ] || fail "$1: summary printed $(wc -l <"$2") times"
    grep -q '"schedule":"asp"' "$2" || fail "$1: $(cat "$2")"
    grep -q "pipedream: asp: 200 minibatches, each gradient applied once at each of 4 shards" "$3" ||
        fail "$1: no asp line: $(grep -v '^unit' "$3" | tail -5)"
    local sm
    sm=$(sed -n 's/.*staleness mean \([0-9.]*\), max \([0-9]*\).*/\1/p' "$3")
    [ -n "$sm" ] && [ "$(echo "$sm > 0.5 && $sm < 20" | bc)" = 1 ] || fail "$1: staleness mean $sm"
    [ "$(json staleness_mean "$2")" = "" ] && fail "$1: staleness_mean not a number in the summary: $(cat "$2")"
    local f m
    f=$(json final_loss "$2"); m=$(json mean_loss "$2")
    [ "$(echo "$f < 1.2 && $m < 1.5" | bc)" = 1 ] || fail "$1: loss did not fall: final $f, mean $m"
    grep -q '"test_accuracy":0\.[0-9]' "$2" || fail "$1: no accuracy: $(cat "$2")"
    echo "ok: $1: $(grep -o 'staleness mean.*' "$3"); final loss $f"
}
args="$SRC/models/mlp.json --plan $tmp/m4.json --schedule asp --steps 200 --lr 0.05 --momentum 0 --timeout 120"
if [ $have_mpi = 1 ]; then
    $MPIRUN -np 4 "$PD" train $args >"$tmp/m4.out" 2>"$tmp/m4.err" || fail "mpi 4: $(grep -v '^unit' "$tmp/m4.err" | tail -5)"
    grep -q '"transport":"mpi"' "$tmp/m4.out" || fail "mpi 4: transport"
    check4 "4 MPI ranks" "$tmp/m4.out" "$tmp/m4.err"
fi
"$PD" train $args --workers 4 >"$tmp/t4.out" 2>"$tmp/t4.err" || fail "threads 4: $(tail -5 "$tmp/t4.err")"
check4 "4 threads" "$tmp/t4.out" "$tmp/t4.err"

# Checkpoint segments and resume (3 workers): 20 minibatches in segments of 8 (8, 16, 20), then
# resumed to 30 (the asp line is the last segment's).
args="$MODEL --plan $tmp/p3.json --schedule asp --minibatch 32 --timeout 60 --workers 3 --checkpoint-every 8"
"$PD" train $args --steps 20 --checkpoint-dir "$tmp/ck" >"$tmp/c.out" 2>"$tmp/c.err" || fail "segments: $(tail -3 "$tmp/c.err")"
for k in 8 16 20; do
    [ -f "$tmp/ck/ckpt-$(printf %010d $k).safetensors" ] || fail "segments: no checkpoint after $k: $(ls "$tmp/ck")"
done
"$PD" train $args --steps 30 --checkpoint-dir "$tmp/ck" --resume "$tmp/ck" >"$tmp/r.out" 2>"$tmp/r.err" ||
    fail "resume: $(tail -3 "$tmp/r.err")"
[ "$(json resumed_from "$tmp/r.out")" = 20 ] || fail "resume: $(cat "$tmp/r.out")"
grep -Eq "pipedream: asp: [0-9]+ minibatches, each gradient applied once at each of 3 shards" "$tmp/r.err" ||
    fail "resume: last segment: $(grep asp: "$tmp/r.err")"
[ -f "$tmp/ck/ckpt-$(printf %010d 30).safetensors" ] || fail "resume: no checkpoint after 30: $(ls "$tmp/ck")"
echo "ok: checkpoint segments and resume"
