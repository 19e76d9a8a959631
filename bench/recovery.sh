#!/usr/bin/env bash
# bench/recovery.sh - how long a stream pauses when a stage node of its
# instance is killed: the instance is rebuilt on the nodes left and the
# stream goes on.  Not a test: prints a table for BENCHMARKS.md ("Surviving
# the loss of a node").
#
#   bench/recovery.sh [MODEL.gguf]      (root: network namespaces)
#
# The default model is /tmp/l1b-q4_0.gguf (`racimo make-model --preset
# llama3-1b --type Q4_0`, made when missing).  Cases: 2 -> 1 (the model over
# 2 nodes; one is killed, the head runs it alone) and 3 -> 2 (over 3; one is
# killed, 2 stages left).  Every node has the file (hard links) and runs
# 1 thread; the nodes' logs and the stream are stamped with the time each
# line arrives, which splits the pause into:
#   detection  kill -> the head's engine says it is rebuilding
#   re-plan    -> the head logs the new placement ("placed again")
#   load       -> the new instance is up (stages loaded, or the model mapped)
#   rebuild    -> the first new token reaches the client (the replay of the
#                 prompt and the tokens so far, then one decode)
# and, for scale, ttft: the same request's time to its first token without
# a fault (the prompt alone on the first plan).
# Environment: REPS (3), PROMPT_TOKENS (roughly; 200), BEFORE (tokens
# streamed before the kill: 40), DOWN_AFTER (the nodes' --down-after, 1500).
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
MODEL_FILE=${1:-/tmp/l1b-q4_0.gguf}
REPS=${REPS:-3} BEFORE=${BEFORE:-40} DOWN_AFTER=${DOWN_AFTER:-1500}
P=rr$$
[ "$(id -u)" -eq 0 ] && command -v ip >/dev/null || { echo "bench/recovery.sh: needs root and iproute2"; exit 1; }
for tool in curl jq; do command -v $tool >/dev/null || { echo "bench/recovery.sh: $tool missing"; exit 1; }; done
if [ ! -f "$MODEL_FILE" ] && [ $# -eq 0 ]; then
  "$BIN" make-model --preset llama3-1b --type Q4_0 -o "$MODEL_FILE" >/dev/null || exit 1
fi
MODEL_FILE=$(realpath "$MODEL_FILE")
MODEL=$(basename "$MODEL_FILE" .gguf)
T=$(mktemp -d /tmp/racimo-bench-recovery.XXXXXX)
source tests/cluster/netns.sh
cleanup() { ns_cleanup; rm -rf "$T"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# stamp: each line of stdin prefixed with the time (ms) it arrived
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s%3N)" "$line"; done; }
start_node() {
  local i=$1; shift
  ip netns exec "$P-n$i" "$BIN" serve --host "10.77.0.$i" --port 8080 --state-dir "$T/n$i" \
    --name "node$i" --no-access-log -t 1 --down-after "$DOWN_AFTER" --parallel 2 --ctx-size 1024 \
    --pipeline-wire f32 "$@" 2>&1 | stamp >"$T/n$i.log" &
  wait_for 30 grep -q "listening on" "$T/n$i.log"
}
# first stamp of a line matching PATTERN in FILE at or after MS
first_after() { awk -v t="$3" -v p="$2" '$1 >= t && $0 ~ p { print $1; exit }' "$1"; }

ns_bridge
for i in 1 2 3; do ns_host "n$i" "$i"; mkdir -p "$T/n$i/models"; ln "$MODEL_FILE" "$T/n$i/models/" 2>/dev/null ||
  cp "$MODEL_FILE" "$T/n$i/models/"; done
PROMPT=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 20))
echo "model $MODEL ($(du -h "$MODEL_FILE" | cut -f1)), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '%-7s %-4s %9s %9s %9s %10s %9s %9s %5s\n' case rep detect_ms replan_ms load_ms rebuild_ms total_ms ttft_ms same
for case in "2 1" "3 2"; do
  set -- $case
  from=$1 to=$2
  for rep in $(seq 1 "$REPS"); do
    for i in 1 2 3; do find "$T/n$i" -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +; done
    start_node 1 --min-nodes "$from"
    TOKEN=$("$BIN" token --state-dir "$T/n1")
    for i in $(seq 2 "$from"); do RACIMO_JOIN_TOKEN=$TOKEN start_node "$i" --peer 10.77.0.1; done
    wait_for 30 n_up 1 "$from"
    # the reference: the same stream without a fault (also loads the instance)
    body="{\"model\":\"$MODEL\",\"prompt\":\"$PROMPT\",\"max_tokens\":$((BEFORE + 60)),\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"
    ts=$(now_ms)
    ip netns exec "$P-n1" curl -sN --max-time 300 http://10.77.0.1:8080/v1/completions -d "$body" |
      stamp >"$T/ref"
    ttft=$(( $(awk '/data: \{/ { print $1; exit }' "$T/ref") - ts ))
    sed 's/^[0-9]* //' "$T/ref" | grep '^data: {' | sed 's/^data: //' | jq -j '.choices[0].text' >"$T/want"
    ip netns exec "$P-n1" curl -sN --max-time 300 http://10.77.0.1:8080/v1/completions -d "$body" |
      stamp >"$T/stream" &
    cpid=$!
    wait_for 120 sh -c "[ \$(grep -c 'data: {' $T/stream) -ge $BEFORE ]"
    victim=$(view 1 | jq -r '.pipelines.instances[0].stages[] | .node' | grep -v "$(cat "$T/n1/node.id")" | head -1)
    for i in $(seq 2 "$from"); do [ "$(cat "$T/n$i/node.id")" = "$victim" ] && vi=$i; done
    t0=$(now_ms)
    pkill -KILL -f -- "--state-dir $T/n$vi " ; sleep 0
    wait "$cpid"
    td=$(first_after "$T/n1.log" "rebuilding the running requests" "$t0")
    tp=$(first_after "$T/n1.log" "model $MODEL: placed again" "$t0")
    tl=$(first_after "$T/n1.log" "engine: rebuilt" "$t0")
    # (tokens already on their way when the node died may land after t0)
    tf=$(awk -v t="${tl:-$t0}" '$1 >= t && /data: \{/ { print $1; exit }' "$T/stream")
    got=$(sed 's/^[0-9]* //' "$T/stream" | grep '^data: {' | sed 's/^data: //' | jq -j '.choices[0].text')
    same=no; [ "$got" = "$(cat "$T/want")" ] && same=yes
    if [ -n "$td" ] && [ -n "$tl" ] && [ -n "$tf" ]; then
      printf '%-7s %-4s %9d %9d %9d %10d %9d %9d %5s\n' "$from->$to" "$rep" $((td - t0)) $((tp - td)) \
        $((tl - tp)) $((tf - tl)) $((tf - t0)) "$ttft" "$same"
    else
      printf '%-7s %-4s no recovery seen (detect %s, loaded %s, token %s)\n' "$from->$to" "$rep" "$td" "$tl" "$tf"
      tail -5 "$T/n1.log"
    fi
    for i in 1 2 3; do pkill -KILL -f -- "--state-dir $T/n$i " 2>/dev/null; done
    sleep 0.5
  done
done
