#!/usr/bin/env bash
# train_data.sh: the data of `train` and `eval` from one place (src/data). Any --data directory
# is standardised with its own training split's mean and std (rounded to 4 decimals, as the
# published constants are: Fashion-MNIST's are 0.2860 and 0.3530); the summary reports them,
# checkpoints and --save weights record them, and `eval` uses the recorded ones (even with
# another directory's training split). A model whose input or classes do not fit the data is a
# one-line error in every mode, before any step.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# two small IDX sets with the same test split and different training splits (dark / bright)
python3 - "$tmp" <<'PY'
import os, random, struct, sys
def write(d, split, xs, ys):
    os.makedirs(d, exist_ok=True)
    pre = "train" if split == "train" else "t10k"
    with open(os.path.join(d, pre + "-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, len(xs), 28, 28))
        for x in xs: f.write(bytes(x))
    with open(os.path.join(d, pre + "-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x801, len(ys)))
        f.write(bytes(ys))
def images(n, lo, hi, seed):
    r = random.Random(seed)
    ys = [r.randrange(10) for _ in range(n)]
    xs = [[min(255, r.randrange(lo, hi) + 8 * y) for _ in range(784)] for y in ys]
    return xs, ys
test = images(96, 0, 100, 3)
for name, lo, hi in (("dark", 0, 100), ("bright", 100, 180)):
    d = os.path.join(sys.argv[1], name)
    write(d, "train", *images(320, lo, hi, 1 if name == "dark" else 2))
    write(d, "test", *test)
    xs, _ = images(320, lo, hi, 1 if name == "dark" else 2)
    v = [p / 255 for x in xs for p in x]
    m = sum(v) / len(v)
    s = (sum((a - m) ** 2 for a in v) / len(v)) ** 0.5
    open(os.path.join(sys.argv[1], name + ".stats"), "w").write("%.4f %.4f\n" % (m, s))
PY
read mean std <"$tmp/dark.stats"
num() { python3 -c "import json,sys; v=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]]; print(v)" "$1" "$2"; }
same() { python3 -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-9)" "$1" "$2"; }
close() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= r * m) }'; }
meta() { python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
print(json.loads(b[8:8 + n]).get("__metadata__", {}).get(sys.argv[2], ""))
PY
}
A="$SRC/models/lenet5.json --steps 10 --minibatch 32 --timeout 60"
for mode in "" "--workers 2"; do
    "$PD" train $A $mode --data "$tmp/dark" --checkpoint-every 10 --checkpoint-dir "$tmp/ck$mode" --save "$tmp/w.st" \
        >"$tmp/out" 2>"$tmp/err" || fail "train on dark $mode: $(tail -3 "$tmp/err")"
    same "$(num "$tmp/out" data_mean)" "$mean" && same "$(num "$tmp/out" data_std)" "$std" ||
        fail "train $mode standardised with $(num "$tmp/out" data_mean), $(num "$tmp/out" data_std), not the data's $mean $std"
    ck=$(ls "$tmp/ck$mode"/ckpt-*.safetensors | tail -1)
    for f in "$ck" "$tmp/w.st"; do
        same "$(meta "$f" pipedream.data_mean)" "$mean" && same "$(meta "$f" pipedream.data_std)" "$std" ||
            fail "$f records mean '$(meta "$f" pipedream.data_mean)' std '$(meta "$f" pipedream.data_std)', want $mean $std"
    done
    # eval uses the recorded statistics: the bright directory's training split changes nothing
    for d in dark bright; do
        "$PD" eval "$SRC/models/lenet5.json" --weights "$tmp/w.st" --data "$tmp/$d" >"$tmp/ev" 2>"$tmp/err" ||
            fail "eval on $d: $(cat "$tmp/err")"
        close "$(num "$tmp/ev" test_loss)" "$(num "$tmp/out" test_loss)" 1e-5 ||
            fail "eval $mode with $d's training split: test loss $(num "$tmp/ev" test_loss), train reported $(num "$tmp/out" test_loss)"
    done
    echo "ok: --data standardised with its own statistics $mode ($mean, $std)"
done
# Fashion-MNIST's own statistics are the published constants
"$PD" train "$SRC/models/lenet5.json" --steps 1 >"$tmp/out" 2>"$tmp/err" || fail "fashion-mnist: $(cat "$tmp/err")"
same "$(num "$tmp/out" data_mean)" 0.286 && same "$(num "$tmp/out" data_std)" 0.353 ||
    fail "Fashion-MNIST standardised with $(num "$tmp/out" data_mean) $(num "$tmp/out" data_std)"

# models that do not fit the data: one line, exit 1, in both modes
cat >"$tmp/m5.json" <<'JSON'
{"name": "mlp5", "input": [1, 28, 28], "layers": [{"type": "flatten"}, {"type": "linear", "in": 784, "out": 16, "relu": true},
 {"type": "linear", "in": 16, "out": 5}]}
JSON
cat >"$tmp/m14.json" <<'JSON'
{"name": "mlp14", "input": [1, 14, 14], "layers": [{"type": "flatten"}, {"type": "linear", "in": 196, "out": 16, "relu": true},
 {"type": "linear", "in": 16, "out": 10}]}
JSON
for mode in "" "--workers 1" "--workers 2"; do
    for m in m5 m14; do
        "$PD" train "$tmp/$m.json" --data "$tmp/dark" --steps 2 $mode >"$tmp/out" 2>"$tmp/err"
        rc=$?
        [ $rc -eq 1 ] || fail "$m $mode: exit $rc, want 1: $(tail -2 "$tmp/err")"
        [ "$(grep -c "^pipedream: error: " "$tmp/err")" -eq 1 ] || fail "$m $mode: $(cat "$tmp/err")"
        case $m in
            m5) grep -q "output (5) for 10 classes" "$tmp/err" || fail "$m $mode: $(cat "$tmp/err")" ;;
            m14) grep -q "input (1, 14, 14) does not match the data's samples (1, 28, 28)" "$tmp/err" ||
                fail "$m $mode: $(cat "$tmp/err")" ;;
        esac
    done
done
echo PASS
