#!/usr/bin/env bash
# bench/elastic.sh: `pipedream launch` losing a host (its processes killed, or its link taken
# down) and taking the host in again, vgg16 on 4 emulated hosts at 1 Gbit/s
# (docs/howto/elastic.md, sections 3 and 4).
#
# The recipe of docs/howto/elastic.md section 2: models/vgg16.json on its default data
# (Fashion-MNIST, /usr/share/datasets/fashion-mnist), --steps STEPS --minibatch 64
# --microbatches 4 --seed 1 --keep-last 2 and RECIPE (the optimizer), checkpoints every 50
# minibatches, the profile of `pipedream profile models/vgg16.json`, one rank per host, launch's
# default schedule (asynchronous 1f1b). Five runs, one after the other:
#   base  uninterrupted, 4 hosts;
#   kill  every process of host 2 (its namespace's) killed 40% of a checkpoint interval after
#         the checkpoint at minibatch 150 appeared; the run ends on 3 hosts;
#   link  host 2's link (its interface in its namespace) taken down 40% of a checkpoint
#         interval after the checkpoint at minibatch 150 appeared; the run ends on 3 hosts;
#   grow  the same loss; host 2 is then taken out of the hostfile, and once the checkpoint at
#         READD_AT exists its link is brought up again and it is listed again: launch takes it
#         in at a later checkpoint and the run ends on 4 hosts.
#   base3 uninterrupted on the 3 hosts the link runs end on (hosts 0, 1, 3): the accuracy of the
#         3-host plan without any failure.
# Every run is given train's --timeout TIMEOUT and launch's --probe-timeout PROBE and --grace
# GRACE, the short values a link going down needs to be noticed quickly.
#
# usage: bench/elastic.sh [--out DIR] [--pd BINARY]   as root; about 10 minutes on 2 cores.
#   Environment: STEPS (600), RECIPE ("--optimizer adam --lr 3e-4 --lr-schedule cosine"; why
#   in docs/howto/elastic.md: with SGD at lr 0.01 vgg16 is still on its loss plateau at 600
#   minibatches, where another plan alone moves the accuracy by points), TIMEOUT (5), PROBE (5),
#   GRACE (3), READD_AT (250), PDC_NAME (pdel: the cluster's name).
# Prints a markdown table: the fault to the first error line, to the relaunch and to training
# again (from the event log and the time of the fault), minibatches lost, wall time,
# test accuracy, and the throughput (minibatches per second between two checkpoints of the same
# attempt, from the checkpoint files' mtimes) on 4 hosts, on 3, and after the re-admission;
# then each run's plans (the stages' layers) and what was checked to be left behind. Raw
# outputs (launch's stdout, stderr, event log, checkpoint times) in OUT (a temporary directory,
# removed at the end, unless --out). The cluster is taken down and every process started is
# ended on any exit. Exit status 0 when every run completed, 1 otherwise. The result file goes
# to bench/results/ (bench/lib/result.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/emulated.sh
emu_args "" "$@"
STEPS=${STEPS:-600} RECIPE=${RECIPE:---optimizer adam --lr 3e-4 --lr-schedule cosine} TIMEOUT=${TIMEOUT:-5} PROBE=${PROBE:-5} GRACE=${GRACE:-3} READD_AT=${READD_AT:-250}
export PDC_NAME=${PDC_NAME:-pdel}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NAME=$PDC_NAME CL=tools/cluster.sh
[ "$(id -u)" = 0 ] || { echo "bench/elastic.sh: needs root (the emulated cluster)" >&2; exit 1; }
[ -x "$PD" ] || { echo "bench/elastic.sh: no $PD (cmake --build build)" >&2; exit 1; }
PD=$(realpath "$PD")
if ip -o -4 addr show | grep -q ' 198\.18\.0\.'; then
    echo "bench/elastic.sh: 198.18.0.0/24 is in use (another cluster is up: tools/cluster.sh status)" >&2; exit 1
fi
KEEP=1
[ -n "$OUT" ] || { OUT=$(mktemp -d /tmp/pd-elastic.XXXXXX); KEEP=0; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
TMP_BEFORE=$(ls -A /tmp /dev/shm | grep -v "^$(basename "$OUT")\$" | sort)

JOB=""
cleanup() {
    [ -n "$JOB" ] && kill "$JOB" 2>/dev/null && sleep 1 && kill -9 "$JOB" 2>/dev/null
    bash "$CL" down >/dev/null 2>&1 || true
    [ "$KEEP" = 1 ] || rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. bench/lib/result.sh
result_start elastic-vgg16 "$@"

bash "$CL" up 4 --rate 1gbit >/dev/null
"$PD" profile models/vgg16.json -o "$OUT/vgg16.prof.json" >/dev/null 2>&1
HOSTS4=$'198.18.0.1\n198.18.0.2\n198.18.0.3\n198.18.0.4'
MPIARGS=$(bash "$CL" mpirun-args)
now() { date +%s.%N; }

# run NAME FAULT (none, link, grow) [HOSTS]: launch in the background; records the checkpoints' mtimes
# (NAME.ck: "minibatches mtime") and the fault's times (NAME.times: "what epoch_seconds").
run() {
    local name=$1 fault=$2 dir=$OUT/$1
    printf '%s\n' "${3:-$HOSTS4}" >"$OUT/$name.hosts"
    : >"$OUT/$name.ck"; : >"$OUT/$name.times"
    "$PD" launch --hosts "$OUT/$name.hosts" --profile "$OUT/vgg16.prof.json" --run-dir "$dir" \
        --checkpoint-every 50 --events "$OUT/$name.jsonl" --mpirun-args "$MPIARGS" \
        --probe-timeout "$PROBE" --grace "$GRACE" \
        models/vgg16.json -- --steps "$STEPS" --minibatch 64 --microbatches 4 --seed 1 --keep-last 2 \
        $RECIPE --timeout "$TIMEOUT" >"$OUT/$name.out" 2>"$OUT/$name.err" &
    JOB=$!
    local state=wait150 t_fault="" seen=" " f key t100="" t150=""
    while kill -0 "$JOB" 2>/dev/null; do
        for f in "$dir"/ckpt/ckpt-*.safetensors; do
            [ -e "$f" ] || continue
            key=$(stat -c '%n:%.3Y' "$f" 2>/dev/null) || continue
            case $seen in *" $key "*) continue ;; esac
            seen="$seen$key "
            local mb=${f##*/ckpt-}; mb=$((10#${mb%.safetensors})) mt=${key##*:}
            echo "$mb $mt" >>"$OUT/$name.ck"
            [ "$mb" = 100 ] && t100=$mt
            [ "$mb" = 150 ] && [ -z "$t150" ] && t150=$mt
        done
        case $fault:$state in
            kill:wait150|link:wait150|grow:wait150)
                if [ -n "$t150" ] && [ -n "$t100" ]; then
                    t_fault=$(awk -v a="$t100" -v b="$t150" 'BEGIN {printf "%.3f", b + 0.4 * (b - a)}')
                    state=fault
                fi ;;
            kill:fault)
                if awk -v n="$(now)" -v t="$t_fault" 'BEGIN {exit !(n >= t)}'; then
                    ip netns pids "$NAME-h2" | xargs -r kill -9
                    echo "fault $(now)" >>"$OUT/$name.times"
                    state=down
                fi ;;
            link:fault|grow:fault)
                if awk -v n="$(now)" -v t="$t_fault" 'BEGIN {exit !(n >= t)}'; then
                    ip -n "$NAME-h2" link set "$NAME-eth" down
                    echo "fault $(now)" >>"$OUT/$name.times"
                    state=down
                fi ;;
            grow:down)
                if grep -q '"event":"membership"' "$OUT/$name.jsonl" 2>/dev/null; then
                    printf '198.18.0.1\n198.18.0.2\n198.18.0.4\n' >"$OUT/$name.hosts"   # taken out
                    echo "unlisted $(now)" >>"$OUT/$name.times"
                    state=out
                fi ;;
            grow:out)
                if awk -v m="$READD_AT" '$1 >= m {f = 1} END {exit !f}' "$OUT/$name.ck"; then
                    ip -n "$NAME-h2" link set "$NAME-eth" up
                    echo "link_up $(now)" >>"$OUT/$name.times"
                    # reachable: a TCP connection to a closed port is refused at once (no ping here)
                    for _ in $(seq 20); do
                        timeout 1 bash -c '</dev/tcp/198.18.0.3/9' 2>/dev/null && break
                        [ $? = 124 ] || break
                    done
                    printf '%s\n' "$HOSTS4" >"$OUT/$name.hosts"                        # listed again
                    echo "listed_again $(now)" >>"$OUT/$name.times"
                    state=in
                fi ;;
        esac
        sleep 0.1
    done
    local rc=0
    wait "$JOB" || rc=$?
    JOB=""
    echo "$rc" >"$OUT/$name.rc"
    # what the run left: processes in the hosts' namespaces, and launch, mpirun or orted of this
    # run anywhere; with the link still down (the cut-off host's rank and daemon must end by
    # themselves), then with it up again
    echo "left_down $(wait_left "$dir")" >>"$OUT/$name.times"
    if [ "$fault" = link ] || [ "$fault" = grow ]; then
        ip -n "$NAME-h2" link set "$NAME-eth" up
        echo "left_up $(wait_left "$dir")" >>"$OUT/$name.times"
    fi
}
# wait_left DIR: waits up to about 20 s for the processes of the run in DIR to end; prints the seconds
# waited, then "pid:name" of each left
left() {
    local i
    for i in 0 1 2 3; do ip netns pids "$NAME-h$i" 2>/dev/null || true; done
    ps -eo pid=,comm=,args= | awk -v d="$1" -v r="/run/pipedream-cluster/$NAME/" \
        '$2 ~ /^(pipedream|mpirun|orted|prted)$/ && (index($0, d) || index($0, r)) {print $1}'
}
wait_left() {
    local t0 l p out=""
    t0=$(now)
    for _ in $(seq 150); do l=$(left "$1" | sort -u); [ -z "$l" ] && break; sleep 0.1; done
    for p in $l; do out="$out $p:$(ps -o comm= -p "$p" || echo gone)"; done
    echo "$(awk -v a="$(now)" -v b="$t0" 'BEGIN {printf "%.1f", a - b}')$out"
}

run base none
run kill kill
run link link
run grow grow
run base3 none $'198.18.0.1\n198.18.0.2\n198.18.0.4'


python3 - "$OUT" "$STEPS" "$RECIPE" <<'PY'
import json, sys, datetime, re, statistics
out, steps, recipe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
RUNS = ("base", "kill", "link", "grow", "base3")
def ts(s): return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
R = {}
for name in RUNS:
    ev = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    times = {}
    for l in open(f"{out}/{name}.times"):
        w = l.split()
        times[w[0]] = w[1:]
    ck = [(int(a), float(b)) for a, b in (l.split() for l in open(f"{out}/{name}.ck"))]
    summ = open(f"{out}/{name}.out").read()
    m = re.search(r'"test_accuracy":([0-9.]+)', summ)
    starts = [(ts(e["time"]), len(e["hosts"])) for e in ev if e["event"] == "start"]
    def attempt(t):
        k = -1
        for i, (s, _) in enumerate(starts):
            if t >= s: k = i
        return k
    seg = {}   # hosts -> [mb/s], and grow's segments after re-admission separately
    ckk = sorted(set(ck), key=lambda x: x[1])
    for (a, ta), (b, tb) in zip(ckk, ckk[1:]):
        if b - a != 50 or attempt(ta) != attempt(tb) or attempt(ta) < 0: continue
        k = attempt(ta)
        key = (starts[k][1], "after" if k > 0 and starts[k][1] > starts[k - 1][1] else "")
        seg.setdefault(key, []).append(50 / (tb - ta))
    r = {"rc": int(open(f"{out}/{name}.rc").read()), "acc": float(m.group(1)) if m else None, "seg": seg}
    done = [e for e in ev if e["event"] == "done"]
    r["wall"] = done[0]["t"] if done else None
    r["steps"] = done[0]["steps"] if done else None
    mem = [e for e in ev if e["event"] == "membership" and e.get("removed")]
    if mem and "fault" in times:
        e, down = mem[0], float(times["fault"][0])
        t0 = ts(e["time"]) - e["t"]   # launch's t = 0
        rel = [x for x in ev if x["event"] == "start" and x["attempt"] == e["attempt"] + 1]
        rec = [x for x in ev if x["event"] == "recovered" and x["attempt"] == e["attempt"] + 1]
        r["detect"] = t0 + e["detected_t"] - down
        r["relaunch"] = ts(rel[0]["time"]) - down if rel else None
        r["training"] = ts(rec[0]["time"]) - down if rec else None
        r["lost"] = e["minibatches_lost"]
        r["resumed"] = e["checkpoint_minibatches"]
        r["removed"] = e["removed"]
        c = dict((a, t) for a, t in ck if t < down)
        if 100 in c and 150 in c: r["past"] = 50 * (down - c[150]) / (c[150] - c[100])
    add = [e for e in ev if e["event"] == "membership" and e.get("added")]
    if add and "listed_again" in times:
        e = add[0]
        r["added"] = e["added"]
        r["add_ck"] = e["checkpoint_minibatches"]
        r["add_after"] = ts(e["time"]) - float(times["listed_again"][0])
        r["ping"] = float(times["listed_again"][0]) - float(times["link_up"][0])
    r["times"] = times
    r["plans"] = "; ".join(f"attempt {e['attempt']} from minibatch {e['resume_minibatches']}: layers "
                           + " ".join(f"{x}-{y}" for x, y in e["plan"]["layers"]) for e in ev if e["event"] == "start")
    R[name] = r

def f(x, fmt="%.1f"): return "" if x is None else fmt % x
def rate(v): return "" if not v else "%.2f (%d)" % (statistics.mean(v), len(v))
b, k, l, g, b3 = (R[n] for n in RUNS)
F = (k, l, g)   # the runs with a fault
def row(what, cells): print(f"| {what} | " + " | ".join(cells) + " |")
print(f"vgg16, {steps} minibatches of 64 (4 micro-batches), {recipe}, seed 1, checkpoints every 50, 4 emulated hosts at 1 Gbit/s")
print()
print("| | uninterrupted | host 2 killed | link down (host 2) | link down, then host 2 taken in again | uninterrupted, 3 hosts |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
row("fault to the first error line (s)", [""] + [f(x.get('detect')) for x in F] + [""])
row("fault to the relaunch on 3 hosts (s)", [""] + [f(x.get('relaunch')) for x in F] + [""])
row("fault to training again (s)", [""] + [f(x.get('training')) for x in F] + [""])
row("resumed from minibatch; minibatches lost (launch's estimate)", [""] + [f"{x.get('resumed', '')}; {x.get('lost', '')}" for x in F] + [""])
row("minibatches past the checkpoint at the fault (trained again)", [""] + [f(x.get('past'), '%.0f') for x in F] + [""])
row("link up to host listed again (reachable) (s)", ["", "", "", f(g.get('ping')), ""])
row("host listed again to the restart on 4 hosts (s); resumed from", ["", "", "", f"{f(g.get('add_after'))}; {g.get('add_ck', '')}", ""])
row("throughput on 4 hosts, minibatches/s (segments)", [rate(x['seg'].get((4, ''))) for x in (b, k, l, g)] + [""])
row("throughput on 3 hosts, minibatches/s (segments)", [""] + [rate(x['seg'].get((3, ''))) for x in (k, l, g, b3)])
row("throughput on 4 hosts after re-admission (segments)", ["", "", "", rate(g['seg'].get((4, 'after'))), ""])
row("launch's wall time (s); minibatches", [f"{f(x['wall'])}; {x['steps']}" for x in (b, k, l, g, b3)])
row("test accuracy", [f(x['acc'], '%.4f') for x in (b, k, l, g, b3)])
row("test accuracy - uninterrupted (points)", [""] + [("" if x['acc'] is None or b['acc'] is None else "%+.2f" % (100 * (x['acc'] - b['acc']))) for x in (k, l, g, b3)])
row("launch's exit status", [str(x['rc']) for x in (b, k, l, g, b3)])
print()
after = g["seg"].get((4, "after"), [])
for what, v in (("the same run before the loss", g["seg"].get((4, ""), [])), ("the uninterrupted run", b["seg"].get((4, ""), []))):
    if v and after:
        print(f"throughput after re-admission / 4-host throughput of {what}: {statistics.mean(after) / statistics.mean(v):.3f}")
for n in RUNS:
    print(f"{n}: {R[n]['plans']}")
print()
for n in RUNS:
    for k, what in (("left_down", "after launch ended"), ("left_up", "after the link came up again")):
        w = R[n]["times"].get(k)
        if w is None: continue
        print(f"{n}: {'nothing' if len(w) == 1 else ' '.join(w[1:])} left in the hosts' namespaces or of its launch, "
              f"mpirun and orted, {w[0]} s {what}")
PY

# nothing left behind: processes, namespaces, temporary files
bash "$CL" down >/dev/null
echo
echo "after \`tools/cluster.sh down\`:"
echo "- processes (the hosts' namespaces; pipedream, mpirun, orted or prted whose command line names $OUT or /run/pipedream-cluster/$NAME/: \`ps -eo pid=,comm=,args=\`): $(left "$OUT" | wc -l) left"
echo "- network namespaces (\`ip netns list | grep ^$NAME-\`): $(ip netns list | grep -c "^$NAME-" || true) left"
echo "- links (\`ip -o link | grep $NAME-\`): $(ip -o link | grep -c " $NAME-" || true) left"
TMP_AFTER=$(ls -A /tmp /dev/shm | grep -v "^$(basename "$OUT")\$" | sort)
new=$(comm -13 <(echo "$TMP_BEFORE") <(echo "$TMP_AFTER") | grep -v -x -e "$(basename "${RESULT_OUT:-x}")" || true)
ours=$(echo "$new" | grep -E "$NAME|pd-elastic" | tr '\n' ' ' || true)
others=$(echo "$new" | grep -v -E "$NAME|pd-elastic" | tr '\n' ' ' || true)
echo "- new entries in /tmp and /dev/shm since the start (\`ls -A /tmp /dev/shm\`, but this script's own OUT and result file), with this cluster's name or pd-elastic in their names (Open MPI's session directories ompi.$NAME-hN.0, shared memory segments): ${ours:-none}${others:+; others, not named after this cluster (other jobs on the machine; the mpiruns of this script use TCP only): $others}"
ok=1
for r in base kill link grow base3; do [ "$(cat "$OUT/$r.rc")" = 0 ] || ok=0; done
result_finish
[ "$ok" = 1 ]
