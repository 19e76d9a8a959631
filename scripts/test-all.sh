#!/usr/bin/env bash
# The whole suite: unit and golden tests in the release build, the same under
# AddressSanitizer + UndefinedBehaviorSanitizer, and every fuzz target for a
# bounded time.  The last line adds them up for CI.
set -u
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
total_p=0; total_f=0; total_s=0
tally() {  # reads a log, adds its closing counts
  local line
  line=$(grep -E '^([a-z]+: )?[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
  if [ -z "$line" ]; then total_f=$((total_f+1)); echo "no closing line in $1"; return; fi
  p=$(grep -oE '[0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
  f=$(grep -oE '[0-9]+ failed' <<<"$line" | grep -oE '[0-9]+')
  s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+' || true)
  total_p=$((total_p+p)); total_f=$((total_f+f)); total_s=$((total_s+${s:-0}))
}
mkdir -p build
step() {  # name, command...
  local name=$1; shift
  echo "== $name"
  "$@" 2>&1 | tee "build/$name.log"
  tally "build/$name.log"
}
make --no-print-directory -j"$jobs" build/rel/racimo build/rel/racimo_tests >build/make-rel.log 2>&1 \
  || { cat build/make-rel.log; echo "0 passed, 1 failed"; exit 1; }
step unit make --no-print-directory test-unit
make --no-print-directory -j"$jobs" SANITIZE=1 build/san/racimo build/san/racimo_tests >build/make-san.log 2>&1 \
  || { cat build/make-san.log; echo "0 passed, 1 failed"; exit 1; }
step sanitizers make --no-print-directory test-san
if command -v clang >/dev/null; then
  step fuzz make --no-print-directory fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
else
  echo "fuzz: skipped (clang not installed)"
fi
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
