#!/usr/bin/env bash
# plan.sh: `pipedream plan` end to end: --help, usage errors (exit 2, one line), runtime
# errors (exit 1), a chain profile over a cluster file and over --workers/--bandwidth,
# the plan JSON's fields, determinism, and the authors' vgg16 on 4 workers (3 + 1); the
# simulator's choice among candidates (our vgg16: the straight split over the partitioner's
# replicated plan), --explain, --no-simulate and predicted.simulated.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PROF=$SRC/tests/data/profiles/tiny_chain.json
CL=$SRC/tests/data/profiles/cluster_2x2.json

"$PD" plan --help >"$tmp/help" || fail "--help exit $?"
grep -q "usage: pipedream plan PROFILE" "$tmp/help" || fail "--help text"

# usage errors: exit 2 and one line "pipedream: error: ..."
expect_usage() {
    local want=$1; shift
    "$PD" plan "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
    [ $rc -eq 2 ] || fail "plan $*: exit $rc, want 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "plan $*: stderr not one line: $(cat "$tmp/err")"
    grep -q "^pipedream: error: .*$want" "$tmp/err" || fail "plan $*: '$(cat "$tmp/err")' lacks '$want'"
}
expect_usage "missing PROFILE" --workers 4
expect_usage "give --cluster" "$PROF"
expect_usage "2 levels of --workers but 1 --bandwidth" "$PROF" --workers 4,4 --bandwidth 1e9
expect_usage "2 levels of --workers but 0 --bandwidth" "$PROF" --workers 4,4
expect_usage "bandwidth must be > 0" "$PROF" --workers 4 --bandwidth 0
expect_usage "expects an integer" "$PROF" --workers 4,x --bandwidth 1e9,1e9
expect_usage "unknown kind" "$PROF" --workers 4 --cost-model fast
expect_usage "unknown option" "$PROF" --workers 4 --bogus
expect_usage "not both" "$PROF" --cluster "$CL" --workers 4

# runtime errors: exit 1
expect_fail() {
    local want=$1; shift
    "$PD" plan "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?
    [ $rc -eq 1 ] || fail "plan $*: exit $rc, want 1"
    grep -q "^pipedream: error: .*$want" "$tmp/err" || fail "plan $*: '$(cat "$tmp/err")' lacks '$want'"
}
expect_fail "no-such" "$tmp/no-such.json" --workers 2
printf 'node1 -- A -- forward_compute_time=-1.0, backward_compute_time=1.0, activation_size=4.0, parameter_size=0.0\n' >"$tmp/neg.txt"
expect_fail "negative or not finite" "$tmp/neg.txt" --workers 2
expect_fail "no feasible plan" "$PROF" --workers 8 --bandwidth 1e9 --straight
expect_fail "no feasible plan" "$PROF" --workers 4 --memory-limit 1000
echo '{"levels": [{"workers": 2, "bandwidth": 0}]}' >"$tmp/bad_cluster.json"
expect_fail "bandwidth" "$PROF" --cluster "$tmp/bad_cluster.json"

# a cluster file: 2 servers x 2 workers
"$PD" plan "$PROF" --cluster "$CL" -o "$tmp/a.json" >"$tmp/out1" 2>"$tmp/err" || fail "plan: $(cat "$tmp/err")"
for w in "stage" "replicas" "bottleneck" "single worker" "speedup over one worker" "over data parallelism" "NOAM"; do
    grep -q "$w" "$tmp/out1" || fail "table lacks '$w'"
done
flat() { tr -d ' \t\n' <"$1"; }   # JSON without whitespace, for grep
# the simulator overlaps a replicated stage's all-reduce with its backward, as the runtime does
# (gradient buckets), and so does the DP's overlapped variant: data parallelism on the 4 workers wins
grep -q "^choice: planner, all-reduce overlapped" "$tmp/out1" || fail "choice: $(grep '^choice' "$tmp/out1")"
for k in '"format":"pipedream-plan"' '"stages":[' '"ranks":[' '"noam":1' '"pipeline_s":' '"speedup_over_data_parallel":' \
    '"profile_crc32":"' '"kind":"ours"' '"memory_limit":16000000000' '"levels":['; do
    flat "$tmp/a.json" | grep -qF "$k" || fail "plan JSON lacks $k"
done
# deterministic: same command, same bytes
"$PD" plan "$PROF" --cluster "$CL" -o "$tmp/b.json" >"$tmp/out2" || fail "second run"
cmp -s "$tmp/a.json" "$tmp/b.json" || fail "plan JSON differs between runs"
diff <(grep -v "^wrote" "$tmp/out1") <(grep -v "^wrote" "$tmp/out2") >/dev/null || fail "table differs between runs"

# --workers/--bandwidth, both cost models, options
"$PD" plan "$PROF" --workers 2,2 --bandwidth 1e10,1.25e9 --cost-model pipedream --activation-compression 1 \
    -o "$tmp/c.json" >/dev/null || fail "pipedream model"
flat "$tmp/c.json" | grep -qF '"kind":"pipedream"' || fail "cost model not recorded"
flat "$tmp/c.json" | grep -qF '"activation_compression":1,' || fail "ratio not recorded"
"$PD" plan "$PROF" --workers 3 --straight --allow-idle --overlap-allreduce -o "$tmp/d.json" >"$tmp/out" ||
    fail "straight"
flat "$tmp/d.json" | grep -qF '"straight":true' || fail "straight not recorded"
flat "$tmp/d.json" | grep -qF '"overlap_allreduce":true' || fail "overlap not recorded"

# the authors' vgg16, README example: 3 + 1
VGG=$SRC/tests/data/pipedream-profiles/vgg16/graph.txt
"$PD" plan "$VGG" --workers 4 --bandwidth 1e9 --activation-compression 1 --cost-model pipedream \
    -o "$tmp/vgg.json" >"$tmp/out" || fail "vgg16"
grep -q "predicted time per minibatch: 205.520896 ms" "$tmp/out" || fail "vgg16 value: $(cat "$tmp/out")"
reps=$(flat "$tmp/vgg.json" | grep -o '"replicas":[0-9]*' | tr -dc '0-9\n' | tr '\n' ' ')
[ "$reps" = "3 1 " ] || fail "vgg16 replicas '$reps', want '3 1 '"
flat "$tmp/vgg.json" | grep -qF '"noam":2' || fail "vgg16 noam"
# interleaved on the authors' vgg16, 8 workers at 100 GB/s: the planner chooses 4 pipelines of 2
# workers (replica j of stage i on rank (i mod 2) 4 + j), predicted faster than the one-replica
# plan --straight forces (16 stages on 8 workers); both written plans load and simulate
"$PD" plan "$VGG" --workers 8 --bandwidth 1e11 --chunks 2 -o "$tmp/il.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "plan --chunks 2: $(cat "$tmp/err")"
grep -qF "interleaved: 4 pipelines of 2 workers, 2 chunks per worker" "$tmp/out" || fail "--chunks 2: $(cat "$tmp/out")"
ranks=$(flat "$tmp/il.json" | grep -o '"ranks":\[[0-9,]*\]' | tr '\n' ' ')
[ "$ranks" = '"ranks":[0,1,2,3] "ranks":[4,5,6,7] "ranks":[0,1,2,3] "ranks":[4,5,6,7] ' ] || fail "--chunks 2 ranks: $ranks"
"$PD" plan "$VGG" --workers 8 --bandwidth 1e11 --chunks 2 --straight -o "$tmp/ils.json" >"$tmp/out.s" 2>"$tmp/err" ||
    fail "plan --chunks 2 --straight: $(cat "$tmp/err")"
reps=$(flat "$tmp/ils.json" | grep -o '"replicas":[0-9]*' | sort -u | tr '\n' ' ')
[ "$reps" = '"replicas":1 ' ] || fail "--chunks 2 --straight: replicas $reps"
[ "$(flat "$tmp/ils.json" | grep -o '"replicas"' | wc -l)" -eq 16 ] || fail "--chunks 2 --straight: not 16 stages"
t=$(grep -o 'predicted time per minibatch: [0-9.]*' "$tmp/out" | grep -o '[0-9.]*$')
ts=$(grep -o 'predicted time per minibatch: [0-9.]*' "$tmp/out.s" | grep -o '[0-9.]*$')
python3 -c "import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))" "$t" "$ts" ||
    fail "--chunks 2: 4 pipelines predicted $t ms, not faster than one ($ts ms)"
# --pipelines 2 forces 2 pipelines of 4 workers; refused without --chunks, with --straight, and
# where the pipelines do not split the workers
"$PD" plan "$VGG" --workers 8 --bandwidth 1e11 --chunks 2 --pipelines 2 -o "$tmp/il2.json" >"$tmp/out.2" 2>"$tmp/err" ||
    fail "plan --chunks 2 --pipelines 2: $(cat "$tmp/err")"
grep -qF "interleaved: 2 pipelines of 4 workers, 2 chunks per worker" "$tmp/out.2" || fail "--pipelines 2: $(cat "$tmp/out.2")"
[ "$(flat "$tmp/il2.json" | grep -o '"replicas":2' | wc -l)" -eq 8 ] || fail "--pipelines 2: not 8 stages of 2 replicas"
expect_usage "--pipelines goes with --chunks" "$VGG" --workers 8 --pipelines 2
for bad in "--pipelines 3" "--pipelines 8" "--pipelines 2 --straight"; do
    "$PD" plan "$VGG" --workers 8 --chunks 2 $bad -o "$tmp/bad.json" >/dev/null 2>"$tmp/err" && fail "plan --chunks 2 $bad succeeded"
    grep -q "pipelines" "$tmp/err" || fail "plan --chunks 2 $bad: $(cat "$tmp/err")"
done
for f in il ils il2; do
    "$PD" simulate "$tmp/$f.json" --profile "$VGG" --minibatches 2 >"$tmp/sim.out" 2>"$tmp/err" ||
        fail "simulate $f: $(cat "$tmp/err")"
    grep -q "^schedule interleaved: 2 minibatches x 8 micro-batches, 8 workers" "$tmp/sim.out" ||
        fail "simulate $f: $(head -2 "$tmp/sim.out")"
done
# the simulator's choice: our vgg16 at 1.196e8 B/s on 2 cores
OURS=$SRC/tests/data/profiles/vgg16_mb64.json
expect_usage "--explain needs" "$OURS" --workers 4 --explain --no-simulate
expect_usage "--explain and --no-simulate go with" "$OURS" --workers 4 --choose-schedule --explain
"$PD" plan "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --explain -o "$tmp/ours.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "plan --explain: $(cat "$tmp/err")"
cp "$tmp/out" "$tmp/out.explain"
for w in "candidates simulated (1f1b): " "faster than the planner's own plan" "simulated (1f1b): " "why (per minibatch" "runner-up (" \
    "the planner's own plan ("; do
    grep -qF "$w" "$tmp/out" || fail "plan --explain lacks '$w': $(cat "$tmp/out")"
done
grep -q '^  \*1 ' "$tmp/out" || fail "the choice is not marked first"
flat "$tmp/ours.json" | grep -qF '"simulated":{"schedule":"1f1b","microbatches":1,"time_per_minibatch_s":' ||
    fail "plan JSON lacks predicted.simulated"
reps=$(flat "$tmp/ours.json" | grep -o '"replicas":[0-9]*' | tr -dc '0-9\n' | tr '\n' ' ')
[ "$reps" = "1 1 1 1 " ] || fail "ours: replicas '$reps', want the straight split"
"$PD" plan "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --no-simulate -o "$tmp/raw.json" >"$tmp/out" || fail "--no-simulate"
grep -q "candidates" "$tmp/out" && fail "--no-simulate printed candidates"
flat "$tmp/raw.json" | grep -qF '"simulated"' && fail "--no-simulate recorded a simulated figure"
reps=$(flat "$tmp/raw.json" | grep -o '"replicas":[0-9]*' | tr -dc '0-9\n' | tr '\n' ' ')
[ "$reps" = "2 1 1 " ] || fail "ours --no-simulate: replicas '$reps', want the partitioner's 2 1 1"
# --pick K writes the K-th listed candidate: the partitioner's own row, as --no-simulate wrote it
k=$(awk '$2 == "planner" && $1 ~ /^[0-9]+$/ { print $1 }' "$tmp/out.explain")
[ -n "$k" ] || fail "no planner row in: $(cat "$tmp/out.explain")"
"$PD" plan "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --pick "$k" -o "$tmp/pick.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "--pick $k: $(cat "$tmp/err")"
grep -qE "^  >$k +planner " "$tmp/out" || fail "--pick $k: the row is not marked: $(cat "$tmp/out")"
grep -qF "picked: candidate $k (planner), " "$tmp/out" || fail "--pick $k: no picked line: $(cat "$tmp/out")"
reps=$(flat "$tmp/pick.json" | grep -o '"replicas":[0-9]*' | tr -dc '0-9\n' | tr '\n' ' ')
[ "$reps" = "2 1 1 " ] || fail "--pick $k: replicas '$reps', want the partitioner's 2 1 1"
expect_usage "only" "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --pick 100000000
expect_usage "--pick takes a candidate" "$OURS" --workers 4 --pick 2 --no-simulate
# --core-efficiency E goes into the plan's cluster; with 2 cores shared by 4 workers the plan's
# simulated time rises (each core slower while both compute); outside (0, 1]: a usage error
"$PD" plan "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --straight -o "$tmp/ce1.json" >"$tmp/ce1.out" 2>"$tmp/err" ||
    fail "--cores 2: $(cat "$tmp/err")"
"$PD" plan "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --core-efficiency 0.8 --straight -o "$tmp/ce.json" >"$tmp/ce.out" 2>"$tmp/err" ||
    fail "--core-efficiency 0.8: $(cat "$tmp/err")"
flat "$tmp/ce.json" | grep -q '"core_efficiency":0.8' || fail "--core-efficiency: not in the plan's cluster"
t1=$(grep -m1 -o '^simulated (1f1b): [0-9.]*' "$tmp/ce1.out" | grep -o '[0-9.]*$')
t2=$(grep -m1 -o '^simulated (1f1b): [0-9.]*' "$tmp/ce.out" | grep -o '[0-9.]*$')
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); assert a < b <= a / 0.8 * 1.000001, (a, b)" "$t1" "$t2" ||
    fail "--core-efficiency 0.8: simulated $t2 ms against $t1 without"
expect_usage "core-efficiency" "$OURS" --workers 4 --bandwidth 1.196e8 --cores 2 --core-efficiency 1.5
# A link's latency stalls 1f1b at NOAM depth (4 units at stage 0 of 4): the plan records the
# smallest depth whose simulated time is within 3 % of the best (schedule.inflight), none without
# latency, a deeper one at 20 ms one way than at 5 ms; simulate runs the plan's depth, faster
# than NOAM (--schedule 1f1b)
for lat in 0 0.005 0.02; do
    cat >"$tmp/lat$lat.json" <<EOF
{"format": "pipedream-cluster", "version": 1, "levels": [{"workers": 4, "bandwidth": 1e9, "latency": $lat}], "memory_per_worker": 0}
EOF
    "$PD" plan "$PROF" --cluster "$tmp/lat$lat.json" --straight -o "$tmp/plat$lat.json" >"$tmp/plat$lat.out" 2>"$tmp/err" ||
        fail "plan at latency $lat: $(cat "$tmp/err")"
done
python3 - "$tmp" <<'PY' || fail "in-flight depth against latency"
import json, sys
d = {lat: json.load(open(f"{sys.argv[1]}/plat{lat}.json")).get("schedule", {}).get("inflight", 0) for lat in ("0", "0.005", "0.02")}
assert d["0"] == 0 and 4 < d["0.005"] < d["0.02"], d
PY
grep -q "^in flight: [0-9]* units at stage 0 (NOAM 4" "$tmp/plat0.02.out" || fail "plan: no in-flight line at 20 ms"
grep -q "^in flight" "$tmp/plat0.out" && fail "plan: an in-flight depth without latency"
"$PD" simulate "$tmp/plat0.02.json" --profile "$PROF" >"$tmp/sdepth" 2>"$tmp/err" || fail "simulate the deep plan: $(cat "$tmp/err")"
grep -q "units in flight" "$tmp/sdepth" || fail "simulate: the plan's depth not taken"
"$PD" simulate "$tmp/plat0.02.json" --profile "$PROF" --schedule 1f1b --microbatches 1 >"$tmp/snoam" 2>"$tmp/err" ||
    fail "simulate at NOAM: $(cat "$tmp/err")"
python3 - "$tmp/sdepth" "$tmp/snoam" <<'PY' || fail "simulate: the plan's depth is not faster than NOAM"
import re, sys
t = [float(re.search(r"time per minibatch ([0-9.e-]+) s", open(f).read()).group(1)) for f in sys.argv[1:]]
assert t[0] < t[1] * 0.9, t
PY
echo "plan.sh: all passed"
