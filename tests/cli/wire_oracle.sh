#!/usr/bin/env bash
# wire_oracle.sh: --wire bf16 against its PyTorch oracle (tools/torch_pipedream_lm.py --wire bf16:
# every activation entering a stage and every gradient leaving one rounded to bf16, to nearest
# even): a tiny GPT over 4 stages, 1f1b-flush and asynchronous 1f1b, ends where the oracle of
# its kind ends (relative 1e-4) while the fp32 wire ends elsewhere by far more; MPI equals
# threads bitwise; the bytes sent halve (all but headers and labels). Skipped (77) without torch.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_TORCH_PYTHON:-/usr/bin/python3}
. "$SRC/tests/cli/lib/common.sh"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "SKIP: $PY cannot import torch"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$SRC/tests/cli/lib/gpt_tiny.sh"
gpt_tiny_setup 13
R="--text $tmp/t.txt --steps 16 --minibatch 8 --optimizer adam --lr 3e-3"
oracle() {   # oracle NAME ARGS...
    local name=$1; shift
    "$PY" "$SRC/tools/torch_pipedream_lm.py" --model "$tmp/gpt.json" --twin "$tmp/twin.py:net" --plan "$tmp/p4.json" \
        $R --losses --start-checkpoint "$tmp/ck" "$@" >"$tmp/or_$name.json" 2>"$tmp/or_$name.err" ||
        fail "oracle $name: $(tail -3 "$tmp/or_$name.err")"
}
ours() {     # ours NAME ARGS...: pipedream on 4 threads from the oracle's initial weights
    local name=$1; shift
    "$PD" train "$tmp/gpt.json" $R --workers 4 --plan "$tmp/p4.json" --resume "$tmp/ck" --staleness none "$@" \
        >"$tmp/pd_$name.out" 2>"$tmp/pd_$name.err" || fail "pipedream $name: $(tail -3 "$tmp/pd_$name.err")"
}
oracle seq --kind seq --wire bf16 --save "$tmp/w_or_seq.st"
oracle seq32 --kind seq --save "$tmp/w_or_seq32.st"
oracle 1f1b --kind 1f1b --wire bf16
ours flush --schedule 1f1b-flush --microbatches 2 --wire bf16 --save "$tmp/w_pd_flush.st"
ours flush32 --schedule 1f1b-flush --microbatches 2
ours 1f1b --microbatches 1 --wire bf16
mpi=0
if command -v mpirun >/dev/null; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"   # Open MPI's plugins are never freed
    timeout 300 mpirun --oversubscribe -np 4 "$PD" train "$tmp/gpt.json" $R --plan "$tmp/p4.json" --resume "$tmp/ck" \
        --staleness none --microbatches 1 --wire bf16 >"$tmp/pd_mpi.out" 2>"$tmp/pd_mpi.err" || fail "MPI: $(tail -3 "$tmp/pd_mpi.err")"
    [ "$(crc "$tmp/pd_mpi.out")" = "$(crc "$tmp/pd_1f1b.out")" ] ||
        fail "MPI and threads differ: $(crc "$tmp/pd_mpi.out") vs $(crc "$tmp/pd_1f1b.out")"
    mpi=1
fi
"$PY" - "$tmp" "$SRC/tools" <<'PY' || fail "the bf16 wire differs from its oracle"
import json, sys
d = sys.argv[1]
def last(p):
    return json.loads(open(p).read().strip().splitlines()[-1])
TOL = 1e-4
def rel(a, b):
    return abs(a - b) / abs(b)
for pd_name, or_name in (('flush', 'seq'), ('1f1b', '1f1b'), ('flush32', 'seq32')):
    pd, o = last('%s/pd_%s.out' % (d, pd_name)), last('%s/or_%s.json' % (d, or_name))
    print('%-7s wire %s: pipedream test_loss %.6f mean_loss %.6f bytes %d | oracle %.6f %.6f'
          % (pd_name, pd['wire'], pd['test_loss'], pd['mean_loss'], pd['bytes_sent'], o['test_loss'], o['mean_loss']))
    for f in ('test_loss', 'mean_loss', 'final_loss'):
        assert rel(pd[f], o[f]) <= TOL, (pd_name, f, pd[f], o[f])
# The losses barely tell the wires apart (rounding errors average out); the weights do: the
# bf16 run is far nearer its own oracle than the fp32 oracle.
sys.path.insert(0, sys.argv[2])
import numpy as np, pd_io
def weights(p):
    t = pd_io.read_safetensors(p)[0]
    return np.concatenate([t[k].ravel() for k in sorted(t) if k.startswith('layers.')])
pw, ob, of = (weights(d + '/' + f) for f in ('w_pd_flush.st', 'w_or_seq.st', 'w_or_seq32.st'))
near, far = np.linalg.norm(pw - ob), np.linalg.norm(pw - of)
print('weights: |pipedream - oracle bf16| %.3g, |pipedream - oracle fp32| %.3g' % (near, far))
assert near * 5 < far, (near, far)
x, y = last(d + '/pd_flush.out'), last(d + '/pd_flush32.out')
assert x['wire'] == 'bf16' and y['wire'] == 'fp32'
assert 0.45 < x['bytes_sent'] / y['bytes_sent'] < 0.55, (x['bytes_sent'], y['bytes_sent'])
PY
[ $? = 0 ] || exit 1
"$PD" train "$tmp/gpt.json" $R --wire fp16 2>"$tmp/u.err" && fail "--wire fp16 accepted"
grep -q "expects fp32, bf16, int8, int4 or delta" "$tmp/u.err" || fail "--wire: $(cat "$tmp/u.err")"
echo "PASS (MPI: $mpi)"
