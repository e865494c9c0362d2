#!/usr/bin/env bash
# data_tokens.sh: token shards (train --tokens) made by tools/bpe.py from the KJV's Genesis. The
# tokenizer decodes its shards back to the text; gpt-mini with the shards' vocabulary (bpe.py
# model) learns on them, over 4 stages with 1f1b-flush (threads, and MPI ranks) ending on the
# one-worker run's weights byte for byte; test_loss_per_byte is test_loss over the validation targets' bytes per token
# (counted here from the tokenizer); a model whose vocabulary is too small, a damaged shard and
# a missing split are one error naming the cause. The byte-level run on the same text is
# printed beside it.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
command -v bible >/dev/null || { echo "skip: the KJV is not installed (bible-kjv)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
BPE="python3 $SRC/tools/bpe.py"
bible -f Gen1:1-Gen50:26 >"$tmp/gen.txt"
[ "$(wc -c <"$tmp/gen.txt")" -gt 100000 ] || fail "bible printed $(wc -c <"$tmp/gen.txt") bytes"
$BPE train "$tmp/gen.txt" --vocab 1024 --out "$tmp/tok.json" 2>/dev/null || fail "bpe.py train"
$BPE encode "$tmp/gen.txt" --tokenizer "$tmp/tok.json" --out "$tmp/sh" --name gen 2>/dev/null || fail "bpe.py encode"
ls "$tmp/sh/gen_train.bin" "$tmp/sh/gen_val.bin" "$tmp/sh/tokenizer.json" >/dev/null || fail "shards missing"
cat <($BPE decode "$tmp/sh/gen_train.bin" --tokenizer "$tmp/tok.json") \
    <($BPE decode "$tmp/sh/gen_val.bin" --tokenizer "$tmp/tok.json") | cmp -s - "$tmp/gen.txt" ||
    fail "the shards do not decode to the text"
$BPE model "$SRC/models/gpt-mini.json" --tokenizer "$tmp/tok.json" --out "$tmp/gm.json" || fail "bpe.py model"

# --- gpt-mini learns; 4 stages with 1f1b-flush end where one worker does --------------------------
plan "$tmp/p4.json" 7 gpt-mini-1024 "0" "1, 2" "3, 4" "5, 6"
plan "$tmp/p1.json" 7 gpt-mini-1024 "0, 1, 2, 3, 4, 5, 6"
A="$tmp/gm.json --tokens $tmp/sh --steps 24 --minibatch 8 --optimizer adam --lr 1e-3 --schedule 1f1b-flush --microbatches 2"
"$PD" train $A --workers 1 --plan "$tmp/p1.json" --save "$tmp/w1.st" --metrics "$tmp/m.jsonl" --log-every 4 \
    >"$tmp/one.out" 2>"$tmp/one.err" || fail "one worker: $(tail -3 "$tmp/one.err")"
"$PD" train $A --workers 4 --plan "$tmp/p4.json" --save "$tmp/w4.st" >"$tmp/four.out" 2>"$tmp/four.err" ||
    fail "4 stages: $(tail -3 "$tmp/four.err")"
cmp -s "$tmp/w1.st" "$tmp/w4.st" || fail "4 stages of 1f1b-flush ended on other weights than one worker"
if command -v mpirun >/dev/null; then   # the same over 4 MPI ranks
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    timeout 300 mpirun -np 4 --oversubscribe "$PD" train $A --plan "$tmp/p4.json" --save "$tmp/wm.st" >"$tmp/m.out" \
        2>"$tmp/m.err" || fail "mpi: $(tail -3 "$tmp/m.err")"
    cmp -s "$tmp/w1.st" "$tmp/wm.st" || fail "4 MPI ranks of 1f1b-flush ended on other weights than one worker"
    echo "ok: 4 MPI ranks with 1f1b-flush save the one-worker run's weights byte for byte"
fi
"$PD" train "$SRC/models/gpt-mini.json" --text "$tmp/gen.txt" --steps 24 --minibatch 8 --optimizer adam --lr 1e-3 \
    >"$tmp/bytes.out" 2>"$tmp/err" || fail "byte-level run: $(tail -3 "$tmp/err")"
python3 - "$tmp/m.jsonl" "$tmp/one.out" "$tmp/four.out" "$tmp/bytes.out" "$tmp/sh" <<'PY' || fail "token run"
import json, math, struct, sys
from array import array
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
one, four, byte = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[2:5])
tok = json.load(open(sys.argv[5] + "/tokenizer.json"))
raw = open(sys.argv[5] + "/gen_val.bin", "rb").read()
n = struct.unpack("<3i", raw[:12])[2]
val = array("H", raw[1024:])
T = 64
seqs = (n - 1) // T
bpt = sum(tok["token_bytes"][t] for t in val[1:seqs * T + 1]) / (seqs * T)
print("tokens: training loss %.3f -> %.3f nats/token; validation %.4f nats/token, %.4f nats/byte "
      "(%.3f bytes/token); the byte-level run: %.4f nats/byte"
      % (steps[0]["loss"], steps[-1]["loss"], one["test_loss"], one["test_loss_per_byte"], bpt, byte["test_loss"]))
assert steps[-1]["loss"] < steps[0]["loss"] - 0.5, steps
assert one["test_loss"] < math.log(1024) - 0.5, one
assert abs(one["test_loss_per_byte"] - one["test_loss"] / bpt) <= 1e-9 * one["test_loss_per_byte"], (one, bpt)
assert one["test_loss"] == four["test_loss"], (one, four)
PY
"$PD" eval "$tmp/gm.json" --weights "$tmp/w1.st" --tokens "$tmp/sh" >"$tmp/ev.json" 2>"$tmp/err" || fail "eval --tokens: $(cat "$tmp/err")"
python3 -c "
import json, sys
e = json.load(open(sys.argv[1])); s = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert abs(e['test_loss'] - s['test_loss']) <= 1e-6 * s['test_loss'] and 'test_loss_per_byte' in e, (e, s)" \
    "$tmp/ev.json" "$tmp/one.out" || fail "eval --tokens differs from train: $(cat "$tmp/ev.json")"

# --- errors ---------------------------------------------------------------------------------------
bad() {   # bad WANT-TEXT ARGS...: train fails with one error line containing the text
    local want=$1; shift
    "$PD" train "$@" --steps 1 >/dev/null 2>"$tmp/err" && fail "$*: no error"
    grep -q "error: .*$want" "$tmp/err" || fail "$*: want \"$want\": $(cat "$tmp/err")"
    [ "$(grep -c 'error' "$tmp/err")" = 1 ] || fail "$*: more than one error: $(cat "$tmp/err")"
}
bad "output (64, 256) has a vocabulary of 256, but the token shards hold token 10[0-9][0-9]: the model's vocabulary must be at least 10" \
    "$SRC/models/gpt-mini.json" --tokens "$tmp/sh"
mkdir "$tmp/b" && cp "$tmp/sh/gen_train.bin" "$tmp/b/"
bad "$tmp/b: no val shard" "$tmp/gm.json" --tokens "$tmp/b"
cp "$tmp/sh/gen_val.bin" "$tmp/b/" && printf '\x01' | dd of="$tmp/b/gen_val.bin" bs=1 seek=0 conv=notrunc 2>/dev/null
bad "gen_val.bin: magic" "$tmp/gm.json" --tokens "$tmp/b"
cp "$tmp/sh/gen_val.bin" "$tmp/b/" && truncate -s -2 "$tmp/b/gen_val.bin"
bad "gen_val.bin: the header declares" "$tmp/gm.json" --tokens "$tmp/b"
"$PD" train "$tmp/gm.json" --tokens "$tmp/sh" --text "$tmp/gen.txt" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] || fail "--tokens with --text: want a usage error: $(cat "$tmp/err")"
"$PD" train "$tmp/gm.json" --tokens "$tmp/gen.txt" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "not a directory" "$tmp/err" || fail "--tokens FILE: want a usage error: $(cat "$tmp/err")"
"$PD" train --help | grep -q -- "--tokens DIR" || fail "train --help lacks --tokens"
echo "data_tokens.sh: ok"
