#!/usr/bin/env bash
# real_cluster_howto.sh: docs/howto/real-cluster.md's commands, as written, on 4 emulated hosts
# (tools/cluster.sh up 4 --private-dirs), run as an ordinary user, as the how-to says.
#
# Every ```sh block of the how-to runs, in the order of the page, in one bash -e shell (a
# variable one block sets, MPI_NET, is there for the next), from a directory laid out as a
# checkout (build/, models/); the ```json block is written to cluster.json where it stands. The
# one block left out is step 2's ssh-keygen/ssh-copy-id: the emulated hosts run no ssh server
# (tools/cluster.sh's rsh agent stands in for ssh), so it cannot work here. Nothing else of the
# page is edited but what must differ on the emulation, all in emulate() below:
#   - host names: server0..server3 -> 198.18.0.1..198.18.0.4 (the emulated hosts' addresses);
#   - ssh: Open MPI's rsh agent (OMPI_MCA_plm_rsh_agent in the user's environment, with
#     plm_rsh_no_tree_spawn as step 2 allows) is a wrapper that enters the host's namespaces
#     as root through the cluster's agent and starts Open MPI's daemon as the user, as sshd
#     would; the user's processes hold CAP_SETUID and CAP_SETGID for that alone;
#   - the network: 10.0.0.0/24 -> 198.18.0.0/24;
#   - each host's own disk: /var/tmp/pd-ckpt -> /var/lib/pipedream-host/pd-ckpt (the directory
#     that --private-dirs makes each host's own);
#   - sizes: models/vgg16.json -> models/lenet5.json (and the file names after it), step 8's
#     run 40 minibatches with a checkpoint every 20, step 9's --steps 5000 -> 40 and
#     --checkpoint-every 100 -> 20.
# The commands run as a throwaway user (useradd; removed at the end), so Open MPI runs without
# its allow-run-as-root variables. Beyond the commands' own exit status, the test checks what
# the page says they show: steps 3 and 4 print each host's name twice, in hostfile order; step
# 8 keeps each checkpoint on server0 (rank 0) and server3 (rank 7) and nowhere else; step 9's
# launch finishes its 40 minibatches on the 4 hosts. PD_HOWTO=FILE runs another copy of the page;
# PD_KEEP=1 keeps the test's directory.
# Exits 77 (ctest SKIP) when not root, without iproute2, mpirun, setpriv or useradd, where
# namespaces cannot be made, or when 198.18.0.0/24 is in use; run it under flock /tmp/pd-cluster.lock.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
DOC=${PD_HOWTO:-$SRC/docs/howto/real-cluster.md}
NAME=pdh$$
U=pdhowto$$
tmp=$(mktemp -d)
cleanup() {
    bash "$CL" down --name "$NAME" >/dev/null 2>&1
    pkill -9 -u "$U" 2>/dev/null; userdel "$U" >/dev/null 2>&1
    [ -n "${PD_KEEP:-}" ] || rm -rf "$tmp"; [ -z "${PD_KEEP:-}" ] || echo "kept $tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, a throwaway user)"
for c in ip tc mpirun setpriv useradd userdel; do command -v $c >/dev/null || skip "needs $c"; done
[ -f "$DOC" ] || fail "no how-to at $DOC"
! ip -o -4 addr show | grep -q ' 198\.18\.0\.' || skip "198.18.0.0/24 is in use (a cluster is up); the test needs it"
PD=$(realpath "$PD")
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
bash "$CL" up 4 --rate 1gbit --private-dirs --name "$NAME" >"$tmp/up" 2>&1
case $? in 0) ;; 3) skip "cannot make the emulated cluster: $(tail -1 "$tmp/up")" ;; *) fail "cluster up: $(cat "$tmp/up")" ;; esac
disk() { echo "/var/lib/pipedream-cluster/$NAME/h$1"; }   # host I's own directory, seen from here

# The user: a checkout-like directory of its own, each host's directory writable by it.
useradd -M -d "$tmp/home" -s /bin/bash -U "$U" || fail "useradd $U"
chmod 711 "$tmp"
mkdir -p "$tmp/home" "$tmp/w"
ln -s "$(dirname "$PD")" "$tmp/w/build"
ln -s "$(realpath "$SRC/models")" "$tmp/w/models"
chown -R "$U:$U" "$tmp/home" "$tmp/w"
for i in 0 1 2 3; do chown "$U:$U" "$(disk "$i")"; done
runuser -u "$U" -- test -x "$tmp/w/build/pipedream" -a -r "$tmp/w/models/lenet5.json" ||
    fail "$U cannot read the build ($PD) or models/"

# ssh's stand-in: enters the host as root (the cluster's agent), runs the command as the user.
cat >"$tmp/rsh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
PD_RSH_CMD="\$*" exec setpriv --reuid=0 --regid=0 --clear-groups /run/pipedream-cluster/$NAME/rsh "\$host" \\
    'exec setpriv --reuid=$U --regid=$U --init-groups --inh-caps=-all --ambient-caps=-all sh -c "\$PD_RSH_CMD"'
EOF
chmod 755 "$tmp/rsh"

# emulate: the page's text with what must differ on the emulation (the opening comment's list)
emulate() {
    sed -e 's/\bserver0\b/198.18.0.1/g' -e 's/\bserver1\b/198.18.0.2/g' \
        -e 's/\bserver2\b/198.18.0.3/g' -e 's/\bserver3\b/198.18.0.4/g' \
        -e 's|10\.0\.0\.0/24|198.18.0.0/24|g' \
        -e 's|/var/tmp/pd-ckpt|/var/lib/pipedream-host/pd-ckpt|g' \
        -e 's/vgg16/lenet5/g' \
        -e 's/--checkpoint-every 500 /--checkpoint-every 20 --steps 40 /' \
        -e 's/--checkpoint-every 100 /--checkpoint-every 20 /' -e 's/--steps 5000 /--steps 40 /'
}

# The page's blocks as one script: "@@ N" on stdout before block N.
awk '
    /^```sh$/ { sh = 1; n++; body = ""; next }
    /^```json$/ { js = 1; body = ""; next }
    /^```$/ {
        if (sh && body ~ /ssh-keygen/) printf "echo \"@@ %d (ssh keys: not on the emulation)\"\n", n
        else if (sh) printf "echo \"@@ %d\"\n%s", n, body
        else if (js) printf "cat >cluster.json <<\"PD_JSON\"\n%sPD_JSON\n", body
        sh = js = 0; next
    }
    sh || js { body = body $0 "\n" }
' "$DOC" | emulate >"$tmp/howto.sh"
[ "$(grep -c '^echo "@@' "$tmp/howto.sh")" -ge 6 ] || fail "fewer sh blocks than expected in $DOC: $(cat "$tmp/howto.sh")"
grep -q 'cat >cluster.json' "$tmp/howto.sh" || fail "no json block (cluster.json) in $DOC"
chmod 644 "$tmp/howto.sh"

( cd "$tmp/w" && timeout 300 setpriv --reuid="$U" --regid="$U" --init-groups \
    --inh-caps=+setuid,+setgid --ambient-caps=+setuid,+setgid \
    env -i PATH="$PATH" HOME="$tmp/home" USER="$U" LOGNAME="$U" \
    OMPI_MCA_plm_rsh_agent="$tmp/rsh" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    bash -e "$tmp/howto.sh" >"$tmp/out" 2>"$tmp/err" )
rc=$?
[ $rc = 0 ] || fail "the how-to's commands stopped (exit $rc) in block $(grep '^@@' "$tmp/out" | tail -1): $(grep -v '^unit' "$tmp/err" | tail -15)"
echo "ok: every sh block ran as $U: $(grep '^@@' "$tmp/out" | tr '\n' ' ')"

# output of block N
block() { awk -v n="@@ $1" '$0 ~ /^@@ / { on = ($0 == n) ; next } on' "$tmp/out"; }
want=$(for i in 0 0 1 1 2 2 3 3; do echo "$NAME-h$i"; done)
got=$(block 2 | sed -n 's/^\[[0-9]*,\([0-9]*\)\]<stdout>:\(.*\)$/\1 \2/p' | sort -n | cut -d' ' -f2)
[ "$got" = "$want" ] || fail "step 3's mpirun --tag-output hostname, by rank: $(echo $got) from $(block 2 | tr '\n' ' ')"
[ "$(block 3 | sort)" = "$want" ] || fail "step 4's mpirun hostname: $(block 3 | tr '\n' ' ')"
echo "ok: steps 3 and 4 reach every host; ranks 2h and 2h+1 run on host h"

block 6 | grep -q '"workers":8,' && block 6 | grep -q '"steps":40,' ||
    fail "step 8: no summary of 40 minibatches on 8 workers: $(block 6 | head -c 300)"
grep -q "^pipedream: rank 7: checkpoint's second copy /var/lib/pipedream-host/pd-ckpt/ckpt-0000000040" "$tmp/err" ||
    fail "step 8: rank 7 kept no second copy: $(grep checkpoint "$tmp/err")"
ckpts() { ls "$(disk "$1")/pd-ckpt" 2>/dev/null | grep '\.safetensors$' | tr '\n' ' '; }
both="ckpt-0000000020.safetensors ckpt-0000000040.safetensors "
[ "$(ckpts 0)" = "$both" ] && [ "$(ckpts 3)" = "$both" ] && [ -z "$(ckpts 1)$(ckpts 2)" ] ||
    fail "checkpoints on server0 and server3 alone expected: h0 $(ckpts 0)| h1 $(ckpts 1)| h2 $(ckpts 2)| h3 $(ckpts 3)"
[ -z "$(find "$(disk 0)" "$(disk 3)" ! -user "$U")" ] || fail "files of another user: $(find "$(disk 0)" "$(disk 3)" ! -user "$U")"
echo "ok: step 8: 40 minibatches on 8 ranks; checkpoints 20 and 40 on server0 and server3 alone, the user's"

block 7 | grep -q '"steps":40,' || fail "step 9: no summary of 40 minibatches: $(block 7 | head -c 300)"
grep -q '"event": *"done".*"steps": *40,' "$tmp/w/run/events.jsonl" || fail "step 9: no done event: $(cat "$tmp/w/run/events.jsonl")"
grep -q "^pipedream: launch: done: 40 minibatches on 4 hosts, 0 membership changes" "$tmp/err" ||
    fail "step 9: $(grep 'launch:' "$tmp/err")"
echo "ok: step 9: launch ran 40 minibatches on the 4 hosts, one worker each"

for i in 0 1 2 3; do
    [ -z "$(ip netns pids "$NAME-h$i")" ] || fail "processes left on host $i: $(ip netns pids "$NAME-h$i" | xargs ps -o pid,user,cmd -p)"
done
for _ in $(seq 50); do pgrep -u "$U" >/dev/null || break; sleep 0.2; done   # daemons being reaped
! pgrep -u "$U" >/dev/null || fail "processes of $U left: $(ps -o pid,ppid,stat,cmd -u "$U"; ps -o pid,cmd -p "$(ps -o ppid= -u "$U" | head -1)")"
echo "ok: nothing left running on the hosts"
