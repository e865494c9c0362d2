#!/usr/bin/env bash
# train_bench.sh: `pipedream bench`: --help, usage errors, and a tiny run printing one JSON
# line with samples_per_s, gflops and per-layer times.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
"$PD" bench --help | grep -q "usage: pipedream bench MODEL.json" || fail "--help"
err=$("$PD" bench "$SRC/models/lenet5.json" --steps x 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] || fail "bad --steps: exit $rc"
echo "$err" | grep -q "^pipedream: error: --steps expects an integer" || fail "bad --steps: $err"
"$PD" bench "$SRC/models/lenet5.json" --frobnicate >/dev/null 2>&1; [ $? -eq 2 ] || fail "unknown flag"
out=$("$PD" bench "$SRC/models/lenet5.json" --minibatch 16 --steps 2 --reps 3 --warmup 1 --layers) || fail "run: exit $?"
echo "$out"
[ "$(echo "$out" | wc -l)" -eq 1 ] || fail "not one line"
for k in samples_per_s gflops step_ms; do echo "$out" | grep -q "\"$k\": [0-9]" || fail "lacks $k"; done
echo "$out" | grep -q '"fwd_flops_per_sample": 833040' || fail "lenet5 forward FLOPs per sample"
[ "$(echo "$out" | grep -o '"fwd_ms"' | wc -l)" -eq 8 ] || fail "per-layer times"
echo PASS
