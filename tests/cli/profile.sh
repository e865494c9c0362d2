#!/usr/bin/env bash
# profile.sh: `pipedream profile`: usage errors, --rounds: the profile written is the
# median round by the sum of its layers' times (each round's total is printed on stderr; 4
# rounds: the lower middle), or with --keep fastest the round of the least time, and
# --small-batch: the layers' times at a second, smaller batch (default B/4; 0: none).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PD" profile --help | grep -q -- "--rounds R" || fail "--help lacks --rounds"
for bad in 0 x -2; do
    err=$("$PD" profile "$SRC/models/lenet5.json" --rounds "$bad" -o "$tmp/x.json" 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || fail "--rounds $bad: exit $rc"
    echo "$err" | grep -q "^pipedream: error: --rounds" || fail "--rounds $bad: $err"
done
[ ! -e "$tmp/x.json" ] || fail "a profile was written after a usage error"
for keep in median fastest; do   # median: the default
    flag=""; [ $keep = fastest ] && flag="--keep fastest"
    "$PD" profile "$SRC/models/lenet5.json" --minibatch 8 --iterations 3 --warmup 1 --rounds 4 $flag \
        -o "$tmp/p.$keep.json" >/dev/null 2>"$tmp/err.$keep" || fail "profile: $(tail -2 "$tmp/err.$keep")"
    [ "$(grep -c '^profile round [1-4]/4: ' "$tmp/err.$keep")" -eq 4 ] || fail "not 4 round lines: $(cat "$tmp/err.$keep")"
    python3 - "$tmp/p.$keep.json" "$tmp/err.$keep" $keep <<'PY' || fail "the profile is not the $keep round"
import json, re, sys
p = json.load(open(sys.argv[1]))
assert p["rounds"] == 4 and p["iterations"] == 3 and p["round_kept"] == sys.argv[3], (p.get("rounds"), p["iterations"])
kept = 1e3 * sum(l["forward_s"] + l["backward_s"] for l in p["layers"])
rounds = [float(m) for m in re.findall(r"^profile round \d+/4: ([0-9.]+) ms", open(sys.argv[2]).read(), re.M)]
assert len(rounds) == 4 and all(r > 0 for r in rounds), rounds
want = sorted(rounds)[1] if sys.argv[3] == "median" else min(rounds)
assert abs(kept - want) <= 1e-5 * want + 1e-6, (kept, rounds)
print("%s: kept %.6f of rounds %s" % (sys.argv[3], kept, rounds))
PY
done
err=$("$PD" profile "$SRC/models/lenet5.json" --keep slowest -o "$tmp/x.json" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && echo "$err" | grep -q "^pipedream: error: --keep expects median or fastest" || fail "--keep slowest: $rc $err"
cp "$tmp/p.median.json" "$tmp/p.json"
sed 's/"round_kept":[^,]*,/"round_kept": "slowest",/' "$tmp/p.json" >"$tmp/bad.json"
err=$("$PD" plan "$tmp/bad.json" --workers 2 -o "$tmp/x.plan.json" 2>&1 >/dev/null) && fail "a profile with round_kept \"slowest\" was read"
echo "$err" | grep -q 'round_kept.*expected "median" or "fastest"' || fail "round_kept slowest: $err"
# the small batch: by default a quarter of the minibatch, every layer timed at it too (> 0);
# --small-batch 0: none written; not below the minibatch: a usage error
python3 - "$tmp/p.json" <<'PY' || fail "the default small batch"
import json, sys
p = json.load(open(sys.argv[1]))
assert p["minibatch"] == 8 and p["small_batch"] == 2, p.get("small_batch")
for l in p["layers"]:
    assert l["small_forward_s"] > 0 and l["small_backward_s"] > 0, l
    assert ("small_backward_input_s" in l) == ("backward_input_s" in l), l
    assert ("small_backward_weight_s" in l) == ("backward_weight_s" in l), l
assert any(l.get("small_backward_input_s", 0) + l.get("small_backward_weight_s", 0) > 0 for l in p["layers"])
PY
"$PD" profile "$SRC/models/lenet5.json" --minibatch 8 --iterations 2 --small-batch 3 -o "$tmp/s3.json" >/dev/null 2>&1 ||
    fail "--small-batch 3"
grep -q '"small_batch":[[:space:]]*3' "$tmp/s3.json" || fail "--small-batch 3 not recorded"
"$PD" profile "$SRC/models/lenet5.json" --minibatch 8 --iterations 2 --small-batch 0 -o "$tmp/s0.json" >/dev/null 2>&1 ||
    fail "--small-batch 0"
grep -q 'small_' "$tmp/s0.json" && fail "--small-batch 0 wrote small-batch times"
"$PD" profile "$SRC/models/lenet5.json" --minibatch 1 --iterations 2 -o "$tmp/m1.json" >/dev/null 2>&1 || fail "--minibatch 1"
grep -q 'small_' "$tmp/m1.json" && fail "a minibatch of one wrote small-batch times"
for bad in 8 9 -1 x; do
    err=$("$PD" profile "$SRC/models/lenet5.json" --minibatch 8 --small-batch "$bad" -o "$tmp/y.json" 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || fail "--small-batch $bad: exit $rc"
    echo "$err" | grep -q "^pipedream: error: --small-batch" || fail "--small-batch $bad: $err"
done
[ ! -e "$tmp/y.json" ] || fail "a profile was written after a --small-batch usage error"
# one round: no "rounds" key, no round lines
"$PD" profile "$SRC/models/lenet5.json" --minibatch 8 --iterations 2 -o "$tmp/q.json" >/dev/null 2>"$tmp/err2" || fail "profile"
grep -q '"rounds"' "$tmp/q.json" && fail "one round wrote a rounds key"
grep -q "profile round" "$tmp/err2" && fail "one round printed round lines"
echo PASS
