#!/usr/bin/env bash
# train_converge.sh: lenet5, one epoch of Fashion-MNIST, minibatch 64, SGD lr 0.01 momentum
# 0.9 (MODELS.md's recipe), inputs standardised with the training set's mean and std,
# reaches >= 83% test accuracy. PyTorch with the same recipe and data reaches 83.0-84.3%
# over seeds 1-3 (tools/torch_models.py lenet5); we reach 83.7-85.0% over seeds 1-4 (85% is
# above what this recipe gives in either framework). ~10-15 s in a release build; skipped in
# sanitizer builds (minutes).
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
if [ -n "${PD_BINARY_DIR:-}" ] && grep -q '^PD_SANITIZE:BOOL=ON' "$PD_BINARY_DIR/CMakeCache.txt" 2>/dev/null; then
    echo "SKIP: sanitizer build (the release build runs this test)"
    exit 77
fi
out=$("$PD" train "$SRC/models/lenet5.json" --epochs 1 --minibatch 64 --lr 0.01 --momentum 0.9 --seed 1) ||
    { echo "FAIL: exit $?"; exit 1; }
echo "$out"
acc=$(echo "$out" | sed -n 's/.*"test_accuracy": *\([0-9.]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 0.83) }' || { echo "FAIL: test accuracy $acc < 0.83"; exit 1; }
echo PASS
