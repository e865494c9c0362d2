#!/usr/bin/env bash
# launch_faults.sh: `pipedream launch` under faults of its own surroundings, on an emulated
# cluster of 2 hosts (tools/cluster.sh), lenet5 on a small IDX set. For each: what launch does,
# that nothing is left running (no process in the hosts' namespaces, none of the test's), and
# that the event log says what happened (stragglers not watched: not the subject here):
#  1. the run directory is called error-feedback and a train flag names a file error.jsonl (the
#     checkpoint lines quote them), with --grace 2: the healthy job trains straight through
#     (exit 0; events start and done only);
#  2. every rank killed at once (nobody says why): launch probes the hosts, and SIGINT during
#     the probe stops it: no host recorded lost, no other mpirun started (events start and
#     stopped);
#  3. SIGHUP to launch while the job trains: mpirun and the ranks end (a stopped event);
#  4. --mpirun /nonexistent: one error naming it, exit 1, no host lost, no "ckpt--000000001";
#  5. an mpirun that leaves a sleeping child holding its stderr: the job finishes, launch does
#     not wait for that child and ends it.
# Exits 77 (ctest SKIP) when not root, without iproute2, python3 or mpirun, where network
# namespaces cannot be made, or when 198.18.0.0/24 is in use (another cluster is up).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
NAME=pdf$$
tmp=$(mktemp -d)
cleanup() { bash "$CL" down --name "$NAME" >/dev/null 2>&1; pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

. "$SRC/tests/cli/lib/cluster3.sh"
cluster3_up 2
cp "$SRC/tests/data/profiles/lenet5_mb32.json" "$tmp/prof.json"
printf '198.18.0.1\n198.18.0.2\n' >"$tmp/hosts"
TRAIN="--data $tmp/d --minibatch 32 --timeout 20"
ev() { python3 -c 'import json,sys; print(eval(sys.argv[2], {"E": [json.loads(l) for l in open(sys.argv[1])]}))' "$@"; }
kinds() { ev "$1" '[e["event"] for e in E]'; }
# go RUN [FLAGS...] -- TRAIN...: launch in the background (pid in $job); stdout RUN.out, stderr RUN.err
go() {
    local run=$1; shift
    timeout 120 "$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/$run" \
        --checkpoint-every 50 --events "$tmp/$run.jsonl" --mpirun-args "$MPIARGS" --probe-timeout 30 --no-stragglers "$@" \
        >"$tmp/$run.out" 2>"$tmp/$run.err" &
    job=$!
}
# finish SECONDS: waits for $job at most that long; its exit status in $rc
finish() {
    for _ in $(seq $(($1 * 10))); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    kill -0 $job 2>/dev/null && { kill -9 $job; fail "launch still running after $1 s: $(tail -5 "$tmp"/*.err)"; }
    wait $job; rc=$?
}
# wait_for FILE: until FILE exists (30 s)
wait_for() { for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done; fail "no $1: $(tail -5 "$tmp"/*.err)"; }
# nothing left running: no process in either host's namespace, no rank or mpirun of the test
none_left() {
    local i
    for _ in $(seq 50); do
        [ -z "$(ip netns pids "$NAME-h0")$(ip netns pids "$NAME-h1")" ] && ! pgrep -f "$tmp/" >/dev/null && return 0
        sleep 0.1
    done
    for i in 0 1; do
        [ -z "$(ip netns pids "$NAME-h$i")" ] || fail "$1: processes left in $NAME-h$i: $(ip netns pids "$NAME-h$i" | xargs ps -o pid,cmd -p)"
    done
    fail "$1: processes of the test left: $(pgrep -af "$tmp/")"
}
M=$SRC/models/lenet5.json

# CASES="2 3" runs those alone (default: all)
want() { case " ${CASES:-1 2 3 4 5} " in *" $1 "*) return 0 ;; esac; return 1; }

# 1.
if want 1; then
go error-feedback --grace 2 "$M" -- $TRAIN --steps 800 --metrics "$tmp/error.jsonl"
finish 100
[ $rc = 0 ] || fail "1: launch exited $rc: $(grep -v '^unit' "$tmp/error-feedback.err" | tail -8)"
grep -q '"steps":800,' "$tmp/error-feedback.out" || fail "1: no summary of 800 steps"
[ "$(kinds "$tmp/error-feedback.jsonl")" = "['start', 'done']" ] || fail "1: events: $(cat "$tmp/error-feedback.jsonl")"
none_left 1
echo "ok: 1. \"error\" in the run directory and a train flag: trained straight through"
fi

# 2. an mpirun that tells when a probe starts and makes it last
if want 2; then
cat >"$tmp/mpirun-probe" <<EOS
#!/usr/bin/env bash
for a in "\$@"; do [ "\$a" = true ] && { touch "$tmp/probing"; sleep 60; }; done
exec mpirun "\$@"
EOS
chmod +x "$tmp/mpirun-probe"
go intr --mpirun "$tmp/mpirun-probe" "$M" -- $TRAIN --steps 2000
wait_for "$tmp/intr/ckpt/ckpt-0000000050.safetensors"
# every rank of this cluster (only its hosts' processes: other tests' ranks run beside it)
pids=$(for h in 0 1; do ip netns pids "$NAME-h$h"; done | paste -sd, -)
ranks=$([ -n "$pids" ] && ps -o pid=,args= -p "$pids" | awk -v pd="$PD" '$2 == pd && $3 == "train" {print $1}')
[ -n "$ranks" ] || fail "2: no rank to kill"
kill -9 $ranks
wait_for "$tmp/probing"
kill -INT $job
finish 30
[ $rc != 0 ] || fail "2: exit 0 after SIGINT"
[ "$(kinds "$tmp/intr.jsonl")" = "['start', 'stopped']" ] || fail "2: events: $(cat "$tmp/intr.jsonl")"
! grep -q "does not answer\|removed" "$tmp/intr.err" || fail "2: a host recorded lost: $(grep launch: "$tmp/intr.err")"
[ "$(grep -c 'launch: attempt' "$tmp/intr.err")" = 1 ] || fail "2: another attempt: $(grep launch: "$tmp/intr.err")"
none_left 2
echo "ok: 2. SIGINT while probing: stopped, no host lost, no other mpirun"
fi

# 3.
if want 3; then
go hup "$M" -- $TRAIN --steps 2000
wait_for "$tmp/hup/ckpt/ckpt-0000000050.safetensors"
kill -HUP $job
finish 30
[ "$(kinds "$tmp/hup.jsonl")" = "['start', 'stopped']" ] || fail "3: events: $(cat "$tmp/hup.jsonl")"
none_left 3
echo "ok: 3. SIGHUP: mpirun and the ranks ended"
fi

# 4.
if want 4; then
"$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/nompi" --events "$tmp/nompi.jsonl" \
    --mpirun /nonexistent "$M" -- $TRAIN --steps 100 >/dev/null 2>"$tmp/nompi.err"
rc=$?
[ $rc = 1 ] || fail "4: exit $rc"
[ "$(grep -c 'pipedream: error' "$tmp/nompi.err")" = 1 ] && grep -q /nonexistent "$tmp/nompi.err" ||
    fail "4: not one error naming it: $(cat "$tmp/nompi.err")"
! grep -q "ckpt--\|does not answer\|removed" "$tmp/nompi.err" || fail "4: $(cat "$tmp/nompi.err")"
[ ! -s "$tmp/nompi.jsonl" ] || [ "$(ev "$tmp/nompi.jsonl" '[e for e in E if e["event"] in ("membership", "failure")]')" = "[]" ] ||
    fail "4: events: $(cat "$tmp/nompi.jsonl")"
none_left 4
echo "ok: 4. --mpirun /nonexistent: one error, no host lost"
fi

# 5.
if want 5; then
cat >"$tmp/mpirun-gc" <<EOS
#!/usr/bin/env bash
sleep 300 &
echo \$! >"$tmp/sleeper"
exec mpirun "\$@"
EOS
chmod +x "$tmp/mpirun-gc"
go gc --mpirun "$tmp/mpirun-gc" "$M" -- $TRAIN --steps 100
finish 60
[ $rc = 0 ] || fail "5: launch exited $rc: $(grep -v '^unit' "$tmp/gc.err" | tail -8)"
[ "$(kinds "$tmp/gc.jsonl")" = "['start', 'done']" ] || fail "5: events: $(cat "$tmp/gc.jsonl")"
s=$(ps -o stat= -p "$(cat "$tmp/sleeper")" 2>/dev/null)
[ -z "$s" ] || [ "${s#Z}" != "$s" ] || fail "5: mpirun's child still running"
none_left 5
echo "ok: 5. a child of mpirun holding its stderr: launch finished and ended it"
fi

cluster3_clean 0 1
echo "ok: nothing left after down"
