#!/usr/bin/env bash
# ckpt_private.sh: checkpoints where the ranks do not share a directory, on this machine alone
# (a directory per rank through --checkpoint-dir's %r), under mpirun -np 2 and with two threads:
#  - each checkpoint is written twice, by rank 0 into its directory and by rank 1 into its own,
#    the two files byte for byte the same;
#  - rank 0's directory lost (and the newest checkpoint, as if the run had died before it), the
#    resume agrees on the newest checkpoint complete anywhere, rank 0 receives it from rank 1 (the
#    same bytes), and the run ends with weights bitwise equal to the uninterrupted run's;
#  - every directory lost: "no complete checkpoint to resume from";
#  - one directory for both ranks (a shared filesystem): one copy, no second write;
#  - a '%' that is not %r or %% in the directory is an error naming it.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
crc() { grep -o '"weights_crc":\[[^]]*\]' "$1"; }
C4=ckpt-0000000004.safetensors C8=ckpt-0000000008.safetensors C12=ckpt-0000000012.safetensors

"$PD" profile "$SRC/models/lenet5.json" --minibatch 16 --iterations 3 -o "$tmp/prof.json" >/dev/null 2>"$tmp/err" ||
    fail "profile: $(tail -3 "$tmp/err")"
"$PD" plan "$tmp/prof.json" --workers 2 --bandwidth 1e9 --straight --no-simulate -o "$tmp/plan2.json" >/dev/null 2>"$tmp/err" ||
    fail "plan: $(tail -3 "$tmp/err")"
A=("$SRC/models/lenet5.json" --minibatch 16 --timeout 60 --plan "$tmp/plan2.json" --steps 12)
K=(--checkpoint-every 4)

modes=(threads)
command -v mpirun >/dev/null && modes+=(mpi)
for mode in "${modes[@]}"; do
    if [ $mode = mpi ]; then run() { timeout 120 mpirun -np 2 --bind-to none "$PD" train "$@"; }
    else run() { timeout 120 "$PD" train --workers 2 "$@"; }; fi
    d=$tmp/$mode
    run "${A[@]}" "${K[@]}" --checkpoint-dir "$d/rank%r" >"$tmp/full.out" 2>"$tmp/err" || fail "$mode: the whole run: $(tail -3 "$tmp/err")"
    for f in $C4 $C8 $C12; do
        cmp -s "$d/rank0/$f" "$d/rank1/$f" || fail "$mode: $f: rank 1's copy differs from rank 0's (or is missing): $(ls "$d"/*)"
    done
    grep -q "rank 1: checkpoint's second copy $d/rank1/$C12" "$tmp/err" || fail "$mode: no second copy named: $(cat "$tmp/err")"
    echo "ok: $mode: each checkpoint on both ranks, byte for byte"

    # rank 0's disk lost, and the run died before its last checkpoint
    rm -rf "$d/rank0" "$d/rank1/$C12"
    run "${A[@]}" "${K[@]}" --checkpoint-dir "$d/rank%r" --resume "$d/rank%r" >"$tmp/res.out" 2>"$tmp/err" ||
        fail "$mode: resume without rank 0's directory: $(tail -3 "$tmp/err")"
    grep -q "rank 0: $d/rank0/$C8 received from rank 1" "$tmp/err" || fail "$mode: $C8 not received: $(cat "$tmp/err")"
    grep -q '"resumed_from":8' "$tmp/res.out" || fail "$mode: not resumed from 8: $(cat "$tmp/res.out")"
    cmp -s "$d/rank0/$C8" "$d/rank1/$C8" || fail "$mode: the received $C8 differs from rank 1's"
    cmp -s "$d/rank0/$C12" "$d/rank1/$C12" || fail "$mode: $C12 after the resume differs between the ranks"
    [ -n "$(crc "$tmp/full.out")" ] && [ "$(crc "$tmp/res.out")" = "$(crc "$tmp/full.out")" ] ||
        fail "$mode: resumed weights $(crc "$tmp/res.out") differ from the whole run's $(crc "$tmp/full.out")"
    echo "ok: $mode: rank 0's directory lost: $C8 came from rank 1, the run ends as the whole run ($(crc "$tmp/res.out"))"

    rm -rf "$d"
    run "${A[@]}" --resume "$d/rank%r" >/dev/null 2>"$tmp/err" && fail "$mode: resumed with no checkpoint anywhere"
    grep -q "no complete checkpoint to resume from" "$tmp/err" || fail "$mode: nothing anywhere: $(cat "$tmp/err")"
    echo "ok: $mode: no checkpoint anywhere: an error"

    # one directory for both: written once
    run "${A[@]}" "${K[@]}" --steps 8 --checkpoint-dir "$tmp/shared-$mode" >/dev/null 2>"$tmp/err" || fail "$mode: shared: $(tail -3 "$tmp/err")"
    grep -q "second copy" "$tmp/err" && fail "$mode: a second copy into the one directory: $(cat "$tmp/err")"
    [ "$(ls -A "$tmp/shared-$mode" | tr '\n' ' ')" = "$C4 $C8 " ] || fail "$mode: shared: $(ls -A "$tmp/shared-$mode")"
    echo "ok: $mode: one directory for both ranks: one copy"
done

"$PD" train "${A[@]}" "${K[@]}" --workers 2 --checkpoint-dir "$tmp/r%d" >/dev/null 2>"$tmp/err" && fail "%d accepted"
grep -q "'%' starts %r (the rank) or %% (a '%'), not '%d'" "$tmp/err" || fail "%d: $(cat "$tmp/err")"
echo "ok: a '%' other than %r and %% is refused"
