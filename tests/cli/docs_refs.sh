#!/usr/bin/env bash
# docs_refs.sh: what README.md and docs/**/*.md name exists.
#  - every repository path they mention (src/..., tools/..., models/..., bench/..., tests/...,
#    docs/...; a path with a placeholder or wildcard such as src/nn/layer_<type>.c or
#    tests/ref/*.bin is skipped) is a file or folder of the repository, and so is every docs
#    page the code, tests, tools and bench scripts name;
#  - every relative Markdown link ([text](howto/resume.md#anchor)) leads to a file, relative
#    to the page it is on, and its anchor, if any, to a heading of that page;
#  - every flag in a `pipedream CMD ...` command line (also `$PD CMD ...`, continuation lines
#    joined) is listed by `pipedream CMD --help`.
# Each miss is reported as FILE:LINE and what is missing; the test fails if there is one.
set -u
PD=${PD:-build/pipedream}
SRC=${PD_SOURCE_DIR:-.}
[ -x "$PD" ] || { echo "SKIP: $PD is not built"; exit 77; }
command -v awk >/dev/null || { echo "SKIP: no awk"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$SRC" || exit 1

pages=(README.md)
while IFS= read -r f; do pages+=("$f"); done < <(find docs -name '*.md' | sort)
[ "${#pages[@]}" -gt 1 ] || { echo "FAIL: no pages under docs/"; exit 1; }

misses=0
miss() { echo "MISSING: $*"; misses=$((misses + 1)); }

# 1. Repository paths: "FILE:LINE PATH" for every path-looking word.
for f in "${pages[@]}"; do
    awk -v F="$f" '{
        s = $0
        while (match(s, /(^|[^A-Za-z0-9_.\/$~-])(src|tools|models|bench|tests|docs)\/[A-Za-z0-9_.\/*<>{}+-]*/)) {
            p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
            sub(/^[^a-z]/, "", p)
            print F ":" NR " " p
        }
    }' "$f"
done >"$tmp/paths"
while read -r where p; do
    case $p in *'<'* | *'>'* | *'*'* | *'{'* | *'}'* | *...*) continue ;; esac
    p=${p%%[.,:;)]}
    p=${p%%[.,:;)]}
    [ -e "$p" ] || miss "$where: path $p"
done <"$tmp/paths"

# 1b. The docs pages the code, tests, tools and scripts point to.
grep -rnoE 'docs/[A-Za-z0-9_./-]+[.](md|svg)' src tools bench tests fuzz Makefile CMakeLists.txt 2>/dev/null |
    grep -v '^tests/cli/docs_refs.sh:' | while IFS=: read -r f l p; do
    [ -e "$p" ] || echo "$f:$l $p"
done >"$tmp/code_paths"
while read -r where p; do miss "$where: path $p"; done <"$tmp/code_paths"

# 2. Relative Markdown links.
for f in "${pages[@]}"; do
    awk -v F="$f" '{
        s = $0
        while (match(s, /\]\([^) ]+\)/)) {
            l = substr(s, RSTART + 2, RLENGTH - 3); s = substr(s, RSTART + RLENGTH)
            if (l ~ /^(https?:|mailto:)/) continue
            if (l ~ /^#/) l = F l; else l = D "/" l
            print F ":" NR " " l
        }
    }' D="$(dirname "$f")" "$f"
done >"$tmp/links"
# the anchors of a page: its headings as GitHub makes them (lower case, punctuation dropped,
# spaces as hyphens)
anchors() {
    awk '/^```/ { code = !code } !code && /^#+ / {
        h = tolower($0); sub(/^#+ /, "", h); gsub(/[^a-z0-9 _-]/, "", h); gsub(/ /, "-", h); print h }' "$1"
}
while read -r where l; do
    file=${l%%#*}
    [ -e "$file" ] || { miss "$where: link $l"; continue; }
    case $l in
    *.md#*) anchors "$file" | grep -qxF -- "${l#*#}" || miss "$where: link $l (no such heading)" ;;
    esac
done <"$tmp/links"

# 3. Flags of pipedream command lines: "FILE:LINE CMD --flag".
for f in "${pages[@]}"; do
    awk -v F="$f" '
    function scan(s, n,    cmd, rest, i, t) {
        while (match(s, /(pipedream|\$PD|\$\{PD\}) +(profile|plan|simulate|train|eval|bench|version)([^a-z-]|$)/)) {
            t = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
            sub(/^[^ ]+ +/, "", t); cmd = t; sub(/[^a-z-].*$/, "", cmd)
            rest = s
            i = index(rest, "`"); if (i) rest = substr(rest, 1, i - 1)
            if (match(rest, /[|;]|&&| #/)) rest = substr(rest, 1, RSTART - 1)
            while (match(rest, /(^|[ [(=|])--[a-z][a-z0-9-]*/)) {
                t = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
                sub(/^[^-]*/, "", t)
                print F ":" n " " cmd " " t
            }
        }
    }
    {
        line = $0
        if (held != "") { line = held " " line; held = "" } else start = NR
        if (line ~ /\\$/) { sub(/\\$/, "", line); held = line; next }
        scan(line, start)
    }' "$f"
done >"$tmp/flags"
for cmd in profile plan simulate train eval bench; do
    "$PD" "$cmd" --help >"$tmp/help-$cmd" 2>&1 || { echo "FAIL: pipedream $cmd --help exit $?"; exit 1; }
done
# train's pipelined flags: listed by `train --workers N --help` where `train --help` lists only
# one worker's (the same text where train has one flag set)
"$PD" train --workers 2 --help >>"$tmp/help-train" 2>&1 || { echo "FAIL: pipedream train --workers 2 --help exit $?"; exit 1; }
: >"$tmp/help-version"
while read -r where cmd flag; do
    [ "$flag" = --help ] && continue
    grep -qE -- "(^|[^a-z0-9-])$flag([^a-z0-9-]|\$)" "$tmp/help-$cmd" ||
        miss "$where: pipedream $cmd $flag (not in pipedream $cmd --help)"
done <"$tmp/flags"

n_paths=$(wc -l <"$tmp/paths") n_links=$(wc -l <"$tmp/links") n_flags=$(wc -l <"$tmp/flags")
[ "$n_paths" -gt 50 ] && [ "$n_flags" -gt 50 ] && [ "$n_links" -gt 10 ] ||
    { echo "FAIL: too little found to check ($n_paths paths, $n_links links, $n_flags flags): the extraction broke"; exit 1; }
if [ "$misses" -gt 0 ]; then
    echo "FAIL: $misses of the paths, links and flags the docs name do not exist"
    exit 1
fi
echo "ok: ${#pages[@]} pages, $n_paths paths, $n_links links, $n_flags flags"
