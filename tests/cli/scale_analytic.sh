#!/usr/bin/env bash
# scale_analytic.sh: tools/gpt_analytic.py and the simulator at scale. The tool's model FLOPs
# against Megatron-LM's closed form 72 B s l h^2 (1 + s/6h + V/12lh); the simulator on its
# plans against the closed forms of a flushed pipeline of equal stages: (m + p - 1) t for 1F1B
# and (m + (p - 1)/V) t interleaved over V chunks (t: one micro-batch through one stage); data
# parallelism (replicated 1F1B stages or whole interleaved pipelines) over a free network costs
# nothing and over a slow one costs time; bad input is refused.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
TOOL=$SRC/tools/gpt_analytic.py
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

# step_s DIR KIND M: seconds per optimizer step of M micro-batches
step_s() {
    "$PD" simulate "$1/plan.json" --profile "$1/profile.json" --schedule "$2" --microbatches "$3" \
        --minibatches 3 --json >"$tmp/sim.json" 2>"$tmp/err" || fail "simulate $1: $(cat "$tmp/err")"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["time_per_minibatch_s"])' "$tmp/sim.json"
}
# close A B TOL: |A/B - 1| <= TOL
close() { python3 -c 'import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(abs(a/b-1) > t)' "$1" "$2" "$3"; }

# The FLOP count: 177B-like widths, 96 blocks, batch 1152 of 4096 tokens.
python3 "$TOOL" --layers 96 --hidden 12288 --seq 4096 --vocab 131072 --tp 8 --pp 6 --dp 2 \
    --global-batch 1152 --peak 989e12 --efficiency 0.5 --bandwidth 4e11 --out "$tmp/big" >"$tmp/info" ||
    fail "gpt_analytic.py: $(cat "$tmp/info")"
flops=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step_flops"])' "$tmp/info")
want=$(python3 -c 'B,s,l,h,V=1152,4096,96,12288,131072; print(72*B*s*l*h*h*(1+s/(6*h)+V/(12*l*h)))')
close "$flops" "$want" 1e-12 || fail "step FLOPs $flops, closed form $want"
grep -q '"devices": 96' "$tmp/info" || fail "devices: $(cat "$tmp/info")"

# The bubble: equal stages (a vocabulary of 1 makes the head negligible), a free network.
for case in "6 12 1" "6 12 2" "6 12 4" "4 16 1" "8 8 2" "3 9 4"; do
    set -- $case
    p=$1 m=$2 v=$3
    d=$tmp/p$p-m$m-v$v
    python3 "$TOOL" --layers 48 --hidden 1024 --seq 1024 --vocab 1 --pp "$p" --chunks "$v" --global-batch "$m" \
        --peak 1e12 --efficiency 1 --bandwidth 1e15 --latency 0 --out "$d" >/dev/null 2>"$tmp/err" ||
        fail "gpt_analytic.py p=$p v=$v: $(cat "$tmp/err")"
    kind=1f1b-flush
    [ "$v" -gt 1 ] && kind=interleaved
    got=$(step_s "$d" $kind "$m")
    # t: the whole model's forward and backward over p
    t=$(python3 -c 'import json,sys; L=json.load(open(sys.argv[1]))["layers"]; print(sum(l["forward_s"]+l["backward_s"] for l in L)/int(sys.argv[2]))' \
        "$d/profile.json" "$p")
    want=$(python3 -c 'import sys; t,m,p,v=map(float,sys.argv[1:]); print((m+(p-1)/v)*t)' "$t" "$m" "$p" "$v")
    close "$got" "$want" 1e-3 || fail "p=$p m=$m V=$v: simulated $got s, closed form $want s"
done

# Data parallelism: 4 replicas of each of 4 stages take 4 x 8 micro-batches in the time one
# pipeline takes 8 when the network is free, and longer over 1 GB/s; so do 4 interleaved
# pipelines of 2 chunks.
for v in 1 2; do
    kind=1f1b-flush
    [ $v -gt 1 ] && kind=interleaved
    for bw in 1e15 1e9; do
        python3 "$TOOL" --layers 16 --hidden 1024 --seq 1024 --vocab 1 --pp 4 --dp 4 --chunks $v --global-batch 32 \
            --peak 1e12 --efficiency 1 --bandwidth $bw --latency 0 --out "$tmp/dp$bw-$v" >/dev/null ||
            fail "gpt_analytic.py dp $bw chunks $v"
    done
    python3 "$TOOL" --layers 16 --hidden 1024 --seq 1024 --vocab 1 --pp 4 --chunks $v --global-batch 8 --peak 1e12 \
        --efficiency 1 --bandwidth 1e15 --latency 0 --out "$tmp/dp1-$v" >/dev/null || fail "gpt_analytic.py dp 1"
    one=$(step_s "$tmp/dp1-$v" $kind 8)
    free=$(step_s "$tmp/dp1e15-$v" $kind 32)
    slow=$(step_s "$tmp/dp1e9-$v" $kind 32)
    close "$free" "$one" 1e-4 || fail "$kind: 4 replicas on a free network: $free s, one pipeline $one s"
    python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 1.01 * float(sys.argv[2]))' "$slow" "$free" ||
        fail "$kind: 4 replicas at 1 GB/s: $slow s, no slower than on a free network ($free s)"
done

# Refused: blocks that do not split, interleaved pipelines that cannot share the micro-batches
# evenly, a batch the replicas cannot share, an efficiency over 1.
for args in "--layers 50 --pp 6 --global-batch 6" "--layers 48 --pp 6 --chunks 2 --dp 2 --global-batch 6" \
    "--layers 48 --pp 6 --dp 4 --global-batch 6" "--layers 48 --pp 6 --global-batch 6 --efficiency 1.5"; do
    python3 "$TOOL" $args --hidden 64 --seq 16 --vocab 8 --peak 1e12 --bandwidth 1e9 \
        $(case "$args" in *efficiency*) ;; *) echo --efficiency 0.5 ;; esac) --out "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || fail "gpt_analytic.py $args: exit $rc, want 2"
    grep -q "^gpt_analytic.py: " "$tmp/err" || fail "gpt_analytic.py $args: $(cat "$tmp/err")"
done
echo "ok"
