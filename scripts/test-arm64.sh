#!/usr/bin/env bash
# The arm64 kernel tests on any Linux machine: cross-builds
# build/arm64/racimo_kernel_tests (src/base, src/tensor and their tests;
# static, -O2, see the Makefile) and runs it under qemu-user twice, on CPU
# models with and without the dotprod extension, so that both instances of
# every NEON kernel (SDOT and SMULL) meet the scalar reference:
#   max         all the extensions qemu knows: the SDOT kernels
#   cortex-a53  armv8.0, no dotprod: the SMULL kernels
# Prints each run's report, then their sum in the runner's format (the line
# scripts/test-all.sh tallies).  Arguments select tests, as for the runner.
# CROSS_CC and QEMU override the tools.
set -u
cd "$(dirname "$0")/.."
cross_cc=${CROSS_CC:-aarch64-linux-gnu-gcc}
qemu=${QEMU:-qemu-aarch64}
bin=build/arm64/racimo_kernel_tests

for tool in "$cross_cc" "$qemu"; do
  if ! command -v "$tool" >/dev/null; then
    echo "test-arm64: $tool not found (scripts/install-deps.sh installs it)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
  fi
done

jobs=$(nproc 2>/dev/null || echo 2)
# ARCH tells the Makefile which ISA files to build (it would read the host's).
if ! make --no-print-directory -j"$jobs" ARCH=aarch64 CC="$cross_cc" BUILD=build/arm64 \
     LDFLAGS=-static "$bin"; then
  echo "test-arm64: build failed"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi

total_p=0; total_f=0; total_s=0
# The two emulated runs are independent and each keeps one core busy: run
# them side by side (the suite's longest wait after the sanitizers), then
# show their logs one after the other.
for cpu in max cortex-a53; do
  # emulation is slow: stretch the runner's per-test timeouts
  RACIMO_TEST_TIMEOUT_SCALE=${RACIMO_TEST_TIMEOUT_SCALE:-10} \
    "$qemu" -cpu "$cpu" "$bin" "$@" >build/arm64/test-$cpu.log 2>&1 &
done
wait
for cpu in max cortex-a53; do
  log=build/arm64/test-$cpu.log
  echo "-- $qemu -cpu $cpu $bin"
  cat "$log"
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "test-arm64: no closing line from the run on $cpu"
    total_f=$((total_f + 1))
    continue
  fi
  read -r p _ f _ s _ <<<"${line//,/}"
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
done
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
