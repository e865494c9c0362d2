#!/usr/bin/env bash
# bench/elastic_private.sh: `pipedream launch` losing a host when the hosts share no checkpoint
# directory, vgg16 on 4 emulated hosts at 1 Gbit/s with --private-dirs (each host its own
# /var/lib/pipedream-host), launch given --checkpoint-dir /var/lib/pipedream-host/ckpt.
#
# The recipe of bench/elastic.sh: models/vgg16.json on its default data (Fashion-MNIST),
# --steps STEPS --minibatch 64 --microbatches 4 --seed 1 --keep-last 2 and RECIPE, checkpoints
# every 50 minibatches, the profile of `pipedream profile models/vgg16.json`, one rank per host,
# launch's default schedule. Three runs, one after the other:
#   base  uninterrupted, 4 hosts;
#   h0    every process of host 0 (rank 0, which writes the checkpoints) killed 40% of a
#         checkpoint interval after rank 0 announced the checkpoint at minibatch 150; the run
#         resumes from the copy its partner (host 3) kept and ends on 3 hosts;
#   h2    the same with host 2 (neither rank 0 nor the partner).
# Every run is given train's --timeout TIMEOUT and launch's --probe-timeout PROBE and --grace GRACE.
#
# usage: bench/elastic_private.sh [--out DIR] [--pd BINARY]   as root; about 10 minutes on 2 cores.
#   Environment: STEPS (600), RECIPE ("--optimizer adam --lr 3e-4 --lr-schedule cosine"), TIMEOUT
#   (5), PROBE (5), GRACE (3), PDC_NAME (pdep: the cluster's name).
# Prints a markdown table: the fault to the first error line, to the relaunch and to training
# again, the checkpoint resumed from against the newest one announced before the fault,
# minibatches lost, wall time, test accuracy and its difference from the uninterrupted run;
# then the checkpoints each host's directory holds and whether launch's run directory holds
# any. Raw outputs in OUT (a temporary directory, removed at the end, unless --out). The cluster
# is taken down on any exit. Exit status 0 when every run completed, 1 otherwise. The result
# file goes to bench/results/ (bench/lib/result.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/emulated.sh
emu_args "" "$@"
STEPS=${STEPS:-600} RECIPE=${RECIPE:---optimizer adam --lr 3e-4 --lr-schedule cosine} TIMEOUT=${TIMEOUT:-5} PROBE=${PROBE:-5} GRACE=${GRACE:-3}
export PDC_NAME=${PDC_NAME:-pdep}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NAME=$PDC_NAME CL=tools/cluster.sh
H=/var/lib/pipedream-host/ckpt
disk() { echo "/var/lib/pipedream-cluster/$NAME/h$1/ckpt"; }   # host I's directory, seen from here
[ "$(id -u)" = 0 ] || { echo "bench/elastic_private.sh: needs root (the emulated cluster)" >&2; exit 1; }
[ -x "$PD" ] || { echo "bench/elastic_private.sh: no $PD (cmake --build build)" >&2; exit 1; }
PD=$(realpath "$PD")
if ip -o -4 addr show | grep -q ' 198\.18\.0\.'; then
    echo "bench/elastic_private.sh: 198.18.0.0/24 is in use (another cluster is up: tools/cluster.sh status)" >&2; exit 1
fi
KEEP=1
[ -n "$OUT" ] || { OUT=$(mktemp -d /tmp/pd-elastic-private.XXXXXX); KEEP=0; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

JOB=""
cleanup() {
    [ -n "$JOB" ] && kill "$JOB" 2>/dev/null && sleep 1 && kill -9 "$JOB" 2>/dev/null
    bash "$CL" down >/dev/null 2>&1 || true
    [ "$KEEP" = 1 ] || rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. bench/lib/result.sh
result_start elastic-private-vgg16 "$@"

bash "$CL" up 4 --rate 1gbit --private-dirs >/dev/null
"$PD" profile models/vgg16.json -o "$OUT/vgg16.prof.json" >/dev/null 2>&1
printf '198.18.0.1\n198.18.0.2\n198.18.0.3\n198.18.0.4\n' >"$OUT/hosts"
MPIARGS=$(bash "$CL" mpirun-args)
now() { date +%s.%N; }

# run NAME VICTIM (none, or a host's index): launch in the background; the checkpoints rank 0
# announced, when launch relayed them (NAME.ck: "minibatches epoch_seconds"), and the fault
# (NAME.times: "fault epoch_seconds"); each host's directory afterwards (NAME.dirs).
run() {
    local name=$1 victim=$2 dir=$OUT/$1 n=0 t100="" t150="" t_fault="" state=wait
    rm -rf "$(disk 0)" "$(disk 1)" "$(disk 2)" "$(disk 3)"
    : >"$OUT/$name.ck"; : >"$OUT/$name.times"; : >"$OUT/$name.err"
    "$PD" launch --hosts "$OUT/hosts" --profile "$OUT/vgg16.prof.json" --run-dir "$dir" \
        --checkpoint-every 50 --checkpoint-dir "$H" --events "$OUT/$name.jsonl" --mpirun-args "$MPIARGS" \
        --probe-timeout "$PROBE" --grace "$GRACE" \
        models/vgg16.json -- --steps "$STEPS" --minibatch 64 --microbatches 4 --seed 1 --keep-last 2 \
        $RECIPE --timeout "$TIMEOUT" >"$OUT/$name.out" 2>"$OUT/$name.err" &
    JOB=$!
    while kill -0 "$JOB" 2>/dev/null; do
        local t lines mb
        t=$(now)
        lines=$(grep -c "^pipedream: checkpoint $H/ckpt-" "$OUT/$name.err" || true)
        while [ "$n" -lt "$lines" ]; do
            n=$((n + 1))
            mb=$(grep "^pipedream: checkpoint $H/ckpt-" "$OUT/$name.err" | sed -n "${n}s|.*/ckpt-0*\([0-9][0-9]*\)\.safetensors.*|\1|p")
            echo "$mb $t" >>"$OUT/$name.ck"
            [ "$mb" = 100 ] && [ -z "$t100" ] && t100=$t
            [ "$mb" = 150 ] && [ -z "$t150" ] && t150=$t
        done
        if [ "$victim" != none ] && [ $state = wait ] && [ -n "$t150" ] && [ -n "$t100" ]; then
            t_fault=$(awk -v a="$t100" -v b="$t150" 'BEGIN {printf "%.3f", b + 0.4 * (b - a)}')
            state=armed
        fi
        if [ $state = armed ] && awk -v n="$t" -v f="$t_fault" 'BEGIN {exit !(n >= f)}'; then
            ip netns pids "$NAME-h$victim" | xargs -r kill -9
            echo "fault $(now)" >>"$OUT/$name.times"
            state=done
        fi
        sleep 0.1
    done
    local rc=0
    wait "$JOB" || rc=$?
    JOB=""
    echo "$rc" >"$OUT/$name.rc"
    {
        for i in 0 1 2 3; do echo "h$i $(ls "$(disk $i)" 2>/dev/null | sed -n 's/^ckpt-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tr '\n' ' ')"; done
        echo "run_dir $(find "$dir" -name '*.safetensors*' | wc -l)"
    } >"$OUT/$name.dirs"
}

run base none
run h0 0
run h2 2

python3 - "$OUT" "$STEPS" "$RECIPE" <<'PY'
import json, sys, datetime, re
out, steps, recipe = sys.argv[1], int(sys.argv[2]), sys.argv[3]
RUNS = ("base", "h0", "h2")
def ts(s): return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
R = {}
for name in RUNS:
    ev = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    times = dict((w[0], float(w[1])) for w in (l.split() for l in open(f"{out}/{name}.times")))
    ck = [(int(a), float(b)) for a, b in (l.split() for l in open(f"{out}/{name}.ck"))]
    m = re.search(r'"test_accuracy":([0-9.]+)', open(f"{out}/{name}.out").read())
    r = {"rc": int(open(f"{out}/{name}.rc").read()), "acc": float(m.group(1)) if m else None,
         "dirs": open(f"{out}/{name}.dirs").read().strip()}
    done = [e for e in ev if e["event"] == "done"]
    r["wall"] = done[0]["t"] if done else None
    r["steps"] = done[0]["steps"] if done else None
    mem = [e for e in ev if e["event"] == "membership" and e.get("removed")]
    if mem and "fault" in times:
        e, down = mem[0], times["fault"]
        t0 = ts(e["time"]) - e["t"]
        rel = [x for x in ev if x["event"] == "start" and x["attempt"] == e["attempt"] + 1]
        rec = [x for x in ev if x["event"] == "recovered" and x["attempt"] == e["attempt"] + 1]
        r["detect"] = t0 + e["detected_t"] - down
        r["relaunch"] = ts(rel[0]["time"]) - down if rel else None
        r["training"] = ts(rec[0]["time"]) - down if rec else None
        r["lost"] = e["minibatches_lost"]
        r["resumed"] = rel[0]["resume_minibatches"] if rel else None
        r["newest"] = max([a for a, t in ck if t < down], default=None)
        r["removed"] = ",".join(e["removed"])
        r["hosts_after"] = len(e["hosts_after"])
    R[name] = r

def f(x, fmt="%.1f"): return "" if x is None else fmt % x
def row(what, cells): print(f"| {what} | " + " | ".join(cells) + " |")
b, k0, k2 = (R[n] for n in RUNS)
F = (k0, k2)
print(f"vgg16, {steps} minibatches of 64 (4 micro-batches), {recipe}, seed 1, checkpoints every 50, "
      "4 emulated hosts at 1 Gbit/s, each with its own /var/lib/pipedream-host (--private-dirs)")
print()
print("| | uninterrupted | host 0 killed | host 2 killed |")
print("| --- | ---: | ---: | ---: |")
row("hosts removed; hosts after", [""] + [f"{x.get('removed', '')}; {x.get('hosts_after', '')}" for x in F])
row("fault to the first error line (s)", [""] + [f(x.get('detect')) for x in F])
row("fault to the relaunch (s)", [""] + [f(x.get('relaunch')) for x in F])
row("fault to training again (s)", [""] + [f(x.get('training')) for x in F])
row("newest checkpoint announced before the fault; resumed from", [""] + [f"{x.get('newest', '')}; {x.get('resumed', '')}" for x in F])
row("minibatches lost (launch's estimate)", [""] + [str(x.get('lost', '')) for x in F])
row("launch's wall time (s); minibatches", [f"{f(x['wall'])}; {x['steps']}" for x in (b, k0, k2)])
row("test accuracy", [f(x['acc'], '%.4f') for x in (b, k0, k2)])
row("test accuracy - uninterrupted (points)", [""] + [("" if x['acc'] is None or b['acc'] is None else "%+.2f" % (100 * (x['acc'] - b['acc']))) for x in F])
row("launch's exit status", [str(x['rc']) for x in (b, k0, k2)])
print()
print("Checkpoints in each host's own directory at the end (--keep-last 2), and checkpoint files in launch's run directory:")
print()
for n in RUNS:
    print(f"- {n}: " + "; ".join(R[n]["dirs"].splitlines()))
PY
bash "$CL" down >/dev/null
ok=1
for r in base h0 h2; do [ "$(cat "$OUT/$r.rc")" = 0 ] || ok=0; done
result_finish
[ "$ok" = 1 ]
