# cluster3.sh: the launch tests' setup (sourced; not a test itself; with PD, CL, NAME, tmp and
# fail/skip defined). cluster3_up: skips (exit 77) when not root, without iproute2, python3 or
# mpirun, where network namespaces cannot be made, or when 198.18.0.0/24 is in use; else
# brings up NAME with 3 hosts (cluster3_up N [UP_FLAGS...]: N, and more flags of tools/cluster.sh up)
# at 1 Gbit/s, makes PD absolute, sets MPIARGS and the environment
# mpirun needs as root, and writes a small IDX set to $tmp/d (2560 training images, 256 test).
cluster3_up() {   # [N [UP_FLAGS...]]: N hosts (default 3)
    [ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
    command -v ip >/dev/null && command -v tc >/dev/null || skip "needs iproute2 (ip, tc)"
    command -v python3 >/dev/null || skip "needs python3"
    command -v mpirun >/dev/null || skip "needs mpirun"
    PD=$(realpath "$PD")
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    if ip -o -4 addr show | grep -q ' 198\.18\.0\.'; then
        skip "198.18.0.0/24 is in use (a cluster is up: tools/cluster.sh status); the test needs it"
    fi
    bash "$CL" up "${1:-3}" --rate 1gbit "${@:2}" --name "$NAME" >"$tmp/up" 2>&1
    case $? in 0) ;; 3) skip "cannot make the emulated cluster: $(tail -1 "$tmp/up")" ;; *) fail "cluster up: $(cat "$tmp/up")" ;; esac
    MPIARGS=$(bash "$CL" mpirun-args --name "$NAME") || fail "mpirun-args"
    python3 - "$tmp" <<'PY'
import os, random, struct, sys
d = os.path.join(sys.argv[1], "d")
os.makedirs(d)
r = random.Random(5)
for pre, n in (("train", 2560), ("t10k", 256)):
    ys = [r.randrange(10) for _ in range(n)]
    with open(os.path.join(d, pre + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28))
        for y in ys: f.write(bytes(min(255, r.randrange(0, 120) + 12 * y) for _ in range(784)))
    with open(os.path.join(d, pre + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(ys))
PY
}

# cluster3_clean [I...]: no process left in the namespaces of hosts I (default all three); down; no namespace, no process of
# the test ($tmp) and no Open MPI session directory of the hosts left.
cluster3_clean() {
    local i
    for i in ${@:-0 1 2}; do
        [ -z "$(ip netns pids "$NAME-h$i")" ] || fail "processes left in $NAME-h$i: $(ip netns pids "$NAME-h$i" | xargs ps -o pid,cmd -p)"
    done
    bash "$CL" down --name "$NAME" >/dev/null || fail "down"
    ! ip netns list | grep -q "^$NAME-" || fail "namespaces left"
    ! pgrep -f "$tmp/" >/dev/null || fail "processes of the test left: $(pgrep -af "$tmp/")"
    ! ls -d "${TMPDIR:-/tmp}/ompi.$NAME-h"* >/dev/null 2>&1 || fail "Open MPI session directories left: $(ls -d "${TMPDIR:-/tmp}/ompi.$NAME-h"*)"
}
