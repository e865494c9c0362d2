#!/usr/bin/env bash
# export.sh: tools/export_torch.py end to end: the PyTorch CNN of export_cnn.py (conv, batch norm,
# relu, max pool, a residual add, dropout, linear) exported with its initial weights gives
# PyTorch's test loss in `pipedream eval` (relative 1e-4); `train --init` starts from those
# weights and `--save` writes weights that `eval` scores exactly as train did; unsupported
# modules are one-line errors naming the module; `train --text` / `eval --text` on a generated
# text. Skipped (77) when /usr/bin/python3 (PD_TORCH_PYTHON) has no torch.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
PY=${PD_TORCH_PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
num() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" | head -1; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }

if ! $PY -c "import torch" 2>/dev/null; then
    echo "SKIP: $PY cannot import torch"
    exit 77
fi

# ---- the CNN: export, PyTorch's test loss vs pipedream eval ----------------------------------------
$PY "$SRC/tools/export_torch.py" "$SRC/tests/cli/export_cnn.py:net" --input-shape 1,28,28 -o "$tmp/cnn.json" \
    --weights "$tmp/init.safetensors" --eval-idx /usr/share/datasets/fashion-mnist >"$tmp/pt.json" 2>"$tmp/err" ||
    fail "export: $(cat "$tmp/err")"
grep -q '"type": "residual"' "$tmp/cnn.json" || fail "no residual layer: $(cat "$tmp/cnn.json")"
"$PD" eval "$tmp/cnn.json" --weights "$tmp/init.safetensors" >"$tmp/pd.json" 2>"$tmp/err" || fail "eval: $(cat "$tmp/err")"
a=$(num test_loss "$tmp/pd.json"); b=$(num test_loss "$tmp/pt.json")
close "$a" "$b" 1e-4 || fail "test_loss: pipedream $a, PyTorch $b"
a=$(num test_accuracy "$tmp/pd.json"); b=$(num test_accuracy "$tmp/pt.json")
close "$a" "$b" 1e-3 || fail "test_accuracy: pipedream $a, PyTorch $b"

# ---- train --init / --save, eval of the saved weights -----------------------------------------------
"$PD" train "$tmp/cnn.json" --init "$tmp/init.safetensors" --steps 20 --save "$tmp/w.safetensors" >"$tmp/tr.json" \
    2>"$tmp/err" || fail "train --init: $(cat "$tmp/err")"
"$PD" eval "$tmp/cnn.json" --weights "$tmp/w.safetensors" >"$tmp/ev.json" 2>"$tmp/err" || fail "eval saved: $(cat "$tmp/err")"
a=$(num test_loss "$tmp/ev.json"); b=$(num test_loss "$tmp/tr.json")
close "$a" "$b" 1e-5 || fail "eval of --save weights $a, train reported $b"
"$PD" train "$tmp/cnn.json" --init "$tmp/missing.safetensors" --steps 1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "missing --init file: want exit 1"
grep -q "missing.safetensors" "$tmp/err" || fail "missing --init: $(cat "$tmp/err")"
"$PD" eval "$SRC/models/lenet5.json" --weights "$tmp/init.safetensors" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "weights of another model: want exit 1"
grep -q "init.safetensors" "$tmp/err" || fail "weights of another model: $(cat "$tmp/err")"
"$PD" eval "$tmp/cnn.json" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "eval without --weights: want exit 2"

# ---- unsupported modules: one line naming the module and the op -------------------------------------
cat >"$tmp/bad.py" <<'PYEOF'
import torch.nn as nn
def sig(): return nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Sigmoid())
def grouped(): return nn.Sequential(nn.Conv2d(1, 4, 3, groups=1), nn.Conv2d(4, 4, 3, groups=2))
PYEOF
$PY "$SRC/tools/export_torch.py" "$tmp/bad.py:sig" --input-shape 1,28,28 -o "$tmp/b.json" --weights "$tmp/b.st" \
    2>"$tmp/err" && fail "Sigmoid exported"
grep -q "^export_torch: error: module '2' (Sigmoid): module not supported" "$tmp/err" || fail "sigmoid: $(cat "$tmp/err")"
$PY "$SRC/tools/export_torch.py" "$tmp/bad.py:grouped" --input-shape 1,28,28 -o "$tmp/b.json" --weights "$tmp/b.st" \
    2>"$tmp/err" && fail "grouped conv exported"
grep -q "module '1' (Conv2d): groups" "$tmp/err" || fail "groups: $(cat "$tmp/err")"

# ---- text: train --text, --save, eval --text --------------------------------------------------------
$PY -c "
import random
random.seed(5)
w = 'in the beginning god created the heaven and the earth and the earth was without form'.split()
print(' '.join(random.choice(w) for _ in range(3000)))" >"$tmp/text.txt"
"$PD" train "$SRC/models/gpt-mini.json" --text "$tmp/text.txt" --steps 3 --minibatch 8 --optimizer adam --lr 1e-3 \
    --save "$tmp/lm.safetensors" >"$tmp/tr.json" 2>"$tmp/err" || fail "train --text: $(cat "$tmp/err")"
"$PD" eval "$SRC/models/gpt-mini.json" --text "$tmp/text.txt" --weights "$tmp/lm.safetensors" --minibatch 5 \
    >"$tmp/ev.json" 2>"$tmp/err" || fail "eval --text: $(cat "$tmp/err")"
a=$(num test_loss "$tmp/ev.json"); b=$(num test_loss "$tmp/tr.json")
close "$a" "$b" 1e-5 || fail "eval --text $a, train reported $b"
"$PD" train "$SRC/models/lenet5.json" --text "$tmp/text.txt" --steps 1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "image model on text: want exit 1"
grep -q "a text model takes (T) byte tokens" "$tmp/err" || fail "image model on text: $(cat "$tmp/err")"
echo "export.sh: ok (test_loss pipedream $(num test_loss "$tmp/pd.json"), PyTorch $(num test_loss "$tmp/pt.json"))"
