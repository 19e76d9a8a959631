#!/usr/bin/env bash
# tests/cluster/run.sh - the cluster end to end: real `racimo serve`
# processes on "hosts" made of network namespaces on one bridge
# (tests/cluster/netns.sh), checked through their GET /v1/cluster, `racimo
# nodes` and avahi-browse.  Needs root (ip netns); skips without it.
#
#   four nodes find each other with no peer list (DNS-SD over mDNS), show
#   one view (nodes, states, leader, links with latency and bandwidth),
#   publish hardware, models on disk and models served; a node of another
#   cluster, one of another protocol version and a member claiming another
#   node's id are refused; a stranger's flood of handshakes does not keep
#   nodes from linking; avahi-browse (its own daemon, in its own namespace)
#   lists and resolves the nodes; a rogue mDNS responder (no key: a spoofed
#   address for a live node, hundreds of made-up nodes, answers from TTL 64
#   and naming loopback/broadcast addresses) changes nothing in any view,
#   makes no dial storm and is logged; a node killed with SIGKILL is marked down
#   within the bound and rejoins after a restart; a cut link (ip link set
#   down) marks the cut node down on both sides, the minority side loses its
#   quorum, and all heals when the link is restored; a node removed with
#   `racimo nodes remove` is refused everywhere and cannot rejoin; `racimo
#   token --rotate` carries the live members over to a new key without a
#   link lost, the old token is refused, the new one joins, and a member away
#   during the rotation is refused until given the new token.  Then a cluster with
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
# which reads RACIMO_TEST_*); DOWN_MS the down-after bound, default 3000;
# RACIMO_MESH=1 starts every node with --mesh, see netns.sh).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
HOOKS_BIN=$(realpath "${RACIMO_HOOKS_BIN:-build/rel/racimo-hooks}")
DOWN_MS=${DOWN_MS:-3000}
SLACK_MS=500                       # tick, scheduling and clock slack over the bound
P=rc$$
LOGS=build/cluster-e2e
passed=0 failed=0 skipped=0

source tests/cluster/netns.sh
ns_preflight "cluster e2e" "curl jq openssl" "$BIN" "$HOOKS_BIN"

T=$(mktemp -d /tmp/racimo-cluster.XXXXXX)
cleanup() { ns_finish "$LOGS" '*.log'; }
trap cleanup EXIT
trap 'exit 130' INT TERM

id_of() { cat "$T/n$1/node.id"; }

start_node() {  # I [options...]   (NODE_BIN=... to run another binary)
  local i=$1; shift
  : >"$T/n$i.out"
  ip netns exec "$P-n$i" "${NODE_BIN:-$BIN}" serve --host "10.77.0.$i" --port 8080 --state-dir "$T/n$i" \
    --name "node$i" --no-access-log -t 1 --down-after "$DOWN_MS" ${MESH_ARG:-} "$@" >"$T/n$i.out" 2>&1 &
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

echo "cluster e2e: namespaces $P-*, state in $T${MESH_ARG:+ (nodes with $MESH_ARG)}"
"$BIN" make-model --preset tiny -o "$T/tiny.gguf" >/dev/null 2>&1 || { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }
ns_bridge
for i in 1 2 3 4 5; do ns_host "n$i" "$i"; mkdir -p "$T/n$i/models"; done
ns_host obs 9
ns_host rogue 66
for i in 1 2 3 4 5; do cp "$T/tiny.gguf" "$T/n$i/models/tiny.gguf"; done

# ---- forming: one node makes the cluster, three join with the token ----
start_node 1 -m "$T/tiny.gguf" || { bad "node 1 starts"; echo "$passed passed, $failed failed"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
if [[ "$TOKEN" == racimo1-* ]] && grep -q -- "RACIMO_JOIN_TOKEN=$TOKEN racimo serve" "$T/n1.out" && \
   [ "$(stat -c %a "$T/n1/cluster.key")" = 600 ]; then
  ok "the first node makes a key (mode 600) and prints its join token; racimo token prints it"
else bad "join token"; fi
# the self-benchmark is cached per machine: the others reuse node 1's
wait_for 20 test -s "$T/n1/bench.json" && for i in 2 3 4 5; do cp "$T/n1/bench.json" "$T/n$i/"; done
# the token from a file (mode 600), from the environment, and (node 4) on the
# command line, which still works
(umask 077; printf '# the cluster token\n%s\n' "$TOKEN" >"$T/token.txt")
start_node 2 --join-file "$T/token.txt" -m "$T/tiny.gguf"
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
id5=$(id_of 5)
if wait_for 10 grep -q "refused a connection from 10.77.0.5.*does not hold this cluster's key" "$T/n1.out" && \
   [ -z "$(state_in 1 "$id5")" ] && n_up 5 1 && n_up 1 4; then
  ok "a node with another key is refused (logged, not admitted, the cluster unaffected)"
else bad "wrong key: $(view 1 | jq -c '[.nodes[] | .name]'); $(grep refused "$T/n1.out" | head -n 2)"; fi
stop_node 5

# ---- a node of this cluster that speaks another protocol version is refused,
# with a message naming both versions (on both sides), not split off ----
rm -rf "$T/n5"; mkdir -p "$T/n5/models"; cp "$T/n1/bench.json" "$T/n5/"; cp "$T/tiny.gguf" "$T/n5/models/"
NODE_BIN=$HOOKS_BIN RACIMO_TEST_PROTOCOL=1.3 RACIMO_JOIN_TOKEN=$TOKEN start_node 5
id5=$(id_of 5)
if wait_for 10 grep -q "speaks racimo cluster protocol 2\.4, this node 1\.3" "$T/n5.out" && \
   wait_for 5 grep -q "refused .*10.77.0.5.*speaks racimo cluster protocol 1\.3, this node 2\.4" "$T/n1.out" && \
   [ -z "$(state_in 1 "$id5")" ] && n_up 5 1 && n_up 1 4; then
  ok "a node of another protocol major version (1.3 against 2.4) is refused, saying which versions differ"
else bad "version mismatch: $(grep -h "protocol 1.3" "$T/n1.out" "$T/n5.out" | head -n 3)"; fi
stop_node 5

# ---- a member (it holds the token) that claims another node's id is
# refused at its HELLO; the honest node keeps its place ----
rm -rf "$T/n5"; mkdir -p "$T/n5/models"; cp "$T/n1/bench.json" "$T/n5/"
id2=$(id_of 2)
NODE_BIN=$HOOKS_BIN RACIMO_TEST_CLAIM_ID=$id2 RACIMO_JOIN_TOKEN=$TOKEN start_node 5
id5=$(id_of 5)
if wait_for 10 grep -q "refused .*10.77.0.5.*claims node id $id2, its key gives $id5" "$T/n1.out" && \
   [ -z "$(state_in 1 "$id5")" ] && n_up 1 4 && all_see up "$id2" 1 3 4 && \
   [ "$(view 1 | jq -r --arg id "$id2" '.nodes[] | select(.id == $id) | .addresses | join(",")')" = 10.77.0.2 ] && \
   [ "$(ip netns exec "$P-n3" curl -s --max-time 60 http://10.77.0.3:8080/v1/completions \
        -d '{"model":"tiny","prompt":"hello","max_tokens":3,"temperature":0}' | jq '.choices | length')" = 1 ]; then
  ok "a member claiming another node's id is refused and logged; that node stays up, the cluster serves"
else bad "claimed id: $(grep -h "claims node id" "$T"/n[1-4].out | head -n 2); $(view 1 | jq -c '[.nodes[] | {name, state, addresses}]')"; fi
stop_node 5

# ---- a stranger flooding handshakes (tests/cluster/flood.py, no key): the
# nodes keep their links, a restarted node rejoins, the flooded node logs
# the refusals in a few summed-up lines ----
ip netns exec "$P-obs" python3 tests/cluster/flood.py 10.77.0.1 7719 15 >"$T/flood.out" 2>&1 &
flood=$!
sleep 2
stop_node 2 KILL
wait_for $(( (DOWN_MS + SLACK_MS) / 1000 + 1 )) all_see down "$id2" 1 3 4
RACIMO_JOIN_TOKEN=$TOKEN start_node 2 -m "$T/tiny.gguf"
if wait_for 20 eval "all_see up $id2 1 3 4 && n_up 2 4 && n_up 1 4" && kill -0 $flood 2>/dev/null; then
  ok "during a stranger's flood of handshakes the nodes stay linked and a restarted node rejoins"
else bad "flood: $(for i in 1 2 3 4; do digest $i; echo; done) $(cat "$T/flood.out")"; fi
wait $flood
if grep -q "too many connections in handshake: closed one from 10.77.0.9" "$T/n1.out" && \
   wait_for 12 grep -q "connections closed at once .*the last from 10.77.0.9" "$T/n1.out" && \
   [ "$(grep -c "10.77.0.9" "$T/n1.out")" -lt 20 ] && n_up 1 4; then
  ok "the flooded node refused the stranger's connections, logged in a few summed-up lines ($(grep -o "opened: [0-9]*" "$T/flood.out"))"
else bad "flood log: $(grep -c "10.77.0.9" "$T/n1.out") lines; $(grep "10.77.0.9" "$T/n1.out" | head -n 3)"; fi

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

# ---- a rogue mDNS responder (tests/cluster/rogue_mdns.py) on the bridge ----
# It has no key, only what anyone hears: the fingerprint and the ids.
ROGUE_S=12
fp=$(view 1 | jq -r .fingerprint)
id1=$(id_of 1)
ip netns exec "$P-rogue" python3 tests/cluster/rogue_mdns.py "$fp" "$id1" 10.77.0.66 "$ROGUE_S" 300 \
  "$T/rogue.count" >"$T/rogue.log" 2>&1
dials=$(cat "$T/rogue.count" 2>/dev/null || echo missing)
addr_kept=1
for i in 2 3 4; do
  view "$i" | jq -e --arg id "$id1" '(.nodes | length) == 4 and
    (.nodes[] | select(.id == $id) | .addresses == ["10.77.0.1"] and .cluster_port == 7719)' \
    >/dev/null || addr_kept=0
done
if [ "$addr_kept" = 1 ] && n_up 1 4 && n_up 2 4 && n_up 3 4 && n_up 4 4 && wait_for 10 same_views 1 2 3 4; then
  ok "a rogue mDNS responder changes no view: 4 nodes, node 1 still at 10.77.0.1:7719"
else bad "rogue mDNS: views $(for i in 1 2 3 4; do view $i | jq -c '[.nodes[] | {name, addresses, state}]'; done)"; fi
# 300 made-up nodes, 150 of them at the rogue's listener: each node dials
# such addresses at most 4 a second (bursts of 8), whatever the flood
if [[ "$dials" =~ ^[0-9]+$ ]] && [ "$dials" -le $(( 4 * (8 + 4 * (ROGUE_S + 2)) )) ]; then
  ok "the flood of made-up nodes makes no dial storm ($dials connections to the rogue in $ROGUE_S s)"
else bad "dials to the rogue: $dials; $(tail -n 3 "$T/rogue.log")"; fi
logs="$T/n1.out $T/n2.out $T/n3.out $T/n4.out"
if grep -q "mDNS: .*from 10.77.0.66 (IP TTL 64): IP TTL is not 255" $logs && \
   grep -q "mDNS: .*A record from 10.77.0.66 .*127.0.0.1\|mDNS: .*A record from 10.77.0.66 .*10.77.0.255" $logs && \
   grep -q "mDNS: .*and 10.77.0.66 (A) that put node ${id1:0:8} .*at 10.77.0.99:7719: the node is linked" $logs && \
   grep -q "more than 32 nodes not met yet" $logs && \
   ! grep -q "discovered node \(eeeeeeee\|dddddddd\|cccccccc\)" $logs && \
   ! grep -q "$(printf '\033')" $logs; then
  ok "what the rogue sent is refused and logged (TTL 64, loopback/broadcast addresses, a live node moved, the flood), with its escape sequences filtered"
else bad "rogue refusals: $(grep -h "mDNS\|not met yet" $logs | head -n 8)"; fi

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

# ---- a stranger cannot hold back the dials of a known node ----
# Node 4 goes down; the rogue answers for its id with its own address, where
# every handshake fails.  Node 4 comes back knowing nobody (no peers.json, no
# multicast): only the others' dials of its proven address bring it back, and
# they go on at their usual pace (a refused handshake at a node's only
# address would hold them back 30 s).
stop_node 4 KILL
wait_for $(( (DOWN_MS + SLACK_MS) / 1000 + 1 )) all_see down "$id4" 1 2 3
ip netns exec "$P-rogue" python3 tests/cluster/rogue_mdns.py "$fp" "$id4" 10.77.0.66 15 0 \
  "$T/rogue2.count" 10.77.0.66 >"$T/rogue2.log" 2>&1 &
rogue_pid=$!
# every node has tried the rogue's address for node 4 (and had the handshake fail)
rogue_tried_all() {
  local i
  for i in 1 2 3; do grep -q "accepted a connection from 10.77.0.$i\$" "$T/rogue2.log" || return 1; done
}
if wait_for 10 rogue_tried_all; then
  rm -f "$T/n4/peers.json"
  t0=$(now_ms)
  start_node 4 --no-discovery
  if wait_for 10 all_see up "$id4" 1 2 3; then
    ok "a stranger answering for a down node's id (its handshakes failing) does not delay dialling the node where it was proven ($(( $(now_ms) - t0 )) ms)"
  else bad "dials held back: $(for i in 1 2 3; do state_in $i "$id4"; done); $(grep -h "10.77.0.66" "$T/n1.out" | tail -n 3)"; fi
else bad "the nodes never dialled the rogue's address for node 4: $(cat "$T/rogue2.log")"; fi
wait "$rogue_pid" 2>/dev/null
stop_node 4
start_node 4
wait_for 20 eval "all_see up $id4 1 2 3 && n_up 4 4" || bad "node 4 back with discovery"

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

# ---- removing a node: refused everywhere, it cannot rejoin ----
fresh_node5() { rm -rf "$T/n5"; mkdir -p "$T/n5/models"; cp "$T/n1/bench.json" "$T/n5/"; }
fresh_node5
RACIMO_JOIN_TOKEN=$TOKEN start_node 5
id5=$(id_of 5)
if wait_for 20 eval "all_see up $id5 1 2 3 4 && n_up 5 5"; then
  out=$(ip netns exec "$P-n2" "$BIN" nodes remove "${id5:0:8}" --host 10.77.0.2 --port 8080 2>&1)
  if echo "$out" | grep -q "removed node $id5" && \
     wait_for 5 eval "[ -z \"\$(state_in 1 $id5)\$(state_in 2 $id5)\$(state_in 3 $id5)\$(state_in 4 $id5)\" ]" && \
     wait_for 5 grep -q "this node (${id5:0:8}) was removed from the cluster by node $(id_of 2 | cut -c1-8)" "$T/n5.out" && \
     n_up 1 4 && wait_for 5 test -f "$T/n3/revoked.json" && [ "$(stat -c %a "$T/n3/revoked.json")" = 600 ] && \
     view 4 | jq -e --arg id "$id5" '.revoked | map(.id) | index($id) != null' >/dev/null && \
     ip netns exec "$P-n3" "$BIN" nodes --host 10.77.0.3 --port 8080 | grep -q "removed from the cluster (refused everywhere): ${id5:0:8}"; then
    ok "racimo nodes remove: every node drops it and keeps the revocation (revoked.json, 600, listed by racimo nodes); the node logs that it was removed"
  else bad "remove: $out; $(for i in 1 2 3 4; do state_in $i "$id5"; done); $(grep -h removed "$T/n5.out" | head -n 2)"; fi
else bad "remove: node 5 did not join first"; fi
st=$(ip netns exec "$P-n3" curl -s -o /dev/null -w '%{http_code}' -X POST "http://10.77.0.2:8080/v1/cluster/nodes/${id5}/remove")
[ "$st" = 403 ] && ok "another host cannot remove nodes or rotate the key through a node's API (403)" \
  || bad "remove from another host answered $st"
# restarted without its list (a removed node need not cooperate), it dials and is refused
stop_node 5
rm -f "$T/n5/revoked.json"
RACIMO_JOIN_TOKEN=$TOKEN start_node 5 --peer 10.77.0.1:7719
if wait_for 10 grep -q "refused a connection from 10.77.0.5.*(node ${id5:0:8}): that node was removed" "$T/n1.out" && \
   wait_for 5 grep -q "this node (${id5:0:8}) was removed" "$T/n5.out" && \
   [ -z "$(state_in 1 "$id5")" ] && [ -z "$(state_in 3 "$id5")" ] && n_up 1 4; then
  ok "the removed node cannot rejoin: refused at the handshake, told why"
else bad "rejoin after removal: $(for i in 1 2 3 4; do state_in $i "$id5"; done) $(grep -c removed "$T/n1.out")"; fi
stop_node 5

# ---- rotating the cluster key: live members carry over; the old token stops working ----
id4=$(id_of 4)
stop_node 4                         # away during the rotation
wait_for 10 all_see down "$id4" 1 2 3
downs() { cat "$T"/n[123].out | grep -c " is down"; }
d0=$(downs)
NEW=$(ip netns exec "$P-n1" "$BIN" token --rotate --host 10.77.0.1 --port 8080 2>"$T/rotate.err")
same=0
for i in 1 2 3; do [ "$("$BIN" token --state-dir "$T/n$i")" = "$NEW" ] && same=$((same+1)); done
if [[ "$NEW" == racimo1-* ]] && [ "$NEW" != "$TOKEN" ] && [ "$same" = 3 ] && \
   grep -q "every live member carried over" "$T/rotate.err" && \
   [ "$(cut -c1-64 "$T/n4/cluster.key")" = "$TOKEN" ]; then
  ok "racimo token --rotate: a new token, stored by every live member"
else bad "rotate: '$NEW' stored by $same of 3: $(cat "$T/rotate.err")"; fi
sleep $(( DOWN_MS / 1000 + 1 ))
if n_up 1 3 && n_up 2 3 && n_up 3 3 && [ "$(downs)" = "$d0" ] && wait_for 10 same_views 1 2 3; then
  ok "the live members stayed linked through the rotation (no node went down in any view)"
else bad "rotation lost links: downs $d0 -> $(downs); $(for i in 1 2 3; do digest $i; echo; done)"; fi
fresh_node5
RACIMO_JOIN_TOKEN=$TOKEN start_node 5 --peer 10.77.0.1:7719
id5=$(id_of 5)
if wait_for 10 grep -q "refused the node at 10.77.0.1:7719.*authentication failed" "$T/n5.out" && \
   [ -z "$(state_in 1 "$id5")" ] && n_up 5 1 && n_up 1 3; then
  ok "a node started with the old token is refused"
else bad "old token: $(state_in 1 "$id5"); $(grep -h refused "$T/n5.out" | head -n 2)"; fi
stop_node 5
fresh_node5
RACIMO_JOIN_TOKEN=$NEW start_node 5
id5=$(id_of 5)
if wait_for 20 eval "all_see up $id5 1 2 3 && n_up 5 4"; then
  ok "a node started with the new token joins"
else bad "new token: $(for i in 1 2 3; do state_in $i "$id5"; done)"; fi
# the member that was away: refused, and its log says why
start_node 4
if wait_for 10 grep -q "authentication failed.*a member of this cluster: the cluster key may have been rotated" "$T/n4.out" && \
   [ "$(state_in 1 "$id4")" = down ]; then
  ok "a member away during the rotation is refused and logs that the key may have been rotated"
else bad "away member: $(state_in 1 "$id4"); $(grep -h refused "$T/n4.out" | head -n 2)"; fi
stop_node 4
RACIMO_JOIN_TOKEN=$NEW start_node 4
if wait_for 20 eval "all_see up $id4 1 2 3 5 && n_up 4 5"; then
  ok "given the new token, it rejoins as the same node"
else bad "rejoin with the new token: $(for i in 1 2 3 5; do state_in $i "$id4"; done)"; fi
stop_node 5

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
RACIMO_JOIN_TOKEN=$KTOKEN start_node 2 --peer 10.77.0.1 --api-key-file "$T/keys.txt"
NODE_BIN=$HOOKS_BIN RACIMO_TEST_FORWARD_NO_KEY=1 RACIMO_JOIN_TOKEN=$KTOKEN start_node 3 --peer 10.77.0.1 \
  --api-key-file "$T/keys.txt"
RACIMO_JOIN_TOKEN=$KTOKEN start_node 4 --peer 10.77.0.1 --api-key-file "$T/other-keys.txt"
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
