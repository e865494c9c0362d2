#!/usr/bin/env bash
# Installs the Debian packages pipedream needs, when missing (--test: and those its tests need).
# As root: apt-get. Otherwise prints the exact command to run and fails, so nothing
# half-configured follows.
set -euo pipefail
PKGS="build-essential cmake pkg-config libopenblas-dev libdnnl-dev openmpi-bin libopenmpi-dev zlib1g-dev libcjson-dev libcmocka-dev libpng-dev libjpeg62-turbo-dev dataset-fashion-mnist bible-kjv"
# --test: also what the tests' oracles need (PyTorch, never a dependency of pipedream itself)
[ "${1:-}" != --test ] || PKGS="$PKGS python3-torch"
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "pipedream: installing:$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q $missing >&2
else
  echo "pipedream: error: missing Debian packages. Run:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
  exit 1
fi
