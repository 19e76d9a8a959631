#!/usr/bin/env bash
# Installs the Debian packages racimo needs to build and test, skipping the
# ones already present.  Safe to run again; needs root (or sudo) only when
# something is missing.
set -euo pipefail

pkgs=(
  build-essential   # gcc, make, libc headers
  clang             # second compiler, libFuzzer for the fuzz targets
  pkg-config
  libjansson-dev    # JSON: golden sidecars, chat messages, the HTTP API
  libpcre2-dev      # pre-tokenizer regexes (Unicode classes, look-ahead, JIT)
)
if [ "$(uname -s)" = Darwin ]; then
  echo "macOS: install jansson with your package manager (brew install jansson)"
  exit 0
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
