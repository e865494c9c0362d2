#!/usr/bin/env bash
# train_edges.sh: what train gives at the edges of its outputs and inputs:
#  1. --calibrated-profile that cannot be written (a missing directory) fails the command (exit
#     1, an error naming the path) but only after the run's summary line, metrics file and curve
#     are written: the run trained;
#  2. without --profile the summary's predicted_time_per_unit_ms is null and
#     predicted_time_per_unit_note says why (as the stderr line does);
#  3. a checkpoint written without the "pipedream.optimizer" key is taken as the optimizer its
#     state tensors say: an Adam checkpoint resumed with --optimizer sgd is an error naming the
#     file (its first moment is no momentum), and with --optimizer adam it resumes;
#  4. one limit on chunks per worker (SCHED_MAX_CHUNKS, 8): plan --chunks / --max-chunks,
#     simulate --chunks and train --chunks refuse 9 as a usage error naming the range.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
A="$SRC/models/lenet5.json --minibatch 16 --timeout 60"
PROF=$SRC/tests/data/profiles/lenet5_mb32.json

# 1.
"$PD" train $A --steps 4 --profile "$PROF" --calibrated-profile "$tmp/no/such/dir/cal.json" --metrics "$tmp/m.jsonl" \
    --curve "$tmp/curve.csv" >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] || fail "unwritable --calibrated-profile: exit 1 expected"
grep -q "no/such/dir/cal.json" "$tmp/err" || fail "no error naming the path: $(tail -3 "$tmp/err")"
grep -q '"steps":4,' "$tmp/out" || fail "no summary of the run that trained: $(cat "$tmp/out")"
[ -s "$tmp/m.jsonl" ] && [ -s "$tmp/curve.csv" ] || fail "no metrics or curve"
echo "ok: a failed --calibrated-profile leaves the summary, metrics and curve"

# 2.
"$PD" train $A --steps 2 >"$tmp/out" 2>"$tmp/err" || fail "train: $(tail -3 "$tmp/err")"
grep -q '"predicted_time_per_unit_ms":null,"predicted_time_per_unit_note":"no profile given"' "$tmp/out" ||
    fail "no reason beside the null prediction: $(cat "$tmp/out")"
echo "ok: a null prediction says why"

# 3.
"$PD" train $A --steps 4 --optimizer adam --lr 0.001 --checkpoint-every 4 --checkpoint-dir "$tmp/ad" >/dev/null \
    2>"$tmp/err" || fail "adam run: $(tail -3 "$tmp/err")"
f=$(ls "$tmp"/ad/ckpt-*.safetensors)
$PY - "$f" <<'PY' || fail "cannot rewrite the checkpoint"
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert h["__metadata__"].pop("pipedream.optimizer") == "adam"
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(p, "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PY
"$PD" train $A --steps 8 --optimizer sgd --resume "$tmp/ad" >/dev/null 2>"$tmp/err"
[ $? = 1 ] || fail "an Adam checkpoint without the key resumed as sgd: $(tail -3 "$tmp/err")"
grep -q "$f.*--optimizer adam" "$tmp/err" || fail "the error names neither the file nor adam: $(tail -3 "$tmp/err")"
"$PD" train $A --steps 8 --optimizer adam --lr 0.001 --resume "$tmp/ad" >"$tmp/out" 2>"$tmp/err" ||
    fail "the Adam checkpoint without the key, resumed as adam: $(tail -3 "$tmp/err")"
echo "ok: a checkpoint without the optimizer key is taken as its state says"

# 4.
for cmd in "plan $PROF --workers 2 --chunks 9" "plan $PROF --workers 2 --choose-schedule --max-chunks 9" \
           "simulate $tmp/none.json --profile $PROF --chunks 9" "train $A --chunks 9"; do
    "$PD" $cmd >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc = 2 ] || fail "$cmd: exit 2 expected, got $rc: $(tail -2 "$tmp/err")"
    grep -q "chunks expects an integer in \[[12], 8\]" "$tmp/err" || fail "$cmd: $(tail -2 "$tmp/err")"
done
echo "ok: one chunks limit (8)"
