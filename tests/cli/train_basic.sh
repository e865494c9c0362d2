#!/usr/bin/env bash
# train_basic.sh: `pipedream train`: --help, usage errors (exit 2, one line), runtime errors
# (exit 1), and a 20-step lenet5 run on one worker that prints a JSON summary and writes metrics.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$PD" train --help >"$tmp/help" || fail "--help exit $?"
grep -q "usage: pipedream train MODEL.json" "$tmp/help" || fail "--help text"

for args in "--bogus" "--lr abc" "--minibatch 0" "--optimizer rmsprop" "--epochs 1 --steps 3" "" "--steps"; do
    "$PD" train $SRC/models/lenet5.json $args >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ -z "$args" ] && { "$PD" train >"$tmp/out" 2>"$tmp/err"; rc=$?; }
    [ $rc -eq 2 ] || fail "train $args: exit $rc, want 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "train $args: stderr not one line: $(cat "$tmp/err")"
    grep -q "^pipedream: error: " "$tmp/err" || fail "train $args: $(cat "$tmp/err")"
    [ -s "$tmp/out" ] && fail "train $args: wrote to stdout"
done

# an interleaved plan (2 stages per worker) with a schedule that is not interleaved: a usage
# error naming the plan's chunks (read before the plan is freed: this case runs under ASan too)
cat >"$tmp/il.json" <<'JSON'
{"format": "pipedream-plan", "version": 1, "model": "lenet5", "profile_crc32": "00000000", "n_layers": 8,
 "cost_model": {"kind": "ours", "straight": true, "allow_idle": false, "memory_limit": 0,
                "activation_compression": 0, "overlap_allreduce": false},
 "cluster": {"levels": [{"workers": 2, "bandwidth": 1e10, "latency": 0}], "memory_per_worker": 0},
 "n_workers": 2, "noam": 2, "chunks": 2,
 "predicted": {"pipeline_s": 1, "single_worker_s": 1, "data_parallel_s": 1, "speedup_over_single": 1,
               "speedup_over_data_parallel": 1},
 "stages": [{"layers": [0, 1], "replicas": 1, "ranks": [0], "compute_s": 1, "time_s": 1},
            {"layers": [2, 3], "replicas": 1, "ranks": [1], "compute_s": 1, "time_s": 1},
            {"layers": [4, 5], "replicas": 1, "ranks": [0], "compute_s": 1, "time_s": 1},
            {"layers": [6, 7], "replicas": 1, "ranks": [1], "compute_s": 1, "time_s": 1}]}
JSON
"$PD" train $SRC/models/lenet5.json --workers 2 --plan "$tmp/il.json" --schedule 1f1b --steps 1 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] || fail "interleaved plan with --schedule 1f1b: exit $rc, want 2: $(head -5 "$tmp/err")"
grep -q "^pipedream: error: .*il.json is an interleaved plan (2 stages per worker)" "$tmp/err" ||
    fail "interleaved plan with --schedule 1f1b: $(head -5 "$tmp/err")"

# a profile the simulator cannot use for this plan (3 layers, the model has 8): the run goes on,
# and the report names the simulator's error instead of claiming no profile was given
python3 - "$tmp/prof3.json" <<'PY'
import json, sys
layers = [{"name": "l%d" % i, "type": "linear", "forward_s": 0.005, "backward_s": 0.010,
           "activation_bytes": 1e6, "parameter_bytes": 4e6} for i in range(3)]
json.dump({"format": "pipedream-profile", "version": 1, "model": "lenet5", "minibatch": 64,
           "input_bytes": 1e6, "layers": layers}, open(sys.argv[1], "w"))
PY
. "$SRC/tests/cli/lib/common.sh"
plan "$tmp/p2.json" 8 lenet5 "0, 1, 2, 3" "4, 5, 6, 7"
"$PD" train $SRC/models/lenet5.json --workers 2 --plan "$tmp/p2.json" --steps 2 --profile "$tmp/prof3.json" \
    >"$tmp/out" 2>"$tmp/err" ||
    fail "an unusable profile: exit $?: $(tail -3 "$tmp/err")"
grep -q "no profile given" "$tmp/err" && fail "an unusable profile reported as none: $(cat "$tmp/err")"
grep -q "simulator: .*the profile has 3 layers" "$tmp/err" || fail "the simulator's error is not named: $(cat "$tmp/err")"
grep -q '"predicted_time_per_unit_ms":null' "$tmp/out" || fail "a prediction from an unusable profile: $(cat "$tmp/out")"

# a run far off its prediction says where: a profile claiming a 1000th of every time
"$PD" profile $SRC/models/lenet5.json --minibatch 64 --iterations 3 -o "$tmp/prof.json" >/dev/null 2>&1 || fail "profile"
python3 - "$tmp/prof.json" "$tmp/fast.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for l in d["layers"]:
    for k in list(l):
        if k.endswith("_s") and l[k]:
            l[k] /= 1000
json.dump(d, open(sys.argv[2], "w"))
PY
"$PD" train $SRC/models/lenet5.json --workers 2 --steps 10 --profile "$tmp/fast.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "a profile far too fast: exit $?: $(tail -3 "$tmp/err")"
grep -q "^off the prediction by +[0-9]*%: furthest, stage [01] computed .* predicted (+[0-9]*%), on a CPU" "$tmp/err" ||
    fail "a run far off its prediction does not say where: $(tail -4 "$tmp/err")"
"$PD" train $SRC/models/lenet5.json --steps 2 >"$tmp/out" 2>"$tmp/err" || fail "one worker: exit $?"
grep -q "^time per unit: measured [0-9.]* ms; no prediction (no profile given)$" "$tmp/err" ||
    fail "one worker without --profile: $(tail -2 "$tmp/err")"
grep -q "off the prediction" "$tmp/err" && fail "no prediction, yet off it: $(tail -3 "$tmp/err")"

"$PD" train "$tmp/missing.json" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "missing model: want exit 1"
grep -q "missing.json" "$tmp/err" || fail "missing model: $(cat "$tmp/err")"
echo '{"name": "x", "input": [1, 28, 28], "layers": [{"type": "flatten"}, {"type": "linear", "in": 784, "out": 10, "bais": true}]}' >"$tmp/bad.json"
"$PD" train "$tmp/bad.json" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "bad model: want exit 1"
grep -q 'layer 1 (linear): unknown key "bais"' "$tmp/err" || fail "bad model: $(cat "$tmp/err")"
"$PD" train $SRC/models/lenet5.json --data "$tmp" --steps 1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "missing data: want exit 1"

"$PD" train $SRC/models/lenet5.json --steps 20 --log-every 10 --metrics "$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" ||
    fail "20 steps: exit $? $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/out")" -eq 1 ] || fail "summary is not one line"
for k in test_accuracy final_loss samples_per_s steps; do
    grep -q "\"$k\":[0-9]" "$tmp/out" || fail "summary lacks $k: $(cat "$tmp/out")"
done
grep -q '"steps":20,' "$tmp/out" || fail "steps: $(cat "$tmp/out")"
grep -q '"workers":1,"stages":1,' "$tmp/out" || fail "one worker: $(cat "$tmp/out")"
grep -q "^pipedream: training .* on 1 workers" "$tmp/err" || fail "no training line on stderr: $(cat "$tmp/err")"
grep -q $'\r' "$tmp/err" && fail "stderr is not a TTY, yet got a live progress line: $(cat "$tmp/err")"
[ "$(grep -c '^{"step":' "$tmp/m.jsonl")" -eq 2 ] || fail "metrics steps: $(cat "$tmp/m.jsonl")"
[ "$(grep -c '^{"eval_minibatches":20,' "$tmp/m.jsonl")" -eq 1 ] || fail "metrics evaluation: $(cat "$tmp/m.jsonl")"
# 20 Adam steps at lr 1e-3 already beat chance (10%) on the test set clearly
"$PD" train $SRC/models/lenet5.json --steps 20 --optimizer adam --lr 0.001 >"$tmp/out" 2>/dev/null || fail "adam"
awk -F'"test_accuracy":' '{split($2, a, ","); exit !(a[1] > 0.2)}' "$tmp/out" || fail "adam did not learn: $(cat "$tmp/out")"
# 1f1b on 2 or more workers defaults to 4 micro-batches (fewer where 4 does not divide the
# minibatch), says so and records it; --microbatches 1 is PipeDream's original
"$PD" train $SRC/models/lenet5.json --workers 2 --steps 2 >"$tmp/out" 2>"$tmp/err" || fail "2 workers: $(tail -3 "$tmp/err")"
grep -q '"microbatches":4,' "$tmp/out" || fail "default micro-batches: $(cat "$tmp/out")"
grep -q "1f1b with 4 micro-batches per minibatch.*the default" "$tmp/err" || fail "default not said: $(cat "$tmp/err")"
"$PD" train $SRC/models/lenet5.json --workers 2 --steps 2 --minibatch 30 >"$tmp/out" 2>/dev/null || fail "minibatch 30"
grep -q '"microbatches":3,' "$tmp/out" || fail "minibatch 30: 3 micro-batches expected: $(cat "$tmp/out")"
"$PD" train $SRC/models/lenet5.json --workers 2 --steps 2 --microbatches 1 >"$tmp/out" 2>"$tmp/err" || fail "--microbatches 1"
grep -q '"microbatches":1,' "$tmp/out" || fail "--microbatches 1: $(cat "$tmp/out")"
grep -q "the default" "$tmp/err" && fail "a default said where none was applied: $(cat "$tmp/err")"
"$PD" train $SRC/models/lenet5.json --steps 2 >"$tmp/out" 2>/dev/null || fail "one worker"
grep -q '"microbatches":1,' "$tmp/out" || fail "one worker: 1 micro-batch expected: $(cat "$tmp/out")"
echo PASS
