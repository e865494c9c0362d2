#!/usr/bin/env bash
# ckpt_cluster.sh: checkpoints on 2 emulated hosts that share no directory (tools/cluster.sh up
# --private-dirs: /var/lib/pipedream-host is each host's own). A 2-stage lenet5 1f1b run with
# --checkpoint-dir /var/lib/pipedream-host/ckpt (one path, two directories) writes each
# checkpoint on both hosts, the same bytes; host 0's directory deleted (its disk lost) and the
# newest checkpoint too (the run died before it), the resume takes the newest checkpoint from
# host 1, host 0 gets the same bytes, and the run ends with weights bitwise equal to the
# uninterrupted run's. Exits 77 (ctest SKIP) where the cluster cannot be made (not root, no
# namespaces) or while another cluster is up; run it under flock /tmp/pd-cluster.lock.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
CL=$SRC/tools/cluster.sh
NAME=pdk$$
tmp=$(mktemp -d)
cleanup() { bash "$CL" down --name "$NAME" >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2 (ip, tc)"
command -v mpirun >/dev/null || skip "needs mpirun"
command -v python3 >/dev/null || skip "needs python3"
PD=$(realpath "$PD")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
for br in $(ls /sys/class/net | grep -E '^pdk[0-9]+-br$' || true); do   # left by a killed run
    pid=${br#pdk}; pid=${pid%-br}
    [ -d "/proc/$pid" ] || bash "$CL" down --name "pdk$pid" >/dev/null 2>&1
done
ip -o -4 addr show | grep -q ' 198\.18\.0\.' && skip "198.18.0.0/24 is in use (a cluster is up); the test needs it"

bash "$CL" up 2 --rate 1gbit --private-dirs --name "$NAME" >"$tmp/up" 2>&1
case $? in 0) ;; 3) skip "$(tail -1 "$tmp/up")" ;; *) fail "up: $(cat "$tmp/up")" ;; esac
H=/var/lib/pipedream-host/ckpt
disk() { echo "/var/lib/pipedream-cluster/$NAME/h$1/ckpt"; }   # host I's directory, seen from here

# a 512-image test set: the evaluation at the end crosses the link too
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
"$PD" profile "$SRC/models/lenet5.json" --minibatch 16 --iterations 3 -o "$tmp/prof.json" >/dev/null 2>"$tmp/err" ||
    fail "profile: $(tail -3 "$tmp/err")"
"$PD" plan "$tmp/prof.json" --workers 2 --bandwidth 1e8 --straight --no-simulate -o "$tmp/plan.json" >/dev/null 2>"$tmp/err" ||
    fail "plan: $(tail -3 "$tmp/err")"
args=("$SRC/models/lenet5.json" --plan "$tmp/plan.json" --schedule 1f1b --steps 12 --minibatch 16 --data "$tmp/data"
      --timeout 60 --checkpoint-every 4 --checkpoint-dir "$H")
crc() { grep -o '"weights_crc":\[[^]]*\]' "$1"; }
C8=ckpt-0000000008.safetensors C12=ckpt-0000000012.safetensors

timeout 120 bash "$CL" run --name "$NAME" 2 "$PD" train "${args[@]}" >"$tmp/full.out" 2>"$tmp/err" ||
    fail "the whole run: $(tail -5 "$tmp/err")"
for f in ckpt-0000000004.safetensors $C8 $C12; do
    [ -f "$(disk 0)/$f" ] || fail "host 0 has no $f: $(ls -R "/var/lib/pipedream-cluster/$NAME")"
    cmp -s "$(disk 0)/$f" "$(disk 1)/$f" || fail "$f: host 1's copy differs from host 0's, or is missing"
done
[ -e "$H" ] && fail "a checkpoint directory at $H outside the hosts"
echo "ok: every checkpoint on both hosts at $H, byte for byte"

bash "$CL" exec --name "$NAME" 0 rm -rf "$H" || fail "deleting host 0's directory"
bash "$CL" exec --name "$NAME" 1 rm "$H/$C12" || fail "deleting host 1's $C12"
timeout 120 bash "$CL" run --name "$NAME" 2 "$PD" train "${args[@]}" --resume "$H" >"$tmp/res.out" 2>"$tmp/err" ||
    fail "the resume without host 0's directory: $(tail -5 "$tmp/err")"
grep -q "rank 0: $H/$C8 received from rank 1" "$tmp/err" || fail "no $C8 from host 1: $(cat "$tmp/err")"
grep -q '"resumed_from":8' "$tmp/res.out" || fail "not resumed from 8: $(cat "$tmp/res.out")"
cmp -s "$(disk 0)/$C8" "$(disk 1)/$C8" || fail "host 0's received $C8 differs from host 1's"
cmp -s "$(disk 0)/$C12" "$(disk 1)/$C12" || fail "$C12 after the resume differs between the hosts"
[ -n "$(crc "$tmp/full.out")" ] && [ "$(crc "$tmp/res.out")" = "$(crc "$tmp/full.out")" ] ||
    fail "resumed weights $(crc "$tmp/res.out") differ from the whole run's $(crc "$tmp/full.out")"
echo "ok: host 0's directory lost: $C8 came from host 1, the run ends as the whole run ($(crc "$tmp/res.out"))"
