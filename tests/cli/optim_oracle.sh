#!/usr/bin/env bash
# optim_oracle.sh: the transformer recipe's optimizer against PyTorch (tools/torch_pipedream_lm.py,
# torch.optim.AdamW, the schedule as pipedream's optim_lr, torch.nn.utils.clip_grad_norm_ over
# every parameter; a flushing pipeline's micro-batches change only the summation order): a tiny GPT on a generated text with AdamW (decoupled weight decay), a linear
# warm-up then cosine decay to a floor, and global gradient-norm clipping; also SGD with coupled
# decay and a linear decay. One worker and 1f1b-flush over 4 stages (threads; and MPI, where
# mpirun exists) each end where the oracle ends (losses and held-out loss, relative 1e-4), and
# the run without clipping ends elsewhere by far more, so a runtime that clipped per stage, or
# not at all, fails. Asynchronous pipelines refuse clipping with a reason. Skipped (77) when
# /usr/bin/python3 has no torch.
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
gpt_tiny_setup 11
STEPS=20
ADAMW="--optimizer adamw --lr 3e-3 --weight-decay 0.1 --beta2 0.95 --lr-schedule cosine --warmup-steps 4 --min-lr 3e-4"
SGD="--optimizer sgd --lr 0.05 --momentum 0.9 --weight-decay 0.01 --lr-schedule linear --warmup-steps 3 --decay-steps 16 --min-lr 0.005"
R="--text $tmp/t.txt --steps $STEPS --minibatch 8"
oracle() {   # oracle NAME ARGS...
    local name=$1; shift
    "$PY" "$SRC/tools/torch_pipedream_lm.py" --model "$tmp/gpt.json" --twin "$tmp/twin.py:net" --plan "$tmp/p4.json" \
        $R --losses --start-checkpoint "$tmp/ck_$name" "$@" >"$tmp/or_$name.json" 2>"$tmp/or_$name.err" ||
        fail "oracle $name: $(tail -3 "$tmp/or_$name.err")"
}
ours() {     # ours NAME CKPT ARGS...: pipedream from the oracle's initial weights
    local name=$1 ck=$2; shift 2
    "$PD" train "$tmp/gpt.json" $R --resume "$tmp/ck_$ck" "$@" >"$tmp/pd_$name.out" 2>"$tmp/pd_$name.err" ||
        fail "pipedream $name: $(tail -3 "$tmp/pd_$name.err")"
}
oracle adamw --kind seq $ADAMW --clip-grad-norm 1.2
oracle noclip --kind seq $SGD
oracle sgd --kind seq $SGD --clip-grad-norm 1.0
ours one adamw $ADAMW --clip-grad-norm 1.2
ours flush adamw $ADAMW --clip-grad-norm 1.2 --workers 4 --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2
ours sgd sgd $SGD --clip-grad-norm 1.0
ours flush_sgd sgd $SGD --clip-grad-norm 1.0 --workers 4 --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2
# A run resumed from its checkpoint half way (schedule position, clipping, AdamW's moments) ends
# bitwise where the uninterrupted run ends.
F4="--workers 4 --plan $tmp/p4.json --schedule 1f1b-flush --microbatches 2"
"$PD" train "$tmp/gpt.json" $R $ADAMW --clip-grad-norm 1.2 $F4 --checkpoint-every 10 --checkpoint-dir "$tmp/cka" \
    >"$tmp/full.out" 2>"$tmp/full.err" || fail "checkpointed run: $(tail -3 "$tmp/full.err")"
mkdir "$tmp/ckb" && cp "$tmp/cka/ckpt-0000000010.safetensors" "$tmp/ckb/" || fail "no ckpt-10 in $(ls "$tmp/cka")"
"$PD" train "$tmp/gpt.json" $R $ADAMW --clip-grad-norm 1.2 $F4 --resume "$tmp/ckb" \
    >"$tmp/resumed.out" 2>"$tmp/resumed.err" || fail "resumed run: $(tail -3 "$tmp/resumed.err")"
[ "$(crc "$tmp/resumed.out")" = "$(crc "$tmp/full.out")" ] ||
    fail "resumed $(crc "$tmp/resumed.out") vs uninterrupted $(crc "$tmp/full.out")"
grep -q "was taken with" "$tmp/resumed.err" && fail "resume warns of changed flags: $(grep 'taken with' "$tmp/resumed.err")"
# ... and one resumed with another schedule is told so.
"$PD" train "$tmp/gpt.json" $R $ADAMW --clip-grad-norm 1.2 $F4 --resume "$tmp/ckb" --lr-schedule linear \
    >/dev/null 2>"$tmp/changed.err" || fail "resume with another schedule: $(tail -3 "$tmp/changed.err")"
grep -q "taken with --lr-schedule cosine; this run has --lr-schedule linear" "$tmp/changed.err" ||
    fail "no warning of the changed schedule: $(cat "$tmp/changed.err")"
mpi=0
if command -v mpirun >/dev/null; then
    timeout 300 mpirun --oversubscribe -np 4 "$PD" train "$tmp/gpt.json" $R --resume "$tmp/ck_sgd" $SGD \
        --clip-grad-norm 1.0 --plan "$tmp/p4.json" --schedule 1f1b-flush --microbatches 2 \
        >"$tmp/pd_mpi.out" 2>"$tmp/pd_mpi.err" || fail "pipedream over MPI: $(tail -3 "$tmp/pd_mpi.err")"
    [ "$(crc "$tmp/pd_mpi.out")" = "$(crc "$tmp/pd_flush_sgd.out")" ] ||
        fail "MPI and threads differ: $(crc "$tmp/pd_mpi.out") vs $(crc "$tmp/pd_flush_sgd.out")"
    mpi=1
fi
"$PY" - "$tmp" <<'PY' || fail "runs differ from the oracle"
import json, sys
d = sys.argv[1]
def last(p):
    return json.loads(open(p).read().strip().splitlines()[-1])
TOL = 1e-4
def rel(a, b):
    return abs(a - b) / abs(b)
for pd_name, or_name in (('one', 'adamw'), ('flush', 'adamw'), ('sgd', 'sgd'), ('flush_sgd', 'sgd')):
    pd, o = last('%s/pd_%s.out' % (d, pd_name)), last('%s/or_%s.json' % (d, or_name))
    print('%-6s pipedream test_loss %.6f mean_loss %.6f last %.6f clipped %s of %d (norm mean %.3f) | oracle %.6f %.6f %.6f'
          % (pd_name, pd['test_loss'], pd['mean_loss'], pd['final_loss'], pd['clipped_steps'], pd['steps'],
             pd['grad_norm_mean'], o['test_loss'], o['mean_loss'], o['final_loss']))
    for f in ('test_loss', 'mean_loss', 'final_loss'):
        assert rel(pd[f], o[f]) <= TOL, (pd_name, f, pd[f], o[f])
    # clipping both acted and did not act: the test covers the factor's clamp at 1
    assert 0 < pd['clipped_steps'] < pd['steps'], (pd_name, pd['clipped_steps'])
    assert pd['lr_schedule'] == ('linear' if 'sgd' in pd_name else 'cosine')
a, n = last(d + '/or_sgd.json'), last(d + '/or_noclip.json')
assert rel(a['test_loss'], n['test_loss']) > 100 * TOL, ('clipping changes nothing here', a['test_loss'], n['test_loss'])
PY
[ $? = 0 ] || exit 1
# Asynchronous pipelines have no one minibatch gradient per step: refused, with the reason.
"$PD" train "$tmp/gpt.json" $R --workers 4 --plan "$tmp/p4.json" --schedule 1f1b --clip-grad-norm 1 \
    >"$tmp/async.out" 2>"$tmp/async.err" && fail "1f1b over 4 stages accepted --clip-grad-norm"
grep -q "stages update at different times" "$tmp/async.err" || fail "1f1b refusal: $(cat "$tmp/async.err")"
# Usage errors name the flag.
"$PD" train "$tmp/gpt.json" $R --min-lr 1e-4 2>"$tmp/u1.err" && fail "--min-lr without a decay accepted"
grep -q "apply to --lr-schedule cosine or linear" "$tmp/u1.err" || fail "--min-lr: $(cat "$tmp/u1.err")"
"$PD" train "$tmp/gpt.json" $R --beta2 0.95 2>"$tmp/u2.err" && fail "--beta2 with sgd accepted"
grep -q "apply to --optimizer adam" "$tmp/u2.err" || fail "--beta2: $(cat "$tmp/u2.err")"
"$PD" train "$tmp/gpt.json" $R --optimizer adamx 2>"$tmp/u3.err" && fail "--optimizer adamx accepted"
grep -q "sgd, adam or adamw" "$tmp/u3.err" || fail "--optimizer: $(cat "$tmp/u3.err")"
echo "PASS (MPI: $mpi)"
