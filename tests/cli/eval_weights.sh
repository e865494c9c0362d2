#!/usr/bin/env bash
# eval_weights.sh: `pipedream eval` and weights files without PyTorch: `train --save` then `eval`
# gives train's test loss; a checkpoint of pipelined training (--workers 2) is a weights file:
# `eval` gives that run's test accuracy and `train --init` starts from it; usage and file errors.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
num() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" | head -1; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }

"$PD" eval --help >"$tmp/help" || fail "--help exit $?"
grep -q "usage: pipedream eval MODEL.json --weights" "$tmp/help" || fail "--help text"
for args in "" "--weights" "--bogus x" "--minibatch 0 --weights w" "--data a --text b --weights w"; do
    "$PD" eval $SRC/models/lenet5.json $args >"$tmp/out" 2>"$tmp/err"
    [ $? -eq 2 ] || fail "eval $args: want exit 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "eval $args: stderr not one line"
done

"$PD" train $SRC/models/lenet5.json --steps 30 --save "$tmp/w.safetensors" >"$tmp/tr.json" 2>"$tmp/err" ||
    fail "train --save: $(cat "$tmp/err")"
"$PD" eval $SRC/models/lenet5.json --weights "$tmp/w.safetensors" >"$tmp/ev.json" 2>"$tmp/err" || fail "eval: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/ev.json")" -eq 1 ] || fail "eval output is not one line"
a=$(num test_loss "$tmp/ev.json"); b=$(num test_loss "$tmp/tr.json")
close "$a" "$b" 1e-5 || fail "eval $a, train reported $b"
a=$(num test_accuracy "$tmp/ev.json"); b=$(num test_accuracy "$tmp/tr.json")
close "$a" "$b" 1e-4 || fail "eval accuracy $a, train reported $b"

# a pipelined run's checkpoint
"$PD" train $SRC/models/lenet5.json --workers 2 --steps 20 --checkpoint-every 10 --checkpoint-dir "$tmp/ck" \
    >"$tmp/pipe.json" 2>"$tmp/err" || fail "pipelined train: $(cat "$tmp/err")"
ck="$tmp/ck/ckpt-0000000020.safetensors"
[ -f "$ck" ] || fail "no checkpoint: $(ls "$tmp/ck")"
"$PD" eval $SRC/models/lenet5.json --weights "$ck" >"$tmp/ev2.json" 2>"$tmp/err" || fail "eval checkpoint: $(cat "$tmp/err")"
a=$(num test_accuracy "$tmp/ev2.json"); b=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$tmp/pipe.json" | tail -1)
[ -n "$b" ] || fail "no test_accuracy in the pipelined summary: $(tail -1 "$tmp/pipe.json")"
close "$a" "$b" 1e-4 || fail "eval of the checkpoint: accuracy $a, the pipelined run reported $b"
"$PD" train $SRC/models/lenet5.json --init "$ck" --steps 2 >"$tmp/out" 2>"$tmp/err" || fail "train --init ckpt: $(cat "$tmp/err")"

# errors: weights of another model, a damaged file
"$PD" eval $SRC/models/mlp.json --weights "$tmp/w.safetensors" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "weights of another model: want exit 1"
grep -q 'w.safetensors: .*layers.1.weight' "$tmp/err" || fail "another model: $(cat "$tmp/err")"
head -c 1000 "$tmp/w.safetensors" >"$tmp/cut.safetensors"
"$PD" eval $SRC/models/lenet5.json --weights "$tmp/cut.safetensors" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "truncated weights: want exit 1"
grep -q "cut.safetensors" "$tmp/err" || fail "truncated: $(cat "$tmp/err")"
echo "eval_weights.sh: ok"
