#!/usr/bin/env bash
# tests/cluster/pull.sh - one `racimo pull` for a whole cluster: three nodes
# in network namespaces (tests/cluster/netns.sh) and a fake Hugging Face Hub
# (tests/e2e/fake_hub.mjs) in a fourth.  Node 1 pulls a split model from the
# Hub (its 3 parts kept as published); the model then runs split over the
# three nodes (--min-nodes 3), nodes 2 and 3 taking the bytes of their
# layers from node 1 over the LAN (node 1 serves the set as its joined
# file).  The
# Hub's access log must show every byte of every part served once: nothing
# was fetched twice from the internet's stand-in.  Then `racimo pull
# --everywhere` of a second model on node 1 leaves a whole verified copy on
# node 2, copied peer to peer, while node 3, whose models folder is a small
# tmpfs, is skipped with a message naming it and keeps nothing of it; the
# Hub still served each byte once.  Last, a model two nodes hold (1 and 3)
# is copied to node 2, which reads pieces of it from both.
#
# Prints "N passed, N failed, N skipped" last; logs stay in build/pull-e2e/.
# Usage: tests/cluster/pull.sh (RACIMO_BIN).
set -u
cd "$(dirname "$0")/../.."
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
P=rq$$
LOGS=build/pull-e2e
passed=0 failed=0

source tests/cluster/netns.sh
ns_preflight "pull e2e" "curl jq node" "$BIN"

T=$(mktemp -d /tmp/racimo-pull.XXXXXX)
cleanup() { umount "$T/n3/models" 2>/dev/null; ns_finish "$LOGS" '*.out' '*.log'; }
trap cleanup EXIT
trap 'exit 130' INT TERM


start_node() {
  local i=$1; shift
  ip netns exec "$P-n$i" "$BIN" serve --host "10.77.0.$i" --port 8080 \
    --state-dir "$T/n$i" --name "node$i" --no-access-log -t 1 --down-after 1500 \
    --parallel 2 --ctx-size 256 ${MESH_ARG:-} "$@" >>"$T/n$i.out" 2>&1 &
  wait_for 20 grep -q "listening on" "$T/n$i.out" || { tail -5 "$T/n$i.out"; return 1; }
}

echo "pull e2e: namespaces $P-*, state in $T"
# the model, as the Hub would hold it: 3 parts (and the whole, to compare)
"$BIN" make-model --preset tiny --layers 6 --type Q8_0 -o "$T/whole.gguf" >/dev/null 2>&1 &&
"$BIN" make-model --preset tiny --layers 6 --type Q8_0 --split 3 -o "$T/m-Q8_0.gguf" >/dev/null 2>&1 &&
"$BIN" make-model --preset tiny --layers 3 --type F16 -o "$T/e-F16.gguf" >/dev/null 2>&1 &&
"$BIN" make-model --preset tiny --layers 12 --type F32 -o "$T/big.gguf" >/dev/null 2>&1 ||
  { echo "make-model failed"; echo "0 passed, 1 failed"; exit 1; }
ns_bridge
for i in 1 2 3 20; do ns_host "n$i" "$i"; done
for i in 1 2 3; do mkdir -p "$T/n$i/models"; done
# node 3's models folder: 64 MiB, room for its layers of m-Q8_0 and for
# big.gguf, not for a whole copy with the 64 MiB margin a copy keeps free
mount -t tmpfs -o size=64m tmpfs "$T/n3/models" ||
  { echo "cannot mount a tmpfs"; echo "0 passed, 1 failed"; exit 1; }

# the Hub, at 10.77.0.20, logging every byte range its CDN sends
ip netns exec "$P-n20" node tests/e2e/fake_hub.mjs 10.77.0.20 "$T/cdn.log" \
  "$T"/m-Q8_0-0000{1,2,3}-of-00003.gguf "$T/e-F16.gguf" >"$T/hub.out" 2>&1 &
wait_for 20 grep -q "^ready " "$T/hub.out" || { cat "$T/hub.out"; echo "0 passed, 1 failed"; exit 1; }
HUB=$(sed -n 's/^ready //p' "$T/hub.out")

start_node 1 --min-nodes 3 || { bad "node 1 starts"; echo "$passed passed, $failed failed"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
for i in 2 3; do RACIMO_JOIN_TOKEN=$TOKEN start_node "$i" --peer 10.77.0.1; done
wait_for 20 n_up 1 3 || bad "three nodes up"

# ---- one pull, on node 1 ----
same_parts() { for i in 1 2 3; do cmp -s "$T/n1/models/m-Q8_0-0000$i-of-00003.gguf" "$T/m-Q8_0-0000$i-of-00003.gguf" || return 1; done; }
if ip netns exec "$P-n1" env HF_ENDPOINT="$HUB" "$BIN" pull hf.co/test/model:q8_0 \
     --models-dir "$T/n1/models" >"$T/pull.out" 2>"$T/pull.log" &&
   [ "$(cat "$T/pull.out")" = m-Q8_0 ] && same_parts; then
  ok "racimo pull on node 1: the 3 parts verified and kept as published"
else bad "racimo pull on node 1: $(tail -3 "$T/pull.log")"; fi
[ -z "$(ls -A "$T/n1/models" | grep -v '^m-Q8_0-0000[123]-of-00003.gguf$')" ] && ok "nothing but the model's parts in the models folder" ||
  bad "left in the models folder: $(ls -A "$T/n1/models")"

# ---- node 1 lists it; the model runs on the three nodes ----
lists() { view "$1" | jq -e '.nodes[] | select(.name == "node1" and .state == "up") | .models[] | select(.name == "m-Q8_0")' >/dev/null; }
wait_for 30 lists 3 && ok "node 3 sees the pulled model in node 1's list" || bad "node 3 sees the model"
answer=$(ip netns exec "$P-n1" curl -s --max-time 120 "http://10.77.0.1:8080/v1/completions" \
  -d '{"model":"m-Q8_0","prompt":"hello","max_tokens":8,"temperature":0}' | jq -r '.choices[0].text // .error.message')
stages=$(view 1 | jq '[.models[] | select(.name == "m-Q8_0") | .plan.stages[]] | length')
nodes=$(view 1 | jq '[.models[] | select(.name == "m-Q8_0") | .plan.stages[].name] | unique | length')
if [ "$stages" = 3 ] && [ "$nodes" = 3 ] && [ -n "$answer" ] && ! grep -qi error <<<"$answer"; then
  ok "the model runs split over the 3 nodes and answers"
else bad "split over 3 nodes: stages=$stages nodes=$nodes answer=$answer"; fi
for i in 2 3; do
  f=$(ls "$T/n$i/models/" 2>/dev/null | grep '^m-Q8_0' | head -1)
  [ -n "$f" ] && ok "node $i holds the bytes of its layers, from the LAN ($f)" || bad "node $i has no copy"
done
# the ranges node 2 holds are those of the joined file (whole.gguf): the
# set and its joined file are one content
if ip netns exec "$P-n2" curl -s --max-time 60 "http://10.77.0.2:8080/v1/models/copy" -d '{"model":"m-Q8_0"}' >/dev/null &&
   wait_for 60 cmp -s "$T/n2/models/m-Q8_0.gguf" "$T/whole.gguf"; then
  ok "node 2's copy of the split set is the joined file, byte for byte"
else bad "node 2's whole copy of m-Q8_0: $(ls "$T/n2/models")"; fi

# ---- --everywhere: a whole copy on every node with room, peer to peer ----
ip netns exec "$P-n1" env HF_ENDPOINT="$HUB" "$BIN" pull test/model --file e-F16.gguf \
  --everywhere --url http://10.77.0.1:8080 --models-dir "$T/n1/models" >"$T/every.out" 2>"$T/every.log"
every_rc=$?
if [ "$every_rc" = 0 ] && cmp -s "$T/n2/models/e-F16.gguf" "$T/e-F16.gguf"; then
  ok "racimo pull --everywhere: node 2 holds a whole verified copy"
else bad "racimo pull --everywhere (exit $every_rc): $(tail -3 "$T/every.log")"; fi
if grep -q "node3 was skipped: no room in $T/n3/models for e-F16" "$T/every.log"; then
  ok "node 3 (a small tmpfs) is skipped with a message naming it"
else bad "node 3 skipped: $(grep -i node3 "$T/every.log" | tail -2)"; fi
left=$(ls -A "$T/n3/models" | grep '^e-F16')
[ -z "$left" ] && ok "nothing of the copy is left on node 3" || bad "left on node 3: $left"
wait_for 20 bash -c "$(declare -f view); P=$P; view 1 | jq -e '[.nodes[] | select(.models[]?.name == \"e-F16\")] | length == 2' >/dev/null" &&
  ok "nodes 1 and 2 list e-F16" || bad "nodes 1 and 2 list e-F16"
# the copy was checked against the sha256 node 1 verified from the Hub, and keeps it
want=$(sha256sum "$T/e-F16.gguf" | cut -c1-64)
sha2() { [ "$(view 2 | jq -r '.nodes[] | select(.name == "node2") | .models[] | select(.name == "e-F16") | .sha256')" = "$want" ]; }
wait_for 30 sha2 && ok "node 2's copy lists the Hub's sha256, checked after the copy" ||
  bad "node 2's sha256 of e-F16: $(view 2 | jq -c '.nodes[] | select(.name == "node2") | .models')"

# ---- two holders: node 2 copies pieces from both ----
cp "$T/big.gguf" "$T/n1/models/big.gguf" && cp "$T/big.gguf" "$T/n3/models/big.gguf"
holders() { view 2 | jq -e '[.nodes[] | select(.state == "up" and (.models[]?.name == "big"))] | length == 2' >/dev/null; }
wait_for 30 holders || bad "node 2 sees nodes 1 and 3 list big"
copied() { cmp -s "$T/n2/models/big.gguf" "$T/big.gguf"; }
code=$(ip netns exec "$P-n2" curl -s -o "$T/copy.out" -w '%{http_code}' --max-time 10 \
  "http://10.77.0.2:8080/v1/models/copy" -d '{"model":"big"}')
if [ "$code" = 202 ] && wait_for 120 copied; then
  ok "node 2 copies big from the two nodes that hold it"
else bad "copy of big to node 2: HTTP $code $(cat "$T/copy.out")"; fi
line=$(grep "pulled .* of 'big' from" "$T/n2.out" | tail -1)
if grep -q "(node1).*, node .* (node3)\|(node3).*, node .* (node1)" <<<"$line"; then
  ok "node 2's bytes of big came from both holders: ${line#*from }"
else bad "bytes from both holders: $line"; fi
state=$(ip netns exec "$P-n2" curl -s --max-time 5 "http://10.77.0.2:8080/v1/models/copies" |
        jq -r '.copies[] | select(.model == "big") | "\(.node) \(.state)"')
[ "$state" = "node2 done" ] && ok "GET /v1/models/copies says node2 done" || bad "copies: $state"

# ---- the Hub served each byte once ----
# every range of the CDN log, by file: sorted, they must tile [0, size) exactly
tiled=1
for part in "$T"/m-Q8_0-0000{1,2,3}-of-00003.gguf "$T/e-F16.gguf"; do
  name=$(basename "$part") size=$(stat -c %s "$part")
  got=$(jq -r --arg f "$name" 'select(.file == $f) | "\(.start) \(.end)"' "$T/cdn.log" | sort -n |
        awk -v size="$size" 'BEGIN { at = 0; ok = 1 } { if ($1 != at) ok = 0; at = $2 } END { print (ok && at == size) ? "once" : "not once" }')
  [ "$got" = once ] || { tiled=0; echo "  $name: $(jq -c --arg f "$name" 'select(.file == $f)' "$T/cdn.log" | tr '\n' ' ')"; }
done
total=$(jq -s 'map(.end - .start) | add' "$T/cdn.log")
parts=$(cat "$T"/m-Q8_0-0000{1,2,3}-of-00003.gguf "$T/e-F16.gguf" | wc -c)
if [ "$tiled" = 1 ] && [ "$total" = "$parts" ]; then
  ok "the Hub's access log shows each byte served once ($total bytes for 3 nodes, 2 models)"
else bad "bytes served: $total for $parts bytes of parts"; fi

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" = 0 ]
