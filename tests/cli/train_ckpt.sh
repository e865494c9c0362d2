#!/usr/bin/env bash
# train_ckpt.sh: what a checkpoint records and which checkpoints stay. A checkpoint records the
# optimizer and its hyper-parameters: resuming an Adam checkpoint with --optimizer sgd is an
# error naming both (it would load Adam's first moment as momentum), a changed learning rate is
# named in a warning and the run goes on. --keep-last N keeps the newest N checkpoints of the
# run, and never deletes the one a resume needs (a damaged newer file in the directory is left
# alone and does not count). A run resumed from the checkpoint at its end trains nothing and
# evaluates the checkpoint. One worker and two (threads) alike.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ckpts() { (cd "$1" && ls ckpt-*.safetensors 2>/dev/null | sed 's/ckpt-0*\([0-9][0-9]*\).safetensors/\1/' | tr '\n' ' '); }
A="$SRC/models/lenet5.json --minibatch 16 --timeout 60"

# Two workers on a plan of their own: without --plan, train plans from a quick profile of its own,
# whose timing may pick another plan for the resumed run (one stage on 2 replicas, not 2 stages).
"$PD" profile "$SRC/models/lenet5.json" --minibatch 16 --iterations 3 -o "$tmp/prof.json" >/dev/null 2>"$tmp/err" ||
    fail "profile: $(tail -3 "$tmp/err")"
"$PD" plan "$tmp/prof.json" --workers 2 --bandwidth 1e9 --straight --no-simulate -o "$tmp/plan2.json" >/dev/null 2>"$tmp/err" ||
    fail "plan: $(tail -3 "$tmp/err")"
for mode in "" "--workers 2 --plan $tmp/plan2.json"; do
    d="$tmp/ad${mode:+2}"
    "$PD" train $A $mode --steps 8 --optimizer adam --lr 0.001 --checkpoint-every 4 --checkpoint-dir "$d" \
        >"$tmp/first" 2>"$tmp/err" || fail "adam run $mode: $(tail -3 "$tmp/err")"
    # resumed from the checkpoint at the end (a run that stopped in its final evaluation): nothing
    # to train; the checkpoint's weights evaluated: the test figures and weights of the run itself
    "$PD" train $A $mode --steps 8 --optimizer adam --lr 0.001 --resume "$d" >"$tmp/out" 2>"$tmp/err" ||
        fail "resumed at the end $mode: $(tail -3 "$tmp/err")"
    grep -q "ckpt-0000000008.safetensors is already 8 minibatches in: nothing to train, evaluating it" "$tmp/err" ||
        fail "resumed at the end $mode: $(cat "$tmp/err")"
    for k in '"test_accuracy":[^,]*' '"test_loss":[^,]*' '"weights_crc":\[[^]]*\]'; do
        [ "$(grep -o "$k" "$tmp/out")" = "$(grep -o "$k" "$tmp/first")" ] && [ -n "$(grep -o "$k" "$tmp/out")" ] ||
            fail "resumed at the end $mode: $k: $(grep -o "$k" "$tmp/out") against the run's $(grep -o "$k" "$tmp/first")"
    done
    grep -q '"units":0,.*"final_loss":null' "$tmp/out" || fail "resumed at the end $mode trained: $(cat "$tmp/out")"
    echo "ok: resumed at the end $mode"
    # another optimizer: an error naming both, before any step
    "$PD" train $A $mode --steps 12 --optimizer sgd --resume "$d" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] || fail "adam checkpoint resumed with sgd $mode: exit $rc, want 1: $(tail -3 "$tmp/err")"
    grep -q "^pipedream: error: .*ckpt-0000000008.safetensors: taken with --optimizer adam, this run has --optimizer sgd" \
        "$tmp/err" || fail "adam resumed with sgd $mode: $(cat "$tmp/err")"
    [ -s "$tmp/out" ] && fail "adam resumed with sgd $mode: trained anyway: $(cat "$tmp/out")"
    # a changed learning rate: a warning naming it, then the run
    "$PD" train $A $mode --steps 12 --optimizer adam --lr 0.002 --resume "$d" >"$tmp/out" 2>"$tmp/err" ||
        fail "adam resumed at another lr $mode: $(tail -3 "$tmp/err")"
    grep -q "^pipedream: warning: .*ckpt-0000000008.safetensors was taken with --lr 0.001; this run has --lr 0.002" \
        "$tmp/err" || fail "no warning for the changed lr $mode: $(cat "$tmp/err")"
    grep -q '"resumed_from":8' "$tmp/out" || fail "adam resumed $mode: $(cat "$tmp/out")"
    "$PD" train $A $mode --steps 12 --optimizer adam --lr 0.001 --resume "$d" >"$tmp/out" 2>"$tmp/err" ||
        fail "adam resumed as taken $mode: $(tail -3 "$tmp/err")"
    grep -q "warning" "$tmp/err" && fail "a warning although nothing changed $mode: $(cat "$tmp/err")"
    echo "ok: optimizer recorded $mode"

    # --keep-last 2: the newest two of the run
    k="$tmp/keep${mode:+2}"
    "$PD" train $A $mode --steps 20 --checkpoint-every 4 --checkpoint-dir "$k" --keep-last 2 >"$tmp/out" 2>"$tmp/err" ||
        fail "--keep-last 2 $mode: $(tail -3 "$tmp/err")"
    [ "$(ckpts "$k")" = "16 20 " ] || fail "--keep-last 2 $mode left: $(ckpts "$k")"
    # a damaged newer checkpoint (a crash while writing it): a resume skips it, so pruning must not
    # count it among the newest, nor delete it
    head -c 100 "$k/ckpt-0000000020.safetensors" >"$k/ckpt-0000000100.safetensors"
    "$PD" train $A $mode --steps 28 --resume "$k" --checkpoint-every 4 --checkpoint-dir "$k" --keep-last 1 \
        >"$tmp/out" 2>"$tmp/err" || fail "--keep-last 1, resumed $mode: $(tail -3 "$tmp/err")"
    grep -q '"resumed_from":20' "$tmp/out" || fail "resumed from $(cat "$tmp/out")"
    [ "$(ckpts "$k")" = "28 100 " ] || fail "--keep-last 1 after a resume $mode left: $(ckpts "$k")"
    "$PD" train $A $mode --steps 30 --resume "$k" >"$tmp/out" 2>"$tmp/err" || fail "resume after pruning $mode"
    grep -q '"resumed_from":28' "$tmp/out" || fail "after pruning $mode, resumed from $(cat "$tmp/out")"
    echo "ok: --keep-last $mode"
done
"$PD" train $A --steps 2 --keep-last 2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "--keep-last without checkpoints: want exit 2"
grep -q "^pipedream: error: --keep-last needs --checkpoint-every" "$tmp/err" || fail "--keep-last alone: $(cat "$tmp/err")"
echo PASS
