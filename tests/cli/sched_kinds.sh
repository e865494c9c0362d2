#!/usr/bin/env bash
# sched_kinds.sh: the schedules past PipeDream's from the command line. A uniform 8-layer chain
# (forward 5 ms, backward 10 ms per layer): on 4 straight stages of 2 layers, 8 micro-batches,
# `simulate` reports the bubbles 3/11 (1f1b-flush) and 1/9 (zb-h1); `plan --chunks 2` (8
# one-layer stages, 2 per worker) and `simulate --chunks 2` on an 8-stage straight plan report
# (3*30/2)/(240+45) (interleaved). --recompute, usage errors. `plan --choose-schedule` on the
# authors' vgg16 with a memory limit under 1f1b's need: a plan that fits, the runner-up and what
# was given up, the schedule recorded in the plan and used by `simulate`; an impossible limit.
# `train` (threads) runs zb-h1 and zb-h2, with and without --recompute, on mlp with a replicated
# stage: weights bitwise 1f1b-flush's (CRC-32 per stage).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$tmp/u8.json" <<'PY'
import json, sys
layers = [{"name": "l%d" % i, "type": "linear", "forward_s": 0.005, "backward_s": 0.010,
           "activation_bytes": 1e6, "parameter_bytes": 4e6} for i in range(8)]
json.dump({"format": "pipedream-profile", "version": 1, "model": "uniform8", "minibatch": 32,
           "input_bytes": 1e6, "layers": layers}, open(sys.argv[1], "w"))
PY
# the runtime executes the zb kinds: the split backward adds every gradient in 1f1b-flush's order
cat >"$tmp/mlp_plan.json" <<JSON
{"format": "pipedream-plan", "version": 1, "model": "mlp", "profile_crc32": "00000000", "n_layers": 4,
 "cost_model": {"kind": "ours", "straight": false, "allow_idle": false, "memory_limit": 0,
                "activation_compression": 0, "overlap_allreduce": false},
 "cluster": {"levels": [{"workers": 3, "bandwidth": 1e10, "latency": 0}], "memory_per_worker": 0},
 "n_workers": 3, "noam": 2,
 "predicted": {"pipeline_s": 1, "single_worker_s": 1, "data_parallel_s": 1, "speedup_over_single": 1,
               "speedup_over_data_parallel": 1},
 "stages": [{"layers": [0, 1], "replicas": 2, "ranks": [0, 1], "compute_s": 1, "time_s": 1},
            {"layers": [2, 3], "replicas": 1, "ranks": [2], "compute_s": 1, "time_s": 1}]}
JSON
crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }
want=""
for run in "1f1b-flush" "zb-h1" "zb-h2" "zb-h1 --recompute" "zb-h2 --recompute"; do
    "$PD" train "$SRC/models/mlp.json" --plan "$tmp/mlp_plan.json" --workers 3 --schedule $run --microbatches 4 \
        --steps 12 --minibatch 16 --timeout 60 >"$tmp/out" 2>"$tmp/err" || fail "train $run: $(tail -3 "$tmp/err")"
    got=$(crc "$tmp/out")
    [ -n "$got" ] || fail "train $run: no weights_crc in $(cat "$tmp/out")"
    [ -n "$want" ] || want=$got
    [ "$got" = "$want" ] || fail "train $run: weights $got, 1f1b-flush's $want"
done
echo "ok: train zb-h1, zb-h2 (and --recompute) = 1f1b-flush bitwise ($want)"
# one default number of micro-batches for a micro-batched kind: train and simulate agree on it
python3 - "$tmp/u4.json" <<'PY'
import json, sys
layers = [{"name": "l%d" % i, "type": "linear", "forward_s": 0.005, "backward_s": 0.010,
           "activation_bytes": 1e6, "parameter_bytes": 4e6} for i in range(4)]
json.dump({"format": "pipedream-profile", "version": 1, "model": "mlp", "minibatch": 32,
           "input_bytes": 1e6, "layers": layers}, open(sys.argv[1], "w"))
PY
"$PD" simulate "$tmp/mlp_plan.json" --profile "$tmp/u4.json" --schedule gpipe --json >"$tmp/sim.json" 2>"$tmp/err" ||
    fail "simulate gpipe: $(cat "$tmp/err")"
"$PD" train "$SRC/models/mlp.json" --plan "$tmp/mlp_plan.json" --workers 3 --schedule gpipe --steps 2 --minibatch 12 \
    --timeout 60 >"$tmp/out" 2>"$tmp/err" || fail "train gpipe: $(tail -3 "$tmp/err")"
python3 - "$tmp/sim.json" "$tmp/out" <<'PY' || fail "train and simulate default to different micro-batch counts"
import json, sys
sim = json.load(open(sys.argv[1]))
run = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert run["units"] // run["steps"] == sim["microbatches"], (run["units"], run["steps"], sim["microbatches"])
PY

"$PD" plan "$tmp/u8.json" --workers 4 --bandwidth 1e30 --straight -o "$tmp/p4.json" >/dev/null 2>"$tmp/err" || fail "plan: $(cat "$tmp/err")"
"$PD" plan "$tmp/u8.json" --workers 8 --bandwidth 1e30 --straight -o "$tmp/p8.json" >/dev/null 2>"$tmp/err" || fail "plan 8: $(cat "$tmp/err")"
"$PD" plan "$tmp/u8.json" --workers 4 --bandwidth 1e30 --chunks 2 -o "$tmp/p4c2.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "plan --chunks: $(cat "$tmp/err")"
grep -q "interleaved: 2 chunks per worker" "$tmp/out" || fail "plan --chunks: $(cat "$tmp/out")"
bubble() {   # FILE -> bubble_fraction
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bubble_fraction"])' "$1"
}
check() {    # NAME GOT WANT
    python3 -c 'import sys; g, w = float(sys.argv[2]), eval(sys.argv[3]); sys.exit(abs(g - w) > 1e-6)' "$@" ||
        fail "$1: bubble $2, want $3"
}
S="--profile $tmp/u8.json --microbatches 8 --minibatches 1 --json"
"$PD" simulate "$tmp/p4.json" $S --schedule 1f1b-flush >"$tmp/a.json" || fail "1f1b-flush"
check 1f1b-flush "$(bubble "$tmp/a.json")" 3/11
"$PD" simulate "$tmp/p4.json" $S --schedule zb-h1 >"$tmp/b.json" || fail "zb-h1"
check zb-h1 "$(bubble "$tmp/b.json")" 1/9
"$PD" simulate "$tmp/p4c2.json" $S --schedule interleaved >"$tmp/c.json" || fail "interleaved"
check interleaved "$(bubble "$tmp/c.json")" "(3*30/2)/(240+45)"
"$PD" simulate "$tmp/p4c2.json" $S >"$tmp/c2.json" || fail "interleaved by default on a chunked plan"
check "interleaved (default)" "$(bubble "$tmp/c2.json")" "(3*30/2)/(240+45)"
"$PD" simulate "$tmp/p8.json" $S --chunks 2 >"$tmp/d.json" || fail "--chunks 2"
check "--chunks 2" "$(bubble "$tmp/d.json")" "(3*30/2)/(240+45)"
# ZB-H1's peak activation memory is 1F1B-flush's in units in flight (warmup_0 = 4 units); per
# unit a stage holds its input and 2 layer outputs (3 MB), and zb-h1 also the output gradient
# of its first layer, kept from BI to BW for the weight pass (the second's is the received one)
python3 - "$tmp/a.json" "$tmp/b.json" <<'PY' || fail "zb-h1 memory"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
ma = max(w["activations_bytes"] for w in a["per_worker"])
mb = max(w["activations_bytes"] for w in b["per_worker"])
assert (ma, mb) == (4 * 3e6, 4 * 4e6), (ma, mb)
PY
"$PD" simulate "$tmp/p4.json" --profile "$tmp/u8.json" --schedule zb-h1 --microbatches 8 --recompute --dump >"$tmp/out" 2>"$tmp/err" ||
    fail "--recompute: $(cat "$tmp/err")"
grep -q "recomputation" "$tmp/out" || fail "--recompute summary: $(head -3 "$tmp/out")"
grep -q "^w0 s0: F0 F1 F2 F3 R0 BI0 BW0 F4 R1 BI1 BW1" "$tmp/out" || fail "--recompute dump: $(head -2 "$tmp/out")"
grep -q "^peak memory" "$tmp/out" || fail "peak memory line"

# usage errors (exit 2) and plans that do not fit the kind (exit 1)
for args in "$tmp/p4.json --profile $tmp/u8.json --schedule 1f1b --chunks 2" \
    "$tmp/p4.json --profile $tmp/u8.json --schedule dp --microbatches 4"; do
    "$PD" simulate $args >"$tmp/out" 2>"$tmp/err"
    [ $? -eq 2 ] || fail "simulate $args: want exit 2"
done
"$PD" simulate "$tmp/p4.json" --profile "$tmp/u8.json" --schedule interleaved >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "interleaved on a plain plan: want exit 1"
grep -q "V >= 2" "$tmp/err" || fail "interleaved on a plain plan: $(cat "$tmp/err")"
"$PD" simulate "$tmp/p4c2.json" --profile "$tmp/u8.json" --schedule interleaved --microbatches 6 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "interleaved, 6 micro-batches on 4 workers: want exit 1"
grep -q "multiple" "$tmp/err" || fail "interleaved M: $(cat "$tmp/err")"
"$PD" simulate "$tmp/p4c2.json" --profile "$tmp/u8.json" --schedule 1f1b >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "1f1b on a chunked plan: want exit 1"
grep -q "only under interleaved" "$tmp/err" || fail "1f1b on a chunked plan: $(cat "$tmp/err")"
"$PD" plan "$tmp/u8.json" --workers 4 --kinds zb-h1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "--kinds without --choose-schedule: want exit 2"

# the schedule search on the authors' vgg16: 1f1b on the partitioner's plan needs ~25 GB per worker
PROF=$SRC/tests/data/pipedream-profiles/vgg16/graph.txt
[ -f "$PROF" ] || fail "$PROF is missing"
"$PD" plan "$PROF" --workers 4 --bandwidth 1e10 --memory-limit 12e9 --choose-schedule -o "$tmp/ch.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "--choose-schedule: $(cat "$tmp/err")"
for w in "^choice: " "^runner-up: " "^gave up: " "does not fit\|partitioner's plan" "wrote "; do
    grep -q "$w" "$tmp/out" || fail "--choose-schedule output lacks '$w': $(cat "$tmp/out")"
done
"$PD" simulate "$tmp/ch.json" --profile "$PROF" --json >"$tmp/ch_sim.json" 2>"$tmp/err" || fail "simulate the choice: $(cat "$tmp/err")"
python3 - "$tmp/ch.json" "$tmp/ch_sim.json" <<'PY' || fail "the choice's plan and simulation"
import json, sys
plan, sim = (json.load(open(f)) for f in sys.argv[1:])
s = plan["schedule"]
assert sim["schedule"] == s["kind"] and sim["microbatches"] == s["microbatches"], (s, sim["schedule"])
assert sim["recompute"] == s["recompute"]
assert max(w["peak_memory_bytes"] for w in sim["per_worker"]) <= 12e9
PY
"$PD" plan "$PROF" --workers 4 --bandwidth 1e10 --memory-limit 1e6 --choose-schedule >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "impossible limit: want exit 1"
grep -q "no plan fits" "$tmp/err" || fail "impossible limit: $(cat "$tmp/err")"
grep -q "nothing fits" "$tmp/out" || fail "impossible limit: $(cat "$tmp/out")"
echo OK
