#!/usr/bin/env bash
# train_eval.sh: evaluations during a pipelined run (--eval-every) and stopping at a target
# accuracy (--target-accuracy): one metrics line per evaluation, the run stops at the first
# evaluation at or above the target, and MPI reports the same figures as threads.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
plan "$tmp/p4.json" 8 lenet5 "0, 1" "2, 3" "4, 5" "6, 7"
A="$SRC/models/lenet5.json --plan $tmp/p4.json --minibatch 32 --steps 400 --eval-every 100"
"$PD" train $A --workers 4 --metrics "$tmp/m.jsonl" >"$tmp/t.out" 2>"$tmp/t.err" || fail "threads: $(tail -3 "$tmp/t.err")"
[ "$(grep -c '"eval_minibatches"' "$tmp/m.jsonl")" = 4 ] || fail "expected 4 evaluation lines: $(cat "$tmp/m.jsonl")"
python3 - "$tmp/m.jsonl" "$tmp/t.out" <<'PY' || fail "evaluation figures"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if '"eval_minibatches"' in l]
summ = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert [e["eval_minibatches"] for e in ev] == [100, 200, 300, 400], ev
assert all(0 < e["test_accuracy"] <= 1 and e["test_loss"] > 0 for e in ev), ev
assert all(a["train_s"] < b["train_s"] for a, b in zip(ev, ev[1:])), ev
assert ev[-1]["test_accuracy"] > ev[0]["test_accuracy"], "no learning between the first and last evaluation"
assert summ["test_accuracy"] == ev[-1]["test_accuracy"] and summ["target_minibatches"] is None, summ
PY
target=$(python3 -c "import json,sys; ev=[json.loads(l) for l in open('$tmp/m.jsonl') if 'eval_min' in l]; print((ev[1]['test_accuracy']+ev[0]['test_accuracy'])/2 if ev[1]['test_accuracy']>ev[0]['test_accuracy'] else ev[1]['test_accuracy'])")
"$PD" train $A --workers 4 --target-accuracy "$target" >"$tmp/s.out" 2>"$tmp/s.err" || fail "target: $(tail -3 "$tmp/s.err")"
grep -q '"target_minibatches":200' "$tmp/s.out" || fail "did not stop at 200 for target $target: $(cat "$tmp/s.out")"
grep -q '"steps":200' "$tmp/s.out" || fail "ran past the target: $(cat "$tmp/s.out")"
echo "ok: --eval-every and --target-accuracy ($target reached after 200 minibatches)"
# --no-stash (ablation): backward on the newest weights. On 4 stages 1f1b reads stale versions,
# so the weights differ from the stashed run; on one stage nothing is stale: identical.
N="$SRC/models/lenet5.json --minibatch 32 --steps 30"
"$PD" train $N --workers 4 --plan "$tmp/p4.json" >"$tmp/a.out" 2>/dev/null || fail "stash"
"$PD" train $N --workers 4 --plan "$tmp/p4.json" --no-stash >"$tmp/b.out" 2>/dev/null || fail "no-stash"
[ "$(crc "$tmp/a.out")" != "$(crc "$tmp/b.out")" ] || fail "--no-stash changed nothing on 4 stages"
plan "$tmp/p1.json" 8 lenet5 "0, 1, 2, 3, 4, 5, 6, 7"
"$PD" train $N --workers 1 --plan "$tmp/p1.json" >"$tmp/c.out" 2>/dev/null || fail "1 stage"
"$PD" train $N --workers 1 --plan "$tmp/p1.json" --no-stash >"$tmp/d.out" 2>/dev/null || fail "1 stage no-stash"
[ "$(crc "$tmp/c.out")" = "$(crc "$tmp/d.out")" ] || fail "--no-stash changed a run without staleness"
echo "ok: --no-stash"
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    timeout 300 mpirun -np 4 --oversubscribe "$PD" train $A --target-accuracy "$target" >"$tmp/m.out" 2>"$tmp/m.err" ||
        fail "mpi: $(tail -3 "$tmp/m.err")"
    for k in test_accuracy test_loss target_minibatches weights_crc; do
        a=$(grep -o "\"$k\":[^,]*" "$tmp/s.out"); b=$(grep -o "\"$k\":[^,]*" "$tmp/m.out")
        [ "$a" = "$b" ] || fail "mpi $b != threads $a"
    done
    echo "ok: mpi = threads"
fi
