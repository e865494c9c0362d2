#!/usr/bin/env bash
# vgg16_vs_peak.sh: vgg16 at 1 thread as a share of the machine's sgemm speed, measured in
# pairs (this VM's speed comes in spells, so the two are timed minutes apart at most seconds):
# ROUNDS (5) times, bench/sgemm_peak (dnnl_sgemm 1024^3, best of 10) then `pipedream bench
# models/vgg16.json --threads 1 --minibatch 64` (GFLOP/s = 3x forward FLOPs), one line each,
# and the median share, also into bench/results/ (bench/lib/result.sh).
# Usage: bash bench/vgg16_vs_peak.sh [build/pipedream]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/result.sh
result_start vgg16-vs-peak "$@"
PD=${1:-build/pipedream} ROUNDS=${ROUNDS:-5}
bin=$(mktemp)
cc -O2 -o "$bin" bench/sgemm_peak.c -ldnnl
pairs=$(mktemp)
trap 'rm -f "$bin" "$pairs"' EXIT
for r in $(seq "$ROUNDS"); do
    peak=$(OMP_NUM_THREADS=1 "$bin")
    g=$("$PD" bench models/vgg16.json --threads 1 --minibatch 64 --steps 10 --reps 1 2>/dev/null |
        python3 -c "import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['gflops'])")
    echo "peak $peak vgg16 $g share $(python3 -c "print(round($g / $peak, 3))")"
done | tee "$pairs"
python3 -c "
import statistics, sys
s = [float(l.split()[-1]) for l in open(sys.argv[1])]
print('median share of the sgemm peak: %.3f (%d pairs)' % (statistics.median(s), len(s)))" "$pairs"
result_finish
