#!/usr/bin/env bash
# Runs each fuzz binary for a bounded time over its corpus in fuzz/corpus/<name>.
# New inputs the fuzzer finds go to build/fuzz/new-<name> (not the repo corpus,
# so a run leaves the tree clean); a crash fails the run and its input is kept
# in build/fuzz/ for the report.  Prints "fuzz: N passed, N failed".
set -u
secs=$1; shift
passed=0; failed=0
for bin in "$@"; do
  name=$(basename "$bin"); name=${name#fuzz_}
  corpus=fuzz/corpus/$name
  work=build/fuzz/new-$name
  mkdir -p "$work" "$corpus"
  echo "fuzzing $name for ${secs}s"
  if "$bin" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix=build/fuzz/"$name"- -print_final_stats=0 "$work" "$corpus" \
      > build/fuzz/"$name".log 2>&1; then
    passed=$((passed+1)); echo "ok   fuzz $name ($(grep -c . build/fuzz/$name.log) log lines)"
  else
    failed=$((failed+1)); echo "FAIL fuzz $name"; tail -n 40 build/fuzz/"$name".log
  fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
