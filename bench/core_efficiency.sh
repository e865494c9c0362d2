#!/usr/bin/env bash
# bench/core_efficiency.sh: each core's speed while every core of this machine computes, relative
# to one core computing alone (`plan --core-efficiency E`, a cluster file's core_efficiency).
#
# With C cores: one `pipedream bench` of MODEL alone (one thread, samples/s), then C of them at
# once, then 2C at once (more threads than cores: the kernel's time slicing too). E = (the 2C
# rates summed) / (C x the one alone). PAIRS rounds, taking turns; prints each round and, on the
# last line, the median E alone (at most 1).
#
# --cluster NAME: the hosts of a tools/cluster.sh cluster that is up with --cpu Q instead: one
# copy alone outside it, then one copy in every host at once, each under its host's quota. E =
# (the hosts' rates summed) / (hosts x Q x the one alone): a capped host computes at Q x E of an
# uncapped core alone (what `cluster.sh cluster-file`'s "speed" assumes is Q).
#
# usage: bench/core_efficiency.sh [--pd BINARY] [--model M.json] [--minibatch B] [--pairs N]
#                                 [--cluster NAME]
#   defaults: build/pipedream, models/vgg16.json, 16, 3. ~40 s with the defaults on 2 cores.
#   Run it on a quiet machine, with the kernels' threads at 1 (OMP_NUM_THREADS is set here).
set -euo pipefail
cd "$(dirname "$0")/.."
PD=build/pipedream MODEL=models/vgg16.json B=16 PAIRS=3 CLUSTER=""
while [ $# -gt 0 ]; do
    case $1 in
        --pd) PD=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --minibatch) B=$2; shift 2 ;;
        --pairs) PAIRS=$2; shift 2 ;;
        --cluster) CLUSTER=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "core_efficiency.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
[[ $B =~ ^[0-9]+$ && $B -ge 1 && $PAIRS =~ ^[0-9]+$ && $PAIRS -ge 1 ]] || { echo "core_efficiency.sh: --minibatch and --pairs take positive integers" >&2; exit 2; }
[ -x "$PD" ] || { echo "core_efficiency.sh: $PD is not an executable (build first, or --pd)" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
C=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
HOSTS=0 Q=1
if [ -n "$CLUSTER" ]; then   # the cluster's hosts and their quota, from its cluster file
    cf=$(PDC_NAME=$CLUSTER tools/cluster.sh cluster-file 2>/dev/null) ||
        { echo "core_efficiency.sh: no cluster $CLUSTER (tools/cluster.sh up N --cpu Q --name $CLUSTER first)" >&2; exit 2; }
    read -r HOSTS Q < <(python3 -c '
import json, sys
hs = json.loads(sys.argv[1]).get("hosts") or [{}]
print(len(hs), hs[0].get("speed", 1))' "$cf")
    awk -v q="$Q" 'BEGIN { exit !(q < 1) }' ||
        { echo "core_efficiency.sh: cluster $CLUSTER's hosts are not capped (tools/cluster.sh up N --cpu Q)" >&2; exit 2; }
fi
# n copies at once (in the cluster's hosts 0..n-1 with in_hosts=1); prints their samples/s summed
together() {
    local n=$1 in_hosts=${2:-0} k pids=() pre=()
    for k in $(seq "$n"); do
        [ "$in_hosts" = 1 ] && pre=(env PDC_NAME="$CLUSTER" tools/cluster.sh exec $((k - 1)))
        "${pre[@]}" "$PD" bench "$MODEL" --minibatch "$B" --threads 1 --steps 30 --reps 3 >"$tmp/b$k.json" 2>"$tmp/b$k.err" & pids+=($!)
    done
    for k in "${pids[@]}"; do wait "$k" || { cat "$tmp"/b*.err >&2; echo "core_efficiency.sh: $PD bench failed" >&2; exit 1; }; done
    python3 - "$tmp" "$n" <<'PY'
import json, sys
print(sum(json.loads(open("%s/b%d.json" % (sys.argv[1], k)).read().splitlines()[-1])["samples_per_s"]
          for k in range(1, int(sys.argv[2]) + 1)))
PY
}
es=()
for p in $(seq "$PAIRS"); do
    one=$(together 1)
    if [ -n "$CLUSTER" ]; then
        hosts=$(together "$HOSTS" 1)
        e=$(python3 -c "print('%.3f' % ($hosts / ($HOSTS * $Q * $one)))")
        printf 'pair %d: one alone %.1f samples/s; %d capped hosts at once %.1f: E = %s (a host %.3f cores of one alone)\n' \
            "$p" "$one" "$HOSTS" "$hosts" "$e" "$(python3 -c "print($hosts / ($HOSTS * $one))")" >&2
        es+=("$e")
        continue
    fi
    full=$(together "$C")
    over=$(together $((2 * C)))
    e=$(python3 -c "print('%.3f' % ($over / ($C * $one)))")
    printf 'pair %d: one alone %.1f samples/s; %d at once %.1f (%.3f of %d x alone); %d at once %.1f: E = %s\n' \
        "$p" "$one" "$C" "$full" "$(python3 -c "print($full / ($C * $one))")" "$C" $((2 * C)) "$over" "$e" >&2
    es+=("$e")
done
# (a noisy machine can give more than 1: the copies alone met a slow spell; E is at most 1)
printf '%s\n' "${es[@]}" | sort -n | awk '{a[NR] = $1} END {m = a[int((NR + 1) / 2)]; print (m > 1 ? 1 : m)}'
