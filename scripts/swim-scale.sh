#!/usr/bin/env bash
# swim-scale.sh - N real `racimo serve` processes on loopback, one cluster:
# how long until every node sees all N up, whether any node sees another
# suspect or down during a quiet watch, and each node's idle CPU.  Not part
# of `make test` (it takes minutes and the whole machine); the figures go
# to BENCHMARKS.md (issue 22).
#
# Usage: scripts/swim-scale.sh [N] [WATCH_S] [--mesh]
#   N        nodes (default 64)
#   WATCH_S  seconds watched once converged (default 300)
#   --mesh   the nodes run with --mesh (the full mesh), to compare
# RACIMO_BIN overrides build/rel/racimo.  Nodes listen on 127.0.0.1, HTTP
# ports 18001.., cluster ports 19001.. (TCP, and UDP for SWIM; PORT_BASE=P
# moves them to P+1.. and P+1001.., for two runs side by side); node 1 is
# every other node's --peer.  Prints one line per result and keeps the
# nodes' logs in build/swim-scale/.
set -u
cd "$(dirname "$0")/.."
N=${1:-64}
WATCH=${2:-300}
MODE=swim
[ "${3:-}" = --mesh ] && MODE=mesh
BIN=$(realpath "${RACIMO_BIN:-build/rel/racimo}")
LOGS=build/swim-scale
HZ=$(getconf CLK_TCK)
PB=${PORT_BASE:-18000}
command -v jq >/dev/null && command -v curl >/dev/null || { echo "needs jq and curl"; exit 1; }
[ -x "$BIN" ] || { echo "$BIN not built"; exit 1; }

T=$(mktemp -d /tmp/racimo-swim-scale.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  # a node that has not stopped 10 s after SIGTERM is killed: the scratch
  # folder under /tmp must not outlive the run
  local end=$(( $(date +%s) + 10 ))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 0.2; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  mkdir -p "$LOGS"; rm -f "$LOGS"/*.log
  for f in "$T"/n*.log; do [ -e "$f" ] && cp "$f" "$LOGS"/; done
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# bash runs a trap only once the foreground command ends: the pauses run in
# the background and are waited for (wait returns at once on a signal), so
# SIGTERM stops the run within a poll, not after the 10 s pause
pause() { sleep "$1" & wait $!; }

now_ms() { date +%s%3N; }
http() { echo $((PB + $1)); }
view() { curl -s --max-time 5 "http://127.0.0.1:$(http "$1")/v1/cluster?summary=1"; }
start() {  # I [env...]
  local i=$1; shift
  mkdir -p "$T/n$i"
  [ "$i" -gt 1 ] && cp "$T/n1/bench.json" "$T/n$i/" 2>/dev/null
  env "$@" "$BIN" serve --host 127.0.0.1 --port "$(http "$i")" --cluster-port $((PB + 1000 + i)) \
    --state-dir "$T/n$i" --name "n$i" --no-access-log -t 1 \
    $([ "$MODE" = mesh ] && echo --mesh) $([ "$i" -gt 1 ] && echo --peer 127.0.0.1:$((PB + 1001))) \
    >"$T/n$i.log" 2>&1 &
  pids[$i]=$!
}
listening() { grep -qs "listening on" "$T/n$1.log"; }
wait_for() {  # SECONDS CMD...
  local end=$(( $(now_ms) + $1 * 1000 )); shift
  until "$@"; do [ "$(now_ms)" -gt "$end" ] && return 1; pause 0.2; done
}
cpu_ticks() {  # utime + stime of node I
  awk '{ print $14 + $15 }' "/proc/${pids[$1]}/stat" 2>/dev/null || echo 0
}

echo "swim-scale: $N nodes ($MODE), watch ${WATCH}s, $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(date -u '+%Y-%m-%d %H:%M UTC')"
start 1
wait_for 30 listening 1 || { echo "node 1 did not start"; tail "$T/n1.log"; exit 1; }
TOKEN=$("$BIN" token --state-dir "$T/n1")
# one self-benchmark (node 1's), copied: N of them would load the machine
wait_for 60 test -s "$T/n1/bench.json" || echo "(node 1 wrote no bench.json; each node measures)"
t_first=$(now_ms)
for i in $(seq 2 "$N"); do start "$i" RACIMO_JOIN_TOKEN="$TOKEN"; done
for i in $(seq 2 "$N"); do wait_for 60 listening "$i" || { echo "node $i did not start"; tail -5 "$T/n$i.log"; exit 1; }; done
t_started=$(now_ms)
echo "started $N nodes in $(( t_started - t_first )) ms"

ups() {  # how many nodes see all N up
  local i k=0
  for i in $(seq 1 "$N"); do
    [ "$(view "$i" | jq -r '.members_up // 0')" = "$N" ] && k=$((k + 1))
  done
  echo "$k"
}
all_up() { [ "$(ups)" = "$N" ]; }
# converged once every node sees N up (members_up, from SWIM's view, from
# the links with --mesh)
if wait_for 900 all_up; then
  t_conv=$(now_ms)
  echo "converged: every node sees $N up $(( t_conv - t_started )) ms after the last node started ($(( t_conv - t_first )) ms after the second)"
else
  echo "not converged in 900 s: $(ups) of $N nodes see all $N up"
  exit 1
fi

# the watch: states sampled, SWIM's counters of suspicions and deaths (and
# the log's "is down" lines) compared at both ends, CPU ticks per node
counter() {  # KEY: sum over nodes of .swim.KEY
  local i s=0 v
  for i in $(seq 1 "$N"); do
    v=$(view "$i" | jq -r ".swim.$1 // 0"); s=$((s + ${v:-0}))
  done
  echo "$s"
}
downs() { cat "$T"/n*.log | grep -c " is down"; }
sus0=$(counter suspicions); dead0=$(counter deaths); down0=$(downs)
declare -a c0
for i in $(seq 1 "$N"); do c0[$i]=$(cpu_ticks "$i"); done
w0=$(now_ms)
short=0 samples=0
while [ $(( $(now_ms) - w0 )) -lt $(( WATCH * 1000 )) ]; do
  pause 10
  k=$(ups); samples=$((samples + 1))
  [ "$k" != "$N" ] && { short=$((short + 1)); echo "  at $(( ($(now_ms) - w0) / 1000 )) s: $k of $N nodes see all up"; }
done
w1=$(now_ms)
declare -a c1
for i in $(seq 1 "$N"); do c1[$i]=$(cpu_ticks "$i"); done
sus1=$(counter suspicions); dead1=$(counter deaths); down1=$(downs)
secs=$(( (w1 - w0) / 1000 ))
echo "watch ${secs} s: $samples samples, $short with a node not seeing all up; suspicions $(( sus1 - sus0 )), deaths $(( dead1 - dead0 )), 'is down' log lines $(( down1 - down0 ))"
tot=0 max=0
for i in $(seq 1 "$N"); do
  d=$(( c1[i] - c0[i] )); tot=$((tot + d)); [ "$d" -gt "$max" ] && max=$d
done
# percent of one core per node: ticks / HZ / seconds * 100
awk -v t="$tot" -v m="$max" -v n="$N" -v hz="$HZ" -v s="$secs" 'BEGIN {
  printf "idle CPU per node: mean %.3f%% of a core, max %.3f%% (all %d nodes: %.1f%% of a core)\n",
    100 * t / n / hz / s, 100 * m / hz / s, n, 100 * t / hz / s }'
echo "a view (node 1, summary): $(view 1 | jq -c '{members, members_up, quorum, swim: (.swim // null | if . then {alive, suspect, dead, suspicions, deaths} else null end)}')"
