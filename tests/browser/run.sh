#!/usr/bin/env bash
# tests/browser/run.sh - the web dashboard in a real browser: headless
# Chromium (Debian's chromium) driven by puppeteer-core (dashboard.test.mjs)
# against three real nodes in network namespaces (tests/cluster/netns.sh),
# the browser in a namespace of its own on the same bridge.
#
# Prints node's TAP, whose "# pass N / # fail N" scripts/test-all.sh adds up;
# skips (one) with the reason when root, iproute2, jq or chromium is missing.
# Screenshots and node logs stay in build/browser/.
# Usage: tests/browser/run.sh (RACIMO_BIN, CHROMIUM: the browser binary).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
P=rb$$
OUT=build/browser
skip() { echo "browser: skipped ($1)"; echo "# pass 0"; echo "# fail 0"; echo "# skipped 1"; exit 0; }
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || skip "needs root and iproute2 for network namespaces"
command -v jq >/dev/null || skip "jq missing: scripts/install-deps.sh"
[ -n "$CHROMIUM" ] || skip "chromium not installed: scripts/install-deps.sh"
[ -x "$BIN" ] || { echo "browser: $BIN not built"; echo "# pass 0"; echo "# fail 1"; exit 1; }
( cd tests/browser && { [ -d node_modules/puppeteer-core ] ||
    npm ci --no-audit --no-fund --loglevel=error; } ) ||
  { echo "browser: npm ci failed"; echo "# pass 0"; echo "# fail 1"; exit 1; }

T=$(mktemp -d /tmp/racimo-browser.XXXXXX)
source tests/cluster/netns.sh
cleanup() {
  ns_cleanup
  mkdir -p "$OUT" && cp -r "$T"/*.out "$T"/shots "$OUT"/ 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

KEY=browser-test-key
kview() { ip netns exec "$P-n$1" curl -s --max-time 2 -H "Authorization: Bearer $KEY" \
            "http://10.77.0.$1:8080/v1/cluster"; }
links_up() { [ "$(kview 1 | jq '[.nodes[] | select(.state == "up")] | length')" = 3 ] &&
             [ "$(kview 1 | jq '[.links[] | select(.rtt_ms != null)] | length')" -ge 6 ]; }
start_node() {
  local i=$1; shift
  ip netns exec "$P-n$i" "$BIN" serve --host "10.77.0.$i" --port 8080 --state-dir "$T/n$i" \
    --name "node$i" --no-access-log -t 1 --down-after 1500 --parallel 2 --ctx-size 256 \
    --api-key "$KEY" --watts $((30 + i * 5)) --price-kwh 0.25 --cloud-price 0.6 ${MESH_ARG:-} "$@" \
    >"$T/n$i.out" 2>&1 &
  echo $! >"$T/n$i.pid"
  wait_for 20 grep -q "listening on" "$T/n$i.out" || { tail -5 "$T/n$i.out"; return 1; }
}

ns_bridge
for i in 1 2 3; do ns_host "n$i" "$i"; mkdir -p "$T/n$i/models"; done
ns_host c 50
"$BIN" make-model --preset tiny --layers 8 --type Q8_0 -o "$T/n1/models/m8.gguf" >/dev/null 2>&1 ||
  { echo "make-model failed"; echo "# pass 0"; echo "# fail 1"; exit 1; }
cp "$T/n1/models/m8.gguf" "$T/n2/models/"
start_node 1 || { echo "# pass 0"; echo "# fail 1"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
for i in 2 3; do RACIMO_JOIN_TOKEN=$TOKEN start_node "$i" --peer 10.77.0.1 ||
  { echo "# pass 0"; echo "# fail 1"; exit 1; }; done
wait_for 30 links_up || echo "browser: the three nodes did not link in 30 s (the tests will say more)"

mkdir -p "$T/shots"
ip netns exec "$P-c" env URL=http://10.77.0.1:8080 API_KEY="$KEY" CHROMIUM="$CHROMIUM" \
  NODE3_PID="$(cat "$T/n3.pid")" SHOTS="$T/shots" \
  node --test --test-reporter=tap tests/browser/dashboard.test.mjs
