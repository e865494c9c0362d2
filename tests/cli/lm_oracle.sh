#!/usr/bin/env bash
# lm_oracle.sh: the pipeline runtime's training semantics against an independent PyTorch oracle
# (tools/torch_pipedream_lm.py): a tiny GPT (two blocks) on a generated text, cut into 4 stages,
# trained from the same weights on the same minibatches. 1f1b (stage s computes minibatch m on
# its version m - (3 - s), weight stashing), 1f1b --vertical-sync (every stage on version
# m - 3) and 2bw (version m - 1) each end where the oracle of their own kind ends (losses and
# held-out loss, relative 1e-4), and the kinds differ from each other by far more than that,
# so a runtime reading the wrong versions fails. Skipped (77) when /usr/bin/python3 has no torch.
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
. "$SRC/tests/cli/lib/gpt_tiny.sh"
gpt_tiny_setup 7
STEPS=16
R="--text $tmp/t.txt --steps $STEPS --minibatch 8 --optimizer adam --lr 3e-3"
oracle() {   # oracle NAME ARGS...: the oracle's summary line in $tmp/or_NAME.json
    local name=$1; shift
    "$PY" "$SRC/tools/torch_pipedream_lm.py" --model "$tmp/gpt.json" --twin "$tmp/twin.py:net" --plan "$tmp/p4.json" \
        $R --losses --start-checkpoint "$tmp/ck0" "$@" >"$tmp/or_$name.json" 2>"$tmp/or_$name.err" ||
        fail "oracle $name: $(tail -3 "$tmp/or_$name.err")"
}
ours() {     # ours NAME ARGS...: pipedream on 4 threads from the oracle's initial weights
    local name=$1; shift
    "$PD" train "$tmp/gpt.json" $R --workers 4 --plan "$tmp/p4.json" --resume "$tmp/ck0" --staleness none "$@" \
        >"$tmp/pd_$name.out" 2>"$tmp/pd_$name.err" || fail "pipedream $name: $(tail -3 "$tmp/pd_$name.err")"
}
oracle seq --kind seq
oracle 1f1b --kind 1f1b
oracle vsync --kind 1f1b --vertical-sync
oracle 2bw --kind 2bw
ours 1f1b --microbatches 1
ours vsync --vertical-sync
ours 2bw --schedule 2bw --microbatches 4
"$PY" - "$tmp" <<'PY' || fail "pipelined runs differ from the oracle"
import json, sys
d = sys.argv[1]
def last(p):
    return json.loads(open(p).read().strip().splitlines()[-1])
orc = {k: last('%s/or_%s.json' % (d, k)) for k in ('seq', '1f1b', 'vsync', '2bw')}
assert orc['1f1b']['delays'] == [3, 2, 1, 0] and orc['vsync']['delays'] == [3] * 4 and orc['2bw']['delays'] == [1] * 4
TOL = 1e-4
def rel(a, b):
    return abs(a - b) / abs(b)
for k in ('1f1b', 'vsync', '2bw'):
    pd, o = last('%s/pd_%s.out' % (d, k)), orc[k]
    print('%-6s pipedream test_loss %.6f mean_loss %.6f last loss %.6f | oracle %.6f %.6f %.6f'
          % (k, pd['test_loss'], pd['mean_loss'], pd['final_loss'], o['test_loss'], o['mean_loss'], o['final_loss']))
    for f in ('test_loss', 'mean_loss', 'final_loss'):
        assert rel(pd[f], o[f]) <= TOL, (k, f, pd[f], o[f])
    # Sensitivity: every other kind's oracle is far outside the tolerance, so agreement above
    # means the runtime read this kind's versions and no other's.
    for j in orc:
        if j != k:
            assert rel(orc[j]['test_loss'], o['test_loss']) > 10 * TOL, (k, j, orc[j]['test_loss'], o['test_loss'])
PY
echo "ok: 1f1b, 1f1b --vertical-sync and 2bw on 4 stages = the PyTorch oracle of their weight versions"
