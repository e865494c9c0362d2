#!/usr/bin/env bash
# failure_disk.sh: the checkpoint disk fills up mid-run (a 768 KiB tmpfs: one lenet5
# checkpoint of ~490 KB fits, the second does not). Every rank exits non-zero (on its own, not
# killed by the `timeout 120` hang guard); the first line names rank 0 and the cause; the last checkpoint it names is the first one,
# which exists and still verifies (a resume picks it). Needs root (mount); else a ctest skip.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
tmp=$(mktemp -d)
cleanup() { pkill -9 -f "$tmp/" 2>/dev/null; umount "$tmp/disk" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
mkdir -p "$tmp/disk"
mount -t tmpfs -o size=768k tmpfs "$tmp/disk" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs (not root?)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
MODEL=$SRC/models/lenet5.json
plan "$tmp/p4.json" 8 lenet5 "0, 1" "2, 3" "4, 5" "6, 7"
t0=$(now)
timeout 120 mpirun -np 4 --oversubscribe "$PD" train "$MODEL" --plan "$tmp/p4.json" --minibatch 32 --steps 200 \
    --checkpoint-every 20 --checkpoint-dir "$tmp/disk/ck" >"$tmp/o" 2>"$tmp/e"
rc=$?
[ $rc -ne 0 ] || fail "the job exited 0 on a full disk"
[ $rc -ne 124 ] || fail "the job did not stop: killed by the hang guard"
first=$(grep -m1 -E "^pipedream: (error|rank [0-9]+: abort|rank [0-9]+ \(stage)" "$tmp/e")
echo "$first" | grep -Eq "rank 0 \(stage 0\): checkpoint after minibatch 40: .*(No space left|write failed|short write)" ||
    fail "first line: $first"
echo "$first" | grep -q "last checkpoint to resume from: $tmp/disk/ck/ckpt-0000000020.safetensors" ||
    fail "last checkpoint not named: $first"
pgrep -f "$tmp/p4.json" >/dev/null && fail "ranks still running"
ls "$tmp/disk/ck" | grep -q tmp && fail "a temporary file was left behind: $(ls "$tmp/disk/ck")"
# the named checkpoint verifies: a resume starts from it
timeout 120 mpirun -np 4 --oversubscribe "$PD" train "$MODEL" --plan "$tmp/p4.json" --minibatch 32 --steps 30 \
    --resume "$tmp/disk/ck" >"$tmp/r.out" 2>"$tmp/r.err" || fail "resume: $(tail -3 "$tmp/r.err")"
grep -q "resuming from $tmp/disk/ck/ckpt-0000000020.safetensors" "$tmp/r.err" || fail "resume: $(cat "$tmp/r.err")"
echo "ok: disk full: $first"
