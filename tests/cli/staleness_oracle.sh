#!/usr/bin/env bash
# staleness_oracle.sh: staleness compensation (train --staleness) against an independent PyTorch
# oracle of 1F1B's weight versions (tools/torch_pipedream_lm.py --staleness): a tiny GPT on a
# generated text, cut into 4 stages (delays 3, 2, 1, 0), trained from the same weights on the same
# minibatches with each method, for Adam and for SGD with momentum, with one unit per minibatch and
# with 2 micro-batches per minibatch (a step per minibatch). Each run ends where its oracle
# ends (losses and held-out loss, relative 1e-4), and every method's oracle is far from the
# uncompensated one, so a runtime that ignored the method (or used the wrong delays or direction)
# fails. Then: where no unit is delayed (1f1b-flush; interleaved; one stage) every method leaves the weights
# bitwise as they are without it, and MPI (when mpirun runs here) gives the threads' weights.
# Skipped (77) when /usr/bin/python3 has no torch.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_TORCH_PYTHON:-/usr/bin/python3}
. "$SRC/tests/cli/lib/common.sh"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "SKIP: $PY cannot import torch"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$PY" - "$tmp/t.txt" <<'PY'
import random, sys
random.seed(7)
words = "the of and to in that he shall unto for his i a lord they be is him not them it with all".split()
with open(sys.argv[1], "w") as f:
    for _ in range(2000):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 12))) + ".\n")
PY
B='[{"type": "layernorm", "features": 32}, {"type": "attention", "dim": 32, "heads": 2, "causal": true}],
   [{"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 64}, {"type": "gelu", "approximate": "tanh"},
    {"type": "dense", "in": 64, "out": 32}]'
cat >"$tmp/gpt.json" <<JSON
{"name": "gpt-tiny", "input": [16],
 "layers": [{"type": "embed", "vocab": 256, "dim": 32, "positions": 16},
            {"type": "block", "steps": [$B]}, {"type": "block", "steps": [$B]},
            {"type": "layernorm", "features": 32}, {"type": "dense", "in": 32, "out": 256}]}
JSON
cat >"$tmp/twin.py" <<'PY'
import torch_models as tm
def net():
    return tm.gpt(vocab=256, ctx=16, dim=32, layers=2, heads=2, hidden=64)
PY
plan "$tmp/p4.json" 5 gpt-tiny "0" "1" "2" "3, 4"
plan "$tmp/p1.json" 5 gpt-tiny "0, 1, 2, 3, 4"
STEPS=16
ADAM="--text $tmp/t.txt --steps $STEPS --minibatch 8 --optimizer adam --lr 3e-3"
SGD="--text $tmp/t.txt --steps $STEPS --minibatch 8 --optimizer sgd --lr 0.05 --momentum 0.9"
oracle() {   # oracle NAME ARGS...: the oracle's summary line in $tmp/or_NAME.json
    local name=$1; shift
    "$PY" "$SRC/tools/torch_pipedream_lm.py" --model "$tmp/gpt.json" --twin "$tmp/twin.py:net" --plan "$tmp/p4.json" \
        --kind 1f1b --losses --start-checkpoint "$tmp/ck0" --staleness-warmup 8 "$@" >"$tmp/or_$name.json" \
        2>"$tmp/or_$name.err" || fail "oracle $name: $(tail -3 "$tmp/or_$name.err")"
}
ours() {     # ours NAME ARGS...: pipedream on 4 threads from the oracle's initial weights
    local name=$1; shift
    "$PD" train "$tmp/gpt.json" --workers "${W:-4}" --resume "$tmp/ck0" --staleness-warmup 8 "$@" \
        >"$tmp/pd_$name.out" 2>"$tmp/pd_$name.err" || fail "pipedream $name: $(tail -3 "$tmp/pd_$name.err")"
}
CASES=""
for opt in adam sgd; do
    R=$ADAM; [ $opt = sgd ] && R=$SGD
    for m in none predict lookahead lr-warmup predict+lr-warmup; do
        oracle $opt-$m $R --optimizer $opt --staleness $m
        ours $opt-$m $R --plan "$tmp/p4.json" --microbatches 1 --staleness $m
        CASES="$CASES $opt-$m"
    done
    # 1f1b with 2 micro-batches per minibatch: one step per minibatch, delays 2, 1, 1, 0
    for m in none predict lookahead; do
        oracle $opt.m2-$m $R --optimizer $opt --microbatches 2 --staleness $m
        ours $opt.m2-$m $R --plan "$tmp/p4.json" --schedule 1f1b --microbatches 2 --staleness $m
        CASES="$CASES $opt.m2-$m"
    done
done
"$PY" - "$tmp" $CASES <<'PY' || fail "compensated runs differ from the oracle"
import json, sys
d, cases = sys.argv[1], sys.argv[2:]
def last(p):
    return json.loads(open(p).read().strip().splitlines()[-1])
TOL = 1e-4
def rel(a, b):
    return abs(a - b) / abs(b)
for k in cases:
    pd, o = last('%s/pd_%s.out' % (d, k)), last('%s/or_%s.json' % (d, k))
    print('%-22s pipedream test_loss %.6f mean_loss %.6f last loss %.6f | oracle %.6f %.6f %.6f'
          % (k, pd['test_loss'], pd['mean_loss'], pd['final_loss'], o['test_loss'], o['mean_loss'], o['final_loss']))
    for f in ('test_loss', 'mean_loss', 'final_loss'):
        assert rel(pd[f], o[f]) <= TOL, (k, f, pd[f], o[f])
    base = last('%s/or_%s-none.json' % (d, k.split('-')[0]))
    if not k.endswith('-none'):   # sensitivity: the method changes the run by far more than the tolerance
        assert max(rel(base[f], o[f]) for f in ('test_loss', 'mean_loss', 'final_loss')) > 10 * TOL, (k, base, o)
PY
# No delay, no change: 1f1b-flush (every unit reads the newest weights) and one stage.
for m in predict lookahead lr-warmup predict+lr-warmup; do
    ours flush-none $SGD --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2 --staleness none
    ours flush-$m $SGD --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2 --staleness $m
    [ "$(crc "$tmp/pd_flush-$m.out")" = "$(crc "$tmp/pd_flush-none.out")" ] || fail "1f1b-flush with --staleness $m changed the weights"
    W=1 ours one-none $SGD --plan "$tmp/p1.json" --staleness none
    W=1 ours one-$m $SGD --plan "$tmp/p1.json" --staleness $m
    [ "$(crc "$tmp/pd_one-$m.out")" = "$(crc "$tmp/pd_one-none.out")" ] || fail "one stage with --staleness $m changed the weights"
done
# Interleaved (4 stages on 2 workers) flushes every minibatch: no unit is delayed either.
W=2 ours int-none $SGD --plan "$tmp/p4.json" --chunks 2 --staleness none
W=2 ours int-la $SGD --plan "$tmp/p4.json" --chunks 2 --staleness lookahead
[ -n "$(crc "$tmp/pd_int-none.out")" ] || fail "interleaved: no weights CRC in $(cat "$tmp/pd_int-none.out")"
[ "$(crc "$tmp/pd_int-la.out")" = "$(crc "$tmp/pd_int-none.out")" ] || fail "interleaved with --staleness lookahead changed the weights"
# 2bw's default (predict) is 1f1b with as many micro-batches (delays at most 1 here): where 1f1b
# reads the newer version, 2bw predicts it from the older one and the step that made it, which
# gives that version bit for bit (SGD here: the last oracle run left an SGD start checkpoint).
for opt in sgd; do
    R=$SGD
    ours 2bw-$opt $R --plan "$tmp/p4.json" --schedule 2bw --microbatches 4
    ours 1f1b4-$opt $R --plan "$tmp/p4.json" --schedule 1f1b --microbatches 4 --staleness predict
    grep -q '"staleness":"predict"' "$tmp/pd_2bw-$opt.out" || fail "2bw's default method is not predict"
    [ "$(crc "$tmp/pd_2bw-$opt.out")" = "$(crc "$tmp/pd_1f1b4-$opt.out")" ] ||
        fail "2bw ($opt) differs from 1f1b --microbatches 4 --staleness predict"
    ours 2bw-none-$opt $R --plan "$tmp/p4.json" --schedule 2bw --microbatches 4 --staleness none
    [ "$(crc "$tmp/pd_2bw-none-$opt.out")" != "$(crc "$tmp/pd_2bw-$opt.out")" ] || fail "2bw: predict changed nothing"
done
# Checkpoints: a method adds no state, so 1f1b with micro-batches and lookahead resumed from a
# checkpoint ends bitwise where the uninterrupted run with the same interval ends.
CK="$tmp/gpt.json --workers 4 --plan $tmp/p4.json --text $tmp/t.txt --minibatch 8 --optimizer sgd --lr 0.05
    --schedule 1f1b --microbatches 2 --staleness lookahead --checkpoint-every 6"
"$PD" train $CK --steps 16 --checkpoint-dir "$tmp/cu" >"$tmp/ck_u.out" 2>"$tmp/ck_u.err" || fail "uninterrupted: $(tail -3 "$tmp/ck_u.err")"
"$PD" train $CK --steps 6 --checkpoint-dir "$tmp/cr" >/dev/null 2>"$tmp/ck_r.err" || fail "first part: $(tail -3 "$tmp/ck_r.err")"
"$PD" train $CK --steps 16 --checkpoint-dir "$tmp/cr" --resume "$tmp/cr" >"$tmp/ck_r.out" 2>"$tmp/ck_r.err" ||
    fail "resumed: $(tail -3 "$tmp/ck_r.err")"
grep -q '"resumed_from":6' "$tmp/ck_r.out" || fail "did not resume from minibatch 6: $(cat "$tmp/ck_r.out")"
[ "$(crc "$tmp/ck_r.out")" = "$(crc "$tmp/ck_u.out")" ] || fail "resumed 1f1b --microbatches 2 differs from uninterrupted"
# MPI gives the threads' weights, bit for bit.
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    # under ASan, as in the other MPI tests: Open MPI's own allocations (its dlopened plugins) are
    # never freed; the threads runs above check our leaks
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    for m in predict lookahead+lr-warmup; do
        mpirun -np 4 --oversubscribe --bind-to none "$PD" train "$tmp/gpt.json" $SGD --plan "$tmp/p4.json" \
            --resume "$tmp/ck0" --microbatches 1 --staleness $m --staleness-warmup 8 >"$tmp/mpi_$m.out" 2>"$tmp/mpi_$m.err" ||
            fail "mpirun --staleness $m: $(tail -3 "$tmp/mpi_$m.err")"
        ours thr-$m $SGD --plan "$tmp/p4.json" --microbatches 1 --staleness $m
        [ "$(crc "$tmp/mpi_$m.out")" = "$(crc "$tmp/pd_thr-$m.out")" ] || fail "MPI and threads differ with --staleness $m"
    done
fi
echo "ok: every staleness method = its PyTorch oracle (Adam, SGD); no delay leaves runs bitwise; 2bw = 1f1b with"\
    "micro-batches under predict; resume exact; MPI = threads"
