#!/usr/bin/env bash
# link_echo.sh: the simulator's charge for one message against the emulated links. Two hosts of
# tools/cluster.sh at --rate and --delay (one way); an echo of 1 byte and of 1 MB between them
# (host 0 sends, host 1 answers with as many bytes once it has them all: a round trip of two
# messages), on a connection already warm (3 rounds first, then the median of 9; 21 for 1
# byte). The prediction: `pipedream simulate` of a two-stage pipeline whose layers take no time
# and pass B bytes (1f1b-flush, one micro-batch: a forward message and its gradient back, each
# bytes / bandwidth + latency), on the cluster file `tools/cluster.sh cluster-file` writes.
# Run as root, under the cluster lock (one cluster at a time):
#
#   flock /tmp/pd-cluster.lock bench/link_echo.sh [--rate 100mbit] [--delay 20ms] [--jitter 0ms]
#                                                [--loss 0%] [--pd build/pipedream] [--out FILE]
#
# Prints a table (bytes, measured ms, predicted ms, measured / predicted) and writes it to FILE
# (default bench/results/link-echo-<rate>-<delay>.txt) with the command and the cluster file.
# Exit 3: this machine cannot make the cluster (no netem for a delay: tools/cluster.sh's 3).
set -euo pipefail
RATE=100mbit DELAY=20ms JITTER=0ms LOSS=0% PD=build/pipedream OUT=""
while [ $# -gt 0 ]; do
    case $1 in
        --rate) RATE=$2; shift 2 ;;
        --delay) DELAY=$2; shift 2 ;;
        --jitter) JITTER=$2; shift 2 ;;
        --loss) LOSS=$2; shift 2 ;;
        --pd) PD=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "link_echo.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-bench/results/link-echo-$RATE-$DELAY.txt}
[ -x "$PD" ] || { echo "link_echo.sh: $PD not found (cmake --build build)" >&2; exit 2; }
NAME=pdecho
CL=tools/cluster.sh
tmp=$(mktemp -d)
trap 'bash "$CL" down --name "$NAME" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

bash "$CL" up 2 --rate "$RATE" --delay "$DELAY" --jitter "$JITTER" --loss "$LOSS" --name "$NAME" >&2
bash "$CL" cluster-file --name "$NAME" >"$tmp/cluster.json"

cat >"$tmp/echo.py" <<'PY'
import socket, statistics, sys, time
mode, addr, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
def recv_all(c, n):
    got = 0
    while got < n:
        b = c.recv(min(1 << 20, n - got))
        if not b: sys.exit("echo: the connection ended early")
        got += len(b)
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5302)); s.listen(1); s.settimeout(30)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b"y" * nbytes
    while True:
        try: recv_all(c, nbytes)
        except SystemExit: break
        c.sendall(buf)
else:
    for _ in range(300):
        try: c = socket.create_connection((addr, 5302), timeout=5); break
        except ConnectionRefusedError: time.sleep(0.02)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); c.settimeout(60)
    buf, ts = b"x" * nbytes, []
    rounds = 21 if nbytes == 1 else 9
    for k in range(3 + rounds):
        t0 = time.perf_counter(); c.sendall(buf); recv_all(c, nbytes)
        if k >= 3: ts.append(time.perf_counter() - t0)
    print(statistics.median(ts) * 1e3)
PY

python3 - "$tmp" <<'PY'
import json, sys
for b in (1, 1048576):
    json.dump({"format": "pipedream-profile", "version": 1, "model": "echo", "minibatch": 1,
               "layers": [{"name": "send", "type": "linear", "forward_s": 0, "backward_s": 0,
                           "activation_bytes": b, "parameter_bytes": 0},
                          {"name": "answer", "type": "linear", "forward_s": 0, "backward_s": 0,
                           "activation_bytes": b, "parameter_bytes": 0}]}, open(f"{sys.argv[1]}/prof{b}.json", "w"))
PY

{
    echo "# bench/link_echo.sh --rate $RATE --delay $DELAY --jitter $JITTER --loss $LOSS ($(date -u +%F), $(uname -r))"
    echo "# cluster file: $(tr -d '\n' <"$tmp/cluster.json")"
    printf '%-8s %12s %13s %9s\n' bytes measured_ms predicted_ms ratio
} >"$tmp/table"
for b in 1 1048576; do
    "$PD" plan "$tmp/prof$b.json" --cluster "$tmp/cluster.json" --straight --no-simulate -o "$tmp/plan$b.json" >/dev/null
    pred=$("$PD" simulate "$tmp/plan$b.json" --profile "$tmp/prof$b.json" --schedule 1f1b-flush --microbatches 1 \
               --minibatches 8 --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["time_per_minibatch_s"] * 1e3)')
    timeout 120 bash "$CL" exec --name "$NAME" 1 python3 "$tmp/echo.py" serve 198.18.0.2 "$b" & srv=$!
    got=$(timeout 120 bash "$CL" exec --name "$NAME" 0 python3 "$tmp/echo.py" ping 198.18.0.2 "$b")
    wait $srv || true
    awk -v b="$b" -v m="$got" -v p="$pred" 'BEGIN { printf "%-8d %12.2f %13.2f %9.3f\n", b, m, p, m / p }' >>"$tmp/table"
done
mkdir -p "$(dirname "$OUT")"
cp "$tmp/table" "$OUT"
cat "$OUT"
