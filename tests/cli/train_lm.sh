#!/usr/bin/env bash
# train_lm.sh: a language model through the pipeline runtime (--text): a tiny GPT (two blocks)
# on a generated text, cut into 4 stages. A flushed schedule (1f1b-flush, 2 micro-batches)
# ends where one-worker training ends up to summation order; 1f1b over MPI equals 1f1b on
# threads bitwise; the loss is over every position (nats per byte).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$tmp/t.txt" <<'PY'
import random, sys
random.seed(7)
words = "the of and to in that he shall unto for his i a lord they be is him not them it with all".split()
with open(sys.argv[1], "w") as f:
    for _ in range(3000):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 12))) + ".\n")
PY
B='[{"type": "layernorm", "features": 32}, {"type": "attention", "dim": 32, "heads": 2, "causal": true}],
   [{"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 64}, {"type": "gelu", "approximate": "tanh"},
    {"type": "dense", "in": 64, "out": 32}]'
cat >"$tmp/gpt.json" <<JSON
{"name": "gpt-tiny", "input": [16],
 "layers": [{"type": "embed", "vocab": 256, "dim": 32, "positions": 16},
            {"type": "block", "steps": [$B]}, {"type": "block", "steps": [$B]},
            {"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 256}]}
JSON
plan "$tmp/p4.json" 5 gpt-tiny "0" "1" "2" "3, 4"
A="--text $tmp/t.txt --steps 30 --minibatch 8 --optimizer adam --lr 1e-3"
"$PD" train "$tmp/gpt.json" $A >"$tmp/one.out" 2>"$tmp/one.err" || fail "one worker: $(tail -3 "$tmp/one.err")"
"$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2 \
    >"$tmp/fl.out" 2>"$tmp/fl.err" || fail "1f1b-flush: $(tail -3 "$tmp/fl.err")"
python3 - "$tmp/one.out" "$tmp/fl.out" <<'PY' || fail "pipelined LM differs from one worker"
import json, sys
a = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
b = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print("one worker test_loss %.6f, 1f1b-flush on 4 stages %.6f" % (a["test_loss"], b["test_loss"]))
assert 1.0 < b["test_loss"] < 5.6, b          # below uniform (ln 256 = 5.55) after 30 steps
assert abs(a["test_loss"] - b["test_loss"]) <= 2e-4 * a["test_loss"], (a["test_loss"], b["test_loss"])
PY
echo "ok: 1f1b-flush on 4 stages = one worker (up to summation order)"
# --init: the pipelined run starts from a weights file (here one-worker --save after 3 steps),
# with a fresh optimizer, exactly as continuing from a step-0 checkpoint of those weights
"$PD" train "$tmp/gpt.json" --text "$tmp/t.txt" --steps 3 --minibatch 8 --save "$tmp/w.st" >/dev/null 2>&1 ||
    fail "one worker --save"
"$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" --init "$tmp/w.st" >"$tmp/i.out" 2>"$tmp/i.err" ||
    fail "--init: $(tail -3 "$tmp/i.err")"
"$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" >"$tmp/n.out" 2>/dev/null || fail "no --init"
[ "$(crc "$tmp/i.out")" != "$(crc "$tmp/n.out")" ] || fail "--init changed nothing"
"$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" --init "$tmp/w.st" --resume "$tmp" \
    >/dev/null 2>"$tmp/x.err" && fail "--init with --resume accepted"
grep -q "exclude each other" "$tmp/x.err" || fail "--init with --resume: $(cat "$tmp/x.err")"
/usr/bin/python3 -c "import numpy" 2>/dev/null && {
    /usr/bin/python3 - "$SRC/tools" "$tmp" <<'PY' || fail "step-0 checkpoint"
import sys; sys.path.insert(0, sys.argv[1]); import pd_io
w, _ = pd_io.read_safetensors(sys.argv[2] + '/w.st')
m = sys.argv[2] + '/gpt.json'
pd_io.write_start_checkpoint(sys.argv[2] + '/ck0', m, [w[n] for n, _ in pd_io.param_names(m)], 1)
PY
    "$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" --resume "$tmp/ck0" >"$tmp/r.out" 2>/dev/null ||
        fail "resume from the step-0 checkpoint"
    [ "$(crc "$tmp/i.out")" = "$(crc "$tmp/r.out")" ] || fail "--init $(crc "$tmp/i.out") != step-0 checkpoint $(crc "$tmp/r.out")"
    echo "ok: pipelined --init = resuming a step-0 checkpoint of the same weights ($(crc "$tmp/i.out"))"
}
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    "$PD" train "$tmp/gpt.json" $A --workers 4 --plan "$tmp/p4.json" >"$tmp/t.out" 2>"$tmp/t.err" || fail "threads: $(tail -3 "$tmp/t.err")"
    timeout 300 mpirun -np 4 --oversubscribe "$PD" train "$tmp/gpt.json" $A --plan "$tmp/p4.json" >"$tmp/m.out" 2>"$tmp/m.err" ||
        fail "mpi: $(tail -3 "$tmp/m.err")"
    [ -n "$(crc "$tmp/t.out")" ] && [ "$(crc "$tmp/t.out")" = "$(crc "$tmp/m.out")" ] ||
        fail "1f1b mpi $(crc "$tmp/m.out") != threads $(crc "$tmp/t.out")"
    echo "ok: 1f1b mpi = threads ($(crc "$tmp/t.out"))"
fi
