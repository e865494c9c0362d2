#!/usr/bin/env bash
# cluster.sh: an emulated cluster on one Linux machine, as root (docs/reference/cluster-sh.md).
#
# N hosts are network namespaces NAME-h0 .. NAME-h<N-1> on a bridge NAME-br; host i is
# 198.18.0.<i+1>/24, the bridge (where mpirun runs) 198.18.0.254. Only 198.18.0.0/24 is ever
# used (RFC 2544's benchmarking range): no route, NAT or forwarding leads anywhere else.
# Each host's link is full duplex: its egress (the namespace side of its veth) and its ingress
# (the bridge side) are each shaped to --rate (tc htb, acknowledgements first; or tc tbf with
# --queue fifo); --delay, --jitter and --loss (tc netem) are added on the ingress. A packet
# from one host to another crosses one egress and one ingress: rate R, the receiver's one-way
# delay D, round trip 2D.
#
#   tools/cluster.sh up N [--rate 100mbit] [--host-rate I=R,...] [--delay 0ms] [--jitter 0ms]
#                      [--loss 0%] [--host-delay I=D,...] [--host-jitter I=J,...]
#                      [--host-loss I=P,...] [--cpu C] [--queue acks-first|fifo]
#                      [--private-dirs] [--name pdc]
#                                                  create or reconcile; --host-rate gives host I
#                                                  its own link rate R (a heterogeneous cluster),
#                                                  --host-delay/-jitter/-loss its own netem
#                                                  figures for what it receives;
#                                                  --cpu caps each host's processes at C cores
#                                                  (a cgroup CPU quota), so that hosts stop
#                                                  sharing this machine's cores as one pool;
#                                                  --private-dirs gives each host its own
#                                                  /var/lib/pipedream-host (a mount namespace)
#   tools/cluster.sh cluster-file                  the cluster as a pipedream-cluster JSON for
#                                                  plan and simulate --cluster (stdout); with
#                                                  --cpu C below 1, each host's speed is C
#   tools/cluster.sh run NP CMD [ARGS...]          mpirun -np NP across the hosts (round robin)
#   tools/cluster.sh run -- MPIRUN_ARGS...         mpirun with your own arguments (give -np)
#   tools/cluster.sh run-torch NP CMD [ARGS...]    run, plus MASTER_ADDR/MASTER_PORT and
#                                                  GLOO_SOCKET_IFNAME for torch.distributed
#   tools/cluster.sh exec I CMD [ARGS...]          one command in host I's namespace
#   tools/cluster.sh status                        hosts, addresses, shaping, mpirun line
#   tools/cluster.sh net-cpu [--mb 300]              the CPU this machine spends per byte between
#                                                  two hosts (a TCP stream from host 0 to host 1,
#                                                  the whole machine's busy time; run it on a
#                                                  quiet machine): plan --net-cpu takes it.
#                                                  The last line is the figure alone
#   tools/cluster.sh mpirun-args                   the mpirun options of `run` but the hostfile,
#                                                  one line (for pipedream launch --mpirun-args)
#   tools/cluster.sh down                          remove everything of cluster NAME
# --name (or PDC_NAME=) selects the cluster on every command; default pdc.
# Exit status: 0 ok, 1 error, 2 bad usage, 3 this machine cannot make namespaces, bridges,
# veths or the tc qdiscs (a container without CAP_NET_ADMIN/CAP_SYS_ADMIN, no sch_netem).
set -euo pipefail

PROG=tools/cluster.sh
NET=198.18.0
SUBNET=$NET.0/24
BRIDGE_ADDR=$NET.254
MAXHOSTS=200
STATE_ROOT=/run/pipedream-cluster
HOST_DIR=/var/lib/pipedream-host          # --private-dirs: each host's own directory, seen here
DISK_ROOT=/var/lib/pipedream-cluster      # ... and where host I's lies: DISK_ROOT/NAME/hI
TAG=pipedream-cluster

die() { echo "$PROG: error: $*" >&2; exit 1; }
usage_err() { echo "$PROG: error: $*" >&2; echo "usage: $PROG up N [--rate R] [--host-rate I=R,...] [--delay D] [--jitter J] [--loss P] [--host-delay I=D,...] [--host-jitter I=J,...] [--host-loss I=P,...] [--cpu C] [--queue acks-first|fifo] [--private-dirs] [--name NAME] | cluster-file | run NP CMD... | run -- MPIRUN_ARGS... | run-torch NP CMD... | exec I CMD... | status | net-cpu [--mb MB] | mpirun-args | down   (--help)" >&2; exit 2; }
cannot() { echo "$PROG: error: this machine cannot $*" >&2; exit 3; }
CAPS="(needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN: not an unprivileged container)"
q() { "$@" >/dev/null 2>&1; }

help() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

need_root_tools() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veths, tc): run it as root or with sudo"
    command -v ip >/dev/null || die "needs iproute2 (the ip command): apt-get install iproute2"
    command -v tc >/dev/null || die "needs iproute2's tc: apt-get install iproute2"
    command -v unshare >/dev/null || die "needs unshare (util-linux)"
}

NAME=${PDC_NAME:-pdc}
check_name() {
    [[ $NAME =~ ^[a-z][a-z0-9]{0,9}$ ]] || usage_err "--name: 1-10 characters, a-z then a-z0-9 (got '$NAME')"
    BR=$NAME-br            # bridge, root namespace
    IFN=$NAME-eth          # each host's interface, inside its namespace
    STATE=$STATE_ROOT/$NAME
}
ns_of() { echo "$NAME-h$1"; }
veth_of() { echo "$NAME-v$1"; }       # bridge side of host i's veth, root namespace
addr_of() { echo "$NET.$(($1 + 1))"; }

# Our hosts, from the kernel (not the state file: survives a lost /run).
hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-h[0-9]+\$" | sed "s/^$NAME-h//" | sort -n || true; }

ours() { [ "$(cat "/sys/class/net/$1/ifalias" 2>/dev/null)" = "$TAG:$NAME" ]; }

# A rate/delay as tc understands it; rejects anything else early with a clear message.
check_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?([kmgt]?bit|[kmgt]?bps)$ ]] || usage_err "--rate: like 100mbit, 1gbit, 500kbit (got '$1')"; }
check_delay() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] || usage_err "${2:---delay}: like 1ms, 200us, 0ms (got '$1')"; }
check_loss() {   # (no awk: it runs before the tools are checked)
    local whole
    [[ $1 =~ ^([0-9]+)(\.[0-9]+)?%$ ]] && whole=$((10#${BASH_REMATCH[1]})) \
        && { [ "$whole" -lt 100 ] || { [ "$whole" = 100 ] && [[ ${BASH_REMATCH[2]:-} =~ ^(\.0*)?$ ]]; }; } \
        || usage_err "${2:---loss}: a percentage of packets, like 0.01%, 1%, 0% (got '$1')"
}
# check_host_list FLAG LIST N CHECK: I=V[,I=V...] with hosts 0..N-1 and each V passing CHECK
check_host_list() {
    local flag=$1 list=$2 n=$3 check=$4 kv
    for kv in ${list//,/ }; do
        [[ $kv =~ ^[0-9]+=.+$ ]] || usage_err "$flag: I=VALUE[,I=VALUE...], e.g. 2=40ms,3=40ms (got '$kv')"
        [ "${kv%%=*}" -lt "$n" ] || usage_err "$flag: host ${kv%%=*} of $n (hosts are 0..$((n - 1)))"
        $check "${kv#*=}" "$flag"
    done
}

# --- up -------------------------------------------------------------------------------------
# tc's rate in bytes/s, for the burst and the queue.
rate_bytes() {
    local v=${1%bit} m=1
    if [[ $1 == *bps ]]; then v=${1%bps}; m=8; fi
    case $v in *k) v=${v%k}; m=$((m * 1000)) ;; *m) v=${v%m}; m=$((m * 1000000)) ;;
               *g) v=${v%g}; m=$((m * 1000000000)) ;; *t) v=${v%t}; m=$((m * 1000000000000)) ;; esac
    awk -v v="$v" -v m="$m" 'BEGIN { printf "%d", v * m / 8 }'
}

# One direction of a link: the rate, a burst of 1 ms at that rate (at least 16 KiB, so a
# full-size frame and some always pass), a queue of 50 ms at that rate.
burst_of() { [ "$(($1 / 1000))" -gt 16384 ] && echo $(($1 / 1000)) || echo 16384; }   # of B bytes/s

# shape_dir PRE DEV PARENT H RATE: that direction's qdiscs on DEV (PRE: a command prefix such
# as `ip netns exec NS`, or empty), at PARENT ("root", or "parent 1:1" below netem), handle H.
#   --queue acks-first (default): an htb class at the rate with two leaves. Packets under 128
#     bytes (pure TCP acknowledgements; the IP total length) go first; the rest wait in a FIFO
#     of 50 ms at the rate (at least 128 KiB). A host that sends a stream while it receives one thus returns the
#     incoming stream's acknowledgements at once, as Linux's default fq_codel does on a real
#     NIC; behind 50 ms of its own data they held the incoming stream at 80-90% of the link
#     (a 4-host ring all-reduce at 300 Mbit/s: docs/reference/cluster-sh.md).
#   --queue fifo: one token bucket (tc tbf) with the same burst and queue for every packet.
# NETEM (netem_of's arguments): with acks-first, both leaves are netem queues with them (htb
# takes from them as its rate allows), the bulk one holding the delay's and the 50 ms queue's packets.
shape_dir() {
    local pre=$1 dev=$2 parent=$3 h=$4 r=$5 netem=${6:-} B b bits lim r2q
    B=$(rate_bytes "$r"); b=$(burst_of "$B")
    if [ "$QUEUE" = fifo ]; then
        $pre tc qdisc add dev "$dev" $parent handle "$h": tbf rate "$r" burst "$b" latency 50ms \
            || cannot "attach a tbf qdisc (tc qdisc ... tbf; CONFIG_NET_SCH_TBF)"
        return
    fi
    # the FIFO: 50 ms at the rate, at least 128 KiB (62.5 KB at 10mbit dropped a lone local
    # sender's bursts until TCP fell to 0.5 Mbit/s; 125 KB held 9.4)
    bits=$((B * 8)); lim=$((B / 20)); [ "$lim" -ge 131072 ] || lim=131072
    r2q=$((B / 60000)); [ "$r2q" -ge 1 ] || r2q=1   # DRR quanta near 60 KB
    $pre tc qdisc add dev "$dev" $parent handle "$h": htb default 20 r2q "$r2q" \
        || cannot "attach an htb qdisc (tc qdisc ... htb; CONFIG_NET_SCH_HTB; or --queue fifo)"
    $pre tc class add dev "$dev" parent "$h": classid "$h":1 htb rate "$r" burst "$b" cburst "$b"
    $pre tc class add dev "$dev" parent "$h":1 classid "$h":10 htb rate $((bits / 30))bit ceil "$r" prio 0 burst "$b" cburst "$b"
    $pre tc class add dev "$dev" parent "$h":1 classid "$h":20 htb rate $((bits - bits / 30))bit ceil "$r" prio 1 burst "$b" cburst "$b"
    if [ -n "$netem" ]; then
        local pk   # packets: the 50 ms queue's and the delay's at the rate
        pk=$(awk -v B="$B" -v s="$(netem_secs "$netem")" 'BEGIN { printf "%d", B * (0.05 + s) / 1514 + 64 }')
        # shellcheck disable=SC2086
        $pre tc qdisc add dev "$dev" parent "$h":10 handle $((h + 2)): netem $netem limit 10000 2>/dev/null \
            && $pre tc qdisc add dev "$dev" parent "$h":20 handle $((h + 1)): netem $netem limit "$pk" 2>/dev/null \
            || cannot "$NETEM_CANNOT"
    else
        $pre tc qdisc add dev "$dev" parent "$h":20 handle $((h + 1)): bfifo limit "$lim"
    fi
    $pre tc filter add dev "$dev" parent "$h": protocol ip prio 1 u32 match u16 0x0000 0xff80 at 2 flowid "$h":10 \
        || cannot "classify packets by size (tc filter ... u32; CONFIG_NET_CLS_U32; or --queue fifo)"
}

# host_val LIST I DEFAULT: host I's value in an I=V list (--host-rate ...), else DEFAULT.
host_val() {
    local kv
    for kv in ${1//,/ }; do [ "${kv%%=*}" = "$2" ] && { echo "${kv#*=}"; return; }; done
    echo "$3"
}
rate_of() { host_val "$HOST_RATES" "$1" "$RATE"; }
delay_of() { host_val "$HOST_DELAYS" "$1" "$DELAY"; }
jitter_of() { host_val "$HOST_JITTERS" "$1" "$JITTER"; }
loss_of() { host_val "$HOST_LOSSES" "$1" "$LOSS"; }
is_zero() { [[ $1 =~ ^0+(\.0+)?(us|ms|s|%)?$ ]]; }

# Host I's netem arguments for what it receives, or nothing when it has no delay, jitter or
# loss. With jitter, netem's rate (10gbit: it never holds a packet back) keeps the packets in
# order: each leaves no earlier than the one before it, as on a path through one queue (plain
# netem jitter reorders them, which TCP takes for losses).
netem_of() {
    local d j l a=""
    d=$(delay_of "$1"); j=$(jitter_of "$1"); l=$(loss_of "$1")
    if ! is_zero "$d" || ! is_zero "$j"; then
        a="delay $d"
        is_zero "$j" || a="$a $j rate 10gbit"
    fi
    is_zero "$l" || a="${a:+$a }loss $l"
    echo "$a"
}
# the seconds a netem argument list holds a packet at most (its delay plus its jitter)
netem_secs() {
    echo "$*" | awk '{ s = 0; for (i = 1; i <= NF; i++) if ($i == "delay") { for (k = i + 1; k <= i + 2 && k <= NF; k++) {
                          v = $k; if (v !~ /^[0-9.]+(us|ms|s)$/) break; x = v + 0
                          if (v ~ /us$/) x /= 1e6; else if (v ~ /ms$/) x /= 1e3; s += x } }
                     printf "%.6f", s }'
}
NETEM_CANNOT="attach a netem qdisc for --delay, --jitter or --loss (kernel without sch_netem, CONFIG_NET_SCH_NETEM; without --delay, --jitter and --loss none is needed)"

no_ipv6() { [ ! -w "/proc/sys/net/ipv6/conf/$1/disable_ipv6" ] || echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6"; }

shape() {   # shape I: (re)apply the qdiscs of host I
    local i=$1 ns veth r ne
    ns=$(ns_of "$i"); veth=$(veth_of "$i"); r=$(rate_of "$i"); ne=$(netem_of "$i")
    # Egress (the host sends): on the namespace side of the veth.
    q ip netns exec "$ns" tc qdisc del dev "$IFN" root || true
    shape_dir "ip netns exec $ns" "$IFN" root 1 "$r"
    # Ingress (the host receives): on the bridge side's egress. The delay, jitter and loss go
    # here, on forwarded packets, not on the sender's own queue where TCP small queues would
    # count them against the socket: every host-to-host packet crosses exactly one such ingress.
    q tc qdisc del dev "$veth" root || true
    if [ -n "$ne" ] && [ "$QUEUE" != fifo ]; then
        shape_dir "" "$veth" root 1 "$r" "$ne"
    elif [ -n "$ne" ]; then
        # shellcheck disable=SC2086
        tc qdisc add dev "$veth" root handle 1: netem $ne limit 100000 2>/dev/null || cannot "$NETEM_CANNOT"
        shape_dir "" "$veth" "parent 1:1" 10 "$r"
    else
        shape_dir "" "$veth" root 1 "$r"
    fi
}

# --cpu: each host's processes in a cgroup of their own with a CPU quota (cgroup v1's cpu
# controller, or v2's cpu.max). The rsh agent and `exec` put what they start into the host's
# group; its children stay there. The quota is granted per 10 ms period (100 ms below 0.1 cores:
# the kernel's smallest quota is 1 ms): over the default 100 ms a host that idles through a
# pipeline bubble would then compute at a whole core for up to C x 100 ms, not at C.
CG_V1=/sys/fs/cgroup/cpu
cg_root() {
    if [ -w "$CG_V1/cpu.cfs_quota_us" ] || [ -e "$CG_V1/cpu.cfs_quota_us" ]; then echo "$CG_V1/$TAG-$NAME"
    elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then echo "/sys/fs/cgroup/$TAG-$NAME"
    else echo ""; fi
}
cpu_caps() {   # cpu_caps N: (re)make host 0..N-1's groups with CPU's quota; none without --cpu
    local n=$1 root i q
    root=$(cg_root)
    if [ -z "$CPU" ]; then [ -z "$root" ] || [ ! -d "$root" ] || cg_remove "$root"; return 0; fi
    [ -n "$root" ] || cannot "cap a host's CPU (--cpu): no cgroup cpu controller (/sys/fs/cgroup/cpu or cgroup v2 with cpu)"
    mkdir -p "$root" 2>/dev/null || cannot "create a cgroup ($root) for --cpu $CAPS"
    [ "$root" = "$CG_V1/$TAG-$NAME" ] || echo +cpu >"$root/../cgroup.subtree_control" 2>/dev/null || true
    [ "$root" = "$CG_V1/$TAG-$NAME" ] || echo +cpu >"$root/cgroup.subtree_control" 2>/dev/null || true
    local period=10000
    awk -v c="$CPU" 'BEGIN { exit !(c < 0.1) }' && period=100000
    q=$(awk -v c="$CPU" -v p=$period 'BEGIN { printf "%d", c * p }')
    for ((i = 0; i < n; i++)); do
        mkdir -p "$root/h$i"
        if [ -e "$root/h$i/cpu.cfs_quota_us" ]; then   # quota first when the period shrinks (-1: none yet)
            echo -1 >"$root/h$i/cpu.cfs_quota_us" && echo $period >"$root/h$i/cpu.cfs_period_us" &&
                echo "$q" >"$root/h$i/cpu.cfs_quota_us"
        else
            echo "$q $period" >"$root/h$i/cpu.max"
        fi || cannot "set a CPU quota in $root/h$i"
    done
}
cg_remove() {   # the cluster's groups, their processes gone (teardown ends them first)
    local d
    for d in "$1"/h*; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
    rmdir "$1" 2>/dev/null || true
}

cmd_up() {
    local n="" ; RATE=100mbit; DELAY=0ms; JITTER=0ms; LOSS=0%; HOST_RATES=""; HOST_DELAYS=""; HOST_JITTERS=""
    HOST_LOSSES=""; CPU=""; QUEUE=acks-first; PRIVATE=0
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) [ $# -ge 2 ] || usage_err "--rate needs a value"; RATE=$2; shift 2 ;;
            --host-rate) [ $# -ge 2 ] || usage_err "--host-rate needs I=RATE[,I=RATE...]"; HOST_RATES=$2; shift 2 ;;
            --delay) [ $# -ge 2 ] || usage_err "--delay needs a value"; DELAY=$2; shift 2 ;;
            --jitter) [ $# -ge 2 ] || usage_err "--jitter needs a value"; JITTER=$2; shift 2 ;;
            --loss) [ $# -ge 2 ] || usage_err "--loss needs a value"; LOSS=$2; shift 2 ;;
            --host-delay) [ $# -ge 2 ] || usage_err "--host-delay needs I=D[,I=D...]"; HOST_DELAYS=$2; shift 2 ;;
            --host-jitter) [ $# -ge 2 ] || usage_err "--host-jitter needs I=J[,I=J...]"; HOST_JITTERS=$2; shift 2 ;;
            --host-loss) [ $# -ge 2 ] || usage_err "--host-loss needs I=P[,I=P...]"; HOST_LOSSES=$2; shift 2 ;;
            --private-dirs) PRIVATE=1; shift ;;
            --cpu) [ $# -ge 2 ] || usage_err "--cpu needs a value"; CPU=$2; shift 2 ;;
            --queue) [ $# -ge 2 ] || usage_err "--queue needs a value"; QUEUE=$2; shift 2 ;;
            --name) [ $# -ge 2 ] || usage_err "--name needs a value"; NAME=$2; shift 2 ;;
            -*) usage_err "up: unknown option $1" ;;
            *) [ -z "$n" ] || usage_err "up: one host count"; n=$1; shift ;;
        esac
    done
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAXHOSTS ] || usage_err "up N: N from 1 to $MAXHOSTS hosts (got '${n}')"
    check_name; check_rate "$RATE"; check_delay "$DELAY"; check_delay "$JITTER" --jitter; check_loss "$LOSS"
    [ "$QUEUE" = acks-first ] || [ "$QUEUE" = fifo ] || usage_err "--queue: acks-first or fifo (got '$QUEUE')"
    if [ -n "$CPU" ]; then
        [[ $CPU =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v c="$CPU" 'BEGIN { exit !(c >= 0.01 && c <= 1024) }' \
            || usage_err "--cpu: cores per host, from 0.01, like 0.5 or 2 (got '$CPU')"
    fi
    check_host_list --host-rate "$HOST_RATES" "$n" check_rate
    check_host_list --host-delay "$HOST_DELAYS" "$n" check_delay
    check_host_list --host-jitter "$HOST_JITTERS" "$n" check_delay
    check_host_list --host-loss "$HOST_LOSSES" "$n" check_loss
    need_root_tools
    # A failed `up` that was creating the cluster leaves nothing behind (not half a cluster
    # that `run` would trip over); one reconciling a running cluster leaves it be.
    local touched=0
    trap 'rc=$?; if [ $rc != 0 ] && [ $touched = 1 ] && teardown >/dev/null 2>&1; then echo "$PROG: removed cluster $NAME after the failed up" >&2; fi' EXIT

    # 198.18.0.0/24 must be ours alone: a second cluster (another --name) would shadow routes.
    local dev
    for dev in $(ip -o -4 addr show 2>/dev/null | awk -v p="$NET." 'index($4, p) == 1 {print $2}' | sort -u); do
        [ "$dev" = "$BR" ] && ours "$dev" && continue
        die "$SUBNET is already in use on $dev (another cluster? tools/cluster.sh down --name ${dev%-br}); one cluster at a time"
    done

    # The bridge.
    if [ -e "/sys/class/net/$BR" ]; then
        ours "$BR" || die "a link named $BR exists and is not ours; choose another --name"
    else
        touched=1
        ip link add "$BR" type bridge 2>/dev/null || cannot "create a bridge (ip link add $BR type bridge) $CAPS"
        no_ipv6 "$BR"
        ip link set "$BR" alias "$TAG:$NAME"
        # A fixed address: a bridge otherwise takes its lowest port's, and changes it as
        # hosts join, which can strand the hosts' first packets.
        ip link set "$BR" address 02:18:00:00:00:fe
    fi
    ip addr replace "$BRIDGE_ADDR/24" dev "$BR"
    ip link set "$BR" up
    local i ne
    for ((i = 0; i < n; i++)); do   # netem, before any host is touched
        ne=$(netem_of "$i")
        [ -n "$ne" ] || continue
        # shellcheck disable=SC2086
        tc qdisc add dev "$BR" root netem $ne 2>/dev/null || cannot "$NETEM_CANNOT"
        tc qdisc del dev "$BR" root
        break
    done

    # Hosts beyond N (a smaller `up` after a larger one) go.
    for i in $(hosts); do [ "$i" -lt "$n" ] || del_host "$i"; done

    for ((i = 0; i < n; i++)); do
        local ns veth addr
        ns=$(ns_of "$i"); veth=$(veth_of "$i"); addr=$(addr_of "$i")
        if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
            ip netns add "$ns" 2>/dev/null || cannot "create a network namespace (ip netns add $ns) $CAPS"
        fi
        # No IPv6 inside (no link-local fe80:: addresses, router or neighbour solicitations):
        # 198.18.0.0/24 is the only range the hosts have.
        ip netns exec "$ns" sh -c 'for f in all default lo; do [ -w /proc/sys/net/ipv6/conf/$f/disable_ipv6 ] && echo 1 >/proc/sys/net/ipv6/conf/$f/disable_ipv6; done; true' 
        # A host gives up on a TCP peer that stopped acknowledging after 5 retransmissions
        # (about 13 s) instead of Linux's 15 (about 15 minutes): a daemon whose host's link was
        # taken down then sees its connection fail and ends, as it would if mpirun had died.
        ip netns exec "$ns" sh -c 'echo 5 >/proc/sys/net/ipv4/tcp_retries2' 2>/dev/null || true
        if [ -e "/sys/class/net/$veth" ] && ! ours "$veth"; then
            die "a link named $veth exists and is not ours; choose another --name"
        fi
        if ! ip -n "$ns" link show "$IFN" >/dev/null 2>&1 || [ ! -e "/sys/class/net/$veth" ]; then
            q ip link del "$veth" || true
            q ip -n "$ns" link del "$IFN" || true
            ip link add "$veth" type veth peer name "$IFN" netns "$ns" 2>/dev/null \
                || cannot "create a veth pair into a namespace (ip link add $veth type veth peer ...) $CAPS"
            no_ipv6 "$veth"
            ip link set "$veth" alias "$TAG:$NAME"
        fi
        ip link set "$veth" master "$BR"
        ip link set "$veth" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr replace "$addr/24" dev "$IFN"
        ip -n "$ns" link set "$IFN" up
        shape "$i"
    done

    cpu_caps "$n"
    if [ "$PRIVATE" = 1 ]; then   # the hosts' directories (kept by an `up` without the flag)
        mkdir -p "$HOST_DIR" || die "cannot create $HOST_DIR"
        for ((i = 0; i < n; i++)); do mkdir -p "$DISK_ROOT/$NAME/h$i" || die "cannot create $DISK_ROOT/$NAME/h$i"; done
    fi

    # State: what `run` and `status` need; the rsh agent Open MPI launches its daemons with.
    mkdir -p "$STATE"
    printf 'N=%s\nRATE=%s\nDELAY=%s\nJITTER=%s\nLOSS=%s\nHOST_RATES=%s\nHOST_DELAYS=%s\nHOST_JITTERS=%s\nHOST_LOSSES=%s\nCPU=%s\nQUEUE=%s\nPRIVATE=%s\n' \
        "$n" "$RATE" "$DELAY" "$JITTER" "$LOSS" "$HOST_RATES" "$HOST_DELAYS" "$HOST_JITTERS" "$HOST_LOSSES" "$CPU" "$QUEUE" \
        "$PRIVATE" >"$STATE/config"
    : >"$STATE/hostfile"
    for ((i = 0; i < n; i++)); do echo "$(addr_of "$i") slots=64" >>"$STATE/hostfile"; done
    write_agent "$n"

    connectivity_check "$n"
    trap - EXIT
    echo "cluster $NAME up: $n host(s) $(addr_of 0)..$(addr_of $((n - 1))) on $BR ($BRIDGE_ADDR), $(describe)"
}

# The cluster's links, cores and directories in words (up, status).
describe() {
    local JITTER=${JITTER:-0ms} LOSS=${LOSS:-0%} HOST_DELAYS=${HOST_DELAYS:-} HOST_JITTERS=${HOST_JITTERS:-} HOST_LOSSES=${HOST_LOSSES:-} x
    x="each link $RATE full duplex${HOST_RATES:+ (hosts $HOST_RATES)}, one-way delay $DELAY${HOST_DELAYS:+ (hosts $HOST_DELAYS)}"
    is_zero "$JITTER" && [ -z "$HOST_JITTERS" ] || x="$x, jitter $JITTER${HOST_JITTERS:+ (hosts $HOST_JITTERS)}"
    is_zero "$LOSS" && [ -z "$HOST_LOSSES" ] || x="$x, loss $LOSS${HOST_LOSSES:+ (hosts $HOST_LOSSES)}"
    x="$x${CPU:+, $CPU cores each}"
    [ "${PRIVATE:-0}" = 0 ] || x="$x, a private $HOST_DIR each"
    echo "$x"
}

write_agent() {   # the plm_rsh_agent: ADDRESS CMD... -> CMD in that host's namespace
    local n=$1 i
    {
        echo '#!/bin/sh'
        echo "# Open MPI rsh agent of cluster $NAME (written by $PROG up): like ssh, it gets"
        echo '# [options] HOST COMMAND... and runs the command line in HOST'"'"'s namespace, under a'
        echo '# UTS namespace whose hostname is the namespace name (session directories and'
        echo '# shared-memory names of Open MPI are per hostname; hosts must not share them).'
        echo 'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done'
        echo 'host=${1:?no host}; shift'
        echo 'case ${host#*@} in'
        for ((i = 0; i < n; i++)); do echo "    $(addr_of "$i")|$(ns_of "$i")) ns=$(ns_of "$i") ;;"; done
        echo "    *) echo \"$NAME rsh agent: \$host is not a host of cluster $NAME\" >&2; exit 255 ;;"
        echo 'esac'
        # --cpu: into the host's group (by its number, the namespace name's suffix)
        local root; root=$(cg_root)
        [ -z "$CPU" ] || [ -z "$root" ] || echo "echo \$\$ >\"$root/h\${ns##*-h}/cgroup.procs\" || exit 255"
        if [ "$PRIVATE" = 1 ]; then   # --private-dirs: the host's directory over HOST_DIR, in a mount namespace
            echo "# --private-dirs: $HOST_DIR is $DISK_ROOT/$NAME/hI in host I's mount namespace."
            echo 'exec ip netns exec "$ns" unshare --uts --mount --propagation private sh -c '"'"'hostname "$0" 2>/dev/null || echo "$0" >/proc/sys/kernel/hostname; mount --bind "$2" "$3" || exit 255; exec sh -c "$1"'"'"' "$ns" "$*" "'"$DISK_ROOT/$NAME"'/h${ns##*-h}" "'"$HOST_DIR"'"'
        else
            echo 'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$0" 2>/dev/null || echo "$0" >/proc/sys/kernel/hostname; exec sh -c "$1"'"'"' "$ns" "$*"'
        fi
    } >"$STATE/rsh.tmp"
    chmod 755 "$STATE/rsh.tmp"
    mv "$STATE/rsh.tmp" "$STATE/rsh"
}

# Every host reaches the bridge's address (where mpirun listens) and host 0 (over the bridge).
# Catches firewalls: an INPUT policy that drops what the namespaces send to the bridge's
# address, or br_netfilter with an iptables FORWARD policy of DROP (as Docker leaves it),
# which drops bridged traffic between hosts. One python3 process enters each namespace in
# turn (setns), so it takes milliseconds even for 200 hosts.
connectivity_check() {
    local n=$1 out
    command -v python3 >/dev/null || return 0
    out=$(timeout 60 python3 - "$NAME" "$n" "$BRIDGE_ADDR" "$(addr_of 0)" <<'PY' 2>&1
import ctypes, os, socket, sys, time
name, n, abr, a0 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
def enter(ns):
    fd = os.open("/run/netns/" + ns, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        sys.exit("setns %s: %s" % (ns, os.strerror(ctypes.get_errno())))
    os.close(fd)
def listener(addr):
    s = socket.socket()
    s.bind((addr, 0))
    s.listen(512)
    return s, s.getsockname()[1]
lbr, pbr = listener(abr)  # root namespace
enter(name + "-h0")
l0, p0 = listener(a0)
for i in range(n):
    enter("%s-h%d" % (name, i))
    for what, addr, port in (("the bridge address " + abr, abr, pbr), (name + "-h0 " + a0, a0, p0)):
        if i == 0 and addr == a0:
            continue
        # A link that has just come up can drop the first SYNs on a loaded machine:
        # retry for 20 s before calling it a firewall.
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((addr, port), timeout=2).close()
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    sys.exit("%s-h%d cannot reach %s: %s (for 20 s)" % (name, i, what, e))
                time.sleep(0.2)
PY
    ) && return 0
    case $out in
        *"the bridge address"*) die "$out: a firewall on this machine drops what the hosts send to it (an INPUT policy of DROP: iptables -I INPUT -i $BR -j ACCEPT)" ;;
        *"cannot reach"*) die "$out: is bridged traffic filtered? (sysctl net.bridge.bridge-nf-call-iptables=1 with an iptables FORWARD policy of DROP: iptables -I FORWARD -i $BR -o $BR -j ACCEPT)" ;;
        *) die "connectivity check failed: $out" ;;
    esac
}

# --- down -----------------------------------------------------------------------------------
del_host() {
    local i=$1 ns veth pids
    ns=$(ns_of "$i"); veth=$(veth_of "$i")
    # Processes still inside (a run killed half way): end them, or the namespace lingers.
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
        kill $pids 2>/dev/null || true
        sleep 0.5
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    fi
    if [ -e "/sys/class/net/$veth" ] && ours "$veth"; then q ip link del "$veth" || true; fi
    q ip netns del "$ns" || true
}

cmd_down() {
    parse_name_only "$@"; check_name; need_root_tools
    if teardown; then echo "cluster $NAME down"; else echo "cluster $NAME: nothing to remove"; fi
}

teardown() {   # succeeds when there was something to remove
    local i found=0
    for i in $(hosts); do del_host "$i"; found=1; done
    # veths whose namespace went away without them (cannot happen with veths, but be exact).
    local l
    for l in $(ls /sys/class/net 2>/dev/null | grep -E "^$NAME-v[0-9]+\$" || true); do
        ours "$l" && { q ip link del "$l" || true; found=1; }
    done
    if [ -e "/sys/class/net/$BR" ] && ours "$BR"; then q ip link del "$BR" || true; found=1; fi
    if [ -d "$STATE" ]; then rm -rf "$STATE"; found=1; fi
    rmdir "$STATE_ROOT" 2>/dev/null || true
    local root; root=$(cg_root)
    if [ -n "$root" ] && [ -d "$root" ]; then cg_remove "$root"; found=1; fi
    # --private-dirs: the hosts' directories go with them, as a machine's disk goes with it
    if [ -d "$DISK_ROOT/$NAME" ]; then rm -rf "${DISK_ROOT:?}/$NAME"; found=1; fi
    rmdir "$DISK_ROOT" 2>/dev/null || true
    [ -d "$DISK_ROOT" ] || rmdir "$HOST_DIR" 2>/dev/null || true   # empty: no other cluster has hosts there
    # Open MPI's session directories of the hosts (ompi.HOSTNAME.UID; each host's hostname is
    # its namespace's name): a daemon killed, or cut off by a link taken down, leaves its own.
    local d
    for d in "${TMPDIR:-/tmp}/ompi.$NAME-h"*; do
        [[ -d $d && ${d##*/} =~ ^ompi\.$NAME-h[0-9]+\.[0-9]+$ ]] && { rm -rf "$d"; found=1; }
    done
    [ $found = 1 ]
}

parse_name_only() {
    while [ $# -gt 0 ]; do
        case $1 in
            --name) [ $# -ge 2 ] || usage_err "--name needs a value"; NAME=$2; shift 2 ;;
            *) usage_err "unexpected argument $1" ;;
        esac
    done
}

# --- run ------------------------------------------------------------------------------------
load_state() {
    check_name; need_root_tools
    [ -f "$STATE/config" ] && [ -x "$STATE/rsh" ] || die "cluster $NAME is not up: $PROG up N [--name $NAME]"
    # shellcheck disable=SC1091
    . "$STATE/config"
    local h; h=$(hosts | wc -l)
    [ "$h" = "$N" ] || die "cluster $NAME: $h namespaces for $N hosts; run $PROG up $N again"
    command -v mpirun >/dev/null || die "needs Open MPI's mpirun: apt-get install openmpi-bin"
}

# The mpirun arguments that put ranks into the namespaces and keep all traffic on the bridge.
MPI_BASE=()
mpi_base() {
    MPI_BASE=(--hostfile "$STATE/hostfile" --map-by node --bind-to none
        --mca plm_rsh_agent "$STATE/rsh" --mca plm_rsh_no_tree_spawn 1
        --mca pml ob1 --mca btl tcp,self
        --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET")
}

cmd_run() {   # run [--name N] (NP CMD... | -- MPIRUN_ARGS...); torch=1 adds the torch env
    local torch=$1; shift
    while [ $# -gt 0 ] && [ "$1" = --name ]; do
        [ $# -ge 2 ] || usage_err "--name needs a value"; NAME=$2; shift 2
    done
    [ $# -ge 1 ] || usage_err "run: NP CMD... or -- MPIRUN_ARGS..."
    local np=""
    if [ "$1" = -- ]; then
        shift; [ $# -ge 1 ] || usage_err "run --: mpirun arguments expected"
    else
        [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge 1 ] || usage_err "run: NP (ranks) first, got '$1'"
        np=$1; shift
        [ $# -ge 1 ] || usage_err "run $np: a command expected"
    fi
    load_state; mpi_base
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    local env=()
    if [ "$torch" = 1 ]; then
        # torch.distributed's env:// rendezvous at rank 0 (host 0 under --map-by node); gloo
        # picks its interface from the hostname, which no namespace can resolve: name it.
        env=(-x MASTER_ADDR="$(addr_of 0)" -x MASTER_PORT="${MASTER_PORT:-29500}" -x GLOO_SOCKET_IFNAME="$IFN")
    fi
    if [ -n "$np" ]; then
        exec mpirun "${MPI_BASE[@]}" "${env[@]}" -np "$np" "$@"
    else
        exec mpirun "${MPI_BASE[@]}" "${env[@]}" "$@"
    fi
}

cmd_exec() {
    while [ $# -gt 0 ] && [ "$1" = --name ]; do
        [ $# -ge 2 ] || usage_err "--name needs a value"; NAME=$2; shift 2
    done
    [ $# -ge 2 ] && [[ $1 =~ ^[0-9]+$ ]] || usage_err "exec I CMD..."
    local i=$1; shift
    check_name; need_root_tools
    hosts | grep -qx "$i" || die "cluster $NAME has no host $i"
    local ns root; ns=$(ns_of "$i")
    [ ! -f "$STATE/config" ] || . "$STATE/config"
    root=$(cg_root)
    if [ -n "${CPU:-}" ] && [ -n "$root" ]; then echo $$ >"$root/h$i/cgroup.procs" || die "cannot join $root/h$i"; fi
    if [ "${PRIVATE:-0}" = 1 ]; then
        exec ip netns exec "$ns" unshare --uts --mount --propagation private sh -c 'hostname "$0" 2>/dev/null || echo "$0" >/proc/sys/kernel/hostname; mount --bind "$1" "$2" || exit 255; shift 2; exec "$@"' \
            "$ns" "$DISK_ROOT/$NAME/h$i" "$HOST_DIR" "$@"
    fi
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" 2>/dev/null || echo "$0" >/proc/sys/kernel/hostname; exec "$@"' "$ns" "$@"
}

cmd_net_cpu() {   # net-cpu [--name N] [--mb MB]: CPU seconds per byte of a TCP stream host 0 -> host 1
    local mb=300
    while [ $# -gt 0 ]; do
        case $1 in
            --name) [ $# -ge 2 ] || usage_err "--name needs a value"; NAME=$2; shift 2 ;;
            --mb) [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || usage_err "--mb: megabytes (>= 1)"; mb=$2; shift 2 ;;
            *) usage_err "net-cpu: unknown argument $1" ;;
        esac
    done
    check_name; need_root_tools
    hosts | grep -qx 0 && hosts | grep -qx 1 || die "net-cpu needs hosts 0 and 1 (up 2 or more)"
    command -v python3 >/dev/null || die "net-cpu needs python3"
    local port=$((47000 + RANDOM % 1000)) dst; dst=$(addr_of 1)
    # The receiver reads into one buffer and answers one byte when it has everything; the sender
    # samples /proc/stat (the whole machine) around the stream and that answer.
    ip netns exec "$(ns_of 1)" python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(300)
want, buf, n = int(sys.argv[3]), bytearray(1 << 20), 0
# polled every millisecond, not woken per packet: as a rank reads when its waits poll MPI
c.setblocking(False)
deadline = time.monotonic() + 300
while n < want:
    try:
        k = c.recv_into(buf, min(len(buf), want - n))
    except BlockingIOError:
        if time.monotonic() > deadline: sys.exit("net-cpu: the stream stalled")
        time.sleep(0.001)
        continue
    if not k: sys.exit("net-cpu: the stream ended early")
    n += k
c.setblocking(True)
c.sendall(b"k")' "$dst" "$port" "$((mb << 20))" &
    local rpid=$!
    sleep 0.5
    ip netns exec "$(ns_of 0)" python3 -c '
import os, socket, sys, time
def cpu():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)   # busy (all but idle and iowait), total; jiffies
mb, hz, ncpu = int(sys.argv[3]), os.sysconf("SC_CLK_TCK"), os.cpu_count()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = memoryview(bytearray(1 << 20))
b0, a0 = cpu(); t0 = time.monotonic()
for _ in range(mb): s.sendall(buf)
s.settimeout(300)
if s.recv(1) != b"k": sys.exit("net-cpu: no answer from the receiver")
t1 = time.monotonic(); b1, a1 = cpu()
busy, nbytes = (b1 - b0) / hz, mb << 20
print(f"net-cpu: {nbytes} bytes in {t1 - t0:.2f} s ({nbytes / (t1 - t0) / 1e6:.1f} MB/s); the machine was "
      f"{busy:.2f} CPU-seconds busy ({100 * (b1 - b0) / max(1, a1 - a0):.0f}% of {ncpu} cores): {busy / nbytes:.3g} s per byte")
print(f"{busy / nbytes:.3g}")' "$dst" "$port" "$mb" || { kill "$rpid" 2>/dev/null; die "net-cpu: the stream failed"; }
    wait "$rpid" || die "net-cpu: the receiver failed"
}

# The cluster file (docs/reference/formats.md) that describes the links up now: one level of N
# workers at --rate's TCP payload (1448 bytes of each 1514-byte frame) and --delay's latency;
# a host with a rate or delay of its own is listed under "hosts". Jitter and loss are not in it
# (the simulator has neither); a worker per host (rank r on host r: run NP=N).
secs_of() { awk -v d="$1" 'BEGIN { s = d + 0; if (d ~ /us$/) s /= 1e6; else if (d ~ /ms$/) s /= 1e3; printf "%.9g", s }'; }
payload_of() { awk -v b="$(rate_bytes "$1")" 'BEGIN { printf "%.9g", b * 1448 / 1514 }'; }
cmd_cluster_file() {
    parse_name_only "$@"; check_name
    [ -f "$STATE/config" ] || die "cluster $NAME is not up: $PROG up N [--name $NAME]"
    # shellcheck disable=SC1091
    . "$STATE/config"
    local JITTER=${JITTER:-0ms} LOSS=${LOSS:-0%} HOST_DELAYS=${HOST_DELAYS:-} CPU=${CPU:-} i hosts="" any=0 h speed=""
    # --cpu below one core: a one-thread rank computes at that fraction of its profile's speed
    [ -z "$CPU" ] || speed=$(awk -v c="$CPU" 'BEGIN { if (c < 1) printf "%g", c }')
    for ((i = 0; i < N; i++)); do
        h=${speed:+\"speed\": $speed}
        [ "$(rate_of "$i")" = "$RATE" ] || h="$h${h:+, }\"bandwidth\": $(payload_of "$(rate_of "$i")")"
        [ "$(delay_of "$i")" = "$DELAY" ] || h="$h${h:+, }\"latency\": $(secs_of "$(delay_of "$i")")"
        [ -z "$h" ] || any=1
        hosts="$hosts${hosts:+, }{$h}"
    done
    printf '{"format": "pipedream-cluster", "version": 1,\n "levels": [{"workers": %s, "bandwidth": %s, "latency": %s}]' \
        "$N" "$(payload_of "$RATE")" "$(secs_of "$DELAY")"
    [ $any = 0 ] || printf ',\n "hosts": [%s]' "$hosts"
    printf '}\n'
}

cmd_mpirun_args() {
    parse_name_only "$@"; load_state; mpi_base
    echo "${MPI_BASE[*]:2}"
}

cmd_status() {
    parse_name_only "$@"; check_name; need_root_tools
    local hs; hs=$(hosts)
    if [ -z "$hs" ] && [ ! -e "/sys/class/net/$BR" ]; then echo "cluster $NAME: down"; return 0; fi
    if [ -f "$STATE/config" ]; then
        # shellcheck disable=SC1091
        . "$STATE/config"
        echo "cluster $NAME: $N host(s), $(describe), queue ${QUEUE:-fifo}; bridge $BR $BRIDGE_ADDR"
    else
        echo "cluster $NAME: partial (no $STATE/config): $PROG down --name $NAME, then up"
    fi
    local i
    for i in $hs; do
        local ns; ns=$(ns_of "$i")
        printf '  %-14s %-12s egress:  %s\n' "$ns" "$(addr_of "$i")" \
            "$(ip netns exec "$ns" tc qdisc show dev "$IFN" 2>/dev/null | head -1 | sed 's/^qdisc //')"
        printf '  %-14s %-12s ingress: %s\n' "" "" "$(tc qdisc show dev "$(veth_of "$i")" 2>/dev/null | head -1 | sed 's/^qdisc //')"
    done
    if [ -f "$STATE/config" ]; then
        mpi_base
        echo "mpirun line ($PROG run NP CMD... adds it):"
        echo "  mpirun ${MPI_BASE[*]} -np NP CMD..."
    fi
}

# --- main -----------------------------------------------------------------------------------
[ $# -ge 1 ] || usage_err "a command expected"
cmd=$1; shift
case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    run) cmd_run 0 "$@" ;;
    run-torch) cmd_run 1 "$@" ;;
    exec) cmd_exec "$@" ;;
    status) cmd_status "$@" ;;
    mpirun-args) cmd_mpirun_args "$@" ;;
    cluster-file) cmd_cluster_file "$@" ;;
    net-cpu) cmd_net_cpu "$@" ;;
    -h|--help|help) help ;;
    *) usage_err "unknown command '$cmd'" ;;
esac
