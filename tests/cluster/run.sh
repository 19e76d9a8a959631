#!/usr/bin/env bash
# tests/cluster/run.sh - the cluster end to end: real `racimo serve`
# processes on "hosts" made of network namespaces on one bridge
# (tests/cluster/netns.sh), checked through their GET /v1/cluster, `racimo
# nodes` and avahi-browse.  Needs root (ip netns); skips without it.
#
#   four nodes find each other with no peer list (DNS-SD over mDNS), show
#   one view (nodes, states, leader, links with latency and bandwidth),
#   publish hardware, models on disk and models served; a node of another
#   cluster is refused; avahi-browse (its own daemon, in its own namespace)
#   lists and resolves the nodes; a node killed with SIGKILL is marked down
#   within the bound and rejoins after a restart; a cut link (ip link set
#   down) marks the cut node down on both sides, the minority side loses its
#   quorum, and all heals when the link is restored.  Then a cluster with
#   API keys and HTTPS: a request forwarded to a node serving over TLS is
#   answered with a key both nodes hold; one forwarded by a member that
#   drops its clients' keys (racimo-hooks, RACIMO_TEST_FORWARD_NO_KEY) or
#   from a node with another key is refused 401 by the serving node (logged
#   there) and the honest requests go on being served; the forwarder's
#   loopback mark sent from another host counts for nothing.
#
# Prints "N passed, N failed, N skipped" last.  Logs stay in
# build/cluster-e2e/.  Usage: tests/cluster/run.sh  (RACIMO_BIN overrides
# the binary, RACIMO_HOOKS_BIN the one the misbehaving nodes run (racimo-hooks,
# which reads RACIMO_TEST_*); DOWN_MS the down-after bound, default 3000).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
HOOKS_BIN=$(realpath "${RACIMO_HOOKS_BIN:-build/rel/racimo-hooks}")
DOWN_MS=${DOWN_MS:-3000}
SLACK_MS=500                       # tick, scheduling and clock slack over the bound
P=rc$$
LOGS=build/cluster-e2e
passed=0 failed=0 skipped=0

if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "cluster e2e: skipped (needs root and iproute2 for network namespaces)"
  echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
for tool in curl jq openssl; do
  command -v $tool >/dev/null || { echo "cluster e2e: $tool missing (scripts/install-deps.sh)"; echo "0 passed, 1 failed"; exit 1; }
done
for b in "$BIN" "$HOOKS_BIN"; do
  [ -x "$b" ] || { echo "cluster e2e: $b not built"; echo "0 passed, 1 failed"; exit 1; }
done

T=$(mktemp -d /tmp/racimo-cluster.XXXXXX)
source tests/cluster/netns.sh
cleanup() {
  ns_cleanup
  mkdir -p "$LOGS" && cp "$T"/*.log "$LOGS"/ 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ok()   { passed=$((passed+1)); echo "ok   $*"; }
bad()  { failed=$((failed+1)); echo "FAIL $*"; }
skip() { skipped=$((skipped+1)); echo "skip $*"; }
id_of() { cat "$T/n$1/node.id"; }

start_node() {  # I [options...]   (NODE_BIN=... to run another binary)
  local i=$1; shift
  : >"$T/n$i.out"
  ip netns exec "$P-n$i" "${NODE_BIN:-$BIN}" serve --host "10.77.0.$i" --port 8080 --state-dir "$T/n$i" \
    --name "node$i" --no-access-log -t 1 --down-after "$DOWN_MS" "$@" >"$T/n$i.out" 2>&1 &
  echo $! >"$T/n$i.pid"
  wait_for 15 grep -q "listening on" "$T/n$i.out" || { cat "$T/n$i.out"; return 1; }
}
stop_node() {  # I [signal]
  local pid; pid=$(cat "$T/n$1.pid")
  kill -"${2:-TERM}" "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  cat "$T/n$1.out" >>"$T/n$1.log"
}

# state_in I ID: the state node I gives ID ("up", "down", or "" if absent)
state_in() { view "$1" | jq -r --arg id "$2" '.nodes[] | select(.id == $id) | .state'; }
all_see() {  # STATE ID NODES...: every node given sees ID in STATE
  local want=$1 id=$2; shift 2
  for i in "$@"; do [ "$(state_in "$i" "$id")" = "$want" ] || return 1; done
}
# the part of a view that must be the same everywhere
digest() { view "$1" | jq -c '{leader, nodes: ([.nodes[] | {id, state}] | sort_by(.id)),
                               links: ([.links[] | [.from, .to]] | sort)}'; }
same_views() {
  local first; first=$(digest "$1"); [ -n "$first" ] || return 1; shift
  for i in "$@"; do [ "$(digest "$i")" = "$first" ] || return 1; done
}
# detect_ms T0 ID NODES...: when the slowest of the nodes marked ID down,
# in ms after T0 - from the view's own down_for_ms, so polling delays do
# not count
detect_ms() {
  local t0=$1 id=$2 worst=0 i at dfm; shift 2
  for i in "$@"; do
    at=$(now_ms)
    dfm=$(view "$i" | jq -r --arg id "$id" '.nodes[] | select(.id == $id) | .down_for_ms')
    [[ "$dfm" =~ ^[0-9]+$ ]] || { echo 999999; return; }
    [ $((at - t0 - dfm)) -gt "$worst" ] && worst=$((at - t0 - dfm))
  done
  echo "$worst"
}
full_links() {  # every node sees N*(N-1) links with latency and bandwidth
  local n=$1; shift
  for i in "$@"; do
    [ "$(view "$i" | jq '[.links[] | select(.rtt_ms != null and .bandwidth_mbps != null)] | length')" = $((n*(n-1))) ] || return 1
  done
}

echo "cluster e2e: namespaces $P-*, state in $T"
"$BIN" make-model --preset tiny -o "$T/tiny.gguf" >/dev/null 2>&1 || { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }
ns_bridge
for i in 1 2 3 4 5; do ns_host "n$i" "$i"; mkdir -p "$T/n$i/models"; done
ns_host obs 9
for i in 1 2 3 4 5; do cp "$T/tiny.gguf" "$T/n$i/models/tiny.gguf"; done

# ---- forming: one node makes the cluster, three join with the token ----
start_node 1 -m "$T/tiny.gguf" || { bad "node 1 starts"; echo "$passed passed, $failed failed"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
if [[ "$TOKEN" == racimo1-* ]] && grep -q -- "--join $TOKEN" "$T/n1.out" && \
   [ "$(stat -c %a "$T/n1/cluster.key")" = 600 ]; then
  ok "the first node makes a key (mode 600) and prints its join token; racimo token prints it"
else bad "join token"; fi
# the self-benchmark is cached per machine: the others reuse node 1's
wait_for 20 test -s "$T/n1/bench.json" && for i in 2 3 4 5; do cp "$T/n1/bench.json" "$T/n$i/"; done
start_node 2 --join "$TOKEN" -m "$T/tiny.gguf"
RACIMO_JOIN_TOKEN=$TOKEN start_node 3
start_node 4 --join "$TOKEN"
t0=$(now_ms)
if wait_for 30 eval 'n_up 1 4 && n_up 2 4 && n_up 3 4 && n_up 4 4'; then
  ok "4 nodes discover each other with no peer list ($(( $(now_ms) - t0 )) ms)"
else bad "discovery: views: $(for i in 1 2 3 4; do digest $i; done)"; fi
if wait_for 40 full_links 4 1 2 3 4; then
  ok "every node measures and shares the whole mesh of links (12 with rtt and bandwidth)"
else bad "links: $(view 1 | jq -c .links)"; fi
if wait_for 10 same_views 1 2 3 4; then
  ok "all four views agree (nodes, states, leader, links)"
else bad "views differ: $(for i in 1 2 3 4; do digest $i; echo; done)"; fi
leader=$(view 1 | jq -r .leader)
smallest=$(for i in 1 2 3 4; do id_of $i; done | sort | head -n 1)
[ "$leader" = "$smallest" ] && ok "the leader is the smallest id among live nodes" || bad "leader $leader, smallest $smallest"
v=$(view 3)
if echo "$v" | jq -e --arg id "$(id_of 1)" '
     (.nodes | length) == 4 and
     (.nodes[] | select(.id == $id) |
        .name == "node1" and .addresses == ["10.77.0.1"] and .cluster_port == 7719 and
        .http_port == 8080 and .hardware.cores >= 1 and (.hardware.simd | length) > 0 and
        .hardware.mem_total > 0 and .hardware.mem_free > 0 and .hardware.mem_bandwidth > 0 and
        .hardware.matmul_gflops > 0 and (.models | map(.name) | index("tiny")) != null)' >/dev/null; then
  ok "identity, hardware (cores, SIMD, memory, bandwidth, matmul) and models reach every node"
else bad "node records: $(echo "$v" | jq -c '.nodes[0]')"; fi
if wait_for 20 eval "view 4 | jq -e --arg a \"$(id_of 1)\" --arg b \"$(id_of 3)\" '
     ([.nodes[] | select(.id == \$a) | .serving] == [[\"tiny\"]]) and
     ([.nodes[] | select(.id == \$b) | .serving] == [[]])' >/dev/null"; then
  ok "what each node serves is published (node 1 serves tiny, node 3 nothing)"
else bad "serving: $(view 4 | jq -c '[.nodes[] | {name, serving}]')"; fi
out=$(ip netns exec "$P-n2" "$BIN" nodes --host 10.77.0.2 --port 8080)
if [ "$(echo "$out" | grep -c ' up ')" = 4 ] && echo "$out" | grep -q "4 of 4 nodes up, quorum" && \
   echo "$out" | grep -q 'tiny\* ([0-9]* free)' && \
   ip netns exec "$P-n2" "$BIN" nodes --host 10.77.0.2 --port 8080 --json | jq -e '.nodes | length == 4' >/dev/null; then
  ok "racimo nodes prints the table, served models with their free slots (and --json the view)"
else bad "racimo nodes: $out"; fi

# ---- a node of another cluster is refused ----
start_node 5 --peer 10.77.0.1:7719
sleep 4
id5=$(id_of 5)
if [ -z "$(state_in 1 "$id5")" ] && n_up 5 1 && n_up 1 4 && \
   grep -q "refused a connection from 10.77.0.5.*does not hold this cluster's key" "$T/n1.out"; then
  ok "a node with another key is refused (logged, not admitted, the cluster unaffected)"
else bad "wrong key: $(view 1 | jq -c '[.nodes[] | .name]'); $(grep refused "$T/n1.out" | head -n 2)"; fi
stop_node 5

# ---- a node of this cluster that speaks another protocol version is refused,
# with a message naming both versions (on both sides), not split off ----
rm -rf "$T/n5"; mkdir -p "$T/n5/models"; cp "$T/n1/bench.json" "$T/n5/"; cp "$T/tiny.gguf" "$T/n5/models/"
NODE_BIN=$HOOKS_BIN RACIMO_TEST_PROTOCOL=2.0 start_node 5 --join "$TOKEN"
id5=$(id_of 5)
if wait_for 10 grep -q "speaks racimo cluster protocol 1\.[0-9]*, this node 2.0" "$T/n5.out" && \
   wait_for 5 grep -q "refused .*10.77.0.5.*speaks racimo cluster protocol 2.0, this node 1\.[0-9]*" "$T/n1.out" && \
   [ -z "$(state_in 1 "$id5")" ] && n_up 5 1 && n_up 1 4; then
  ok "a node of another protocol major version is refused, saying which versions differ"
else bad "version mismatch: $(grep -h "protocol 2.0" "$T/n1.out" "$T/n5.out" | head -n 3)"; fi
stop_node 5

# ---- avahi-browse sees the nodes (its own daemons, in its own namespace) ----
if command -v avahi-browse >/dev/null && command -v avahi-daemon >/dev/null && command -v dbus-daemon >/dev/null; then
  cat >"$T/avahi.conf" <<'EOF'
[server]
use-ipv4=yes
use-ipv6=no
allow-interfaces=eth0
enable-dbus=yes
[wide-area]
enable-wide-area=no
[publish]
disable-publishing=yes
EOF
  # ip netns exec gives the script a mount namespace of its own: the
  # daemons' sockets and pid files go to private tmpfs mounts
  cat >"$T/browse.sh" <<EOF
mount -t tmpfs tmpfs /run/dbus 2>/dev/null || { mkdir -p /run/dbus && mount -t tmpfs tmpfs /run/dbus; }
mkdir -p /run/avahi-daemon && mount -t tmpfs tmpfs /run/avahi-daemon
dpid=\$(dbus-daemon --system --fork --nopidfile --print-pid) || exit 3
avahi-daemon -f "$T/avahi.conf" --no-drop-root --no-chroot --no-rlimits >"$T/avahi.log" 2>&1 &
apid=\$!
for i in \$(seq 100); do avahi-browse -a -t -p >/dev/null 2>&1 && break; sleep 0.1; done
timeout 8 avahi-browse -r -p _racimo._tcp
kill \$apid \$dpid 2>/dev/null
wait \$apid 2>/dev/null
EOF
  ip netns exec "$P-obs" bash "$T/browse.sh" >"$T/browse.out" 2>&1
  found=0
  for i in 1 2 3 4; do
    grep -q "^=;eth0;IPv4;node$i.*;_racimo._tcp;local;racimo-.*\.local;10\.77\.0\.$i;7719;.*\"id=$(id_of $i)\"" "$T/browse.out" && found=$((found+1))
  done
  if [ "$found" = 4 ] && ! grep -q "tiny\|$TOKEN" "$T/browse.out"; then
    ok "avahi-browse -r _racimo._tcp lists and resolves the 4 nodes (and no key, no model names)"
  else bad "avahi-browse found $found of 4: $(head -n 20 "$T/browse.out")"; fi
else
  skip "avahi-browse (install avahi-utils avahi-daemon dbus: scripts/install-deps.sh)"
fi

# ---- SIGKILL: down within the bound, back after a restart ----
id4=$(id_of 4)
t0=$(now_ms)
stop_node 4 KILL
if wait_for $(( (DOWN_MS + SLACK_MS) / 1000 + 1 )) all_see down "$id4" 1 2 3; then
  dt=$(detect_ms "$t0" "$id4" 1 2 3)
  [ "$dt" -le $((DOWN_MS + SLACK_MS)) ] && ok "a node killed with SIGKILL is marked down everywhere in $dt ms (bound $DOWN_MS)" \
    || bad "SIGKILL: down after $dt ms"
else bad "SIGKILL: not marked down: $(for i in 1 2 3; do state_in $i "$id4"; done)"; fi
if n_up 1 3 && view 1 | jq -e '.quorum == true' >/dev/null; then
  ok "three of four up keep the quorum"; else bad "quorum with 3 of 4: $(view 1 | jq -c '{quorum, members, members_up}')"; fi
t0=$(now_ms)
start_node 4
if wait_for 20 eval "all_see up $id4 1 2 3 && n_up 4 4"; then
  [ "$(view 1 | jq '.nodes | length')" = 4 ] && ok "the restarted node rejoins by itself as the same node ($(( $(now_ms) - t0 )) ms)" \
    || bad "rejoin: $(view 1 | jq '.nodes | length') nodes"
else bad "rejoin: $(for i in 1 2 3 4; do state_in $i "$id4"; done)"; fi

# ---- a cut link: both sides see it, the minority loses its quorum ----
id3=$(id_of 3)
wait_for 10 same_views 1 2 3 4 >/dev/null
t0=$(now_ms)
ip -n "$P-n3" link set eth0 down
if wait_for $(( (DOWN_MS + SLACK_MS) / 1000 + 1 )) all_see down "$id3" 1 2 4; then
  dt=$(detect_ms "$t0" "$id3" 1 2 4)
  [ "$dt" -le $((DOWN_MS + SLACK_MS)) ] && ok "a cut link marks the node down on the other side in $dt ms (bound $DOWN_MS)" \
    || bad "link cut: down after $dt ms"
else bad "link cut: $(for i in 1 2 4; do state_in $i "$id3"; done)"; fi
if wait_for 5 eval 'n_up 3 1 && view 3 | jq -e ".quorum == false" >/dev/null && view 1 | jq -e ".quorum == true" >/dev/null'; then
  ok "partition: the cut node sees itself alone without quorum; the majority keeps it"
else bad "partition: $(view 3 | jq -c '{quorum, members_up}') / $(view 1 | jq -c '{quorum, members_up}')"; fi
t0=$(now_ms)
ip -n "$P-n3" link set eth0 up
ip -n "$P-n3" route add 224.0.0.0/4 dev eth0 2>/dev/null
if wait_for 20 eval "all_see up $id3 1 2 4 && n_up 3 4" && wait_for 20 same_views 1 2 3 4; then
  ok "the restored link heals the cluster ($(( $(now_ms) - t0 )) ms), one view again"
else bad "heal: $(for i in 1 2 3 4; do digest $i; echo; done)"; fi

# ---- the nodes survived all of it ----
for i in 1 2 3 4; do kill -0 "$(cat "$T/n$i.pid")" 2>/dev/null || bad "node $i died"; done
for i in 1 2 3 4; do stop_node "$i"; done

# ---- one API-key policy across the cluster, and HTTPS ----
# A new cluster: node 1 serves tiny over HTTPS; nodes 2-4 hold no model file,
# so they forward tiny's requests to node 1.  Nodes 1-3 share the key, node
# 3 runs racimo-hooks and forwards without its clients' keys, node 4 has
# another key.
cp "$T/n1/bench.json" "$T/bench.json"
for i in 1 2 3 4; do rm -rf "$T/n$i"; mkdir -p "$T/n$i/models"; cp "$T/bench.json" "$T/n$i/"; done
echo "e2e-shared-key" >"$T/keys.txt"
echo "e2e-other-key" >"$T/other-keys.txt"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/tls.key" \
  -out "$T/tls.crt" -days 2 -subj /CN=node1 -addext subjectAltName=IP:10.77.0.1 >/dev/null 2>&1
AUTH="Authorization: Bearer e2e-shared-key"
COMPLETION='{"model":"tiny","prompt":"hi","max_tokens":4,"temperature":0}'
# api I KEY [curl options]: POST COMPLETION at node I over http; prints the body, then the status
api() { local i=$1 key=$2; shift 2
  ip netns exec "$P-n$i" curl -s --max-time 60 -w '\n%{http_code}' -H "Authorization: Bearer $key" \
    -H 'Content-Type: application/json' -d "$COMPLETION" "$@" "http://10.77.0.$i:8080/v1/completions"; }
kview() { ip netns exec "$P-n$1" curl -s --max-time 2 -H "$AUTH" "http://10.77.0.$1:8080/v1/cluster"; }
serves_tiny() { kview "$1" | jq -e '[.nodes[] | select(.name == "node1") | .serving[]] | index("tiny")' >/dev/null; }
start_node 1 -m "$T/tiny.gguf" --api-key-file "$T/keys.txt" --tls-cert "$T/tls.crt" --tls-key "$T/tls.key"
KTOKEN=$("$BIN" token --state-dir "$T/n1")
start_node 2 --join "$KTOKEN" --peer 10.77.0.1 --api-key-file "$T/keys.txt"
NODE_BIN=$HOOKS_BIN RACIMO_TEST_FORWARD_NO_KEY=1 start_node 3 --join "$KTOKEN" --peer 10.77.0.1 \
  --api-key-file "$T/keys.txt"
start_node 4 --join "$KTOKEN" --peer 10.77.0.1 --api-key-file "$T/other-keys.txt"
if wait_for 30 eval 'serves_tiny 2 && serves_tiny 3' && \
   wait_for 10 eval "ip netns exec $P-n4 curl -s --max-time 2 -H 'Authorization: Bearer e2e-other-key' \
     http://10.77.0.4:8080/v1/cluster | jq -e '[.nodes[] | select(.name == \"node1\") | .serving[]] | index(\"tiny\")' >/dev/null"; then
  tls=$(ip netns exec "$P-n1" curl -s --max-time 60 --cacert "$T/tls.crt" -H "$AUTH" \
        -H 'Content-Type: application/json' -d "$COMPLETION" -w '\n%{http_code}' https://10.77.0.1:8080/v1/completions)
  plain=$(ip netns exec "$P-n1" curl -s --max-time 5 -o /dev/null -w '%{http_code}' http://10.77.0.1:8080/health)
  if [ "$(echo "$tls" | tail -n 1)" = 200 ] && echo "$tls" | grep -q text_completion && [ "$plain" != 200 ]; then
    ok "HTTPS: node 1 answers over TLS (curl --cacert) and not in clear"
  else bad "HTTPS: $tls / plain $plain"; fi
  r=$(api 2 e2e-shared-key)
  if [ "$(echo "$r" | tail -n 1)" = 200 ] && echo "$r" | grep -q text_completion && \
     grep -q "forward: /v1/completions for tiny to node" "$T/n2.out" && \
     grep -q "forward: running /v1/completions for node $(id_of 2 | cut -c1-8)" "$T/n1.out"; then
    ok "a request forwarded to the TLS node with a key both nodes hold is answered"
  else bad "forwarding with the shared key: $r"; fi
  r=$(api 3 e2e-shared-key)
  if [ "$(echo "$r" | tail -n 1)" = 401 ] && echo "$r" | grep -q "requires one of its own API keys" && \
     grep -q "forward: refused /v1/completions (request [0-9]*) from node node3 .*carries no API key" "$T/n1.out"; then
    ok "a member forwarding without its client's key is refused 401 by the serving node (logged there)"
  else bad "keyless forwarding: $r / $(grep refused "$T/n1.out" | head -n 2)"; fi
  r=$(api 4 e2e-other-key)
  if [ "$(echo "$r" | tail -n 1)" = 401 ] && echo "$r" | grep -q "a key that is not one of them" && \
     grep -q "forward: refused /v1/completions (request [0-9]*) from node node4 .*none of this node's API keys" "$T/n1.out"; then
    ok "a request admitted with another node's key is refused 401 by the serving node"
  else bad "another key: $r"; fi
  # the forwarder's loopback mark from another host, even on a generation endpoint: any client's
  mark=$(ip netns exec "$P-n2" curl -s --max-time 10 --cacert "$T/tls.crt" -o /dev/null -w '%{http_code}' \
         -H "X-Racimo-Forward: $(printf '0%.0s' $(seq 32))" -H 'Content-Type: application/json' \
         -d "$COMPLETION" https://10.77.0.1:8080/v1/completions)
  if [ "$mark" = 401 ] && grep -q "a request from 10.77.0.2:[0-9]* for /v1/completions carried the forwarding mark on the public listener" "$T/n1.out"; then
    ok "the forwarding mark from another host is refused and logged (401 without a key)"
  else bad "the forwarding mark from 10.77.0.2: $mark"; fi
  served=0
  for k in 1 2 3; do r=$(api 2 e2e-shared-key); [ "$(echo "$r" | tail -n 1)" = 200 ] && served=$((served+1)); done
  [ "$served" = 3 ] && ok "honest forwarded requests go on being served (3 of 3)" || bad "after the refusals: $served of 3"
else bad "the keyed cluster: node 2-4 never saw node 1 serve tiny: $(kview 2 | jq -c '[.nodes[] | {name, state, serving}]')"; fi
for i in 1 2 3 4; do kill -0 "$(cat "$T/n$i.pid")" 2>/dev/null || bad "node $i died (keyed cluster)"; done
for i in 1 2 3 4; do stop_node "$i"; done
if grep -q "AddressSanitizer\|runtime error\|Segmentation" "$T"/*.log; then bad "a node crashed or a sanitizer reported"; fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
