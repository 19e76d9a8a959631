#!/usr/bin/env bash
# tests/cluster/onehop.sh - replicas of a small model reached in one hop in
# a cluster larger than a node's ring neighbours (issue 22).  Real `racimo
# serve` processes with SWIM (the default membership), all on the loopback of one network namespace
# of their own (ports 8001.. HTTP, 9001.. cluster; node 1 is every other
# node's --peer).  Needs root (ip netns); skips without it.
#
#   15 nodes converge and a 16th, the asking node, joins; it links to its
#   --peer (first contact) and its 8 ring neighbours only.  Copies of a model sit on 3 nodes that are
#   not its neighbours; one of them is kept busy (its one slot taken by a
#   long generation).  Every request to the asking node is forwarded in one
#   hop to a copy with a free slot, chosen from the free-slot counts in the
#   SWIM digests (no link to those nodes before), never to the busy copy;
#   each copy's log shows it ran the request for the asking node itself;
#   the asking node ends with far fewer links than the 15 of a full mesh.
#
# Prints "N passed, N failed, N skipped" last.  Logs stay in
# build/onehop-e2e/.  RACIMO_BIN overrides the binary; N the number of
# nodes (default 16, at least 13).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
N=${N:-16}
P=rh$$
LOGS=build/onehop-e2e
MODEL=m24
passed=0 failed=0 skipped=0

source tests/cluster/netns.sh
ns_preflight "one-hop e2e" "curl jq" "$BIN"
[ "$N" -ge 13 ] || { echo "N=$N: needs at least 13 nodes (8 neighbours, node 1 and 3 others)"; echo "0 passed, 1 failed"; exit 1; }

T=$(mktemp -d /tmp/racimo-onehop.XXXXXX)
cleanup() { ns_finish "$LOGS" '*.out'; }
trap cleanup EXIT
trap 'exit 130' INT TERM

NS=$P-lo
ip netns add "$NS"
ip -n "$NS" link set lo up
inns() { ip netns exec "$NS" "$@"; }
api() { echo "http://127.0.0.1:$((8000 + $1))"; }
# v I: node I's view
v() { inns curl -s --max-time 5 "$(api "$1")/v1/cluster"; }
start_node() {  # I [options...]
  local i=$1; shift
  mkdir -p "$T/n$i/models"
  inns "$BIN" serve --host 127.0.0.1 --port $((8000 + i)) --cluster-port $((9000 + i)) \
    --state-dir "$T/n$i" --name "node$i" --no-access-log -t 1 --parallel 1 --ctx-size 2048 \
    "$@" >"$T/n$i.out" 2>&1 &
}
id_of() { cat "$T/n$1/node.id"; }
node_of_id() {  # ID: the index of the node with that id
  local i; for i in $(seq "$N"); do [ "$(id_of "$i")" = "$1" ] && { echo "$i"; return; }; done
}

echo "one-hop e2e: $N nodes on the loopback of namespace $NS, state in $T"
# 24 layers: ~100 tokens/s on one thread, so one long answer keeps a copy
# busy for seconds
"$BIN" make-model --preset tiny --layers 24 --type Q8_0 -o "$T/$MODEL.gguf" >/dev/null 2>&1 ||
  { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }
start_node 1
wait_for 30 grep -q "listening on" "$T/n1.out" || { cat "$T/n1.out"; echo "0 passed, 1 failed"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
# one self-benchmark (node 1's), copied: $N of them would load the machine
wait_for 60 test -s "$T/n1/bench.json"
join() {
  mkdir -p "$T/n$1"; cp "$T/n1/bench.json" "$T/n$1/" 2>/dev/null
  RACIMO_JOIN_TOKEN=$TOKEN start_node "$1" --peer 127.0.0.1:9001
}
all_up() { [ "$(v "$1" | jq '.members_up')" = "$2" ]; }
t0=$(now_ms)
for i in $(seq 2 $((N - 1))); do join "$i"; done
if wait_for 90 eval 'all_up 1 '$((N - 1))' && all_up '$((N - 1)) $((N - 1)); then
  ok "$((N - 1)) nodes with SWIM converge ($(( $(now_ms) - t0 )) ms)"
else bad "convergence: node 1 sees $(v 1 | jq .members_up), node $((N - 1)) sees $(v $((N - 1)) | jq .members_up) of $((N - 1)) up"; fi
# the asking node joins a settled cluster: one link for first contact
# (node 1, its --peer), then its ring neighbours
t0=$(now_ms)
join "$N"
if wait_for 60 eval 'all_up 1 '"$N"' && all_up '"$N $N"; then
  ok "node $N joins: all $N up in its view and node 1's ($(( $(now_ms) - t0 )) ms)"
else bad "join: node 1 sees $(v 1 | jq .members_up), node $N sees $(v "$N" | jq .members_up) of $N up"; fi

# ---- the ring: the asking node's neighbours and the others ----
A=$N
ring=($(for i in $(seq "$N"); do id_of "$i"; done | sort))
for k in "${!ring[@]}"; do [ "${ring[$k]}" = "$(id_of "$A")" ] && at=$k; done
far=()
# (not node 1: every node linked to it first)
for d in $(seq 5 $((N - 5))); do
  i=$(node_of_id "${ring[$(( (at + d) % N ))]}"); [ "$i" != 1 ] && far+=("$i")
done
F1=${far[0]} F2=${far[1]} FB=${far[2]}
echo "  asking node $A; not its neighbours: ${far[*]}; copies on $F1, $F2 and $FB (kept busy)"
for i in "$F1" "$F2" "$FB"; do cp "$T/$MODEL.gguf" "$T/n$i/models/"; done
# each copy loads it (a first request of its own) and serves it
for i in "$F1" "$F2" "$FB"; do
  inns curl -s --max-time 120 "$(api "$i")/v1/completions" \
    -d "{\"model\":\"$MODEL\",\"prompt\":\"hi\",\"max_tokens\":2}" >/dev/null
done
# links the asking node holds now (from == it, open)
a_links() { v "$A" | jq --arg a "$(id_of "$A")" '[.links[] | select(.from == $a and .linked != false)] | length'; }
linked_to() { v "$A" | jq -e --arg a "$(id_of "$A")" --arg b "$(id_of "$1")" \
  '[.links[] | select(.from == $a and .to == $b and .linked != false)] | length > 0' >/dev/null; }
# free slots of node I in the asking node's view ("" when not serving)
free_in_a() { v "$A" | jq -r --arg b "$(id_of "$1")" --arg m "$MODEL" \
  '.nodes[] | select(.id == $b) | .serving_free[$m] // empty'; }
from_digest() { v "$A" | jq -e --arg b "$(id_of "$1")" '.nodes[] | select(.id == $b) | .from_digest == true' >/dev/null; }
if wait_for 60 eval '[ "$(free_in_a '"$F1"')" = 1 ] && [ "$(free_in_a '"$F2"')" = 1 ] && [ "$(free_in_a '"$FB"')" = 1 ]'; then
  ok "the asking node sees the 3 copies and their free slots"
else bad "copies in node $A's view: free $(free_in_a "$F1")/$(free_in_a "$F2")/$(free_in_a "$FB")"; fi
if from_digest "$F1" && from_digest "$F2" && from_digest "$FB" &&
   ! linked_to "$F1" && ! linked_to "$F2" && ! linked_to "$FB"; then
  ok "...from the SWIM digests: no link to any of them"
else bad "node $A's view of the copies: digest $(from_digest "$F1" && echo y)/$(from_digest "$F2" && echo y)/$(from_digest "$FB" && echo y), linked $(linked_to "$F1" && echo y)/$(linked_to "$F2" && echo y)/$(linked_to "$FB" && echo y)"; fi

# ---- one copy busy: its one slot taken by a long answer ----
inns curl -s -N --max-time 300 "$(api "$FB")/v1/completions" \
  -d "{\"model\":\"$MODEL\",\"prompt\":\"busy\",\"max_tokens\":1900,\"ignore_eos\":true,\"stream\":true}" \
  >"$T/busy.out" 2>&1 &
BUSY=$!
if wait_for 30 eval '[ "$(free_in_a '"$FB"')" = 0 ]'; then
  ok "the busy copy's free slots reach the asking node as 0"
else bad "busy copy: free $(free_in_a "$FB") in node $A's view"; fi
# requests to the asking node, one at a time, while the copy stays busy
sent=0 answered=0
for k in $(seq 8); do
  kill -0 "$BUSY" 2>/dev/null || break
  sent=$((sent + 1))
  out=$(inns curl -s --max-time 60 "$(api "$A")/v1/completions" \
    -d "{\"model\":\"$MODEL\",\"prompt\":\"question $k\",\"max_tokens\":4,\"temperature\":0}")
  [ "$(jq -r '.choices[0].text | type' <<<"$out" 2>/dev/null)" = string ] && answered=$((answered + 1))
done
still_busy=$(kill -0 "$BUSY" 2>/dev/null && echo yes || echo no)
kill "$BUSY" 2>/dev/null; wait "$BUSY" 2>/dev/null
to() { grep -c "forward: /v1/completions for $MODEL to node $(id_of "$1" | cut -c1-8)" "$T/n$A.out"; }
ran() { grep -c "forward: running /v1/completions for node $(id_of "$A" | cut -c1-8)" "$T/n$1.out"; }
echo "  $answered of $sent answered; forwarded to $F1: $(to "$F1"), $F2: $(to "$F2"), busy $FB: $(to "$FB"); ran for node $A: $(ran "$F1")/$(ran "$F2")/$(ran "$FB"); busy all along: $still_busy"
if [ "$sent" -ge 4 ] && [ "$answered" = "$sent" ] && [ "$still_busy" = yes ] &&
   [ "$(to "$FB")" = 0 ] && [ $(( $(to "$F1") + $(to "$F2") )) = "$sent" ] &&
   [ "$(ran "$F1")" = "$(to "$F1")" ] && [ "$(ran "$F2")" = "$(to "$F2")" ] && [ "$(ran "$FB")" = 0 ]; then
  ok "every request to node $A answered in one hop by a copy with a free slot, none by the busy copy"
else bad "one hop: $answered of $sent answered, forwarded $(to "$F1")/$(to "$F2")/busy $(to "$FB"), ran $(ran "$F1")/$(ran "$F2")/$(ran "$FB"), busy all along: $still_busy"; fi
if ! grep -q "forward: /v1/completions for $MODEL to node" "$T/n$F1.out" "$T/n$F2.out"; then
  ok "the copies ran what they were sent (no second hop)"
else bad "a copy forwarded again: $(grep -h "forward: /v1/completions" "$T/n$F1.out" "$T/n$F2.out" | head -3)"; fi
# its open links: ring neighbours, node 1 (first contact, closed once idle
# 60 s) and the two copies it forwarded to (on demand); nothing else.  A link
# shows in its view once it has measured it: the dialler's first ping goes
# out up to a heartbeat (1 s) after a forward opened the link, so wait for it
near=" $(for d in 1 2 3 4; do id_of "$(node_of_id "${ring[$(( (at + d) % N ))]}")"; \
         id_of "$(node_of_id "${ring[$(( (at - d + N) % N ))]}")"; done | tr '\n' ' ')"
a_links_ok() {
  others=""
  for b in $(v "$A" | jq -r --arg a "$(id_of "$A")" '.links[] | select(.from == $a and .linked != false) | .to'); do
    case "$near $(id_of 1) $(id_of "$F1") $(id_of "$F2")" in *"$b"*) ;; *) others="$others $(node_of_id "$b")";; esac
  done
  links=$(a_links)
  [ -n "$links" ] && [ "$links" -le 11 ] && [ -z "$others" ] && linked_to "$F1" && linked_to "$F2" &&
    ! linked_to "$FB"
}
if wait_for 10 a_links_ok; then
  ok "the asking node holds $links links (neighbours, its --peer, the 2 copies asked), not the $((N - 1)) of a full mesh"
else bad "the asking node holds ${links:-?} links (of $((N - 1)) nodes); to others than neighbours, node 1 and the copies asked:${others:- none}; to the copies asked: $(linked_to "$F1" && echo yes || echo no)/$(linked_to "$F2" && echo yes || echo no); to the busy copy: $(linked_to "$FB" && echo yes || echo no)"; fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
