#!/usr/bin/env bash
# export_nanogpt.sh: tools/export_torch.py on nanoGPT-style language models (tests/cli/export_nanogpt.py):
# wte + wpe(arange), the hand-written CausalSelfAttention (and, in a second variant,
# nn.MultiheadAttention with a causal mask), LayerNorm, both GELUs, and an lm_head whose weight is
# the token embedding's. The export ties the head to layers.0.weight instead of copying it, and
# `pipedream eval --text` of the exported weights gives PyTorch's held-out loss (relative 1e-5)
# and accuracy; 6 steps on one worker, Adam, and SGD with --clip-grad-norm, end at the held-out
# loss PyTorch's own training of the module (one shared tensor, the same minibatches) ends at
# (relative 1e-4), and so do 4 stages with clipping; a weights file whose two copies of the tied matrix differ is refused. Then the tied model trains on 4 pipeline stages (embedding on stage 0, head on
# stage 3, 1f1b-flush) over threads: its saved copies of the tied matrix are bitwise equal and its
# held-out loss is the one-worker run's (relative 1e-4); a run checkpointed at step 3 and resumed
# ends bitwise as the uninterrupted one, and so does one checkpointing after every step; gpipe with
# --wire bf16 keeps the copies bitwise equal too; 1f1b (asynchronous) refuses the split tie; over MPI (when mpirun exists) the weights
# are bitwise the threads run's. Skipped (77) when /usr/bin/python3 (PD_TORCH_PYTHON) has no torch.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_TORCH_PYTHON:-/usr/bin/python3}
. "$SRC/tests/cli/lib/common.sh"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "SKIP: $PY cannot import torch"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
num() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" | head -1; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }

"$PY" - "$tmp/t.txt" <<'PY'
import random, sys
random.seed(3)
words = "the of and to in that he shall unto for his i a lord they be is him not them it with all".split()
with open(sys.argv[1], "w") as f:
    for _ in range(1500):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 12))) + ".\n")
PY

for fac in gpt gpt_mha; do
    "$PY" "$SRC/tools/export_torch.py" "$SRC/tests/cli/export_nanogpt.py:$fac" --input-shape 16 -o "$tmp/$fac.json" \
        --weights "$tmp/$fac.st" 2>"$tmp/err" || fail "export $fac: $(cat "$tmp/err")"
    grep -q '"type": "dense", "in": 32, "out": 256, "bias": false, "tie": "layers.0.weight"' "$tmp/$fac.json" ||
        fail "$fac: the head is not tied: $(cat "$tmp/$fac.json")"
    grep -q '"type": "embed", "vocab": 256, "dim": 32, "positions": 16' "$tmp/$fac.json" || fail "$fac: no position embedding"
    [ "$(grep -o '"type": "attention", "dim": 32, "heads": 4, "causal": true' "$tmp/$fac.json" | wc -l)" -eq 2 ] ||
        fail "$fac: want 2 causal attention layers: $(cat "$tmp/$fac.json")"
    grep -q '"approximate": "none"' "$tmp/$fac.json" && grep -q '"approximate": "tanh"' "$tmp/$fac.json" ||
        fail "$fac: want both GELUs"
    ! grep -q dropout "$tmp/$fac.json" || fail "$fac: dropout p=0 exported"
    # PyTorch's held-out loss and accuracy of the module, as pipedream evaluates (tools/torch_models.py)
    "$PY" - "$SRC" "$fac" "$tmp/t.txt" >"$tmp/pt.json" <<'PY' || fail "$fac: PyTorch evaluation"
import json, sys
sys.path[:0] = [sys.argv[1] + '/tools', sys.argv[1] + '/tests/cli']
import torch
import export_nanogpt, pd_io, torch_models as tm
torch.set_num_threads(1)
torch.manual_seed(0)   # export_torch.py's default seed
m = getattr(export_nanogpt, sys.argv[2])()
class Floats(torch.nn.Module):   # pipedream's buffers hold token ids as floats
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, x):
        return self.m(x.long())
loss, acc = tm.lm_evaluate(Floats(m), pd_io.Text(open(sys.argv[3], 'rb').read(), 16))
print(json.dumps({'test_loss': loss, 'test_accuracy': acc}))
PY
    "$PD" eval "$tmp/$fac.json" --text "$tmp/t.txt" --weights "$tmp/$fac.st" >"$tmp/pd.json" 2>"$tmp/err" ||
        fail "eval $fac: $(cat "$tmp/err")"
    a=$(num test_loss "$tmp/pd.json"); b=$(num test_loss "$tmp/pt.json")
    close "$a" "$b" 1e-5 || fail "$fac: test_loss pipedream $a, PyTorch $b"
    a2=$(num test_accuracy "$tmp/pd.json"); b2=$(num test_accuracy "$tmp/pt.json")
    close "$a2" "$b2" 1e-3 || fail "$fac: test_accuracy pipedream $a2, PyTorch $b2"
    echo "ok: $fac: exported with a tie; held-out loss pipedream $a, PyTorch $b"
done

# a weights file whose two copies of the tied matrix differ is refused, naming both
"$PY" - "$SRC" "$tmp/gpt.st" "$tmp/bad.st" "$tmp/gpt.json" <<'PY' || fail "writing the bad weights file"
import sys
sys.path.insert(0, sys.argv[1] + '/tools')
import pd_io
w, _ = pd_io.read_safetensors(sys.argv[2])
w['layers.4.weight'] = w['layers.4.weight'] * 2
names = pd_io.param_names(sys.argv[4])
pd_io.write_weights(sys.argv[3], sys.argv[4], [w[n] for n, _ in names])
PY
"$PD" eval "$tmp/gpt.json" --text "$tmp/t.txt" --weights "$tmp/bad.st" >"$tmp/out" 2>"$tmp/err" && fail "differing tied copies loaded"
grep -q "bad.st: layers.4.weight differs from layers.0.weight, which the model ties it to" "$tmp/err" ||
    fail "differing tied copies: $(cat "$tmp/err")"

# ---- the tied model on 4 stages: embedding on stage 0, head on stage 3 --------------------------------------
M=$tmp/gpt.json
plan "$tmp/p4.json" 5 gpt "0" "1" "2" "3, 4"
args="$M --text $tmp/t.txt --init $tmp/gpt.st --steps 6 --minibatch 16 --optimizer adam --lr 1e-3 --timeout 60"
"$PD" train $args --plan "$tmp/p4.json" --workers 4 --schedule 1f1b-flush --microbatches 4 --save "$tmp/w4.st" \
    >"$tmp/thr.json" 2>"$tmp/err" || fail "4 stages: $(tail -3 "$tmp/err")"
"$PD" train $args >"$tmp/one.json" 2>"$tmp/err" || fail "one worker: $(tail -3 "$tmp/err")"
"$PY" - "$SRC" "$tmp/w4.st" <<'PY' || fail "the saved tied copies differ"
import sys
sys.path.insert(0, sys.argv[1] + '/tools')
import numpy as np, pd_io
w, _ = pd_io.read_safetensors(sys.argv[2])
assert w['layers.0.weight'].tobytes() == w['layers.4.weight'].tobytes()
PY
# PyTorch trains the module itself (one shared tensor) on the same minibatches: the same held-out loss,
# without and with gradient-norm clipping (the tied tensor counts once in the norm)
sgd="--optimizer sgd --lr 0.5 --momentum 0.9 --clip-grad-norm 0.2"   # SGD: the clipped norm sets the step
"$PD" train $args $sgd >"$tmp/one_clip.json" 2>"$tmp/err" || fail "one worker, clipped: $(tail -3 "$tmp/err")"
for clip in 0 0.2; do
    "$PY" - "$SRC" "$tmp/t.txt" "$clip" >"$tmp/pt_train.json" <<'PY' || fail "PyTorch training"
import json, sys
sys.path[:0] = [sys.argv[1] + '/tools', sys.argv[1] + '/tests/cli']
import torch
import export_nanogpt, pd_io, torch_models as tm
torch.set_num_threads(1)
torch.manual_seed(0)
m = export_nanogpt.gpt()
text = pd_io.Text(open(sys.argv[2], 'rb').read(), 16)
clip = float(sys.argv[3])
opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9) if clip else torch.optim.Adam(m.parameters(), lr=1e-3)
clipped = 0
for g in range(6):
    x, y = text.minibatch(g, 16, 1)
    opt.zero_grad()
    tm.lm_loss(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    if clip:
        clipped += float(torch.nn.utils.clip_grad_norm_(m.parameters(), clip)) > clip
    opt.step()
assert not clip or clipped == 6, 'clipping inactive'
class Floats(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, x):
        return self.m(x.long())
loss, acc = tm.lm_evaluate(Floats(m), text)
print(json.dumps({'test_loss': loss}))
PY
    f=$tmp/one.json
    [ "$clip" = 0 ] || f=$tmp/one_clip.json
    a=$(num test_loss "$f"); b=$(num test_loss "$tmp/pt_train.json")
    close "$a" "$b" 1e-4 || fail "trained 6 steps, clip $clip: held-out loss pipedream $a, PyTorch $b"
    echo "ok: 6 steps of the tied model, clip $clip (0: Adam, else SGD): held-out loss pipedream $a, PyTorch $b"
done
"$PD" train $args $sgd --plan "$tmp/p4.json" --workers 4 --schedule 1f1b-flush --microbatches 4 \
    >"$tmp/thr_clip.json" 2>"$tmp/err" || fail "4 stages, clipped: $(tail -3 "$tmp/err")"
a=$(num test_loss "$tmp/thr_clip.json"); b=$(num test_loss "$tmp/one_clip.json")
close "$a" "$b" 1e-4 || fail "4 stages, clipped: test_loss $a, one worker $b"
echo "ok: 4 stages, clipped: held-out loss $a, one worker $b"
a=$(num test_loss "$tmp/thr.json"); b=$(num test_loss "$tmp/one.json")
close "$a" "$b" 1e-4 || fail "4 stages: test_loss $a, one worker $b"
echo "ok: 4 stages (1f1b-flush): tied copies bitwise equal; held-out loss $a, one worker $b"
# bf16 on the wire rounds activations and gradients between stages, never the tied exchange
"$PD" train $args --plan "$tmp/p4.json" --workers 4 --schedule gpipe --microbatches 4 --wire bf16 --save "$tmp/wb.st" \
    >"$tmp/out" 2>"$tmp/err" || fail "gpipe --wire bf16: $(tail -3 "$tmp/err")"
"$PY" - "$SRC" "$tmp/wb.st" <<'PY' || fail "--wire bf16: the saved tied copies differ"
import sys
sys.path.insert(0, sys.argv[1] + '/tools')
import pd_io
w, _ = pd_io.read_safetensors(sys.argv[2])
assert w['layers.0.weight'].tobytes() == w['layers.4.weight'].tobytes()
PY
# interrupted at step 3 (checkpoint) and resumed: bitwise the uninterrupted run
"$PD" train ${args/--steps 6/--steps 3} --plan "$tmp/p4.json" --workers 4 --schedule 1f1b-flush --microbatches 4 \
    --checkpoint-every 3 --checkpoint-dir "$tmp/ck" >"$tmp/out" 2>"$tmp/err" || fail "checkpointed run: $(tail -3 "$tmp/err")"
"$PD" train ${args/--init $tmp\/gpt.st/} --plan "$tmp/p4.json" --workers 4 --schedule 1f1b-flush --microbatches 4 --resume "$tmp/ck" \
    >"$tmp/res.json" 2>"$tmp/err" || fail "resume: $(tail -3 "$tmp/err")"
grep -q '"resumed_from":3' "$tmp/res.json" || fail "resume: $(cat "$tmp/res.json")"
[ "$(crc "$tmp/res.json")" = "$(crc "$tmp/thr.json")" ] ||
    fail "resumed weights $(crc "$tmp/res.json") differ from the uninterrupted run's $(crc "$tmp/thr.json")"
echo "ok: resumed from a checkpoint at step 3 = uninterrupted ($(crc "$tmp/res.json"))"
# a checkpoint after every step: six one-step segments of one process, the same bits
"$PD" train $args --plan "$tmp/p4.json" --workers 4 --schedule 1f1b-flush --microbatches 4 --checkpoint-every 1 \
    --checkpoint-dir "$tmp/ck1" >"$tmp/seg.json" 2>"$tmp/err" || fail "checkpoint every step: $(tail -3 "$tmp/err")"
[ "$(crc "$tmp/seg.json")" = "$(crc "$tmp/thr.json")" ] ||
    fail "checkpointed every step: weights $(crc "$tmp/seg.json") differ from $(crc "$tmp/thr.json")"
"$PD" train $args --plan "$tmp/p4.json" --workers 4 --schedule 1f1b >"$tmp/out" 2>"$tmp/err" &&
    fail "1f1b with a tie over stages 0 and 3 ran"
grep -q "layers.4.weight (stage 3) ties to layers.0.weight (stage 0), but schedule 1f1b steps its stages at different times" \
    "$tmp/err" || fail "1f1b refusal: $(cat "$tmp/err")"
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    timeout 120 mpirun --oversubscribe -np 4 "$PD" train $args --plan "$tmp/p4.json" --schedule 1f1b-flush \
        --microbatches 4 >"$tmp/mpi.json" 2>"$tmp/err" || fail "mpi: $(tail -5 "$tmp/err")"
    [ "$(crc "$tmp/mpi.json")" = "$(crc "$tmp/thr.json")" ] ||
        fail "MPI weights $(crc "$tmp/mpi.json") differ from threads $(crc "$tmp/thr.json")"
    echo "ok: MPI = threads ($(crc "$tmp/mpi.json"))"
fi
echo "export_nanogpt.sh: ok"
