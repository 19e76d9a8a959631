# netns.sh - helpers for the cluster end-to-end tests (sourced by run.sh):
# a bridge in a namespace of its own, and "hosts" (namespaces) plugged into
# it with a veth pair each, on 10.77.0.0/24.  Nothing is added to the
# machine's own network namespace, so only the test's namespaces and
# loopback are ever contacted.  $P is the prefix of every namespace name.
# Also the polling helpers every namespace script (tests/cluster, bench/)
# uses: waiting on a condition, and a node's view of the cluster.

now_ms() { date +%s%3N; }

# RACIMO_MESH=1: every node the scripts start runs with --mesh (the full
# mesh of earlier versions instead of SWIM, the default)
MESH_ARG=
[ "${RACIMO_MESH:-0}" = 1 ] && MESH_ARG=--mesh

# A check's line, counted for the closing "N passed, N failed, N skipped".
# Each line ends with the seconds since the script started: where a
# slow run spends its time.
ok()   { passed=$((passed+1)); echo "ok   $* [${SECONDS} s]"; }
bad()  { failed=$((failed+1)); echo "FAIL $* [${SECONDS} s]"; }
skip() { skipped=$((skipped+1)); echo "skip $*"; }

# ns_preflight NAME "TOOLS..." BINARIES...: ends the script, as skipped
# without root or iproute2, as failed without a tool or a binary.
ns_preflight() {
  local name=$1 tools=$2 t; shift 2
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    echo "$name: skipped (needs root and iproute2 for network namespaces)"
    echo "0 passed, 0 failed, 1 skipped"; exit 0
  fi
  for t in $tools; do
    command -v "$t" >/dev/null || { echo "$name: $t missing (scripts/install-deps.sh)"; echo "0 passed, 1 failed"; exit 1; }
  done
  for t in "$@"; do
    [ -x "$t" ] || { echo "$name: $t not built"; echo "0 passed, 1 failed"; exit 1; }
  done
}

# ns_finish LOGS FILES...: the end of a run: the namespaces go, FILES
# (globs under $T) are kept in LOGS, $T is removed.
ns_finish() {
  local logs=$1 f; shift
  ns_cleanup
  mkdir -p "$logs"
  for f in "$@"; do cp "$T"/$f "$logs"/ 2>/dev/null; done
  rm -rf "$T"
}

# wait_for SECONDS COMMAND...: polls until the command succeeds
wait_for() {
  local end=$(( $(now_ms) + $1 * 1000 )); shift
  while [ "$(now_ms)" -lt "$end" ]; do "$@" && return 0; sleep 0.1; done
  return 1
}

# view I: node I's GET /v1/cluster (asked from inside its namespace, at 10.77.0.I:8080)
view() { ip netns exec "$P-n$1" curl -s --max-time 2 "http://10.77.0.$1:8080/v1/cluster"; }
# n_up I N: node I sees exactly N nodes up
n_up() { [ "$(view "$1" | jq '[.nodes[] | select(.state == "up")] | length')" = "$2" ]; }

ns_bridge() {
  ip netns add "$P-br"
  ip -n "$P-br" link set lo up
  ip -n "$P-br" link add br0 type bridge
  # 224.0.0.x is flooded anyway; no snooping keeps every port in the group
  ip -n "$P-br" link set br0 type bridge mcast_snooping 0
  ip -n "$P-br" link set br0 up
}

# ns_host NAME INDEX: namespace $P-NAME with eth0 = 10.77.0.INDEX/24
ns_host() {
  local ns="$P-$1" i=$2
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name "v$i" netns "$P-br"
  ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add 224.0.0.0/4 dev eth0
  ip -n "$P-br" link set "v$i" master br0
  ip -n "$P-br" link set "v$i" up
}

# Kills every process left in the test's namespaces and deletes them.
ns_cleanup() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P-"); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
