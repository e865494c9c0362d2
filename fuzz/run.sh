#!/usr/bin/env bash
# fuzz/run.sh [SECONDS] [HARNESS...]: builds every libFuzzer harness fuzz/fuzz_<name>.c with
# clang (ASan + UBSan) into build-fuzz/, compiling the src/ modules it needs directly, then
# runs each for SECONDS (default 60) on its seed corpus fuzz/corpus/<name>/ and prints the
# executions reached. New inputs go to build-fuzz/corpus/<name>/ (the seeds stay as they
# are); crashing inputs go to fuzz/crashes/<name>/. Exit status 1 if any harness crashed
# or failed to build.
#   fuzz/run.sh --seeds   regenerates fuzz/corpus/ with fuzz/gen_seeds.c.
# Not part of `make test`; `make fuzz SECONDS=N` runs it.
set -u
cd "$(dirname "$0")/.."
CC=${CC:-clang}
B=build-fuzz
mkdir -p "$B"

# harness : modules (src/<m>/*.c compiled in) : extra libraries : malloc limit (MB)
# A reader given a few KB must not ask for more than the malloc limit in one allocation.
HARNESSES="ckpt json idx cifar model profile plan"
mods() {
    case $1 in
    ckpt) echo "ckpt core" ;;
    json) echo "core" ;;
    idx | cifar) echo "data core" ;;
    model) echo "nn kernels core" ;;
    profile) echo "profile core" ;;
    plan) echo "plan profile core" ;;
    esac
}
extra_libs() { [ "$1" = model ] && echo "-lopenblas -ldnnl"; }
malloc_mb() { case $1 in ckpt) echo 64 ;; *) echo 256 ;; esac; }
dict() {
    case $1 in
    ckpt) echo "-dict=fuzz/dict/ckpt.dict" ;;
    json | model | profile | plan) echo "-dict=fuzz/dict/json.dict" ;;
    esac
}

CFLAGS="-std=c11 -D_POSIX_C_SOURCE=200809L -g -O1 -fno-omit-frame-pointer -Wall -Wno-unused-parameter"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
LIBS="-lcjson -lz -lm -lpthread"

if [ "${1:-}" = "--seeds" ]; then
    srcs=""
    incs="-Ifuzz"
    for m in ckpt plan profile core; do
        srcs="$srcs $(ls src/$m/*.c)"
        incs="$incs -Isrc/$m"
    done
    $CC $CFLAGS $incs -o "$B/gen_seeds" fuzz/gen_seeds.c $srcs $LIBS || exit 1
    rm -rf fuzz/corpus
    "$B/gen_seeds" fuzz/corpus . || exit 1
    find fuzz/corpus -type f | sort
    exit 0
fi

SECONDS_EACH=${1:-60}
shift 2>/dev/null
[ $# -gt 0 ] && HARNESSES="$*"
case $SECONDS_EACH in '' | *[!0-9]*)
    echo "usage: fuzz/run.sh [SECONDS] [HARNESS...] | --seeds" >&2
    exit 2
    ;;
esac

# Objects of each module, compiled once per run with coverage instrumentation.
build_module() {
    local m=$1 ok=0
    mkdir -p "$B/obj/$m"
    local incs="-Isrc/$m -Iinclude"
    for d in core kernels nn data profile plan ckpt; do incs="$incs -Isrc/$d"; done
    for c in src/$m/*.c; do
        local o="$B/obj/$m/$(basename "${c%.c}").o"
        if [ ! -f "$o" ] || [ "$c" -nt "$o" ] || [ -n "$(find "src/$m" -name '*.h' -newer "$o" 2>/dev/null)" ]; then
            $CC $CFLAGS $SAN -fsanitize=fuzzer-no-link $incs -c "$c" -o "$o" || ok=1
        fi
    done
    return $ok
}

declare -A BUILT
status=0
summary=""
for h in $HARNESSES; do
    if [ ! -f "fuzz/fuzz_$h.c" ]; then
        echo "no harness fuzz/fuzz_$h.c" >&2
        status=1
        continue
    fi
    objs=""
    incs="-Ifuzz"
    fail=0
    for m in $(mods "$h"); do
        if [ -z "${BUILT[$m]:-}" ]; then
            echo "== compiling src/$m" >&2
            if build_module "$m"; then BUILT[$m]=ok; else BUILT[$m]=fail; fi
        fi
        [ "${BUILT[$m]}" = fail ] && fail=1
        objs="$objs $(ls $B/obj/$m/*.o 2>/dev/null)"
        incs="$incs -Isrc/$m"
    done
    echo "== building fuzz_$h" >&2
    if [ $fail = 1 ] || ! $CC $CFLAGS $SAN -fsanitize=fuzzer $incs -Iinclude -o "$B/fuzz_$h" "fuzz/fuzz_$h.c" $objs \
        $(extra_libs "$h") $LIBS; then
        summary="$summary$(printf '%-8s BUILD FAILED' "$h")\n"
        status=1
        continue
    fi
    mkdir -p "$B/corpus/$h" "fuzz/crashes/$h"
    echo "== running fuzz_$h for ${SECONDS_EACH}s (log: $B/$h.log)" >&2
    "$B/fuzz_$h" "$B/corpus/$h" "fuzz/corpus/$h" -max_total_time="$SECONDS_EACH" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -malloc_limit_mb="$(malloc_mb "$h")" -artifact_prefix="fuzz/crashes/$h/" $(dict "$h") \
        >"$B/$h.log" 2>&1
    rc=$?
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$B/$h.log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+' "$B/$h.log" | tail -1)
    if [ $rc = 0 ]; then
        result=ok
    else
        result="CRASH: $(grep -m1 -oE 'ERROR: [A-Za-z]+: [^ ]+|runtime error: .*|SUMMARY: .*' "$B/$h.log" | head -1); input: $(grep -oE 'fuzz/crashes/[^ ]+' "$B/$h.log" | tail -1)"
        status=1
    fi
    rmdir "fuzz/crashes/$h" 2>/dev/null
    summary="$summary$(printf '%-8s %12s execs  %-10s %s' "$h" "${execs:-?}" "${cov:-}" "$result")\n"
done
echo
echo "harness  executions          coverage   result (${SECONDS_EACH}s each)"
printf "%b" "$summary"
exit $status
