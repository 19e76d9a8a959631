#!/usr/bin/env bash
# bench/pipeline.sh - one model on one node against the same model split
# over two nodes (a 2-stage pipeline), with the link between the two nodes
# emulated as none / 10 GbE / 1 GbE.  Not a test: prints tables for
# BENCHMARKS.md ("Pipeline across nodes").
#
#   bench/pipeline.sh [MODEL.gguf]      (root: network namespaces)
#
# The default model is /tmp/l1b-q4_0.gguf, made when missing with
# `racimo make-model --preset llama3-1b --type Q4_0` (random weights); it is
# hard-linked into each node's models folder, so it must be on the same file
# system as /tmp.
#
# Environment: REPS (2), TOKENS per stream (128), STREAMS (8), PROFILES
# ("none 10g 1g"), WIRE (f16), PARALLEL (8), CTX (1024), SPLIT (layers: a
# 2-stage pipeline; tensor: 2 tensor-parallel shards), RACIMO_BIN,
# RELAY_OPTS (more racimo-relay flags, e.g. "-s 0": no spinning), and the
# nodes' own (RACIMO_DATA_CHANNELS=0: shards' parts on the cluster link).
#
# Network (namespaces named $P-*, nothing in the machine's own namespace):
#
#   ref (10.77.0.9, --no-cluster)
#   node1 10.77.0.1 --[bridge]-- 10.77.0.254 relay 10.78.0.254 -- 10.78.0.2 node2
#
# node1 and node2 sit on two subnets with no route between them (the relay's
# namespace does not forward), so the only path is the relay
# (bench/relay.c): it listens on 10.77.0.254:7719 (to node2's cluster port)
# and 10.78.0.254:7719 (to node1's), and each node advertises the relay's
# address on the other side (--advertise), so whichever node dials, the
# link crosses the relay.  The relay delays each direction (DELAY us after
# a chunk was read) and serialises it at the link's rate; its byte counters
# give the bytes per token per hop.  Every node runs 1 thread (-t 1).
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
MODEL_FILE=${1:-/tmp/l1b-q4_0.gguf}
REPS=${REPS:-2} TOKENS=${TOKENS:-128} STREAMS=${STREAMS:-8} WIRE=${WIRE:-f16}
PROFILES=${PROFILES:-"none 10g 1g"} PARALLEL=${PARALLEL:-8} CTX=${CTX:-1024}
SPLIT=${SPLIT:-layers}
RELAY=build/rel/racimo-relay
P=rb$$

[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || { echo "bench/pipeline.sh: needs root and iproute2 (network namespaces)"; exit 1; }
for tool in curl jq cc; do command -v $tool >/dev/null || { echo "bench/pipeline.sh: $tool missing"; exit 1; }; done
[ -x "$BIN" ] || { echo "bench/pipeline.sh: $BIN not built (make)"; exit 1; }
if [ ! -f "$MODEL_FILE" ] && [ $# -eq 0 ]; then   # the default: the synthetic 1B model (~0.7 GB)
  "$BIN" make-model --preset llama3-1b --type Q4_0 -o "$MODEL_FILE" >/dev/null || exit 1
fi
[ -f "$MODEL_FILE" ] || { echo "bench/pipeline.sh: no model $MODEL_FILE"; exit 1; }
MODEL_FILE=$(realpath "$MODEL_FILE")
if [ ! -x "$RELAY" ] || [ bench/relay.c -nt "$RELAY" ]; then
  mkdir -p build/rel
  cc -std=c11 -O2 -Wall -Wextra -Werror -o "$RELAY" bench/relay.c || exit 1
fi
RELAY=$(realpath "$RELAY")
MODEL=$(basename "$MODEL_FILE" .gguf)

T=$(mktemp -d /tmp/racimo-bench-pipeline.XXXXXX)
source tests/cluster/netns.sh
cleanup() { ns_cleanup; rm -rf "$T"; }
trap cleanup EXIT
trap 'exit 130' INT TERM


# ---- namespaces ----
ns_bridge
ns_host n1 1
ns_host n9 9
ns_host rl 254
ip netns add "$P-n2"
ip -n "$P-n2" link set lo up
ip -n "$P-n2" link add eth0 type veth peer name eth1 netns "$P-rl"
ip -n "$P-n2" addr add 10.78.0.2/24 dev eth0
ip -n "$P-n2" link set eth0 up
ip -n "$P-rl" addr add 10.78.0.254/24 dev eth1
ip -n "$P-rl" link set eth1 up
ip netns exec "$P-rl" sysctl -qw net.ipv4.ip_forward=0
if ip netns exec "$P-n2" ping -c1 -W1 10.77.0.1 >/dev/null 2>&1; then
  echo "bench/pipeline.sh: node2 reaches node1 without the relay; refusing to measure"; exit 1
fi

# the model in every node's folder by hard link (one page cache for all)
for i in 1 2 9; do
  mkdir -p "$T/n$i/models"
  ln "$MODEL_FILE" "$T/n$i/models/$MODEL.gguf" ||
    { echo "bench/pipeline.sh: cannot hard-link $MODEL_FILE into $T (same file system needed)"; exit 1; }
done

COMMON=(--port 8080 --no-access-log -t 1 --parallel "$PARALLEL" --ctx-size "$CTX")
start_ref() {
  ip netns exec "$P-n9" "$BIN" serve --host 10.77.0.9 --no-cluster --models-dir "$T/n9/models" \
    "${COMMON[@]}" >"$T/ref.out" 2>&1 &
  echo $! >"$T/ref.pid"
  wait_for 30 grep -q "listening on" "$T/ref.out" || { tail -5 "$T/ref.out"; exit 1; }
}
# profile: delay (us, one way) and rate of the emulated link
profile_args() {
  case $1 in
    none) echo "-d 0" ;;
    10g)  echo "-d 50 -r 10gbit" ;;
    1g)   echo "-d 200 -r 1gbit" ;;
    *) echo "unknown profile $1" >&2; exit 1 ;;
  esac
}
start_pair() {
  # the relay gets a real-time priority where allowed: an emulated wire
  # should not queue behind the nodes for a CPU (see BENCHMARKS.md)
  local rt=; command -v chrt >/dev/null && rt="chrt -f 20"
  # shellcheck disable=SC2046
  ip netns exec "$P-rl" $rt "$RELAY" -c $(profile_args "$1") ${RELAY_OPTS:-} \
    10.77.0.254:7719=10.78.0.2:7719 10.78.0.254:7719=10.77.0.1:7719 >>"$T/relay.out" 2>"$T/relay.err" &
  echo $! >"$T/relay.pid"
  wait_for 5 grep -q "^relay: 10.78.0.254:7719" "$T/relay.err" || { cat "$T/relay.err"; exit 1; }
  : >"$T/n1.out"; : >"$T/n2.out"
  ip netns exec "$P-n1" "$BIN" serve --host 10.77.0.1 --advertise 10.78.0.254 --no-discovery \
    --state-dir "$T/n1" --name node1 --min-nodes 2 --split "$SPLIT" --pipeline-wire "$WIRE" "${COMMON[@]}" >>"$T/n1.out" 2>&1 &
  echo $! >"$T/n1.pid"
  wait_for 30 grep -q "listening on" "$T/n1.out" || { tail -5 "$T/n1.out"; exit 1; }
  local token; token=$("$BIN" token --state-dir "$T/n1")
  RACIMO_JOIN_TOKEN=$token ip netns exec "$P-n2" "$BIN" serve --host 10.78.0.2 --advertise 10.77.0.254 --no-discovery \
    --state-dir "$T/n2" --name node2 --peer 10.78.0.254:7719 \
    "${COMMON[@]}" >>"$T/n2.out" 2>&1 &
  echo $! >"$T/n2.pid"
  wait_for 30 grep -q "listening on" "$T/n2.out" || { tail -5 "$T/n2.out"; exit 1; }
  wait_for 30 n_up 2 || { echo "the two nodes did not link through the relay"; tail -5 "$T/n1.out" "$T/n2.out" "$T/relay.err"; exit 1; }
}
stop() { local pid; pid=$(cat "$T/$1.pid"); kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }

# cpu NAME: CPU seconds a process used so far (user + system), and those of
# its busiest thread: where the two vCPUs went besides the compute threads
cpu() {
  local pid hz; pid=$(cat "$T/$1.pid"); hz=$(getconf CLK_TCK)
  awk -v hz="$hz" -v name="$1" '{ sub(/.*\) /, ""); t = ($12 + $13) / hz; sum += t; if (t > top) top = t }
    END { printf "%s %.1f s (busiest thread %.1f s)", name, sum, top }' /proc/"$pid"/task/*/stat 2>/dev/null
}

view() { ip netns exec "$P-n1" curl -s --max-time 2 "http://10.77.0.1:8080/v1/cluster"; }
n_up() { [ "$(view | jq '[.nodes[] | select(.state == "up")] | length')" = "$1" ]; }

# relay counters, node1->node2 then node2->node1 (whoever dialled):
# "total_bytes small_record_bytes small_records" each (relay.c -c)
relay_bytes() {
  local pid; pid=$(cat "$T/relay.pid")
  : >"$T/relay.out"     # the relay appends (O_APPEND): no hole before its next lines
  kill -USR1 "$pid"
  wait_for 2 grep -q "^relay 10.78.0.254" "$T/relay.out"
  awk '{ for (i = 3; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
       /^relay 10.77.0.254/ { for (k in v) a[k] = v[k] }
       /^relay 10.78.0.254/ { for (k in v) b[k] = v[k] }
       END { printf "%d %d %d %d %d %d\n",
               a["to_bytes"] + b["back_bytes"], a["to_small_bytes"] + b["back_small_bytes"],
               a["to_small_recs"] + b["back_small_recs"],
               a["back_bytes"] + b["to_bytes"], a["back_small_bytes"] + b["to_small_bytes"],
               a["back_small_recs"] + b["to_small_recs"] }' "$T/relay.out"
}

# complete NS IP PROMPT N: one greedy completion; prints the JSON
complete() {
  ip netns exec "$1" curl -s --max-time 900 "http://$2:8080/v1/completions" \
    -d "{\"model\":\"$MODEL\",\"prompt\":\"$3\",\"max_tokens\":$4,\"temperature\":0,\"ignore_eos\":true}"
}
PROMPTS=("Once upon a time" "The capital of France is" "In a distant galaxy" "def fibonacci(n):"
         "The weather today" "My favourite recipe" "A short poem about" "Breaking news from")

# concurrent NAME NS IP N: N streams at once; prints the aggregate tokens/s
concurrent() {
  local name=$1 ns=$2 ip=$3 n=$4 k ok t0 t1 pids=()
  t0=$(now_ms)
  for ((k = 0; k < n; k++)); do
    complete "$ns" "$ip" "${PROMPTS[k % ${#PROMPTS[@]}]}" "$TOKENS" >"$T/conc$k" &
    pids+=($!)
  done
  wait "${pids[@]}"
  t1=$(now_ms)
  ok=0
  for ((k = 0; k < n; k++)); do
    [ "$(jq '.usage.completion_tokens' "$T/conc$k")" = "$TOKENS" ] && ok=$((ok + 1))
  done
  [ "$ok" = "$n" ] || { echo "$name: only $ok of $n streams gave $TOKENS tokens: $(head -c 300 "$T/conc0")" >&2; return 1; }
  awk -v n=$((n * TOKENS)) -v ms=$((t1 - t0)) 'BEGIN { printf "%.3f", n / (ms / 1000) }'
}

# measure NAME NS IP [relay]: single stream, then STREAMS concurrent;
# appends to $T/results "NAME single_tps single_wall_tps agg_tps" then, for
# the hop stage 0 -> stage 1 (hidden states) and the hop back (the next
# batch's token ids), "total_bytes small_record_bytes small_records" during
# the single stream (idle traffic subtracted), then "gen_tokens
# prompt_tokens micro_batches agg_half_streams"
measure() {
  local name=$1 ns=$2 ip=$3 relay=${4:-}
  local j t0 t1 tok
  j=$(complete "$ns" "$ip" "hello" 8)                 # warm-up: places and loads the stages
  [ "$(jq '.usage.completion_tokens' <<<"$j")" = 8 ] || { echo "$name: warm-up failed: $j"; exit 1; }
  local b0 b1 i0 i1 hop="0 0 0 0 0 0"
  if [ -n "$relay" ]; then                            # idle traffic (heartbeats, STATEs) for 3 s
    i0=$(relay_bytes); sleep 3; i1=$(relay_bytes)
    b0=$(relay_bytes)
  fi
  t0=$(now_ms)
  j=$(complete "$ns" "$ip" "${PROMPTS[0]}" "$TOKENS")
  t1=$(now_ms)
  tok=$(jq '.usage.completion_tokens' <<<"$j")
  [ "$tok" = "$TOKENS" ] || { echo "$name: single stream gave $tok tokens: $j"; exit 1; }
  local single wall_tps prompt_n
  single=$(jq '.timings.predicted_per_second' <<<"$j")
  prompt_n=$(jq '.usage.prompt_tokens' <<<"$j")
  wall_tps=$(awk -v n="$TOKENS" -v ms=$((t1 - t0)) 'BEGIN { printf "%.3f", n / (ms / 1000) }')
  if [ -n "$relay" ]; then
    b1=$(relay_bytes)
    # stages go in node id order: when node2 is stage 0 the hidden states
    # flow node2 -> node1 (node1, the head, is then the last stage)
    local swap=0
    [ "$(view | jq -r '.pipelines.instances[0].stages[0].node')" != "$(cat "$T/n1/node.id")" ] && swap=1
    hop=$(awk -v b0="$b0" -v b1="$b1" -v i0="$i0" -v i1="$i1" -v s=$(( t1 - t0 )) -v swap=$swap 'BEGIN {
      split(b0, x); split(b1, y); split(i0, u); split(i1, w)
      for (k = 1; k <= 6; k++) d[k] = (y[k] - x[k]) - (w[k] - u[k]) * s / 3000
      if (swap) for (k = 1; k <= 3; k++) { t = d[k]; d[k] = d[k + 3]; d[k + 3] = t }
      printf "%d %d %d %d %d %d", d[1], d[2], d[3], d[4], d[5], d[6] }')
    echo "  $name idle link traffic (bytes/s, node1->node2 and back): $(awk -v a="$i0" -v b="$i1" 'BEGIN { split(a, x); split(b, y); printf "%d, %d", (y[1] - x[1]) / 3, (y[4] - x[4]) / 3 }')" >&2
  fi
  local batches0=0 batches1=0
  [ -n "$relay" ] && batches0=$(view | jq '[.pipelines.instances[].batches] | add // 0')
  local agg half=0
  agg=$(concurrent "$name" "$ns" "$ip" "$STREAMS") || exit 1
  [ -n "$relay" ] && batches1=$(view | jq '[.pipelines.instances[].batches] | add // 0')
  # one node with half the streams: the batch size each stage of the
  # pipeline computes (its micro-batch), for reading the ratio
  [ -z "$relay" ] && { half=$(concurrent "$name" "$ns" "$ip" $((STREAMS / 2))) || exit 1; }
  echo "$name $single $wall_tps $agg $hop $TOKENS $prompt_n $((batches1 - batches0)) $half" >>"$T/results"
  printf '  %-6s single %.2f tok/s (decode; %.2f wall)  %d streams %.2f tok/s' "$name" "$single" "$wall_tps" "$STREAMS" "$agg" >&2
  [ -n "$relay" ] && awk -v h="$hop" -v n=$((TOKENS - 1)) -v mb=$((batches1 - batches0)) 'BEGIN { split(h, d)
    printf "  per decode step: stage 0->1 %.0f bytes in %.2f records (%.0f with prompt and probes), back %.0f in %.2f (%.0f); %d micro-batches",
      d[2] / n, d[3] / n, d[1] / n, d[5] / n, d[6] / n, d[4] / n, mb }' >&2
  [ -z "$relay" ] && printf '  %d streams %.2f tok/s' $((STREAMS / 2)) "$half" >&2
  echo >&2
}

# One self-benchmark for both nodes.  Placement shares the layers in
# proportion to memory x measured memory bandwidth; two nodes started at
# once each benchmark themselves at the same time, on the same 2 cores, and
# measured 12.6 and 35.0 GB/s here, which put 4 of 16 layers on one node
# and 12 on the other.  Both nodes are this machine, so node1's measurement
# (taken alone) is given to both: the split is then even, as for two equal
# machines.
ip netns exec "$P-n1" "$BIN" serve --host 10.77.0.1 --no-discovery --state-dir "$T/n1" --name node1 \
  "${COMMON[@]}" >"$T/bench.out" 2>&1 &
echo $! >"$T/n1.pid"
wait_for 60 test -f "$T/n1/bench.json" || { echo "no self-benchmark: $(tail -3 "$T/bench.out")"; exit 1; }
stop n1
cp "$T/n1/bench.json" "$T/n2/bench.json"
echo "self-benchmark for both nodes: $(jq -c '{mem_bandwidth, matmul_gflops}' "$T/n1/bench.json")" >&2

echo "bench: model $MODEL_FILE, $TOKENS tokens per stream, $STREAMS streams, wire $WIRE, split $SPLIT, reps $REPS, profiles $PROFILES" >&2
: >"$T/results"
for ((rep = 1; rep <= REPS; rep++)); do
  echo "rep $rep" >&2
  start_ref
  measure ref "$P-n9" 10.77.0.9
  stop ref
  for prof in $PROFILES; do
    start_pair "$prof"
    if [ "$rep" = 1 ]; then   # the link as the cluster measures it (its probes cross the relay)
      sleep 3
      echo "  $prof: the cluster's link probes: $(view | jq -r '[.links[] | "\(.from[0:4])->\(.to[0:4]) rtt \(.rtt_ms * 1000 | floor) us"] | join(", ")')" >&2
    fi
    measure "$prof" "$P-n1" 10.77.0.1 relay
    [ "$rep" = 1 ] && echo "  $prof: stages $(view | jq -r '[.pipelines.instances[0].stages[] | "\(.node[0:4]) layers \(.first)-\(.last - 1)"] | join(", ")')" >&2
    n_stages=$(view | jq '[.pipelines.instances[0].stages[]?] | length')
    [ "$n_stages" = 2 ] || { echo "$prof: expected a 2-stage pipeline, /v1/cluster shows $n_stages stages"; exit 1; }
    echo "  $prof: CPU time: $(cpu n1), $(cpu n2), $(cpu relay)" >&2
    stop n2; stop n1; stop relay
    # what each node's stage or shard says when it stops (shards: time spent waiting for parts)
    grep -h "pipeline: s[a-z]* [0-9].* stopped after" "$T/n1.out" "$T/n2.out" | sed 's/^/  /' >&2
  done
done

# ---- summary (means over the repetitions) ----
echo
echo "| setup | single stream tok/s, decode (each rep) | single, wall incl. prompt | vs 1 node | $STREAMS streams tok/s (each rep) | vs 1 node | stage 0->1 bytes per decoded token (records) | 1->0 bytes per decoded token (records) | micro-batches for $STREAMS x $TOKENS tokens |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
awk -v profiles="ref $PROFILES" '
  { p = $1; n[p]++; s[p] += $2; w[p] += $3; a[p] += $4
    f[p] += $6 / ($11 - 1); fr[p] += $7 / ($11 - 1); b[p] += $9 / ($11 - 1); br[p] += $10 / ($11 - 1); mb[p] += $13
    all_s[p] = all_s[p] sprintf("%s%.2f", n[p] > 1 ? ", " : "", $2)
    all_a[p] = all_a[p] sprintf("%s%.2f", n[p] > 1 ? ", " : "", $4) }
  END {
    split(profiles, ps, " ")
    label["ref"] = "1 node"; label["none"] = "2 nodes, relay without delay"
    label["10g"] = "2 nodes, 10 GbE (50 us, 10 Gbit/s)"; label["1g"] = "2 nodes, 1 GbE (200 us, 1 Gbit/s)"
    for (i = 1; i in ps; i++) {
      p = ps[i]; if (!n[p]) continue
      rs = s[p] / n[p] / (s["ref"] / n["ref"]); ra = a[p] / n[p] / (a["ref"] / n["ref"])
      printf "| %s | %.2f (%s) | %.2f | %.2fx | %.2f (%s) | %.2fx | %s | %s | %s |\n", label[p], s[p] / n[p], all_s[p],
        w[p] / n[p], rs, a[p] / n[p], all_a[p], ra,
        p == "ref" ? "-" : sprintf("%.0f (%.2f)", f[p] / n[p], fr[p] / n[p]),
        p == "ref" ? "-" : sprintf("%.0f (%.2f)", b[p] / n[p], br[p] / n[p]),
        p == "ref" ? "-" : sprintf("%.0f", mb[p] / n[p])
    }
  }' "$T/results"
awk -v s="$STREAMS" '$1 == "ref" { h += $14; a += $4; n++ }
  END { if (n) printf "\n1 node: %d streams %.2f tok/s, %d streams %.2f tok/s (%.2fx of %d streams)\n", s / 2, h / n, s, a / n, a / h, s / 2 }' "$T/results"
echo
echo "raw: name single_decode_tps single_wall_tps agg_tps, stage 0->1: bytes small_record_bytes small_records, 1->0: the same, tokens prompt_tokens micro_batches agg_half_streams"
cat "$T/results"
