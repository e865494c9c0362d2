#!/usr/bin/env bash
# cluster.sh: the emulated cluster of tools/cluster.sh (docs/reference/cluster-sh.md), 2 hosts:
#  - at 10mbit each direction of each host's link carries its shaped rate, both directions at
#    once (full duplex: egress shaping), and so does the ingress alone (bridge -> host); where
#    the kernel has sch_netem, --delay 5ms makes a 10 ms round trip between the hosts; with
#    acknowledgements ahead of the data (the default queue), each of two opposite streams keeps
#    90% of the rate;
#  - `up` again with another rate or --queue reshapes in place (idempotent reconcile); `net-cpu` streams
#    20 MB from host 0 to host 1 and reports a positive CPU cost per byte; then a 1f1b run
#    of lenet5 on 2 stages across the 2 hosts (Open MPI over TCP on the bridge; the byte
#    counters of the shaped links see its activations) ends with weights bitwise equal to
#    the same run on this host over shared memory;
#  - with netem, --host-delay 1=15ms makes host 1's ingress its own: a 20 ms round trip (5 + 15);
#  - `cluster-file` describes the links (TCP payload bytes/s, latency in seconds) for plan;
#  - --private-dirs: each host sees its own /var/lib/pipedream-host (a file one host writes there
#    is not in the other's), under `exec` and under `run`; `down` removes the hosts' directories;
#  - --cpu 0.25 holds a busy loop in a host to about a quarter of a core (a cgroup quota), and
#    `up` again without it removes the groups;
#  - clear errors: bad usage, `run` on a cluster that is not up, not root, no iproute2;
#  - `down` removes every namespace and link; `down` again is a no-op.
# Exits 77 (ctest SKIP) when not root, without iproute2 or python3, or where network
# namespaces, veths, bridges or tbf cannot be made (an unprivileged container).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
NAME=pdt$$                    # 3 + at most 7 digits: within the tool's 10 characters
tmp=$(mktemp -d)
cleanup() { bash "$CL" down --name "$NAME" >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP     # the EXIT trap tears down
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2 (ip, tc)"
command -v python3 >/dev/null || skip "needs python3 (the bandwidth probe)"
command -v mpirun >/dev/null || skip "needs mpirun"
PD=$(realpath "$PD")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
t_start=$(date +%s)

# Clusters left by earlier runs of this test that were killed (SIGKILL skips traps).
for br in $(ls /sys/class/net | grep -E '^pdt[0-9]+-br$' || true); do
    pid=${br#pdt}; pid=${pid%-br}
    [ -d "/proc/$pid" ] || bash "$CL" down --name "pdt$pid" >/dev/null 2>&1
done
if ip -o -4 addr show | grep -q ' 198\.18\.0\.'; then
    skip "198.18.0.0/24 is in use (a cluster is up: tools/cluster.sh status); the test needs it"
fi

# --- errors that need no cluster ---
bash "$CL" up 0 >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "up 0: exit 2 expected"
grep -q "N from 1 to" "$tmp/err" || fail "up 0 message: $(cat "$tmp/err")"
bash "$CL" up 2 --rate fast --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--rate fast: exit 2 expected"
bash "$CL" up 2 --cpu 0 --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--cpu 0: exit 2 expected"
grep -q -- "--cpu: cores per host" "$tmp/err" || fail "--cpu 0 message: $(cat "$tmp/err")"
bash "$CL" up 2 --queue lifo --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--queue lifo: exit 2 expected"
grep -q -- "--queue: acks-first or fifo" "$tmp/err" || fail "--queue lifo message: $(cat "$tmp/err")"
bash "$CL" up 2 --loss 0.5 --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--loss 0.5: exit 2 expected"
grep -q -- "--loss: a percentage" "$tmp/err" || fail "--loss 0.5 message: $(cat "$tmp/err")"
bash "$CL" up 2 --host-delay 2=5ms --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--host-delay 2=5ms: exit 2 expected"
grep -q -- "--host-delay: host 2 of 2" "$tmp/err" || fail "--host-delay 2=5ms message: $(cat "$tmp/err")"
bash "$CL" up 2 --host-jitter 1=fast --name "$NAME" >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--host-jitter 1=fast: exit 2 expected"
grep -q -- "--host-jitter: like 1ms" "$tmp/err" || fail "--host-jitter message: $(cat "$tmp/err")"
bash "$CL" run --name "$NAME" 2 true >/dev/null 2>"$tmp/err"; [ $? = 1 ] || fail "run before up: exit 1 expected"
grep -q "cluster $NAME is not up" "$tmp/err" || fail "run before up message: $(cat "$tmp/err")"
if command -v setpriv >/dev/null; then
    setpriv --reuid=65534 --regid=65534 --clear-groups bash -s -- up 2 --name "$NAME" <"$CL" >/dev/null 2>"$tmp/err"
    [ $? = 1 ] && grep -q "needs root" "$tmp/err" || fail "not root: $(cat "$tmp/err")"
fi
mkdir "$tmp/bin"; ln -s "$(command -v id)" "$tmp/bin/id"
PATH=$tmp/bin /bin/bash "$CL" up 2 --name "$NAME" >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q "needs iproute2" "$tmp/err" || fail "no iproute2: $(cat "$tmp/err")"
echo "ok: usage and environment errors"

# --- bring up: with a delay where the kernel has netem, else rate only ---
RATE=10mbit RATE_BPS=10000000 DELAY=5ms
bash "$CL" up 2 --rate $RATE --delay $DELAY --name "$NAME" >"$tmp/up" 2>"$tmp/err"
rc=$?
if [ $rc = 3 ] && grep -q netem "$tmp/err"; then
    echo "note: $(cat "$tmp/err" | head -1); the delay is not checked"
    DELAY=
    bash "$CL" up 2 --rate $RATE --name "$NAME" >"$tmp/up" 2>"$tmp/err"
    rc=$?
fi
[ $rc = 3 ] && skip "$(cat "$tmp/err")"
[ $rc = 0 ] || fail "up: $(cat "$tmp/err")"
cat "$tmp/up"
bash "$CL" up 2 --rate $RATE ${DELAY:+--delay $DELAY} --name "$NAME" >/dev/null 2>"$tmp/err" || fail "up again: $(cat "$tmp/err")"
[ "$(ip netns list | grep -c "^$NAME-h")" = 2 ] || fail "up twice: $(ip netns list)"

# --- the links' bandwidth (and delay) ---
cat >"$tmp/net.py" <<'PY'
import socket, sys, time
def server(addr):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5301)); s.listen(1); s.settimeout(20)
    c, _ = s.accept(); c.settimeout(20); return c
def client(addr):
    for _ in range(200):
        try: return socket.create_connection((addr, 5301), timeout=5)
        except ConnectionRefusedError: time.sleep(0.02)
    sys.exit("no server at " + addr)
mode, addr = sys.argv[1], sys.argv[2]
if mode == "recv":      # Mbit/s of payload, steady state: from 0.5 s after the first byte to the end
    c = server(addr); n, t0, t1 = 0, None, None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        now = time.perf_counter()
        if t0 is None: t0 = now
        if now - t0 < 0.5: t1 = now
        else: n += len(b)
    print(n * 8 / (time.perf_counter() - t1) / 1e6)
elif mode == "send":    # SECONDS of data as fast as the link takes it
    c = client(addr); end = time.perf_counter() + float(sys.argv[3]); buf = b"x" * 65536
    while time.perf_counter() < end: c.sendall(buf)
    c.close()
elif mode == "echo":
    c = server(addr); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(64)
        if not b: break
        c.sendall(b)
elif mode == "ping":    # median round trip of 1-byte messages, ms
    c = client(addr); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); ts = []
    for _ in range(21):
        t0 = time.perf_counter(); c.sendall(b"x"); c.recv(1); ts.append(time.perf_counter() - t0)
    print(sorted(ts)[10] * 1e3)
PY
A0=198.18.0.1 A1=198.18.0.2
inns() { local i=$1; shift; timeout 30 bash "$CL" exec --name "$NAME" "$i" "$@"; }
check_bw() {   # check_bw WHAT FILE [LOW]: measured payload rate within LOW (0.80)-102% of the shaped rate
    python3 - "$1" "$(cat "$2")" "$RATE_BPS" "${3:-0.80}" <<'PY' || exit 1
import sys
what, got, rate, low = sys.argv[1], float(sys.argv[2] or 0), float(sys.argv[3]) / 1e6, float(sys.argv[4])
ok = low * rate <= got <= 1.02 * rate   # payload: ~95.6% of the line rate (1448 of 1514 B)
print(("ok: " if ok else "FAIL: ") + f"{what}: {got:.2f} Mbit/s of payload on a {rate:g} Mbit/s link")
sys.exit(0 if ok else 1)
PY
}
# Both directions at once: each host's egress and ingress, full duplex.
inns 1 python3 "$tmp/net.py" recv $A1 >"$tmp/bw01" & r1=$!
inns 0 python3 "$tmp/net.py" recv $A0 >"$tmp/bw10" & r0=$!
inns 0 python3 "$tmp/net.py" send $A1 2 & s0=$!
inns 1 python3 "$tmp/net.py" send $A0 2 & s1=$!
for p in $s0 $s1 $r0 $r1; do wait $p || fail "bandwidth probe failed"; done
# Acknowledgements go ahead of the data on the link they share with it (--queue acks-first,
# the default): each stream keeps at least 90% of the rate (payload is 95.6% of it).
check_bw "h0 -> h1 while h1 -> h0" "$tmp/bw01" 0.90
check_bw "h1 -> h0 while h0 -> h1" "$tmp/bw10" 0.90
ip netns exec "$NAME-h0" tc qdisc show dev "$NAME-eth" | grep -q "^qdisc htb 1: root" || fail "egress qdisc: $(ip netns exec "$NAME-h0" tc qdisc show dev "$NAME-eth")"
ip netns exec "$NAME-h0" tc filter show dev "$NAME-eth" | grep -q "flowid 1:10" || fail "no acknowledgement class filter: $(ip netns exec "$NAME-h0" tc filter show dev "$NAME-eth")"
bash "$CL" status --name "$NAME" | grep -q "queue acks-first" || fail "status: $(bash "$CL" status --name "$NAME")"
# The ingress shaping alone: from the bridge's address (root namespace) to h1.
inns 1 python3 "$tmp/net.py" recv $A1 >"$tmp/bwb1" & r1=$!
timeout 30 python3 "$tmp/net.py" send $A1 2 || fail "send from the bridge"
wait $r1 || fail "bandwidth probe failed"
check_bw "bridge -> h1 (ingress shaping)" "$tmp/bwb1"
if [ -n "$DELAY" ]; then
    inns 1 python3 "$tmp/net.py" echo $A1 & r1=$!
    rtt=$(inns 0 python3 "$tmp/net.py" ping $A1) || fail "ping probe failed"
    wait $r1
    python3 -c "import sys; sys.exit(0 if 9.5 <= $rtt <= 20 else 1)" || fail "round trip $rtt ms, expected ~10 ms for --delay 5ms"
    echo "ok: round trip h0 <-> h1 $rtt ms with --delay 5ms"
    bash "$CL" up 2 --rate $RATE --delay $DELAY --host-delay 1=15ms --name "$NAME" >/dev/null 2>"$tmp/err" ||
        fail "up --host-delay: $(cat "$tmp/err")"
    inns 1 python3 "$tmp/net.py" echo $A1 & r1=$!
    rtt=$(inns 0 python3 "$tmp/net.py" ping $A1) || fail "ping probe failed"
    wait $r1
    python3 -c "import sys; sys.exit(0 if 19.5 <= $rtt <= 30 else 1)" || fail "round trip $rtt ms, expected ~20 ms for 5 ms into h0, 15 into h1"
    bash "$CL" cluster-file --name "$NAME" | grep -q '"hosts": \[{}, {"latency": 0.015}\]' ||
        fail "cluster-file with --host-delay: $(bash "$CL" cluster-file --name "$NAME")"
    echo "ok: round trip h0 <-> h1 $rtt ms with --host-delay 1=15ms"
fi
bash "$CL" cluster-file --name "$NAME" >"$tmp/cl.json" || fail "cluster-file"
python3 - "$tmp/cl.json" "${DELAY:-0ms}" <<'PY' || fail "cluster-file: $(cat "$tmp/cl.json")"
import json, sys
c = json.load(open(sys.argv[1])); lv = c["levels"][0]; d = float(sys.argv[2][:-2]) / 1e3
assert c["format"] == "pipedream-cluster" and lv["workers"] == 2, c
assert abs(lv["bandwidth"] - 10e6 / 8 * 1448 / 1514) < 1 and abs(lv["latency"] - d) < 1e-12, c
PY
echo "ok: cluster-file: $(tr -d '\n' <"$tmp/cl.json")"

# --- reshape in place, then 1f1b across the hosts = 1f1b on this host ---
bash "$CL" up 2 --rate 200mbit --queue fifo --name "$NAME" >/dev/null 2>"$tmp/err" || fail "up at 200mbit: $(cat "$tmp/err")"
ip netns exec "$NAME-h0" tc qdisc show dev "$NAME-eth" | grep -q "tbf 1: root.*rate 200Mbit" || fail "not reshaped to a fifo: $(ip netns exec "$NAME-h0" tc qdisc show dev "$NAME-eth")"
bash "$CL" up 2 --rate 200mbit --name "$NAME" >/dev/null 2>"$tmp/err" || fail "up at 200mbit: $(cat "$tmp/err")"
ip netns exec "$NAME-h0" tc class show dev "$NAME-eth" | grep -q "class htb 1:1 root rate 200Mbit" || fail "not reshaped: $(ip netns exec "$NAME-h0" tc class show dev "$NAME-eth")"
tc class show dev "$NAME-v0" | grep -q "rate 200Mbit" || fail "ingress not reshaped: $(tc class show dev "$NAME-v0")"
bash "$CL" status --name "$NAME" | grep -q "2 host(s), each link 200mbit" || fail "status: $(bash "$CL" status --name "$NAME")"
echo "ok: reshaped to 200mbit in place (a fifo, then acknowledgements first)"

# --- net-cpu: the whole stream arrives, the figure is a positive number of seconds per byte ---
bash "$CL" net-cpu --name "$NAME" --mb 20 >"$tmp/nc" 2>"$tmp/err" || fail "net-cpu: $(cat "$tmp/err")"
grep -q "^net-cpu: 20971520 bytes in" "$tmp/nc" || fail "net-cpu report: $(cat "$tmp/nc")"
python3 -c "import sys; v = float(sys.argv[1]); sys.exit(0 if 0 < v < 1e-5 else 1)" "$(tail -1 "$tmp/nc")" \
    || fail "net-cpu figure: $(cat "$tmp/nc")"
bash "$CL" net-cpu --name "$NAME" --mb 0 >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "net-cpu --mb 0: exit 2 expected"
echo "ok: net-cpu $(tail -1 "$tmp/nc") s per byte"

# A small test set (512 images) keeps the evaluation pass, which crosses the link too, short.
mkdir "$tmp/data"
D=/usr/share/datasets/fashion-mnist
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz; do ln -s "$D/$f" "$tmp/data/$f"; done
python3 - "$D" "$tmp/data" <<'PY' || fail "test subset"
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for f, item in (("t10k-images-idx3-ubyte.gz", 784), ("t10k-labels-idx1-ubyte.gz", 1)):
    b = gzip.open(f"{src}/{f}").read()
    hdr = 16 if item > 1 else 8
    out = bytearray(b[:hdr]); out[4:8] = struct.pack(">I", 512)
    gzip.open(f"{dst}/{f}", "wb").write(bytes(out) + b[hdr:hdr + 512 * item])
PY
"$PD" profile "$SRC/models/lenet5.json" -o "$tmp/prof.json" >/dev/null 2>"$tmp/err" || fail "profile: $(cat "$tmp/err")"
"$PD" plan "$tmp/prof.json" --workers 2 --bandwidth 1e10 --straight -o "$tmp/plan.json" >/dev/null 2>"$tmp/err" \
    || fail "plan: $(cat "$tmp/err")"
args=("$SRC/models/lenet5.json" --plan "$tmp/plan.json" --schedule 1f1b --steps 20 --minibatch 32 --data "$tmp/data" --timeout 60)
timeout 90 mpirun -np 2 --bind-to none "$PD" train "${args[@]}" >"$tmp/shm.out" 2>"$tmp/shm.err" \
    || fail "1f1b on this host: $(tail -5 "$tmp/shm.err")"
sent() { tc -s qdisc show dev "$NAME-v1" | awk '/Sent/ {print $2; exit}'; }
before=$(sent)
timeout 90 bash "$CL" run --name "$NAME" 2 "$PD" train "${args[@]}" >"$tmp/cl.out" 2>"$tmp/cl.err" \
    || fail "1f1b across the cluster: $(tail -5 "$tmp/cl.err")"
moved=$(( $(sent) - before ))
crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }
a=$(crc "$tmp/cl.out"); b=$(crc "$tmp/shm.out")
[ "$(wc -l <"$tmp/cl.out")" = 1 ] || fail "cluster run: $(cat "$tmp/cl.out")"
[ -n "$a" ] || fail "cluster run: no weights_crc in $(cat "$tmp/cl.out")"
[ "$a" = "$b" ] || fail "1f1b across 2 hosts: weights $a differ from the run over shared memory: $b"
# What stage 0 sends forward: 20 minibatches of 32 samples of its last layer's output (the
# profile's activation_bytes are for its own minibatch), all through h1's ingress.
want=$(python3 - "$tmp/prof.json" "$tmp/plan.json" <<'PY'
import json, sys
prof, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
last = plan["stages"][0]["layers"][-1]
print(int(20 * 32 * prof["layers"][last]["activation_bytes"] / prof["minibatch"]))
PY
)
[ "$moved" -gt "$want" ] || fail "$moved bytes crossed h1's link, less than stage 0's $want bytes of activations: did the ranks talk over the bridge?"
echo "ok: 1f1b lenet5 on 2 hosts over TCP = on this host over shared memory ($a; $((moved / 1000000)) MB into h1, of which $((want / 1000000)) MB activations)"

# --- --cpu: a host's processes capped at a quarter of a core ---
# (where the machine has no cgroup cpu controller, `up` exits 3: the check is skipped)
bash "$CL" up 2 --rate 200mbit --host-rate 1=100mbit --cpu 0.25 --name "$NAME" >"$tmp/up" 2>&1
case $? in
    0) share=$(bash "$CL" exec --name "$NAME" 0 python3 -c 'import time
t = time.time(); c = time.process_time()
while time.time() - t < 1.5: pass
print(round((time.process_time() - c) / (time.time() - t), 3))') || fail "--cpu: exec"
       python3 -c "import sys; sys.exit(0 if 0.05 < $share < 0.35 else 1)" ||
           fail "--cpu 0.25: a busy loop in host 0 got $share of a core"
       bash "$CL" status --name "$NAME" | grep -q "0.25 cores each" || fail "--cpu: status: $(bash "$CL" status --name "$NAME")"
       bash "$CL" cluster-file --name "$NAME" | grep -q '"hosts": \[{"speed": 0.25}, {"speed": 0.25, "bandwidth": [0-9.]*}\]' ||
           fail "cluster-file with --cpu 0.25: $(bash "$CL" cluster-file --name "$NAME")"
       bash "$CL" up 2 --rate 200mbit --name "$NAME" >/dev/null 2>&1 || fail "up again without --cpu"
       ls -d /sys/fs/cgroup/cpu/pipedream-cluster-"$NAME" /sys/fs/cgroup/pipedream-cluster-"$NAME" 2>/dev/null &&
           fail "up without --cpu kept the groups"
       echo "ok: --cpu 0.25: a busy loop in a host got $share of a core" ;;
    3) echo "ok: --cpu not checked: $(tail -1 "$tmp/up")" ;;
    *) fail "up --cpu: $(cat "$tmp/up")" ;;
esac

# --- --private-dirs: a directory of each host's own at one path ---
bash "$CL" up 2 --rate 200mbit --private-dirs --name "$NAME" >/dev/null 2>"$tmp/err" || fail "up --private-dirs: $(cat "$tmp/err")"
H=/var/lib/pipedream-host
bash "$CL" exec --name "$NAME" 0 sh -c "echo zero >$H/who" || fail "--private-dirs: write on host 0"
[ -e "$H/who" ] && fail "--private-dirs: host 0's file is in this machine's $H"
bash "$CL" exec --name "$NAME" 1 sh -c "[ ! -e $H/who ] && echo one >$H/who" || fail "--private-dirs: host 1 sees host 0's file"
timeout 60 bash "$CL" run --name "$NAME" 2 sh -c "echo \$(hostname) \$(cat $H/who)" >"$tmp/who" 2>"$tmp/err" ||
    fail "--private-dirs: run: $(cat "$tmp/err")"
[ "$(sort "$tmp/who" | tr '\n' ' ')" = "$NAME-h0 zero $NAME-h1 one " ] || fail "--private-dirs under run: $(cat "$tmp/who")"
bash "$CL" status --name "$NAME" | grep -q "a private $H each" || fail "--private-dirs: status: $(bash "$CL" status --name "$NAME")"
[ -f "/var/lib/pipedream-cluster/$NAME/h1/who" ] || fail "--private-dirs: host 1's directory is not /var/lib/pipedream-cluster/$NAME/h1"
echo "ok: --private-dirs: each host has its own $H (exec and run)"

# --- down, twice ---
bash "$CL" down --name "$NAME" >"$tmp/down" 2>&1 || fail "down: $(cat "$tmp/down")"
ip netns list | grep -q "^$NAME-" && fail "namespaces left: $(ip netns list)"
ls /sys/class/net | grep -q "^$NAME-" && fail "links left: $(ls /sys/class/net)"
[ -e "/var/lib/pipedream-cluster/$NAME" ] && fail "the hosts' directories left: /var/lib/pipedream-cluster/$NAME"
bash "$CL" down --name "$NAME" >"$tmp/down" 2>&1 || fail "down again: $(cat "$tmp/down")"
grep -q "nothing to remove" "$tmp/down" || fail "down again: $(cat "$tmp/down")"
echo "ok: down removes everything; down again is a no-op ($(( $(date +%s) - t_start )) s)"
