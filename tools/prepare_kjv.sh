#!/usr/bin/env bash
# prepare_kjv.sh [OUT]: the real corpus of the language-model runs, once: the King James Bible
# as plain text (4.4 MB), from Debian's bible-kjv package (`bible -f Gen1:1-Rev22:21`), written
# to OUT (default out/kjv.txt). Installs bible-kjv when missing (as root; otherwise prints the
# apt-get line and fails, as tools/install-deps.sh does). Does nothing if OUT already exists.
#   pipedream train models/gpt-mini.json --text out/kjv.txt --steps 200 --minibatch 32 \
#       --optimizer adam --lr 1e-3
set -euo pipefail
out=${1:-out/kjv.txt}
if [ -s "$out" ]; then echo "$out"; exit 0; fi
if ! command -v bible >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "pipedream: installing: bible-kjv" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv >&2 ||
            { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv >&2; }
    else
        echo "pipedream: error: missing Debian package bible-kjv. Run:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y bible-kjv" >&2
        exit 1
    fi
fi
mkdir -p "$(dirname "$out")"
bible -f Gen1:1-Rev22:21 >"$out.tmp"
[ "$(wc -c <"$out.tmp")" -gt 4000000 ] || { echo "pipedream: error: bible printed only $(wc -c <"$out.tmp") bytes" >&2; exit 1; }
mv "$out.tmp" "$out"
echo "$out"
