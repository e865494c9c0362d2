#!/usr/bin/env bash
# codec_plan.sh: the planner and the simulator know the wire codecs. `plan --wire auto` picks per
# boundary the first allowed codec whose bytes cross the link in the slowest stage's time: fp32
# on a fast link, the most compressing one on a slow link, nothing outside --wire-allow; the plan
# file records the codecs, `simulate` costs them, and `train` with that plan sends them: the
# simulator's bytes across each boundary equal the run's (int4: no row length to guess), the
# summary names each boundary's codecs, and a slow link makes the simulated run slower with
# fp32 than with int4.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
PY=python3
. "$SRC/tests/cli/lib/gpt_tiny.sh"
gpt_tiny_setup 13
"$PD" profile "$tmp/gpt.json" --minibatch 8 --iterations 2 -o "$tmp/prof.json" >/dev/null 2>&1 || fail "profile"
wires() { python3 -c 'import json, sys; print(" ".join(b["act"] + "/" + b["grad"] for b in json.load(open(sys.argv[1]))["wire"]))' "$1"; }
pl() {   # pl OUT BANDWIDTH ARGS...
    local out=$1 bw=$2; shift 2
    "$PD" plan "$tmp/prof.json" --workers 4 --bandwidth "$bw" --straight "$@" -o "$out" >"$out.txt" 2>&1 ||
        fail "plan $*: $(tail -3 "$out.txt")"
}
pl "$tmp/fast.json" 1e13 --wire auto
[ "$(wires "$tmp/fast.json")" = "fp32/fp32 fp32/fp32 fp32/fp32" ] || fail "fast link: $(wires "$tmp/fast.json")"
pl "$tmp/slow.json" 1e4 --wire auto --wire-allow fp32,int8,int4
[ "$(wires "$tmp/slow.json")" = "int4/int4 int4/int4 int4/int4" ] || fail "slow link: $(wires "$tmp/slow.json")"
grep -q "^wire: boundary 0 int4 / int4" "$tmp/slow.json.txt" || fail "plan's wire line: $(cat "$tmp/slow.json.txt")"
# none allowed passes: the fewest bytes among the allowed; gradients never delta
pl "$tmp/slow8.json" 1e4 --wire auto --wire-allow fp32,int8,delta
[ "$(wires "$tmp/slow8.json")" = "delta/int8 delta/int8 delta/int8" ] || fail "int8 only: $(wires "$tmp/slow8.json")"
pl "$tmp/u8.json" 1e10 --wire int8 --wire-grad bf16
[ "$(wires "$tmp/u8.json")" = "int8/bf16 int8/bf16 int8/bf16" ] || fail "--wire int8: $(wires "$tmp/u8.json")"
"$PD" plan "$tmp/prof.json" --workers 4 --bandwidth 1e6 --wire auto --wire-allow fp32,fp8 >"$tmp/e" 2>&1 &&
    fail "--wire-allow fp8 accepted"
grep -q "unknown codec \"fp8\"" "$tmp/e" || fail "--wire-allow fp8: $(cat "$tmp/e")"

# the simulator's bytes and the run's, per boundary and direction
"$PD" simulate "$tmp/slow.json" --profile "$tmp/prof.json" --schedule 1f1b --microbatches 1 --minibatches 6 --json \
    >"$tmp/sim.json" || fail "simulate"
"$PD" simulate "$tmp/slow.json" --profile "$tmp/prof.json" --schedule 1f1b --microbatches 1 --minibatches 6 --json \
    --wire fp32 >"$tmp/sim32.json" || fail "simulate --wire fp32"
"$PD" train "$tmp/gpt.json" --text "$tmp/t.txt" --steps 6 --minibatch 8 --microbatches 1 --plan "$tmp/slow.json" \
    --workers 4 >"$tmp/run.out" 2>"$tmp/run.err" || fail "train: $(tail -3 "$tmp/run.err")"
python3 - "$tmp" <<'PY' || fail "the simulator's bytes or the run's summary"
import json, sys
d = sys.argv[1]
sim, sim32 = json.load(open(d + "/sim.json")), json.load(open(d + "/sim32.json"))
run = json.loads(open(d + "/run.out").read().strip().splitlines()[-1])
assert run["wire"] == "plan" and run["wire_grad"] == "plan", run
for s, r in zip(sim["boundaries"], run["boundaries"]):
    assert r["wire"] == "int4" and r["wire_grad"] == "int4", r
    assert s["act_bytes"] == r["act_bytes"] and s["grad_bytes"] == r["grad_bytes"], (s, r)
    assert abs(s["act_ratio"] - r["act_ratio"]) < 1e-4, (s, r)
assert abs(sim["wire_ratio"] - run["wire_ratio"]) < 1e-4 and run["wire_ratio"] > 7, (sim["wire_ratio"], run["wire_ratio"])
assert sim32["wire_ratio"] == 1 and sim32["time_per_unit_s"] > 2 * sim["time_per_unit_s"], (sim32, sim)
print("int4: %.3g x fewer bytes; simulated %.3g ms per unit (fp32: %.3g)"
      % (run["wire_ratio"], 1e3 * sim["time_per_unit_s"], 1e3 * sim32["time_per_unit_s"]))
PY
[ $? = 0 ] || exit 1
"$PD" simulate "$tmp/slow.json" --profile "$tmp/prof.json" --wire fp8 >"$tmp/e" 2>&1 && fail "simulate --wire fp8 accepted"
grep -q "unknown \"fp8\"" "$tmp/e" || fail "simulate --wire fp8: $(cat "$tmp/e")"
echo PASS
