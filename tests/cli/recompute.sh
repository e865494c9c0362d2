#!/usr/bin/env bash
# recompute.sh: --recompute (stages keep only their input per unit in flight and run the
# forward again before the backward) gives bitwise the run without it — weights, batch-norm
# running statistics and dropout masks included (checkpoints compared byte for byte) — on
# threads and over MPI, for 1f1b and 1f1b-flush; and it allocates less activation memory.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
. "$SRC/tests/cli/lib/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat >"$tmp/bnd.json" <<'JSON'
{"name": "bnd", "input": [1, 28, 28],
 "layers": [{"type": "conv2d", "in": 1, "out": 8, "kernel": 3, "stride": 1, "pad": 1},
            {"type": "batchnorm", "features": 8, "relu": true}, {"type": "maxpool", "kernel": 2, "stride": 2},
            {"type": "conv2d", "in": 8, "out": 8, "kernel": 3, "stride": 1, "pad": 1},
            {"type": "batchnorm", "features": 8, "relu": true}, {"type": "flatten"},
            {"type": "dropout", "p": 0.5}, {"type": "linear", "in": 1568, "out": 10}]}
JSON
plan "$tmp/p4.json" 8 bnd "0, 1" "2, 3" "4, 5" "6, 7"
for k in 1f1b 1f1b-flush; do
    M=""; [ $k = 1f1b-flush ] && M="--microbatches 2"
    A="$tmp/bnd.json --plan $tmp/p4.json --schedule $k $M --steps 40 --minibatch 32 --checkpoint-every 15"
    "$PD" train $A --workers 4 --checkpoint-dir "$tmp/a$k" --metrics "$tmp/a$k.jsonl" >"$tmp/a.out" 2>"$tmp/a.err" ||
        fail "$k: $(tail -3 "$tmp/a.err")"
    "$PD" train $A --workers 4 --recompute --checkpoint-dir "$tmp/b$k" --metrics "$tmp/b$k.jsonl" >"$tmp/b.out" 2>"$tmp/b.err" ||
        fail "$k --recompute: $(tail -3 "$tmp/b.err")"
    [ -n "$(crc "$tmp/a.out")" ] && [ "$(crc "$tmp/a.out")" = "$(crc "$tmp/b.out")" ] ||
        fail "$k: --recompute $(crc "$tmp/b.out") != $(crc "$tmp/a.out")"
    for f in "$tmp/a$k"/ckpt-*.safetensors; do
        cmp -s "$f" "$tmp/b$k/$(basename "$f")" || fail "$k: checkpoint $(basename "$f") differs with --recompute"
    done
    python3 - "$tmp/a$k.jsonl" "$tmp/b$k.jsonl" <<'PY' || fail "$k: activation memory"
import json, sys
a, b = ([json.loads(l) for l in open(f) if '"activation_bytes"' in l] for f in sys.argv[1:])
assert len(a) == len(b) == 4, (a, b)
for x, y in zip(a, b):
    assert y["activation_bytes"] < x["activation_bytes"], (x, y)
print("activation bytes per stage:", [x["activation_bytes"] for x in a], "->", [y["activation_bytes"] for y in b])
PY
    echo "ok: $k --recompute = without ($(crc "$tmp/a.out")), checkpoints identical"
done
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    A="$tmp/bnd.json --plan $tmp/p4.json --steps 30 --minibatch 32 --recompute"
    "$PD" train $A --workers 4 >"$tmp/t.out" 2>"$tmp/t.err" || fail "threads: $(tail -3 "$tmp/t.err")"
    timeout 300 mpirun -np 4 --oversubscribe "$PD" train $A >"$tmp/m.out" 2>"$tmp/m.err" || fail "mpi: $(tail -3 "$tmp/m.err")"
    [ "$(crc "$tmp/t.out")" = "$(crc "$tmp/m.out")" ] || fail "mpi $(crc "$tmp/m.out") != threads $(crc "$tmp/t.out")"
    echo "ok: 1f1b --recompute: mpi = threads"
fi
