# result.sh: sourced by the bench scripts: each run leaves one result file in bench/results/.
#
#   result_start NAME "$@"   at the start: everything the script prints on stdout from here on
#                            also goes into the file (the script's own figures)
#   result_finish            at the end: writes bench/results/<UTC date>-<time>-NAME.md: the
#                            date, the command, the commit, the machine, the load average at the
#                            start and the end, and the output
#
# PD_RESULTS=DIR writes into DIR instead; PD_RESULTS= (set and empty) writes no file. A run that
# fails before result_finish leaves no file.
RESULT=""
result_start() {
    local name=$1; shift
    local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    local dir=${PD_RESULTS-$root/bench/results}
    [ -n "$dir" ] || return 0
    mkdir -p "$dir"
    RESULT=$dir/$(date -u +%Y-%m-%d-%H%M)-$name.md
    [ ! -e "$RESULT" ] || RESULT=$dir/$(date -u +%Y-%m-%d-%H%M%S)-$name.md   # same minute: keep both
    RESULT_NAME=$name
    RESULT_CMD="bench/$(basename "$0")${*:+ $*}"
    RESULT_T0=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
    RESULT_LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
    RESULT_COMMIT=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
    RESULT_OUT=$(mktemp)
    exec 3>&1 > >(tee "$RESULT_OUT")
    RESULT_TEE=$!
}
result_finish() {
    [ -n "$RESULT" ] || return 0
    exec 1>&3 3>&-
    wait "$RESULT_TEE" 2>/dev/null || true
    local cpu mem mpi
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
    mem=$(awk '/^MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo)
    mpi=$(mpirun --version 2>/dev/null | head -1 || true)
    {
        echo "# $RESULT_NAME"
        echo
        echo "- date: $RESULT_T0 to $(date -u '+%H:%M:%S UTC')"
        echo "- command: \`$RESULT_CMD\`"
        echo "- commit: $RESULT_COMMIT"
        echo "- machine: $(uname -srm); ${cpu:-unknown CPU}; $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores; $mem${mpi:+; $mpi}"
        echo "- load average: $RESULT_LOAD0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
        echo
        echo '```'
        cat "$RESULT_OUT"
        echo '```'
    } >"$RESULT"
    rm -f "$RESULT_OUT"
    echo "wrote $RESULT" >&2
}
