#!/usr/bin/env bash
# docs_size.sh: the manual stays a manual.
#  - README.md is at most 900 words and docs/ (every docs/**/*.md) at most 40,000 (wc -w);
#  - a reference page (docs/reference/*.md) carries no date (YYYY-MM-DD) and no commit hash:
#    measurements and how they were found live in bench/results/, linked from explanation pages.
#    A commit hash is a word of 7 or 9-40 lower-case hex digits with a letter and a digit, not
#    inside a JSON string ("...") and not after 0x; 8-digit words are CRC-32 values, which the
#    formats carry (profile_crc32, pipedream.crc32, weights_crc);
#  - `pipedream train --help` lists no flag whose name runs into its description.
# Each miss is reported as FILE:LINE and what is wrong; the test fails if there is one.
set -u
SRC=${PD_SOURCE_DIR:-.}
PD=${PD:-build/pipedream}
README_MAX=${README_MAX:-900}
DOCS_MAX=${DOCS_MAX:-40000}
cd "$SRC" || exit 1
command -v awk >/dev/null || { echo "SKIP: no awk"; exit 77; }
misses=0
miss() { echo "FAIL: $*"; misses=$((misses + 1)); }

n=$(wc -w <README.md)
[ "$n" -le "$README_MAX" ] || miss "README.md: $n words, more than $README_MAX"
mapfile -t pages < <(find docs -name '*.md' | sort)
[ "${#pages[@]}" -gt 10 ] || { echo "FAIL: only ${#pages[@]} pages under docs/"; exit 1; }
n=$(cat "${pages[@]}" | wc -w)
[ "$n" -le "$DOCS_MAX" ] || miss "docs/: $n words, more than $DOCS_MAX"

# dates and commit hashes on reference pages, outside JSON strings
hits=$(awk '{
    s = $0
    gsub(/"[^"]*"/, "\"\"", s)                       # JSON strings: format content
    gsub(/0[xX][0-9a-fA-F]+/, "", s)                 # hex constants
    if (match(s, /(^|[^0-9])[0-9][0-9][0-9][0-9]-[01][0-9]-[0-3][0-9]([^0-9]|$)/)) {
        print FILENAME ":" FNR ": a date: " substr(s, RSTART, RLENGTH); next
    }
    t = s
    while (match(t, /(^|[^0-9a-zA-Z_])[0-9a-f]+([^0-9a-zA-Z_]|$)/)) {
        w = substr(t, RSTART, RLENGTH); t = " " substr(t, RSTART + RLENGTH)
        gsub(/[^0-9a-f]/, "", w)
        l = length(w)
        if (l >= 7 && l <= 40 && l != 8 && w ~ /[a-f]/ && w ~ /[0-9]/) {
            print FILENAME ":" FNR ": a commit hash: " w; break
        }
    }
}' docs/reference/*.md)
if [ -n "$hits" ]; then
    while IFS= read -r h; do miss "$h (reference pages carry no dates or commits)"; done <<<"$hits"
fi

# train's help: every flag line is "  FLAG [ARG]" then two spaces or more and its text, or alone
if [ -x "$PD" ]; then
    for args in "" "--workers 2"; do
        # shellcheck disable=SC2086
        out=$("$PD" train $args --help 2>&1) || { miss "pipedream train $args --help: exit $?"; continue; }
        bad=$(printf '%s\n' "$out" | grep -E '^  -' | grep -vE '^  -[^ ]+( [^ ]+)?(  +[^ ]|$)')
        [ -z "$bad" ] || while IFS= read -r b; do miss "pipedream train $args --help: a flag runs into its text: $b"; done <<<"$bad"
    done
else
    echo "note: $PD not built, train's help not checked"
fi

if [ "$misses" -gt 0 ]; then
    echo "FAIL: $misses"
    exit 1
fi
echo "ok: README $(wc -w <README.md) words, docs/ $(cat "${pages[@]}" | wc -w) words, reference pages without dates or commits"
