#!/usr/bin/env bash
# Runs each fuzz binary for a bounded time over its corpus in fuzz/corpus/<name>.
# New inputs the fuzzer finds go to build/fuzz/new-<name> (not the repo corpus,
# so a run leaves the tree clean); a crash fails the run and its input is kept
# in build/fuzz/ for the report.  A fuzzer is one process on one core, so
# FUZZ_JOBS of them (default: the number of cores) run side by side: each
# still gets its whole time.  Prints "fuzz: N passed, N failed".
set -u
secs=$1; shift
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
mkdir -p build/fuzz

one() {  # bin: runs it, leaves its exit status in build/fuzz/<name>.rc
  local bin=$1 name corpus work
  name=$(basename "$bin"); name=${name#fuzz_}
  corpus=fuzz/corpus/$name
  work=build/fuzz/new-$name
  mkdir -p "$work" "$corpus"
  "$bin" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix=build/fuzz/"$name"- -print_final_stats=0 "$work" "$corpus" \
      > build/fuzz/"$name".log 2>&1
  echo $? > build/fuzz/"$name".rc
}

running=0
for bin in "$@"; do
  name=$(basename "$bin"); name=${name#fuzz_}
  rm -f build/fuzz/"$name".rc
  echo "fuzzing $name for ${secs}s"
  one "$bin" &
  running=$((running+1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running-1))
  fi
done
wait

passed=0; failed=0
for bin in "$@"; do
  name=$(basename "$bin"); name=${name#fuzz_}
  if [ "$(cat build/fuzz/"$name".rc 2>/dev/null)" = 0 ]; then
    passed=$((passed+1)); echo "ok   fuzz $name ($(grep -c . build/fuzz/$name.log) log lines)"
  else
    failed=$((failed+1)); echo "FAIL fuzz $name"; tail -n 40 build/fuzz/"$name".log
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
