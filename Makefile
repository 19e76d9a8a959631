# racimo - build, run and test.
#
#   make            build build/rel/racimo
#   make run        install missing Debian packages, build, start a node
#   make test       all tests: unit+golden (release), the same under
#                   ASan+UBSan, and a bounded fuzz run of every parser
#   make SANITIZE=1 build with ASan+UBSan into build/san
#
# Sources are found by wildcard: src/<layer>/*.c form libracimo.a, except
# src/cli (the binary).  Files named *_avx2.c and *_avx512.c get their x86-64 SIMD flags and
# *_neon.c the arm64 ones; nothing else does, so one binary runs on any CPU
# of its architecture and picks kernels at start-up.

CC      ?= cc
ARCH    := $(shell uname -m)
OS      := $(shell uname -s)

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-parameter
CFLAGS_BASE := -std=c11 -g $(WARN) -Isrc -pthread -fno-strict-aliasing
ifeq ($(OS),Darwin)
  CFLAGS_BASE += -D_DARWIN_C_SOURCE
else
  CFLAGS_BASE += -D_GNU_SOURCE
endif
# -lcurl: racimo pull (HTTPS to Hugging Face: HTTP/2, redirects, proxies, resume).
# -levent_openssl -lssl -lcrypto: racimo serve --tls-cert/--tls-key (HTTPS through
# libevent's OpenSSL bufferevents) and https:// addresses in the CLI's clients
LDLIBS  := -lcurl -levent -levent_pthreads -levent_openssl -lssl -lcrypto -lsodium -lpcre2-8 \
           -ljansson -lm -pthread
TEST_LDLIBS := $(if $(filter Darwin,$(OS)),,-lutil)

ifeq ($(FUZZ),1)
  # libFuzzer instrumentation for the library the fuzz targets link
  CC      := clang
  BUILD   := build/fuzzlib
  OPT     := -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
             -fno-sanitize-recover=undefined
  # No fuzz target reaches the SIMD kernels, and clang took minutes of CPU
  # on each of the largest with the sanitizers and coverage (seconds
  # without): they are built plain here, and checked under ASan by test-san.
  ISA_OPT := -O1 -fno-omit-frame-pointer
else ifeq ($(SANITIZE),1)
  BUILD   := build/san
  OPT     := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
             -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else
  BUILD   := build/rel
  OPT     := -O2
endif
CFLAGS  ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(OPT) $(CFLAGS)
ISA_CFLAGS = $(CFLAGS_BASE) $(if $(ISA_OPT),$(ISA_OPT),$(OPT)) $(CFLAGS)

ifeq ($(ARCH),x86_64)
  ISA_AVX2 := -mavx2 -mfma -mf16c
  ISA_AVX512 := $(ISA_AVX2) -mavx512f -mavx512bw -mavx512vl -mavx512vnni
else
  ISA_AVX2 :=
  ISA_AVX512 :=
endif
ISA_NEON :=   # NEON is arm64's baseline; SDOT kernels carry their own target attribute

LIB_SRC  := $(filter-out src/cli/%,$(wildcard src/*/*.c))
ifneq ($(ARCH),x86_64)
  LIB_SRC := $(filter-out %_avx2.c %_avx512.c,$(LIB_SRC))
endif
ifeq ($(filter aarch64 arm64,$(ARCH)),)
  LIB_SRC := $(filter-out %_neon.c,$(LIB_SRC))
endif
CLI_SRC  := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/*.c)

# The dashboard's files (web/) become byte arrays in a generated C file of
# the library (tools/web_embed.c: no xxd, no linker tricks, Linux and macOS).
WEB_FILES := $(sort $(wildcard web/*.html web/*.css web/*.js web/*.svg web/*.png))
WEB_OBJ  := $(BUILD)/gen/web_assets.o
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(WEB_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all run test test-unit test-san test-e2e test-cluster test-pipeline test-browser fuzz clean deps
all: $(BUILD)/racimo

$(BUILD)/libracimo.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/racimo: $(CLI_OBJ) $(BUILD)/libracimo.a
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libracimo.a $(LDLIBS)

# Tests link the CLI objects too (minus main) so commands can be tested
# in-process; the test binary's main is the runner.
$(BUILD)/racimo_tests: $(TEST_OBJ) $(BUILD)/libracimo.a
	$(CC) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libracimo.a $(TEST_LDLIBS) $(LDLIBS)

# racimo-kernel-time: one matrix product as in the file against repacked,
# in thread CPU time (bench/kernel_time.c; BENCHMARKS.md's kernel tables).
$(BUILD)/racimo-kernel-time: $(BUILD)/bench/kernel_time.o $(BUILD)/libracimo.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
-include $(BUILD)/bench/kernel_time.d

$(BUILD)/gen/web_embed: tools/web_embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -Wall -Wextra -o $@ $<

# (the folder too: a file removed from web/ leaves the build as well)
$(BUILD)/gen/web_assets.c: $(BUILD)/gen/web_embed $(WEB_FILES) web
	$(BUILD)/gen/web_embed $(WEB_FILES) > $@.tmp && mv $@.tmp $@

$(WEB_OBJ): $(BUILD)/gen/web_assets.c src/api/web_assets.h
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# racimo_swimsim: the membership simulation (tests/swimsim, tests/swim_net.c):
# many nodes running src/cluster/swim.c in one process; BENCHMARKS.md's table.
$(BUILD)/racimo_swimsim: $(BUILD)/tests/swimsim/main.o $(BUILD)/tests/swim_net.o $(BUILD)/libracimo.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
-include $(BUILD)/tests/swimsim/main.d

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(ISA_CFLAGS) $(ISA_AVX2) -MMD -MP -c $< -o $@

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(ISA_CFLAGS) $(ISA_AVX512) -MMD -MP -c $< -o $@

$(BUILD)/%_neon.o: %_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(ISA_CFLAGS) $(ISA_NEON) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d)

deps:
	@scripts/install-deps.sh

# `make run` serves MODEL (default: a synthetic model it writes to
# build/demo.gguf) on http://127.0.0.1:$(PORT) with the OpenAI and Ollama APIs.
MODEL ?= build/demo.gguf
PORT ?= 8080
run: deps
	@$(MAKE) --no-print-directory all
	@[ -f $(MODEL) ] || ./$(BUILD)/racimo make-model --preset tiny --type Q8_0 -o $(MODEL)
	./$(BUILD)/racimo serve -m $(MODEL) --port $(PORT)

# racimo-hooks: the release binary whose `serve` also reads the e2e tests'
# RACIMO_TEST_* variables (a node that misbehaves on purpose: another
# protocol version, a hostile member).  Only src/cli/cmd_serve.c is built
# again, with RACIMO_TEST_HOOKS; the library's test-only knobs are fields of
# its config structs that the racimo binary never sets.
$(BUILD)/hooks/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DRACIMO_TEST_HOOKS -MMD -MP -c $< -o $@
-include $(BUILD)/hooks/src/cli/cmd_serve.d
HOOKS_CLI_OBJ := $(filter-out $(BUILD)/src/cli/cmd_serve.o,$(CLI_OBJ)) $(BUILD)/hooks/src/cli/cmd_serve.o

$(BUILD)/racimo-hooks: $(HOOKS_CLI_OBJ) $(BUILD)/libracimo.a
	$(CC) $(LDFLAGS) -o $@ $(HOOKS_CLI_OBJ) $(BUILD)/libracimo.a $(LDLIBS)

# Tests run side by side (TEST_JOBS, default the number of cores): many
# wait on sockets and timers rather than the CPU.  TEST_JOBS=1 runs them
# one after another with their output as it comes.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test-unit: $(BUILD)/racimo_tests $(BUILD)/racimo
	RACIMO_BIN=$(BUILD)/racimo $(BUILD)/racimo_tests -j $(TEST_JOBS) $(T)

# test-arm64: the kernel tests cross-built for arm64 (CC=aarch64-linux-gnu-gcc,
# static, -O2, into build/arm64 by scripts/test-arm64.sh) and run under
# qemu-user, once on a CPU with the dotprod extension and once without.  The
# arm64 builds of jansson and pcre2 would need a foreign dpkg architecture, so
# this binary holds only what needs neither: src/base (less evbase.c, the
# one file there that calls libevent), src/tensor and their tests (runner,
# base, quant, kernels).
KTEST_SRC := tests/runner.c $(wildcard tests/test_base.c tests/test_quant.c tests/test_kernels.c \
                                        tests/test_kv_types.c tests/test_repack_q4k.c \
                                        tests/test_repack_q8.c tests/test_repack_q6k.c tests/test_membw.c \
                                        tests/tile_check.c)
KLIB_SRC  := $(filter-out src/base/evbase.c,$(filter src/base/% src/tensor/%,$(LIB_SRC)))
$(BUILD)/racimo_kernel_tests: $(KTEST_SRC:%.c=$(BUILD)/%.o) $(KLIB_SRC:%.c=$(BUILD)/%.o)
	$(CC) $(LDFLAGS) -o $@ $^ -lm -pthread

.PHONY: test-arm64
test-arm64:
	@scripts/test-arm64.sh

test-san:
	@$(MAKE) --no-print-directory SANITIZE=1 build/san/racimo_tests build/san/racimo
	RACIMO_TEST_TIMEOUT_SCALE=6 RACIMO_BIN=build/san/racimo \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  build/san/racimo_tests -j $(TEST_JOBS) $(T)

# Fuzz targets: fuzz/fuzz_<name>.c, built with clang's libFuzzer against
# the library sources; each runs FUZZ_SECONDS over its corpus fuzz/corpus/<name>.
FUZZ_SECONDS ?= 60
FUZZ_SRC  := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN  := $(FUZZ_SRC:fuzz/%.c=build/fuzz/%)
build/fuzzlib/libracimo.a: FORCE
	@$(MAKE) --no-print-directory FUZZ=1 build/fuzzlib/libracimo.a-real
build/fuzzlib/libracimo.a-real: $(LIB_OBJ)
	@rm -f build/fuzzlib/libracimo.a
	ar rcs build/fuzzlib/libracimo.a $^
build/fuzz/%: fuzz/%.c build/fuzzlib/libracimo.a
	@mkdir -p build/fuzz
	clang $(CFLAGS_BASE) -O1 -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -o $@ $< build/fuzzlib/libracimo.a $(LDLIBS)
.PHONY: FORCE
FORCE:

fuzz: $(FUZZ_BIN)
	@scripts/run-fuzz.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# test-e2e: the real binary on real sockets, driven by the official openai,
# ollama and @anthropic-ai/sdk npm packages and curl (tests/e2e, node's
# built-in test runner); pull.test.mjs pulls from a fake Hugging Face Hub on
# loopback (fake_hub.mjs), never the internet.  The packages install from
# tests/e2e/package-lock.json on first use.
# RACIMO_LOAD_SECONDS=60 lengthens the load test (default 15 s).
test-e2e: build/rel/racimo
	@cd tests/e2e && { [ -d node_modules/openai ] && [ -d node_modules/ollama ] && \
	  [ -d node_modules/@anthropic-ai/sdk ] || \
	  npm ci --no-audit --no-fund --loglevel=error; } && \
	  RACIMO_BIN=$(CURDIR)/build/rel/racimo node --test --test-reporter=tap \
	  openai.test.mjs ollama.test.mjs anthropic.test.mjs protocol.test.mjs load.test.mjs \
	  structured.test.mjs embeddings.test.mjs pull.test.mjs

# test-cluster: real nodes in network namespaces on a bridge (needs root):
# discovery, refusals, avahi-browse, a rogue mDNS responder, SIGKILL and a
# cut link (tests/cluster).
test-cluster: build/rel/racimo build/rel/racimo-hooks
	@RACIMO_BIN=build/rel/racimo RACIMO_HOOKS_BIN=build/rel/racimo-hooks tests/cluster/run.sh

# test-browser: the web dashboard in headless Chromium (puppeteer-core,
# tests/browser/package-lock.json, installed on first use) against three
# nodes in network namespaces (needs root; skipped without chromium).
.PHONY: test-browser
test-browser: build/rel/racimo
	@RACIMO_BIN=build/rel/racimo tests/browser/run.sh

# test-pipeline: one model across 2-4 nodes in network namespaces (needs
# root): same greedy text as one node, a killed stage node, weight pulls,
# nodes under an address-space limit (tests/cluster/pipeline.sh).
test-pipeline: build/rel/racimo build/rel/racimo-hooks
	@RACIMO_BIN=build/rel/racimo RACIMO_HOOKS_BIN=build/rel/racimo-hooks tests/cluster/pipeline.sh

# test-cluster-mesh, test-pipeline-mesh: the same with every node on --mesh
# (the full mesh of earlier versions instead of SWIM, the default;
# RACIMO_MESH=1).  Not part of `make test`.
.PHONY: test-cluster-mesh test-pipeline-mesh
test-cluster-mesh: build/rel/racimo build/rel/racimo-hooks
	@RACIMO_MESH=1 RACIMO_BIN=build/rel/racimo RACIMO_HOOKS_BIN=build/rel/racimo-hooks tests/cluster/run.sh
test-pipeline-mesh: build/rel/racimo build/rel/racimo-hooks
	@RACIMO_MESH=1 RACIMO_BIN=build/rel/racimo RACIMO_HOOKS_BIN=build/rel/racimo-hooks tests/cluster/pipeline.sh

# test-pull-cluster: one `racimo pull` for three nodes in network namespaces
# (needs root): a fake Hugging Face Hub in a fourth namespace, the model then
# split over the three, the Hub's log showing each byte served once
# (tests/cluster/pull.sh).
.PHONY: test-pull-cluster
test-pull-cluster: build/rel/racimo
	@RACIMO_BIN=build/rel/racimo tests/cluster/pull.sh

# test-onehop: 16 nodes with SWIM on the loopback of one network namespace
# (needs root): a request to a node reaches, in one hop, a copy of the model
# with a free slot on a node that is not its ring neighbour, never a busy
# copy, chosen from the SWIM digests (tests/cluster/onehop.sh).
.PHONY: test-onehop
test-onehop: build/rel/racimo
	@RACIMO_BIN=build/rel/racimo tests/cluster/onehop.sh

# bench-pipeline: one node against a 2-node pipeline over links emulated as
# none / 10 GbE / 1 GbE (needs root; bench/pipeline.sh, see BENCHMARKS.md).
.PHONY: bench-pipeline
bench-pipeline: build/rel/racimo
	@RACIMO_BIN=build/rel/racimo bench/pipeline.sh $(MODEL)

test:
	@scripts/test-all.sh

clean:
	rm -rf build
