#!/usr/bin/env bash
# launch_edges.sh: `pipedream launch` against a made-up mpirun (tests/cli/lib/fake_mpirun.sh),
# no cluster: how it tells a failure, stops, cleans up and counts, each with the event log:
#  1. a run directory and a train flag with "error" in them (quoted in the checkpoint line)
#     and the job running past --grace: it trains straight through (no failure event);
#  2. a failure: the estimate of minibatches lost is never negative (rank 1's error line came
#     before the checkpoint rank 0 wrote), and the relaunch finishes;
#  3. SIGINT while probing the hosts after a failure: launch stops (a stopped event), records
#     no host lost and starts no other mpirun;
#  4. SIGHUP while training: launch ends mpirun and what it started, records a stopped event;
#  5. mpirun leaves a process holding its stderr: launch finishes, and ends that process;
#  6. --mpirun /nonexistent: one error, exit 1, nothing started; an mpirun exiting 127 at once:
#     no host lost, no checkpoint named "ckpt--000000001";
#  7. many train flags and a long --mpirun-args: every one reaches mpirun, and so does --resume;
#  8. train's --chunks and --wire reach the plan launch writes (interleaved, bf16 on the wire);
#  9. mpirun inherits no descriptor of launch but its stdin, stdout and stderr (not the
#     attempt's log, the event log, or a second /dev/null);
# 10. 2 chunks per worker computing as predicted (each chunk one stage's prediction): no
#     straggler reported, no link probed;
# 11. a straggler under --schedule 2bw: launch scores the plans under the job's schedule (a
#     finite prediction, not 1e300 for every plan);
# 12. a failure a second into training, before the first checkpoint: the minibatches lost are
#     estimated at the plan's predicted pace (here all --checkpoint-every of them), not 0.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PD=$(realpath "$PD")
tmp=$(mktemp -d)
cleanup() { pkill -9 -f "$tmp/" 2>/dev/null; [ -f "$tmp/f/sleeper" ] && kill -9 "$(cat "$tmp/f/sleeper")" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
FAKE=$tmp/mpirun
cp "$SRC/tests/cli/lib/fake_mpirun.sh" "$FAKE"
export FAKE_DIR=$tmp/f
printf 'h0\nh1\n' >"$tmp/hosts"
cp "$SRC/tests/data/profiles/lenet5_mb32.json" "$tmp/prof.json"
ev() { python3 -c 'import json,sys; print(eval(sys.argv[2], {"E": [json.loads(l) for l in open(sys.argv[1])]}))' "$@"; }
kinds() { ev "$1" '[e["event"] for e in E]'; }
# fresh RUN: clears the fake's records; RUN is the run directory's name under $tmp
fresh() { rm -rf "$FAKE_DIR" "$tmp/$1" "$tmp/$1.jsonl"; mkdir -p "$FAKE_DIR"; }
# go RUN [FLAGS...] [-- TRAIN...]: launch in the background (pid in $job)
go() {
    local run=$1; shift
    "$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/$run" --events "$tmp/$run.jsonl" \
        --mpirun "$FAKE" --probe-timeout 20 "$@" >"$tmp/$run.out" 2>"$tmp/$run.err" &
    job=$!
}
finish() { # finish SECONDS: waits for $job at most that long; its exit status in $rc
    for _ in $(seq $(($1 * 10))); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    kill -0 $job 2>/dev/null && { kill -9 $job; fail "launch still running after $1 s: $(tail -5 "$tmp"/*.err)"; }
    wait $job; rc=$?
}
# running PID: alive and not a zombie waiting to be reaped by init
running() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${s#Z}" = "$s" ]; }
none_left() { ! pgrep -f "$tmp/" >/dev/null || fail "$1: processes left: $(pgrep -af "$tmp/")"
    [ ! -f "$FAKE_DIR/sleeper" ] || ! running "$(cat "$FAKE_DIR/sleeper")" || fail "$1: mpirun's child left running"; }
M=$SRC/models/lenet5.json

# CASES="1 3" runs those alone (default: all)
want() { case " ${CASES:-1 2 3 4 5 6 7 8 9 10 11 12} " in *" $1 "*) return 0 ;; esac; return 1; }

# 1.
if want 1; then
    fresh error-feedback
    FAKE_MODE=ok FAKE_SLEEP=3 go error-feedback --grace 1 "$M" -- --steps 100 --metrics "$tmp/error.jsonl"
    finish 30
    [ $rc = 0 ] || fail "1: exit $rc: $(tail -5 "$tmp/error-feedback.err")"
    [ "$(kinds "$tmp/error-feedback.jsonl")" = "['start', 'done']" ] || fail "1: events $(kinds "$tmp/error-feedback.jsonl")"
    ! grep -q "still running" "$tmp/error-feedback.err" || fail "1: the healthy job was ended: $(grep launch "$tmp/error-feedback.err")"
    none_left 1
    echo "ok: 1. \"error\" in the run directory and a train flag is no failure"
fi

# 2.
if want 2; then
    fresh lost
    FAKE_MODE=fail_once go lost "$M" -- --steps 100
    finish 30
    [ $rc = 0 ] || fail "2: exit $rc: $(tail -5 "$tmp/lost.err")"
    [ "$(ev "$tmp/lost.jsonl" '[(e["event"], e["minibatches_lost"] >= 0) for e in E if "minibatches_lost" in e]')" = \
      "[('failure', True), ('done', True)]" ] || fail "2: $(grep minibatches_lost "$tmp/lost.jsonl")"
    none_left 2
    echo "ok: 2. minibatches lost not negative ($(ev "$tmp/lost.jsonl" '[e["minibatches_lost"] for e in E if e["event"] == "failure"]'))"
fi

# 3.
if want 3; then
    fresh intr
    FAKE_MODE=silent FAKE_PROBE_S=30 go intr "$M" -- --steps 100
    for _ in $(seq 100); do [ -f "$FAKE_DIR/probing" ] && break; sleep 0.1; done
    [ -f "$FAKE_DIR/probing" ] || fail "3: no probe: $(tail -5 "$tmp/intr.err")"
    kill -INT $job
    finish 15
    [ $rc != 0 ] || fail "3: exit 0 after SIGINT"
    [ "$(ls "$FAKE_DIR" | grep -c '^argv-')" = 1 ] || fail "3: another mpirun started after SIGINT"
    [ "$(kinds "$tmp/intr.jsonl")" = "['start', 'stopped']" ] || fail "3: events $(cat "$tmp/intr.jsonl")"
    ! grep -q "does not answer" "$tmp/intr.err" || fail "3: a host recorded lost: $(grep launch "$tmp/intr.err")"
    none_left 3
    echo "ok: 3. SIGINT while probing: stopped, no host lost, no other mpirun"
fi

# 4.
if want 4; then
    fresh hup
    FAKE_MODE=hang go hup "$M" -- --steps 100
    for _ in $(seq 100); do [ -f "$FAKE_DIR/sleeper" ] && break; sleep 0.1; done
    [ -f "$FAKE_DIR/sleeper" ] || fail "4: mpirun did not start: $(tail -5 "$tmp/hup.err")"
    kill -HUP $job
    finish 20
    [ "$(kinds "$tmp/hup.jsonl")" = "['start', 'stopped']" ] || fail "4: events $(cat "$tmp/hup.jsonl")"
    grep -q "stopping on signal 1: ending mpirun" "$tmp/hup.err" && ! grep -q "still running" "$tmp/hup.err" ||
        fail "4: $(grep launch: "$tmp/hup.err")"
    none_left 4
    echo "ok: 4. SIGHUP: mpirun and its processes ended, a stopped event"
fi

# 5.
if want 5; then
    fresh gc
    FAKE_MODE=grandchild go gc "$M" -- --steps 100
    finish 20
    [ $rc = 0 ] || fail "5: exit $rc: $(tail -5 "$tmp/gc.err")"
    [ "$(kinds "$tmp/gc.jsonl")" = "['start', 'done']" ] || fail "5: events $(cat "$tmp/gc.jsonl")"
    none_left 5
    echo "ok: 5. a process holding mpirun's stderr does not hold launch, and is ended"
fi

# 6.
if want 6; then
    fresh nompi
    "$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/nompi" --events "$tmp/nompi.jsonl" \
        --mpirun /nonexistent "$M" -- --steps 100 >/dev/null 2>"$tmp/nompi.err"
    rc=$?
    [ $rc = 1 ] || fail "6: --mpirun /nonexistent: exit $rc"
    [ "$(grep -c 'pipedream: error' "$tmp/nompi.err")" = 1 ] && grep -q "/nonexistent" "$tmp/nompi.err" ||
        fail "6: not one error naming it: $(cat "$tmp/nompi.err")"
    ! grep -q "lost\|does not answer\|removed" "$tmp/nompi.err" || fail "6: hosts blamed: $(cat "$tmp/nompi.err")"
    fresh n127
    FAKE_MODE=notfound go n127 "$M" -- --steps 100
    finish 30
    [ $rc = 1 ] || fail "6: mpirun exit 127: launch exit $rc"
    ! grep -q "ckpt--\|does not answer\|removed" "$tmp/n127.err" || fail "6: $(grep launch "$tmp/n127.err")"
    [ "$(ev "$tmp/n127.jsonl" '[e["event"] for e in E if e["event"] in ("membership", "failure", "gave_up")]')" = "['gave_up']" ] ||
        fail "6: events $(cat "$tmp/n127.jsonl")"
    none_left 6
    echo "ok: 6. no mpirun, or one that cannot start the job: one error, no host lost"
fi

# 7.
if want 7; then
    fresh many
    mkdir -p "$tmp/many/ckpt" && touch "$tmp/many/ckpt/ckpt-0000000050.safetensors"
    T=() && for i in $(seq 300); do T+=(--seed "$i"); done
    MA=$(for i in $(seq 400); do printf -- '-x PD_FAKE_%04d=1 ' "$i"; done)
    FAKE_MODE=ok go many --mpirun-args "$MA" "$M" -- --steps 100 "${T[@]}"
    finish 30
    [ $rc = 0 ] || fail "7: exit $rc: $(tail -5 "$tmp/many.err")"
    a=$FAKE_DIR/argv-0
    [ "$(grep -c '^--seed$' "$a")" = 300 ] && grep -qx 300 "$a" || fail "7: train flags lost: $(grep -c '^--seed$' "$a") of 300"
    [ "$(grep -c '^PD_FAKE_' "$a")" = 400 ] || fail "7: --mpirun-args cut: $(grep -c '^PD_FAKE_' "$a") of 400"
    grep -qx -- --resume "$a" || fail "7: no --resume"
    echo "ok: 7. 600 train flags and ${#MA} bytes of --mpirun-args all reach mpirun, --resume too"
fi

# 8.
if want 8; then
    fresh chunks
    FAKE_MODE=ok go chunks "$M" -- --steps 100 --chunks 2 --wire bf16
    finish 30
    [ $rc = 0 ] || fail "8: exit $rc: $(tail -5 "$tmp/chunks.err")"
    python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert p.get("chunks") == 2, "chunks %r" % p.get("chunks")
assert p["cost_model"]["activation_compression"] == 2, "no bf16 wire"' "$tmp/chunks/plan-0.json" ||
        fail "8: plan-0.json: $(head -c 400 "$tmp/chunks/plan-0.json")"
    echo "ok: 8. the job's chunks and wire reach launch's plan"
fi

# 9.
if want 9; then
    fresh fds
    FAKE_MODE=ok go fds "$M" -- --steps 100
    finish 30
    [ -s "$FAKE_DIR/fds-0" ] || fail "9: no descriptors listed"
    # descriptors 3 to 9 (bash keeps its own at 10 and up) that launch opened: its files in the
    # run, /dev/null (what the test's own caller left open is not launch's)
    extra=$(awk '$(NF-2) ~ /^[3-9]$/' "$FAKE_DIR/fds-0" | grep -e "$tmp/" -e /dev/null)
    [ -z "$extra" ] || fail "9: mpirun inherited descriptors of launch: $extra"
    echo "ok: 9. mpirun inherits no descriptor of launch but 0, 1 and 2"
fi

# 10.
if want 10; then
    fresh ilv
    FAKE_MODE=chunks2 go ilv "$M" -- --steps 150 --chunks 2
    finish 30
    [ $rc = 0 ] || fail "10: exit $rc: $(tail -5 "$tmp/ilv.err")"
    ! grep -q "probing the links\|straggler" "$tmp/ilv.err" || fail "10: $(grep launch: "$tmp/ilv.err")"
    echo "ok: 10. 2 chunks per worker computing as predicted: no straggler, no link probe"
fi

# 11.
if want 11; then
    fresh twobw
    FAKE_MODE=straggler FAKE_MB=1000 go twobw "$M" -- --steps 1000 --schedule 2bw
    finish 30
    [ $rc = 0 ] || fail "11: exit $rc: $(tail -5 "$tmp/twobw.err")"
    grep -q "straggler: h1" "$tmp/twobw.err" || fail "11: no straggler: $(grep launch: "$tmp/twobw.err")"
    grep -q "re-plan\|not re-planning" "$tmp/twobw.err" && ! grep -q "1e+300" "$tmp/twobw.err" ||
        fail "11: plans not scored under 2bw: $(grep launch: "$tmp/twobw.err")"
    echo "ok: 11. under 2bw the plans around a straggler are scored"
fi

# 12.
if want 12; then
    fresh early
    FAKE_MODE=fail_early go early --checkpoint-every 20 "$M" -- --steps 100
    finish 30
    [ $rc = 0 ] || fail "12: exit $rc: $(tail -5 "$tmp/early.err")"
    [ "$(ev "$tmp/early.jsonl" '[e["minibatches_lost"] for e in E if e["event"] == "failure"]')" = "[20]" ] ||
        fail "12: $(grep failure "$tmp/early.jsonl")"
    echo "ok: 12. a failure before the first checkpoint: 20 minibatches lost (estimated)"
fi
