#!/usr/bin/env bash
# simulate.sh: `pipedream simulate`: --help, usage errors (exit 2, one line), runtime
# errors (exit 1), and the authors' vgg16 profile planned on 4 workers and simulated with
# every schedule kind: the table, --json figures, --dump order, --svg and --trace files.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PROF=$SRC/tests/data/pipedream-profiles/vgg16/graph.txt
[ -f "$PROF" ] || fail "$PROF is missing"

"$PD" simulate --help >"$tmp/help" || fail "--help exit $?"
grep -q "usage: pipedream simulate PLAN.json --profile PROFILE" "$tmp/help" || fail "--help text"

"$PD" plan "$PROF" --workers 4 --bandwidth 1e10 --straight -o "$tmp/plan.json" >"$tmp/out" 2>"$tmp/err" ||
    fail "plan: $(cat "$tmp/err")"

for args in "--bogus" "" "$tmp/plan.json" "$tmp/plan.json --profile $PROF --schedule zigzag" \
    "$tmp/plan.json --profile $PROF --minibatches 0" "$tmp/plan.json --profile $PROF --schedule dp --microbatches 2" \
    "$tmp/plan.json --profile $PROF --schedule gpipe --vertical-sync" "$tmp/plan.json --profile" \
    "$tmp/plan.json --profile $PROF --optimizer rmsprop"; do
    "$PD" simulate $args >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || fail "simulate $args: exit $rc, want 2"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "simulate $args: stderr not one line: $(cat "$tmp/err")"
    grep -q "^pipedream: error: " "$tmp/err" || fail "simulate $args: $(cat "$tmp/err")"
    [ -s "$tmp/out" ] && fail "simulate $args: wrote to stdout"
done

"$PD" simulate "$tmp/missing.json" --profile "$PROF" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "missing plan: want exit 1"
grep -q "missing.json" "$tmp/err" || fail "missing plan: $(cat "$tmp/err")"
# 2bw with one micro-batch per minibatch cannot keep to two weight versions on 4 stages
"$PD" simulate "$tmp/plan.json" --profile "$PROF" --schedule 2bw --microbatches 1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "2bw m=1: want exit 1"
grep -q "2bw" "$tmp/err" || fail "2bw m=1: $(cat "$tmp/err")"

"$PD" simulate "$tmp/plan.json" --profile "$PROF" --minibatches 12 --microbatches 1 --dump --svg "$tmp/t.svg" --trace "$tmp/t.json" \
    >"$tmp/out" 2>"$tmp/err" || fail "1f1b: exit $? $(cat "$tmp/err")"
grep -q "^w0 s0: F0 F1 F2 F3 B0 F4 B1 F5" "$tmp/out" || fail "dump: $(head -3 "$tmp/out")"
grep -q "^w3 s3: F0 B0 F1 B1 F2 B2" "$tmp/out" || fail "dump: $(head -5 "$tmp/out")"
grep -q "^time per minibatch" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
grep -q "<svg" "$tmp/t.svg" || fail "svg"
[ "$(grep -c '<title>forward' "$tmp/t.svg")" -eq 48 ] || fail "svg: want 48 forward boxes"

# --cluster overrides the plan's: a 1000x slower network makes 1f1b slower
echo '{"levels": [{"workers": 4, "bandwidth": 1e7, "latency": 0.001}]}' >"$tmp/slow.json"
"$PD" simulate "$tmp/plan.json" --profile "$PROF" --cluster "$tmp/slow.json" --json >"$tmp/slow_out.json" 2>"$tmp/err" ||
    fail "--cluster: exit $? $(cat "$tmp/err")"
echo '{"levels": [{"workers": 4, "bandwith": 1e7}]}' >"$tmp/typo.json"
"$PD" simulate "$tmp/plan.json" --profile "$PROF" --cluster "$tmp/typo.json" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "cluster typo: want exit 1"
grep -q "bandwidth\|bandwith" "$tmp/err" || fail "cluster typo: $(cat "$tmp/err")"

for k in 1f1b gpipe 1f1b-flush 2bw dp model-parallel; do
    M=""; [ $k = 1f1b ] && M="--microbatches 1"   # PipeDream's original: a step per unit
    "$PD" simulate "$tmp/plan.json" --profile "$PROF" --schedule $k $M --json >"$tmp/$k.json" 2>"$tmp/err" ||
        fail "$k: exit $? $(cat "$tmp/err")"
done
# one python3 for every JSON check (its start-up is slow on a busy machine)
python3 - "$tmp" <<'EOF' || fail "JSON checks"
import json, sys
tmp = sys.argv[1]
t = json.load(open(tmp + "/t.json"))
n = sum(e["ph"] == "X" and e["cat"] == "compute" for e in t["traceEvents"])
assert n == 96, "trace: %d compute events, want 96" % n
res = {}
for k in ["1f1b", "gpipe", "1f1b-flush", "2bw", "dp", "model-parallel"]:
    d = json.load(open("%s/%s.json" % (tmp, k)))
    res[k] = d
    assert d["schedule"] == k, d["schedule"]
    assert d["time_per_minibatch_s"] > 0 and d["samples_per_s"] >= 0, k
    assert 0 <= d["bubble_fraction"] < 1, k
    w = d["per_worker"]
    assert len(w) == 4, k
    assert all(x["peak_memory_bytes"] > 0 for x in w if x["stage"] >= 0), k
    if k == "1f1b":
        assert d["stage_warmup"] == [4, 3, 2, 1], d["stage_warmup"]
        assert d["stage_versions_alive"] == [4, 3, 2, 1], d["stage_versions_alive"]
    if k in ("gpipe", "1f1b-flush", "dp", "model-parallel"):
        assert max(d["stage_versions_alive"]) == 1, k
    if k == "2bw":
        assert max(d["stage_versions_alive"]) <= 2, k
    if k == "dp":
        assert d["stages"] == 1 and all(x["stage"] == 0 for x in w), k
# pipelining is faster than model parallelism on the same plan
a, b = res["1f1b"]["time_per_minibatch_s"], res["model-parallel"]["time_per_minibatch_s"]
assert a < 0.5 * b, (a, b)
slow = json.load(open(tmp + "/slow_out.json"))["time_per_minibatch_s"]
assert slow > 1.5 * a, (slow, a)
EOF
# cores: 4 workers sharing 2 cores (the same plan, --cores 2) share them as they compute
# (docs/explanation/simulator.md, "Cores"). Under model-parallel one worker computes at a time:
# nothing changes. Under 1f1b they compute at once: slower, by at most 2x, and no faster than
# the machine's two cores can do the compute of a minibatch.
# The same plan: the dynamic program's, which does not see the cores (--no-simulate; the
# simulator's choice would see them and may choose another split)
"$PD" plan "$PROF" --workers 4 --bandwidth 1e10 --straight --no-simulate -o "$tmp/plan1c.json" >/dev/null 2>"$tmp/err" ||
    fail "plan --no-simulate: $(cat "$tmp/err")"
"$PD" plan "$PROF" --workers 4 --bandwidth 1e10 --straight --no-simulate --cores 2 -o "$tmp/plan2c.json" >/dev/null 2>"$tmp/err" ||
    fail "plan --cores: $(cat "$tmp/err")"
tr -d ' \t\n' <"$tmp/plan2c.json" | grep -q '"cores_per_machine":2' || fail "cores not in the plan"
for k in model-parallel 1f1b; do
    for c in 1 2; do
        "$PD" simulate "$tmp/plan${c}c.json" --profile "$PROF" --schedule $k --json >"$tmp/$k-c$c.json" 2>"$tmp/err" ||
            fail "simulate $k, plan$c: $(cat "$tmp/err")"
    done
done
python3 - "$tmp" <<'PY' || fail "cores"
import json, sys
ld = lambda k, c: json.load(open("%s/%s-c%d.json" % (sys.argv[1], k, c)))
busy = lambda d: [x["busy_fraction"] * d["makespan_s"] for x in d["per_worker"]]
a, b = ld("model-parallel", 2), ld("model-parallel", 1)
ta, tb = a["time_per_minibatch_s"], b["time_per_minibatch_s"]
print("model-parallel, 4 workers: %.6f s per minibatch on 2 cores, %.6f s on 4" % (ta, tb))
assert abs(ta - tb) <= 1e-6 * tb, (ta, tb)
for x, y in zip(busy(a), busy(b)):
    assert abs(x - y) <= 5e-5 * y, (x, y)   # busy fractions are printed to 6 digits
a, b = ld("1f1b", 2), ld("1f1b", 1)
ta, tb = a["time_per_minibatch_s"], b["time_per_minibatch_s"]
work = sum(busy(b)) / b["minibatches"]   # compute per minibatch at full speed
print("1f1b, 4 workers: %.6f s per minibatch on 2 cores, %.6f s on 4, %.6f s of compute each" % (ta, tb, work))
assert tb < ta <= 2 * tb * (1 + 1e-6), (ta, tb)
assert ta >= work / 2 * (1 - 1e-3), (ta, work)
PY
# --unit-batch: units of N samples as train runs them. Our profile (minibatch 32, with small-batch
# times): 32 changes nothing; 8 takes less time per unit but more than a quarter (each time's
# fixed part stays); a profile without a minibatch (graph.txt) is refused.
OURS=$SRC/tests/data/profiles/lenet5_mb32.json
"$PD" plan "$OURS" --workers 2 --bandwidth 1e7 --straight -o "$tmp/pl32.json" >/dev/null 2>"$tmp/err" || fail "plan lenet5: $(cat "$tmp/err")"
for u in 0 32 8; do
    extra=""; [ $u -gt 0 ] && extra="--unit-batch $u"
    "$PD" simulate "$tmp/pl32.json" --profile "$OURS" --microbatches 1 $extra --json >"$tmp/u$u.json" 2>"$tmp/err" || fail "--unit-batch $u: $(cat "$tmp/err")"
done
python3 - "$tmp/u0.json" "$tmp/u32.json" "$tmp/u8.json" <<'PY' || fail "--unit-batch"
import json, sys
d0, d32, d8 = (json.load(open(f)) for f in sys.argv[1:])
t0, t32, t8 = (d["time_per_minibatch_s"] for d in (d0, d32, d8))
assert t0 == t32, (t0, t32)
assert t32 / 4 < t8 < t32, (t8, t32)
assert abs(d8["samples_per_s"] - 8 / t8) <= 1e-3 * d8["samples_per_s"], d8["samples_per_s"]
print("lenet5 on 2 workers: %.6g s per unit of 32, %.6g of 8" % (t32, t8))
PY
"$PD" simulate "$tmp/plan.json" --profile "$PROF" --unit-batch 16 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "--unit-batch with graph.txt: want exit 1"
grep -q "unit-batch needs a profile" "$tmp/err" || fail "--unit-batch with graph.txt: $(cat "$tmp/err")"
echo OK
