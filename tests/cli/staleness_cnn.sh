#!/usr/bin/env bash
# staleness_cnn.sh: staleness compensation on a CNN with batch norm against the independent
# PyTorch oracle (tools/torch_pipedream_lm.py --data): conv, batch norm, relu, max-pool, dense cut
# into 4 stages, trained on Fashion-MNIST's first minibatches from the oracle's initial weights
# with 1f1b and 2 micro-batches per step (delays 2, 1, 1, 0), SGD with momentum, for each method.
# Batch norm's running statistics are stage state updated at every forward, so the held-out loss
# (evaluated with them) checks them too. Each run ends where its oracle ends (losses, relative
# 1e-3), and each method moves the oracle's result by more than 10x that. The tolerance is wider
# than rounding: the relu before the max pool turns rounding differences (our kernels and
# PyTorch's round otherwise, and otherwise on each CPU) into other argmax choices. On an AVX2 CPU
# 'none' ended 4.8e-4 from its oracle, the other methods within 7e-5. Over MPI (when mpirun runs
# here) the weights are the threads' bit for bit. Skipped (77) without torch or Fashion-MNIST.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_TORCH_PYTHON:-/usr/bin/python3}
DATA=${PD_FMNIST:-/usr/share/datasets/fashion-mnist}
. "$SRC/tests/cli/lib/common.sh"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
"$PY" -c "import torch" 2>/dev/null || { echo "SKIP: $PY cannot import torch"; exit 77; }
[ -r "$DATA/train-images-idx3-ubyte.gz" ] || [ -r "$DATA/train-images-idx3-ubyte" ] ||
    { echo "SKIP: no Fashion-MNIST in $DATA"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat >"$tmp/cnn.json" <<'JSON'
{"name": "cnn-bn", "input": [1, 28, 28],
 "layers": [{"type": "conv2d", "in": 1, "out": 4, "kernel": 3, "stride": 1, "pad": 1, "bias": false},
            {"type": "batchnorm", "features": 4}, {"type": "relu"}, {"type": "maxpool", "kernel": 2, "stride": 2},
            {"type": "flatten"}, {"type": "dense", "in": 784, "out": 10}]}
JSON
cat >"$tmp/twin.py" <<'PY'
import torch.nn as nn
def net():
    return nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Flatten(), nn.Linear(784, 10))
PY
plan "$tmp/p4.json" 6 cnn-bn "0, 1" "2, 3" "4" "5"
R="--steps 24 --minibatch 16 --optimizer sgd --lr 0.02 --momentum 0.9"
for m in none predict lookahead; do
    "$PY" "$SRC/tools/torch_pipedream_lm.py" --model "$tmp/cnn.json" --twin "$tmp/twin.py:net" --plan "$tmp/p4.json" \
        --data "$DATA" --kind 1f1b --microbatches 2 --start-checkpoint "$tmp/ck0" --staleness $m $R \
        >"$tmp/or_$m.json" 2>"$tmp/or_$m.err" || fail "oracle $m: $(tail -3 "$tmp/or_$m.err")"
    "$PD" train "$tmp/cnn.json" --workers 4 --plan "$tmp/p4.json" --resume "$tmp/ck0" --data "$DATA" \
        --schedule 1f1b --microbatches 2 --staleness $m $R >"$tmp/pd_$m.json" 2>"$tmp/pd_$m.err" ||
        fail "pipedream $m: $(tail -3 "$tmp/pd_$m.err")"
done
"$PY" - "$tmp" <<'PY' || fail "compensated CNN runs differ from the oracle"
import json, sys
d = sys.argv[1]
def last(p):
    return json.loads(open(p).read().strip().splitlines()[-1])
TOL = 1e-3
rel = lambda a, b: abs(a - b) / abs(b)
base = last('%s/or_none.json' % d)
for m in ('none', 'predict', 'lookahead'):
    pd, o = last('%s/pd_%s.json' % (d, m)), last('%s/or_%s.json' % (d, m))
    print('%-10s pipedream test_loss %.6f mean_loss %.6f last loss %.6f | oracle %.6f %.6f %.6f'
          % (m, pd['test_loss'], pd['mean_loss'], pd['final_loss'], o['test_loss'], o['mean_loss'], o['final_loss']))
    for f in ('test_loss', 'mean_loss', 'final_loss'):
        assert rel(pd[f], o[f]) <= TOL, (m, f, pd[f], o[f])
    if m != 'none':
        assert rel(base['test_loss'], o['test_loss']) > 10 * TOL, (m, base['test_loss'], o['test_loss'])
PY
# MPI gives the threads' weights, bit for bit.
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"   # Open MPI's plugins are never freed
    mpirun -np 4 --oversubscribe --bind-to none "$PD" train "$tmp/cnn.json" --plan "$tmp/p4.json" --resume "$tmp/ck0" \
        --data "$DATA" --schedule 1f1b --microbatches 2 --staleness lookahead $R >"$tmp/mpi.json" 2>"$tmp/mpi.err" ||
        fail "mpirun: $(tail -3 "$tmp/mpi.err")"
    [ -n "$(crc "$tmp/mpi.json")" ] && [ "$(crc "$tmp/mpi.json")" = "$(crc "$tmp/pd_lookahead.json")" ] ||
        fail "MPI ($(crc "$tmp/mpi.json")) and threads ($(crc "$tmp/pd_lookahead.json")) differ"
fi
echo "ok: a CNN with batch norm, 1f1b with micro-batches: every method = its PyTorch oracle; MPI = threads"
