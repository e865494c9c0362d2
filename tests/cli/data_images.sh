#!/usr/bin/env bash
# data_images.sh: image folders, CIFAR-10 batches and augmentation from the command line.
# Fashion-MNIST's first images (train and test), ordered by class, are written as IDX files and,
# by a real encoder (tests/tools/imgwrite.c: libpng, libjpeg-turbo), as PNG and JPEG folders in
# ImageFolder's layout, whose sorted order is the IDX files' order. The PNG folder gives `eval`
# the IDX files' test loss (to 1e-6 relative) and accuracy for the same weights, and training on
# it ends with the IDX run's weights bit for bit (same pixels, same statistics, same order); a
# JPEG folder trains and learns; the second read comes from the decode cache (its time against
# the decoding's is printed), a changed file or a damaged cache is decoded again; a corrupt
# image, an empty class, a file that is no image and a missing test/ are one error naming the
# file; CIFAR-10 batches train; --augment changes the run, the same seed repeats it.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
BIN=${PD_BINARY_DIR:-build}
FM=/usr/share/datasets/fashion-mnist
[ -f "$FM/train-images-idx3-ubyte.gz" ] || { echo "skip: Fashion-MNIST is not installed in $FM"; exit 77; }
[ -x "$BIN/imgwrite" ] || { echo "FAIL: $BIN/imgwrite not built"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
num() { sed -n "s/.*\"$1\": *\([-0-9.eE+]*\).*/\1/p" "$2" | head -1; }
crc() { sed -n 's/.*"weights_crc":\[\([^]]*\)\].*/\1/p' "$1"; }
NTR=3000 NTE=1000
python3 - "$FM" "$tmp/idx" $NTR $NTE <<'PY'
import gzip, os, struct, sys
src, out, ntr, nte = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.makedirs(out)
for pre, n in (("train", ntr), ("t10k", nte)):
    img = gzip.open("%s/%s-images-idx3-ubyte.gz" % (src, pre)).read()[16:16 + 784 * n]
    lab = gzip.open("%s/%s-labels-idx1-ubyte.gz" % (src, pre)).read()[8:8 + n]
    order = sorted(range(n), key=lambda i: (lab[i], i))   # class order: the folder's sorted order
    with open("%s/%s-images-idx3-ubyte" % (out, pre), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + b"".join(img[784 * i:784 * i + 784] for i in order))
    with open("%s/%s-labels-idx1-ubyte" % (out, pre), "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(lab[i] for i in order))
PY
"$BIN/imgwrite" "$tmp/idx" "$tmp/png" png $NTR $NTE || fail "imgwrite png"
"$BIN/imgwrite" "$tmp/idx" "$tmp/jpg" jpeg $NTR $NTE 90 || fail "imgwrite jpeg"
[ "$(find "$tmp/png" -name '*.png' | wc -l)" = $((NTR + NTE)) ] || fail "PNG folder incomplete"

M=$SRC/models/lenet5.json
A="--steps 60 --minibatch 32"
# --- the same weights evaluated on IDX and on the PNG folder; training on each ------------------
"$PD" train $M --data "$tmp/idx" $A --save "$tmp/w.safetensors" >"$tmp/idx.out" 2>"$tmp/idx.err" ||
    fail "train on IDX: $(tail -3 "$tmp/idx.err")"
"$PD" train $M --data "$tmp/png" $A >"$tmp/png.out" 2>"$tmp/png1.err" || fail "train on PNG: $(tail -3 "$tmp/png1.err")"
[ -n "$(crc "$tmp/idx.out")" ] && [ "$(crc "$tmp/idx.out")" = "$(crc "$tmp/png.out")" ] ||
    fail "training on the PNG folder ended elsewhere than on the IDX files: $(crc "$tmp/png.out") vs $(crc "$tmp/idx.out")"
"$PD" eval $M --weights "$tmp/w.safetensors" --data "$tmp/idx" >"$tmp/e_idx.json" 2>"$tmp/err" || fail "eval IDX: $(cat "$tmp/err")"
"$PD" eval $M --weights "$tmp/w.safetensors" --data "$tmp/png" >"$tmp/e_png.json" 2>"$tmp/err" || fail "eval PNG: $(cat "$tmp/err")"
python3 - "$tmp/e_idx.json" "$tmp/e_png.json" "$tmp/idx.out" "$tmp/png.out" <<'PY' || fail "IDX and PNG evaluations differ"
import json, sys
a, b = (json.loads(open(p).read()) for p in sys.argv[1:3])
ti, tp = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[3:5])
print("eval on IDX: loss %.8f accuracy %.4f; on the PNG folder: loss %.8f accuracy %.4f; "
      "trained on IDX %.4f, on PNG %.4f" % (a["test_loss"], a["test_accuracy"], b["test_loss"], b["test_accuracy"],
                                          ti["test_accuracy"], tp["test_accuracy"]))
assert a["samples"] == b["samples"] == 1000, (a, b)
assert a["test_accuracy"] == b["test_accuracy"], (a, b)
assert abs(a["test_loss"] - b["test_loss"]) <= 1e-6 * abs(a["test_loss"]), (a, b)
assert abs(ti["test_accuracy"] - tp["test_accuracy"]) <= 0.005, (ti, tp)
assert ti["data_mean"] == tp["data_mean"] and ti["data_std"] == tp["data_std"], (ti, tp)
PY
# --- the decode cache: the second run reads it; a changed image or a damaged cache is decoded ----
ls "$tmp/png"/.pipedream-cache-train-1x28x28.bin "$tmp/png"/.pipedream-cache-test-1x28x28.bin >/dev/null ||
    fail "no cache beside the folder"
"$PD" train $M --data "$tmp/png" --steps 1 >/dev/null 2>"$tmp/png2.err" || fail "second run: $(tail -3 "$tmp/png2.err")"
grep -q "png/train: $NTR images of 10 classes decoded in" "$tmp/png1.err" || fail "first run did not decode: $(cat "$tmp/png1.err")"
grep -q "png/train: $NTR images of 10 classes read from the decode cache" "$tmp/png2.err" ||
    fail "second run did not read the cache: $(head -3 "$tmp/png2.err")"
t1=$(sed -n 's/.*png\/train: .* decoded in \([0-9.]*\) s/\1/p' "$tmp/png1.err")
t2=$(sed -n 's/.*png\/train: .* read from the decode cache in \([0-9.]*\) s/\1/p' "$tmp/png2.err")
echo "data time of the training split ($NTR PNG images): decoded $t1 s, from the cache $t2 s"
f=$(find "$tmp/png/train/3" -name '*.png' | sort | head -1)
touch -d '2001-01-01' "$f"
"$PD" eval $M --weights "$tmp/w.safetensors" --data "$tmp/png" >/dev/null 2>"$tmp/err" || fail "eval after touch"
"$PD" train $M --data "$tmp/png" --steps 1 >/dev/null 2>"$tmp/err" || fail "train after touch: $(cat "$tmp/err")"
grep -q "png/train: .* decoded in" "$tmp/err" || fail "a changed image did not invalidate the cache: $(head -2 "$tmp/err")"
truncate -s 5000 "$tmp/png/.pipedream-cache-test-1x28x28.bin"
"$PD" eval $M --weights "$tmp/w.safetensors" --data "$tmp/png" >"$tmp/e2.json" 2>"$tmp/err" || fail "eval, damaged cache"
grep -q "png/test: .* decoded in" "$tmp/err" || fail "a damaged cache was read: $(cat "$tmp/err")"
[ "$(num test_loss "$tmp/e2.json")" = "$(num test_loss "$tmp/e_png.json")" ] || fail "after the rebuild: $(cat "$tmp/e2.json")"
[ "$(ls -A "$tmp/png" | grep -c tmp)" = 0 ] || fail "temporary files left beside the folder: $(ls -A "$tmp/png")"

# --- a JPEG folder trains and learns -----------------------------------------------------------
"$PD" train $M --data "$tmp/jpg" --steps 150 --minibatch 32 --metrics "$tmp/j.jsonl" --log-every 25 >"$tmp/j.out" \
    2>"$tmp/err" || fail "train on JPEG: $(tail -3 "$tmp/err")"
python3 - "$tmp/j.jsonl" "$tmp/j.out" <<'PY' || fail "the JPEG folder did not learn"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
s = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print("JPEG folder: training loss %.3f -> %.3f, test accuracy %.3f" % (steps[0]["loss"], steps[-1]["loss"], s["test_accuracy"]))
assert steps[-1]["loss"] < 0.8 * steps[0]["loss"], steps
assert s["test_accuracy"] > 0.4, s
PY

# --- errors: one line naming the file ----------------------------------------------------------
bad() {   # bad NAME EXPECTED-TEXT: train on $tmp/NAME fails with one error line containing the text
    "$PD" train $M --data "$tmp/$1" --steps 1 >/dev/null 2>"$tmp/err" && fail "$1: no error"
    grep -q "error: .*$2" "$tmp/err" || fail "$1: want \"$2\": $(cat "$tmp/err")"
    [ "$(grep -c 'error' "$tmp/err")" = 1 ] || fail "$1: more than one error: $(cat "$tmp/err")"
}
mkdir -p "$tmp/c/train/a" "$tmp/c/test/a"
cp "$tmp/png/train/0/"*.png "$tmp/c/train/a/" 2>/dev/null; cp "$tmp/png/test/0/"*.png "$tmp/c/test/a/"
head -c 300 "$f" >"$tmp/c/train/a/zz-broken.png"
bad c "c/train/a/zz-broken.png: .*PNG"
rm "$tmp/c/train/a/zz-broken.png"
echo "not an image" >"$tmp/c/train/a/notes.txt"
bad c "c/train/a/notes.txt: not an image file"
rm "$tmp/c/train/a/notes.txt"
mkdir "$tmp/c/train/b" "$tmp/c/test/b"
bad c "c/train/b: an empty class folder"
cp "$tmp/png/train/1/"*.png "$tmp/c/train/b/"
bad c "c/test/b: an empty class folder"
rm -r "$tmp/c/test"
bad c "c/test: missing"
j=$(find "$tmp/jpg/train/0" -name '*.jpg' | head -1)
head -c $(($(wc -c <"$j") / 2)) "$j" >"$tmp/trunc.jpg"
mkdir -p "$tmp/d/train/a" "$tmp/d/test/a" && cp "$tmp/trunc.jpg" "$tmp/d/train/a/" && cp "$tmp/jpg/test/0/"*.jpg "$tmp/d/test/a/"
bad d "d/train/a/trunc.jpg: JPEG image does not decode"

# --- CIFAR-10 binary batches -------------------------------------------------------------------
python3 - "$tmp/cifar" <<'PY'
import os, random, sys
os.makedirs(sys.argv[1])
r = random.Random(5)
proto = [[r.randrange(256) for _ in range(3072)] for _ in range(10)]
def batch(path, n):
    with open(path, "wb") as f:
        for _ in range(n):
            y = r.randrange(10)
            f.write(bytes([y]) + bytes((p + r.randrange(64)) % 256 for p in proto[y]))
for i in range(1, 6):
    batch(os.path.join(sys.argv[1], "data_batch_%d.bin" % i), 40)
batch(os.path.join(sys.argv[1], "test_batch.bin"), 100)
PY
cat >"$tmp/lin.json" <<'JSON'
{"name": "lin", "input": [3, 32, 32], "layers": [{"type": "flatten"}, {"type": "linear", "in": 3072, "out": 10}]}
JSON
"$PD" train "$tmp/lin.json" --data "$tmp/cifar" --epochs 4 --minibatch 20 --lr 0.001 >"$tmp/cf.out" 2>"$tmp/err" ||
    fail "CIFAR-10: $(tail -3 "$tmp/err")"
python3 -c "import json,sys; s=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print('CIFAR-10 batches: test accuracy', s['test_accuracy']); assert s['test_accuracy'] > 0.5, s" \
    "$tmp/cf.out" || fail "CIFAR-10 did not learn"

# --- augmentation: seeded, off by default ------------------------------------------------------
G="$M --data $tmp/png --steps 20 --minibatch 32"
"$PD" train $G --augment crop=4,flip >"$tmp/a1.out" 2>"$tmp/err" || fail "--augment: $(tail -2 "$tmp/err")"
"$PD" train $G --augment crop=4,flip >"$tmp/a2.out" 2>/dev/null || fail "--augment again"
"$PD" train $G >"$tmp/a0.out" 2>/dev/null || fail "no augment"
"$PD" train $G --augment flip >"$tmp/a3.out" 2>/dev/null || fail "--augment flip"
[ "$(crc "$tmp/a1.out")" = "$(crc "$tmp/a2.out")" ] || fail "--augment with one seed differs between runs"
[ "$(crc "$tmp/a1.out")" != "$(crc "$tmp/a0.out")" ] || fail "--augment changed nothing"
[ "$(crc "$tmp/a3.out")" != "$(crc "$tmp/a0.out")" ] && [ "$(crc "$tmp/a3.out")" != "$(crc "$tmp/a1.out")" ] ||
    fail "--augment flip is not its own run"
"$PD" train $M --text "$tmp/lin.json" --augment flip >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "augment applies to images" "$tmp/err" || fail "--augment with --text: $(cat "$tmp/err")"
"$PD" train $G --augment crop=0 >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "crop=0" "$tmp/err" || fail "--augment crop=0: $(cat "$tmp/err")"
"$PD" train --help | grep -q -- "--augment SPEC" || fail "train --help lacks --augment"
echo "data_images.sh: ok"
