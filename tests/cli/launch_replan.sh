#!/usr/bin/env bash
# launch_replan.sh: `pipedream launch` re-plans around a host whose link slows mid-run
# (docs/howto/elastic.md, "Stragglers"), on an emulated cluster of 3 hosts at 1 Gbit/s
# (tools/cluster.sh), lenet5 on a small IDX set, one stage per host (--straight). After the
# checkpoint at minibatch 20, host 1's link (the middle stage's: both boundaries cross it) is
# shaped to 2 Mbit/s:
#  1. the pipeline's time per unit goes over the factor times its prediction, launch probes the
#     links and reports 198.18.0.2 as a straggler (a `straggler` event with its link's measured
#     rate, under a third of --bandwidth: 2 Mbit/s once the shaping holds, more when the probe
#     overlaps the change of the link's queues; and no other host's link), plans around it (a
#     `replan` event predicting at
#     least 10% less time per minibatch than the current plan on the hosts as now known), and
#     resumes from a checkpoint on the new plan (a second attempt);
#  2. the run finishes its 3000 minibatches (exit 0, summary steps), and after the re-plan its
#     time per unit (the progress lines of the last attempt) is under half of the slowest before;
#  3. nothing is left behind: no process in the hosts' namespaces or of the test.
# Exits 77 (ctest SKIP) when not root, without iproute2, python3 or mpirun, where network
# namespaces cannot be made, or when 198.18.0.0/24 is in use (another cluster is up).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
NAME=pdr$$
tmp=$(mktemp -d)
cleanup() {
    bash "$CL" down --name "$NAME" >/dev/null 2>&1; pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

"$PD" launch --hosts h --profile p --run-dir r --link-probe-bytes 10 m.json >/dev/null 2>"$tmp/e"; [ $? = 2 ] ||
    fail "--link-probe-bytes 10: exit 2 expected"
grep -q -- "--link-probe-bytes" "$tmp/e" || fail "--link-probe-bytes message: $(cat "$tmp/e")"
echo "ok: usage errors"

. "$SRC/tests/cli/lib/cluster3.sh"
cluster3_up
"$PD" profile "$SRC/models/lenet5.json" --minibatch 32 --iterations 5 -o "$tmp/prof.json" >/dev/null 2>&1 || fail "profile"
printf '198.18.0.1\n198.18.0.2\n198.18.0.3\n' >"$tmp/hosts"
ev() { python3 -c 'import json,sys; print(eval(sys.argv[2], {"E": [json.loads(l) for l in open(sys.argv[1])]}))' "$@"; }

timeout 300 "$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/run" --straight \
    --checkpoint-every 10 --events "$tmp/run.jsonl" --mpirun-args "$MPIARGS" --straggler-factor 3 \
    --link-probe-bytes 200000 "$SRC/models/lenet5.json" -- --data "$tmp/d" --minibatch 32 --steps 3000 --timeout 30 \
    >"$tmp/run.out" 2>"$tmp/run.err" &
pid=$!
for _ in $(seq 600); do
    [ -e "$tmp/run/ckpt/ckpt-0000000020.safetensors" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
[ -e "$tmp/run/ckpt/ckpt-0000000020.safetensors" ] || fail "no checkpoint at minibatch 20: $(grep -v '^unit' "$tmp/run.err" | tail -5)"
bash "$CL" up 3 --rate 1gbit --host-rate 1=2mbit --name "$NAME" >"$tmp/slow" 2>&1 || fail "slowing host 1: $(cat "$tmp/slow")"
wait $pid
rc=$?
[ $rc = 0 ] || fail "launch exited $rc: $(grep -v '^unit' "$tmp/run.err" | tail -15)"
grep -q '"steps":3000,' "$tmp/run.out" || fail "no summary of 3000 steps: $(head -c 300 "$tmp/run.out")"
J=$tmp/run.jsonl
[ "$(ev "$J" 'sorted(set(e["host"] for e in E if e["event"] == "straggler" and "link_bytes_per_s" in e))')" = "['198.18.0.2']" ] ||
    fail "straggler events: $(grep straggler "$J"); launch: $(grep 'launch:' "$tmp/run.err")"
[ "$(ev "$J" 'all(0 < e["link_bytes_per_s"] < e["bandwidth"] / 3 for e in E if e["event"] == "straggler" and "link_bytes_per_s" in e)')" = True ] ||
    fail "straggler link rate: $(grep straggler "$J")"
[ "$(ev "$J" '[e["predicted_s_per_minibatch_after"] < 0.9 * e["predicted_s_per_minibatch_before"] for e in E if e["event"] == "replan"][:1]')" = "[True]" ] ||
    fail "replan events: $(grep replan "$J"); launch: $(grep 'launch:' "$tmp/run.err")"
last=$(ev "$J" 'max(e["attempt"] for e in E if e["event"] == "start")')
[ "$last" -ge 1 ] || fail "no second attempt"
grep -q "pipedream: launch: re-planned " "$tmp/run.err" || fail "no re-planned line: $(grep 'launch:' "$tmp/run.err")"
grep -q "pipedream: launch: done: 3000 minibatches .*straggler.*198.18.0.2.*, [0-9]* re-plan" "$tmp/run.err" ||
    fail "done line: $(grep 'launch: done' "$tmp/run.err")"
# the pace per unit (rank 0's waits and the rest) before the last attempt and in it
pace='[r["wait_ms_per_unit"] + r["busy_ms_per_unit"] for e in E for r in e["ranks"] if r["rank"] == 0]'
cat $(seq -f "$tmp/run/progress-%g.jsonl" 0 $((last - 1))) >"$tmp/before.jsonl" 2>/dev/null
slow=$(ev "$tmp/before.jsonl" "round(max($pace), 3)")
fast=$(ev "$tmp/run/progress-$last.jsonl" "round(sorted($pace)[len($pace) // 2], 3)")
python3 -c "import sys; sys.exit(0 if $fast < 0.5 * $slow else 1)" ||
    fail "after the re-plan $fast ms per unit (median), before it $slow at worst"
echo "ok: $(grep -o 'straggler: 198.18.0.2 (rank 1).*' "$tmp/run.err" | head -1); $(grep -o 're-planned .*' "$tmp/run.err"); ${slow} -> ${fast} ms per unit"

cluster3_clean
echo "ok: nothing left behind"
