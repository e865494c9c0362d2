#!/usr/bin/env bash
# export_stats.sh: tools/export_torch.py --eval-idx standardises an IDX set as pipedream does,
# with the mean and std of that set's training split (not Fashion-MNIST's): on a generated
# set whose statistics are far from Fashion-MNIST's, PyTorch's test loss of the exported
# initial weights equals `pipedream eval`'s (relative 1e-4). Skipped (77) when /usr/bin/python3
# (PD_TORCH_PYTHON) has no torch.
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

# bright images: mean about 0.7, std about 0.1 (Fashion-MNIST: 0.2860, 0.3530)
$PY - "$tmp/d" <<'PY'
import os, random, struct, sys
d = sys.argv[1]
os.makedirs(d)
r = random.Random(7)
for pre, n in (("train", 512), ("t10k", 256)):
    ys = [r.randrange(10) for _ in range(n)]
    with open(os.path.join(d, pre + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28))
        for y in ys: f.write(bytes(min(255, 150 + r.randrange(0, 40) + 4 * y) for _ in range(784)))
    with open(os.path.join(d, pre + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(ys))
PY
$PY "$SRC/tools/export_torch.py" "$SRC/tests/cli/export_cnn.py:net" --input-shape 1,28,28 -o "$tmp/cnn.json" \
    --weights "$tmp/init.safetensors" --eval-idx "$tmp/d" >"$tmp/pt.json" 2>"$tmp/err" || fail "export: $(cat "$tmp/err")"
"$PD" eval "$tmp/cnn.json" --weights "$tmp/init.safetensors" --data "$tmp/d" >"$tmp/pd.json" 2>"$tmp/err" ||
    fail "eval: $(cat "$tmp/err")"
a=$(num test_loss "$tmp/pd.json"); b=$(num test_loss "$tmp/pt.json")
[ -n "$a" ] && [ -n "$b" ] || fail "no test_loss: $(cat "$tmp/pd.json" "$tmp/pt.json")"
close "$a" "$b" 1e-4 || fail "test_loss on a set of other statistics: pipedream $a, PyTorch $b"
echo "ok: test loss $a (pipedream) and $b (PyTorch) on a set with its own mean and std"
