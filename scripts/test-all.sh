#!/usr/bin/env bash
# The whole suite: unit and golden tests in the release build, the same under
# AddressSanitizer + UndefinedBehaviorSanitizer, the kernel tests cross-built
# for arm64 under qemu (when the cross tools are installed), the end-to-end
# tests of `racimo serve` with real clients (node), and every fuzz target for
# a bounded time.  The last line adds them up for CI: a part that cannot run
# here (tools missing) counts as skipped there, e2e and arm64 as one each,
# cluster as five (cluster, pipeline, pull, one-hop, browser), fuzz as one per target.
set -u
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
total_p=0; total_f=0; total_s=0
tally() {  # reads a log, adds its closing counts
  local line
  line=$(grep -E '^([a-z]+: )?[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
  if [ -z "$line" ] && grep -qE '^# pass [0-9]+' "$1"; then
    # node's test runner (TAP): "# pass N", "# fail N", "# skipped N"
    line="$(grep -E '^# pass [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+') passed, $(grep -E '^# fail [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+') failed, $(grep -E '^# skipped [0-9]+' "$1" | tail -n 1 | grep -oE '[0-9]+') skipped"
  fi
  if [ -z "$line" ]; then total_f=$((total_f+1)); echo "no closing line in $1"; return; fi
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
  f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+' || true)
  total_p=$((total_p+p)); total_f=$((total_f+f)); total_s=$((total_s+${s:-0}))
}
mkdir -p build
rm -f build/unit.log build/sanitizers.log build/arm64.log build/e2e.log \
      build/cluster.log build/pipeline.log build/pull.log build/onehop.log build/browser.log build/fuzz.log
step() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name"
  "$@" 2>&1 | tee "build/$name.log"
  tally "build/$name.log"
  echo "== $name took $((SECONDS-t0)) s"
}
make --no-print-directory -j"$jobs" build/rel/racimo build/rel/racimo_tests >build/make-rel.log 2>&1 \
  || { cat build/make-rel.log; echo "0 passed, 1 failed"; exit 1; }
step unit make --no-print-directory test-unit
make --no-print-directory -j"$jobs" SANITIZE=1 build/san/racimo build/san/racimo_tests >build/make-san.log 2>&1 \
  || { cat build/make-san.log; echo "0 passed, 1 failed"; exit 1; }
step sanitizers make --no-print-directory test-san
if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then
  step arm64 make --no-print-directory test-arm64
else
  echo "arm64: skipped (aarch64-linux-gnu-gcc or qemu-aarch64 missing: scripts/install-deps.sh)"
  total_s=$((total_s+1))
fi
if command -v node >/dev/null && command -v npm >/dev/null && command -v curl >/dev/null; then
  step e2e make --no-print-directory test-e2e
else
  echo "e2e: skipped (node, npm or curl missing: scripts/install-deps.sh)"; total_s=$((total_s+1))
fi
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v jq >/dev/null; then
  step cluster make --no-print-directory test-cluster
  step pipeline make --no-print-directory test-pipeline
  step pull make --no-print-directory test-pull-cluster
  step onehop make --no-print-directory test-onehop
  if command -v node >/dev/null && command -v npm >/dev/null; then
    step browser make --no-print-directory test-browser
  else
    echo "browser: skipped (node or npm missing: scripts/install-deps.sh)"; total_s=$((total_s+1))
  fi
else
  echo "cluster: skipped (needs root, iproute2 and jq: scripts/install-deps.sh)"; total_s=$((total_s+5))
fi
if command -v clang >/dev/null; then
  step fuzz make --no-print-directory -j"$jobs" fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-10}"
else
  # one skip per target, as a run counts one pass or failure per target
  n_fuzz=$(ls fuzz/fuzz_*.c 2>/dev/null | wc -l)
  echo "fuzz: skipped, $n_fuzz targets (clang not installed)"; total_s=$((total_s+n_fuzz))
fi
# What failed, gathered from every part's log just above the closing line:
# CI keeps only the tail of this long output.
for log in build/unit.log build/sanitizers.log build/arm64.log build/e2e.log \
           build/cluster.log build/pipeline.log build/pull.log build/onehop.log build/browser.log build/fuzz.log; do
  [ -f "$log" ] || continue
  grep -E '^(failed: |FAIL|not ok )' "$log" | sed "s|^|$(basename "$log" .log): |" || true
done
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
