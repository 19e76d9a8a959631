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
  libevent-dev      # racimo serve: evhttp event loop (HTTP parsing, keep-alive, timeouts)
  curl              # e2e tests: SSE framing as a plain HTTP client sees it
  libsodium-dev     # cluster: key exchange, authentication and encryption between nodes
  libcurl4-openssl-dev  # racimo pull: HTTPS downloads from Hugging Face (HTTP/2, redirects,
                        # proxies, Range resumes)
  libssl-dev        # racimo serve --tls-cert/--tls-key: HTTPS (libevent-dev already brings
                    # libevent_openssl, its OpenSSL bufferevents, which links against this)
  openssl           # unit tests: the openssl command makes a self-signed certificate
  iproute2          # cluster e2e tests: network namespaces, veth pairs, a bridge
  jq                # cluster e2e tests: reading the nodes' /v1/cluster JSON
  avahi-utils       # cluster e2e tests: avahi-browse must see the nodes (DNS-SD over mDNS)
  avahi-daemon      # ... the daemon avahi-browse asks (started by the test, in its namespace)
  dbus              # ... the bus between them (a private one, started by the test)
  chromium          # browser tests of the web dashboard: headless Chromium driven by
                    # puppeteer-core (tests/browser)
)
# e2e tests drive racimo serve with the official openai and ollama npm packages
command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
# On x86-64, make test-arm64 cross-builds the kernel tests for arm64 and runs
# them under qemu-user, so the NEON kernels are checked on this machine too.
if [ "$(uname -m)" = x86_64 ]; then
  pkgs+=(
    gcc-aarch64-linux-gnu   # the cross compiler
    libc6-dev-arm64-cross   # arm64 libc to link the (static) test binary
    qemu-user               # qemu-aarch64, with CPU models with and without dotprod
  )
fi
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
