#!/usr/bin/env bash
# launch_private.sh: `pipedream launch` on 3 emulated hosts that share no checkpoint directory
# (tools/cluster.sh up --private-dirs: /var/lib/pipedream-host is each host's own), lenet5 on a
# small IDX set, --checkpoint-dir /var/lib/pipedream-host/ckpt, the run directory elsewhere:
#  1. train --plan FILE under mpirun where only host 0 has FILE (in its own directory): rank 0
#     reads it and sends it to the others, and the run completes;
#  2. every process of host 0 (rank 0, which wrote the checkpoints) killed after checkpoint 100:
#     the run finishes all its minibatches on hosts 1 and 2, resumed from the newest checkpoint,
#     which host 2 kept as the second copy and sent to host 1 (its line names both); the event
#     log has one membership change removing 198.18.0.1 and the recovery from that checkpoint;
#  3. the same with host 2 (the partner) killed: resumed from host 0's copy;
#  4. nothing was read across hosts: each host's directory holds only checkpoints it wrote or
#     received (host 1 none before the one it received; host 0 none after its loss in 2), the
#     run directory none at all; no process is left in the hosts.
# Exits 77 (ctest SKIP) when not root, without iproute2, python3 or mpirun, where namespaces
# cannot be made, or when 198.18.0.0/24 is in use; run it under flock /tmp/pd-cluster.lock.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
NAME=pdp$$
tmp=$(mktemp -d)
cleanup() { bash "$CL" down --name "$NAME" >/dev/null 2>&1; pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

. "$SRC/tests/cli/lib/cluster3.sh"
cluster3_up 3 --private-dirs
H=/var/lib/pipedream-host            # each host's own directory, as the host sees it
disk() { echo "/var/lib/pipedream-cluster/$NAME/h$1"; }   # host I's, seen from here
cp "$SRC/tests/data/profiles/lenet5_mb32.json" "$tmp/prof.json"
printf '198.18.0.1 slots=1\n198.18.0.2 slots=1\n198.18.0.3 slots=1\n' >"$tmp/hosts"
TRAIN="--data $tmp/d --minibatch 32 --steps 600 --timeout 20"
ev() { python3 -c 'import json,sys; print(eval(sys.argv[2], {"E": [json.loads(l) for l in open(sys.argv[1])]}))' "$@"; }
# the checkpoints rank 0 of RUN announced, in order
announced() { sed -n "s|^pipedream: checkpoint $H/ckpt/ckpt-0*\([0-9][0-9]*\)\.safetensors$|\1|p" "$tmp/$1.err" | sort -nu | tr '\n' ' '; }
ckpts() { ls "$(disk "$1")/ckpt" 2>/dev/null | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tr '\n' ' '; }

# 1. the plan in host 0's directory alone
"$PD" plan "$tmp/prof.json" --workers 3 --bandwidth 1.25e8 --straight --no-simulate -o "$(disk 0)/plan.json" \
    >/dev/null 2>"$tmp/err" || fail "plan: $(tail -3 "$tmp/err")"
timeout 60 mpirun $MPIARGS --hostfile "$tmp/hosts" -np 3 "$PD" train "$SRC/models/lenet5.json" --data "$tmp/d" \
    --minibatch 32 --steps 20 --timeout 20 --plan "$H/plan.json" >"$tmp/p.out" 2>"$tmp/p.err" ||
    fail "1: --plan in host 0's directory only: $(grep -v '^unit' "$tmp/p.err" | tail -5)"
grep -q '"steps":20,' "$tmp/p.out" || fail "1: no summary: $(head -c 300 "$tmp/p.out")"
[ ! -e "$(disk 1)/plan.json" ] && [ ! -e "$(disk 2)/plan.json" ] || fail "1: the plan reached another host's directory"
rm "$(disk 0)/plan.json"
echo "ok: 1. --plan read by rank 0 alone, sent to the other ranks"

# launch RUN I: in the background, checkpoints in each host's own directory; once rank 0 has
# announced checkpoint 100, kills every process of host I; waits. RUN.out, RUN.err, RUN.rc
launch() {
    local run=$1 victim=$2
    timeout 150 "$PD" launch --hosts "$tmp/hosts" --profile "$tmp/prof.json" --run-dir "$tmp/$run" \
        --checkpoint-every 50 --checkpoint-dir "$H/ckpt" --events "$tmp/$run.jsonl" --mpirun-args "$MPIARGS" \
        --probe-timeout 10 "$SRC/models/lenet5.json" -- $TRAIN >"$tmp/$run.out" 2>"$tmp/$run.err" &
    local job=$!
    for _ in $(seq 900); do grep -q "^pipedream: checkpoint $H/ckpt/ckpt-0000000100" "$tmp/$run.err" && break; sleep 0.1; done
    grep -q "^pipedream: checkpoint $H/ckpt/ckpt-0000000100" "$tmp/$run.err" ||
        fail "$run: no checkpoint 100: $(grep -v '^unit' "$tmp/$run.err" | tail -5)"
    ip netns pids "$NAME-h$victim" | xargs -r kill -9
    wait $job
    echo $? >"$tmp/$run.rc"
}

# check RUN I ADDR PARTNER: host I (ADDR, rank I) lost; the run finished on the other two,
# resumed from the checkpoint at the loss, sent from rank PARTNER of the relaunch; echoes it
check() {
    local run=$1 victim=$2 addr=$3 from=$4 J=$tmp/$1.jsonl
    [ "$(cat "$tmp/$run.rc")" = 0 ] || fail "$run: launch exited $(cat "$tmp/$run.rc"): $(grep -v '^unit' "$tmp/$run.err" | tail -15)"
    grep -q '"steps":600,' "$tmp/$run.out" || fail "$run: no summary of 600 steps: $(head -c 300 "$tmp/$run.out")"
    [ "$(ev "$J" '[(e["removed"], e["lost_ranks"], len(e["hosts_after"])) for e in E if e["event"] in ("membership", "failure", "gave_up")]')" = \
      "[(['$addr'], [$victim], 2)]" ] || fail "$run: one membership change removing $addr expected: $(cat "$J")"
    local ck
    ck=$(ev "$J" '[e["checkpoint_minibatches"] for e in E if e["event"] == "membership"][0]')
    [ "$ck" -ge 100 ] && [ "$ck" -lt 600 ] || fail "$run: resumed from minibatch $ck"
    [ "$(ev "$J" '[e["resume_minibatches"] for e in E if e["event"] == "start"]')" = "[0, $ck]" ] ||
        fail "$run: the relaunch does not resume from $ck: $(grep start "$J")"
    [ "$(ev "$J" '[e["resume_minibatches"] == '"$ck"' for e in E if e["event"] == "recovered"]')" = "[True]" ] ||
        fail "$run: recovered event: $(cat "$J")"
    [ "$(ev "$J" '[(e["steps"], len(e["hosts"])) for e in E if e["event"] == "done"]')" = "[(600, 2)]" ] ||
        fail "$run: done event: $(tail -1 "$J")"
    local c
    c=$(printf '%s/ckpt/ckpt-%010d.safetensors' "$H" "$ck")
    grep -q "received from rank $from (the newest complete checkpoint" "$tmp/$run.err" &&
        grep -q "$c received from rank $from" "$tmp/$run.err" ||
        fail "$run: checkpoint $ck not sent from rank $from: $(grep -e received -e 'launch:' "$tmp/$run.err")"
    [ -z "$(find "$tmp/$run" -name '*.safetensors*')" ] && [ ! -e "$tmp/$run/ckpt" ] ||
        fail "$run: checkpoints in the run directory: $(find "$tmp/$run")"
    local acc
    acc=$(sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$tmp/$run.out")
    python3 -c "import sys; sys.exit(0 if float('$acc') > 0.3 else 1)" || fail "$run: test accuracy $acc"
    echo "$ck"
}

# 2. host 0 lost: host 2 (rank 2, the partner; rank 1 of the relaunch) sends the newest to host 1
launch h0 0
ck=$(check h0 0 198.18.0.1 1) || { echo "$ck"; exit 1; }
# host 0 wrote checkpoints up to the loss; host 1 had none before the one it received; host 2
# kept the second copy of each
after() { for c in $(ckpts "$1"); do [ "$c" -gt "$2" ] && echo "$c"; done; }
before() { for c in $(ckpts "$1"); do [ "$c" -lt "$2" ] && echo "$c"; done; }
[ -z "$(after 0 "$ck")" ] || fail "2: host 0's directory has checkpoints after its loss: $(ckpts 0)"
[ -z "$(before 1 "$ck")" ] || fail "2: host 1 had checkpoints before the one it received: $(ckpts 1)"
[ "$(ckpts 2)" = "$(announced h0)" ] || fail "2: host 2 (the partner throughout) has $(ckpts 2), not every checkpoint: $(announced h0)"
echo "ok: 2. host 0 lost after checkpoint $ck: resumed from host 2's copy on hosts 1 and 2, 600 minibatches; directories: h0 $(ckpts 0)| h1 $(ckpts 1)| h2 $(ckpts 2)"
rm -rf "$(disk 0)/ckpt" "$(disk 1)/ckpt" "$(disk 2)/ckpt"

# 3. host 2 (the partner) lost: host 0 sends the newest to host 1
launch h2 2
ck=$(check h2 2 198.18.0.3 0) || { echo "$ck"; exit 1; }
[ -z "$(before 1 "$ck")" ] || fail "3: host 1 had checkpoints before the one it received: $(ckpts 1)"
[ -z "$(after 2 "$ck")" ] || fail "3: host 2's directory has checkpoints after its loss: $(ckpts 2)"
[ "$(ckpts 0)" = "$(announced h2)" ] || fail "3: host 0 (rank 0 throughout) has $(ckpts 0), not every checkpoint: $(announced h2)"
echo "ok: 3. host 2 lost after checkpoint $ck: resumed from host 0's copy on hosts 0 and 1; directories: h0 $(ckpts 0)| h1 $(ckpts 1)| h2 $(ckpts 2)"

cluster3_clean
echo "ok: 4. nothing left in the hosts, the namespaces or Open MPI's session directories"
