# dgemma - one flat Makefile.
#
#   make                 build everything this machine can build (CPU always,
#                        CUDA objects when nvcc is found)
#   make test            build and run the CPU test suite
#   make test-asan       the same suite under AddressSanitizer + UBSan, plus a
#                        bounded run of every fuzz target (build-asan/)
#   make test-tsan       the threaded tests under ThreadSanitizer (build-tsan/)
#   make test-gpu        build the GPU suite; run it where a GPU is present
#   make fuzz            run every fuzz target for FUZZ_SECONDS each
#   make eval            exact-match accuracy of the default model over the 500
#                        held-out problems, through the daemon (CPU backend;
#                        EVAL_ARGS="--backend cuda --tp 2 --limit 50 ..." to vary)
#   make check           what CI runs: every build, then test and test-asan side
#                        by side, then test-tsan; ends with the total
#                        "N passed, N failed"
#   make deps            install the Debian/Ubuntu packages the build needs
#   make install         PREFIX=/usr/local DESTDIR=
#   V=1                  show full commands
#   SANITIZE=address,undefined   build with sanitizers
#   CUDA=0               build CPU-only even where nvcc exists

BUILD    ?= build
PREFIX   ?= /usr/local
BINDIR   ?= $(PREFIX)/bin
MANDIR   ?= $(PREFIX)/share/man
DATADIR  ?= $(PREFIX)/share/dgemma
LIBDIR   ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
SYSCONFDIR ?= /etc
UNITDIR  ?= /etc/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
DESTDIR  ?=
CC       ?= cc
CLANG    ?= clang
FUZZ_SECONDS ?= 20

ifeq ($(V),1)
Q :=
say = @true
else
Q := @
say = @printf '  %-7s %s\n' $(1) $(2)
endif

# ---- toolchain detection ------------------------------------------------
CUDA_HOME ?= /usr/local/cuda
ifeq ($(CUDA),0)
NVCC :=
else
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
endif
ifneq ($(NVCC),)
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
ifeq ($(NVCC_VERSION),)
$(error $(NVCC) did not report a version; set NVCC= or CUDA=0 for a CPU-only build)
endif
CUDA_ARCH     ?= 90a
CUDA_PTX_ARCH ?= 90
HAVE_CUDA := 1
else
HAVE_CUDA := 0
endif

ifeq ($(MAKELEVEL),0)
ifeq ($(HAVE_CUDA),1)
$(info dgemma: nvcc $(NVCC_VERSION) at $(NVCC); sm_$(CUDA_ARCH) + compute_$(CUDA_PTX_ARCH) PTX; cuBLAS, NCCL from $(CUDA_HOME))
else
$(info dgemma: no CUDA: CPU-only build)
endif
$(info dgemma: cc $(shell $(CC) -dumpfullversion 2>/dev/null); jansson $(shell pkg-config --modversion jansson 2>/dev/null || echo MISSING); build dir $(BUILD)$(if $(SANITIZE), with -fsanitize=$(SANITIZE)))
endif

# ---- flags -----------------------------------------------------------------
# -Wno-format-truncation: messages are cut to fit their buffers on purpose.
WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wno-unused-parameter -Wno-format-truncation
CFLAGS   ?= -O2 -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -I. -MMD -MP $(WARN) $(CFLAGS)
LDFLAGS  ?=
# Third-party C libraries (jansson, libyaml, liburing, SQLite) are linked statically, so the binaries run on the
# GPU machine's image, which lacks them (shared/device.md).
STATIC_LIBS := -Wl,-Bstatic -ljansson -lyaml -luring -lsqlite3 -Wl,-Bdynamic
SYS_LIBS    := -lm -lpthread -ldl

ifneq ($(SANITIZE),)
ALL_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS    += -fsanitize=$(SANITIZE)
else
# The plain build hardened as distributions build daemons: stack canaries
# in functions with arrays, and the relocations read-only once loaded
# (full RELRO).  Not _FORTIFY_SOURCE=2: it made the CPU backend's
# 2,048-token prefill and first canvas 10% slower (dgemma-eval generate,
# medians of 5 interleaved with a build without it: 2,001 against 1,803
# ms, where the canaries and RELRO read 1,805 against 1,800; a machine
# of 2 CPUs).  The sanitizer builds check what it would, and more.
ALL_CFLAGS += -fstack-protector-strong
LDFLAGS    += -Wl,-z,relro -Wl,-z,now
endif

NVCCFLAGS ?= -O2 -g
ALL_NVCCFLAGS = -std=c++17 -I. -MMD -MP $(NVCCFLAGS) \
    -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
    -gencode arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH) \
    --Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lnccl \
             -lcudart_static -lrt -lstdc++

# ---- sources ---------------------------------------------------------------
LIB_SRC    := $(wildcard lib/*.c)
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o)
LIBCORE    := $(BUILD)/libdgemma-core.a

KERNEL_SRC := $(wildcard kernels/*.cu)
# (the host side of the CUDA backend is C, built with the C compiler)
KERNEL_CSRC := $(wildcard kernels/*.c)
KERNEL_OBJ := $(KERNEL_SRC:%.cu=$(BUILD)/%.o) $(KERNEL_CSRC:%.c=$(BUILD)/%.o)
LIBCUDA    := $(BUILD)/libdgemma-cuda.a

DAEMON_SRC  := $(wildcard daemon/*.c)
DAEMON_OBJ  := $(DAEMON_SRC:%.c=$(BUILD)/%.o)
DAEMON_LIB  := $(BUILD)/libdgemma-daemon.a
DAEMON_BIN  := $(BUILD)/bin/dgemmad

CLIENT_BIN  := $(BUILD)/bin/dgemma-client
# (libdgemma's sources are client/libdgemma*.c; the CLI's, the other client/*.c)
LIBDGEMMA_SRC := $(wildcard client/libdgemma*.c)
CLIENT_SRC  := $(filter-out $(LIBDGEMMA_SRC),$(wildcard client/*.c))
# (and the core's JSON reader, which it carries inside it: lib/json-load.c says why)
LIBDGEMMA_CORE := lib/json-load.c lib/json-scan.c lib/utf8.c lib/error.c
LIBDGEMMA_OBJ := $(LIBDGEMMA_SRC:%.c=$(BUILD)/%.o) $(LIBDGEMMA_CORE:%.c=$(BUILD)/%.o)
LIBDGEMMA_PIC := $(LIBDGEMMA_SRC:client/%.c=$(BUILD)/client/pic/%.o) \
                 $(LIBDGEMMA_CORE:lib/%.c=$(BUILD)/client/pic/lib/%.o)
LIBDGEMMA_VERSION := 0.1.0
LIBDGEMMA_A   := $(BUILD)/lib/libdgemma.a
LIBDGEMMA_SO  := $(BUILD)/lib/libdgemma.so.$(LIBDGEMMA_VERSION)
LIBDGEMMA_PC  := $(BUILD)/lib/pkgconfig/dgemma.pc

EVAL_SRC   := $(wildcard tools/eval/*.c)
EVAL_OBJ   := $(EVAL_SRC:%.c=$(BUILD)/%.o)
EVAL_BIN   := $(BUILD)/bin/dgemma-eval

HARNESS_OBJ := $(BUILD)/tests/harness.o $(BUILD)/tests/sql-peek.o $(BUILD)/tests/json-alloc.o
UNIT_SRC   := $(wildcard tests/unit/t-*.c)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit/%)
CLI_TESTS  := $(wildcard tests/cli/t-*.sh)
INTEG_SRC  := $(wildcard tests/integration/t-*.c)
.SECONDARY: $(BUILD)/tests/integration/fixture.o
INTEG_BIN  := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/integration/%)

GPU_TEST_SRC := $(wildcard tests/gpu/t-*.c)
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(BUILD)/tests/gpu/%)
GPU_TEST_SH  := $(wildcard tests/gpu/t-*.sh)

BENCH_SRC  := $(wildcard bench/*/bench-*.c)
ifneq ($(HAVE_CUDA),1)
BENCH_SRC  := $(filter-out bench/gpu/%,$(BENCH_SRC))
endif
BENCH_BIN  := $(patsubst %.c,$(BUILD)/%,$(BENCH_SRC))

FUZZ_SRC   := $(wildcard tests/fuzz/fuzz-*.c)
FUZZ_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)

BINS := $(EVAL_BIN) $(DAEMON_BIN) $(CLIENT_BIN)
LIBS_OUT := $(LIBDGEMMA_A) $(LIBDGEMMA_SO) $(LIBDGEMMA_PC)

# The embedded default model: model/default/ (trained, with its tokenizer)
# copied into the build tree.
DEFAULT_MODEL := $(BUILD)/model/default
# random weights of the small preset: the daemon tests' model (its random
# generations run long; tests/integration/fixture.h)
RANDOM_MODEL  := $(BUILD)/model/random
ifeq ($(HAVE_CUDA),1)
GPU_ALL := $(LIBCUDA)
endif

.SECONDARY:
.PHONY: bench-build
.PHONY: all test test-asan test-tsan test-gpu fuzz eval check check-cpu-only deps install uninstall clean
.PHONY: test-asan-build test-tsan-build
.DEFAULT_GOAL := all

all: $(LIBCORE) $(BINS) $(LIBS_OUT) $(DEFAULT_MODEL)/config.json $(RANDOM_MODEL)/config.json \
     $(GPU_ALL)

# ---- rules -----------------------------------------------------------------
$(BUILD)/%.o: %.c
	$(call say,CC,$<)
	@mkdir -p $(@D)
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu
	$(call say,NVCC,$<)
	@mkdir -p $(@D)
	$(Q)$(NVCC) $(ALL_NVCCFLAGS) -c $< -o $@

$(LIBCORE): $(LIB_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBCUDA): $(KERNEL_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

# (bench-linear and bench-ksplit call cuBLASLt's own API)
$(BUILD)/bench/gpu/bench-linear.o $(BUILD)/bench/gpu/bench-ksplit.o: \
    ALL_CFLAGS += -isystem $(CUDA_HOME)/include

# the daemon's modules as a library (tests link them), its main() apart
# the installed default model's place, for a dgemmad outside a build tree
$(BUILD)/daemon/main.o: ALL_CFLAGS += -DDG_DATADIR='"$(DATADIR)"'
# (with CUDA the daemon can run the GPU backend; without, only the CPU's)
$(BUILD)/daemon/main.o: ALL_CFLAGS += -DDG_HAVE_CUDA=$(HAVE_CUDA)

$(DAEMON_LIB): $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJ))
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

# the daemon's link (also tests/fault/dgemmad's, with the injector)
LINK_DAEMON = $(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(if $(GPU_ALL),$(CUDA_LIBS)) $(SYS_LIBS) -o $@
$(DAEMON_BIN): $(BUILD)/daemon/main.o $(DAEMON_LIB) $(GPU_ALL) $(LIBCORE)
	$(call say,LINK,$@)
	@mkdir -p $(@D)
	$(Q)$(LINK_DAEMON)

# libdgemma: a static archive (the CLI links it) and a shared library that
# exports only dgemma_* (client/libdgemma.map), with its pkg-config file.
define COMPILE_PIC
	$(call say,CC,$< [pic])
	@mkdir -p $(@D)
	$(Q)$(CC) $(ALL_CFLAGS) -fPIC -c $< -o $@
endef
$(filter-out $(BUILD)/client/pic/lib/%,$(LIBDGEMMA_PIC)): $(BUILD)/client/pic/%.o: client/%.c
	$(COMPILE_PIC)

$(filter $(BUILD)/client/pic/lib/%,$(LIBDGEMMA_PIC)): $(BUILD)/client/pic/lib/%.o: lib/%.c
	$(COMPILE_PIC)

$(LIBDGEMMA_A): $(LIBDGEMMA_OBJ)
	$(call say,AR,$@)
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBDGEMMA_SO): $(LIBDGEMMA_PIC) client/libdgemma.map
	$(call say,LINK,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libdgemma.so.0 \
	    -Wl,--version-script=client/libdgemma.map $(LIBDGEMMA_PIC) -ljansson -lm -o $@
	$(Q)ln -sf libdgemma.so.$(LIBDGEMMA_VERSION) $(BUILD)/lib/libdgemma.so.0
	$(Q)ln -sf libdgemma.so.0 $(BUILD)/lib/libdgemma.so

$(LIBDGEMMA_PC): client/dgemma.pc.in Makefile
	@mkdir -p $(@D)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(LIBDGEMMA_VERSION)|' $< >$@

$(CLIENT_BIN): $(CLIENT_SRC:%.c=$(BUILD)/%.o) $(LIBDGEMMA_A) $(LIBCORE)
	$(call say,LINK,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

$(EVAL_BIN): $(EVAL_OBJ) $(LIBDGEMMA_A) $(LIBCORE)
	$(call say,LINK,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

# the embedded default model: the checkpoint tools/train/train.py trained
# (model/default/, docs/notes.md "Training the default model")
DEFAULT_MODEL_SRC := $(wildcard model/default/*)
$(DEFAULT_MODEL)/config.json: $(DEFAULT_MODEL_SRC)
	$(call say,MODEL,$(DEFAULT_MODEL))
	$(Q)rm -rf $(DEFAULT_MODEL) && mkdir -p $(DEFAULT_MODEL)
	$(Q)cp $(DEFAULT_MODEL_SRC) $(DEFAULT_MODEL)/

$(RANDOM_MODEL)/config.json: $(EVAL_BIN)
	$(call say,MODEL,$(RANDOM_MODEL))
	$(Q)rm -rf $(RANDOM_MODEL) && mkdir -p $(dir $(RANDOM_MODEL))
	$(Q)$(EVAL_BIN) mkmodel --preset small --seed 1 --out $(RANDOM_MODEL) >/dev/null

$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(HARNESS_OBJ) $(DAEMON_LIB) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

# the allocation calls a fault injector linked into a program takes over
# (the linker's --wrap): t-alloc-failures brings its own allocator, so every
# allocation of the project's code and of the static libraries goes through it
FAULT_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup \
              -Wl,--wrap=posix_memalign
$(BUILD)/tests/unit/t-alloc-failures: LDFLAGS += $(FAULT_WRAP)

$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(BUILD)/tests/integration/fixture.o \
                               $(HARNESS_OBJ) $(LIBDGEMMA_A) $(DAEMON_LIB) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

# (t-faults preloads this fault injector into dgemmad: no sanitizers in it)
$(BUILD)/tests/fault/failmalloc.so: tests/fault/failmalloc.c
	$(call say,CC,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -O2 -g -fPIC -shared $< -ldl -o $@
$(BUILD)/tests/integration/t-faults: | $(BUILD)/tests/fault/failmalloc.so

# (under AddressSanitizer nothing can be preloaded over malloc: t-faults
# runs a dgemmad linked with the same injector wrapped around its calls)
$(BUILD)/tests/fault/failmalloc-wrap.o: tests/fault/failmalloc.c
	$(call say,CC,$< [wrap])
	@mkdir -p $(@D)
	$(Q)$(CC) $(ALL_CFLAGS) -DDG_FAULT_WRAP -c $< -o $@

$(BUILD)/tests/fault/dgemmad: LDFLAGS += $(FAULT_WRAP)
$(BUILD)/tests/fault/dgemmad: $(BUILD)/daemon/main.o $(BUILD)/tests/fault/failmalloc-wrap.o \
                              $(DAEMON_LIB) $(GPU_ALL) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(LINK_DAEMON)
ifneq ($(findstring address,$(SANITIZE)),)
$(BUILD)/tests/integration/t-faults: | $(BUILD)/tests/fault/dgemmad
endif

# (t-client makes each allocation of a dgemma-client run fail in turn: a
# client linked with the same injector wrapped around its calls, every build)
$(BUILD)/tests/fault/dgemma-client: LDFLAGS += $(FAULT_WRAP)
$(BUILD)/tests/fault/dgemma-client: $(CLIENT_SRC:%.c=$(BUILD)/%.o) \
                                    $(BUILD)/tests/fault/failmalloc-wrap.o $(LIBDGEMMA_A) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@
$(BUILD)/tests/integration/t-client-nomem: | $(BUILD)/tests/fault/dgemma-client
# (and a round of ring jobs through libdgemma, under the same injector)
$(BUILD)/tests/fault/ring-client: LDFLAGS += $(FAULT_WRAP)
$(BUILD)/tests/fault/ring-client: $(BUILD)/tests/fault/ring-client.o \
                                  $(BUILD)/tests/fault/failmalloc-wrap.o $(LIBDGEMMA_A) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@
$(BUILD)/tests/integration/t-client-nomem: | $(BUILD)/tests/fault/ring-client
ifeq ($(findstring address,$(SANITIZE)),)
$(BUILD)/tests/integration/t-client-nomem: | $(BUILD)/tests/fault/failmalloc.so
endif

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

# (the ring benchmark talks to a daemon through libdgemma)
$(BUILD)/bench/ring/%: $(BUILD)/bench/ring/%.o $(LIBDGEMMA_A) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(SYS_LIBS) -o $@

# (the GPU benchmarks link the CUDA side)
$(BUILD)/bench/gpu/%: $(BUILD)/bench/gpu/%.o $(LIBCUDA) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(CUDA_LIBS) $(SYS_LIBS) -o $@

bench-build: $(BENCH_BIN)

.SECONDARY: $(BUILD)/tests/gpu/gpu-util.o
$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(BUILD)/tests/gpu/gpu-util.o $(HARNESS_OBJ) \
                      $(LIBCUDA) $(LIBCORE)
	$(call say,LINK,$@)
	$(Q)$(CC) $(LDFLAGS) $^ $(STATIC_LIBS) $(CUDA_LIBS) $(SYS_LIBS) -o $@

# libFuzzer targets: clang, ASan + UBSan, linked with the library sources
# compiled once for them (with libFuzzer's coverage, not its main) into
# $(BUILD)/fuzz/libfuzz.a.
# A float converted to an integer type that cannot hold it, and a float
# divided by zero: GCC's -fsanitize=undefined leaves out both, clang's the
# second; the ASan suite and the fuzz targets ask for both.
SAN_FLOAT := float-cast-overflow,float-divide-by-zero
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -I. -g -O1 -fsanitize=address,undefined,$(SAN_FLOAT) \
               -fno-sanitize-recover=all
FUZZ_FLAGS := $(FUZZ_CFLAGS) -fsanitize=fuzzer
# (the daemon's request parser is fuzzed too: its sources go in as well)
FUZZ_DAEMON_SRC := daemon/protocol.c daemon/shm-ring.c
FUZZ_LIB := $(BUILD)/fuzz/libfuzz.a
FUZZ_LIB_OBJ := $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(LIB_SRC) $(FUZZ_DAEMON_SRC))
$(BUILD)/fuzz/obj/%.o: %.c
	$(call say,FUZZCC,$<)
	@mkdir -p $(@D)
	$(Q)$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_LIB): $(FUZZ_LIB_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && $(AR) rcs $@ $^
# (a target that needs more, e.g. a client parser: FUZZ_EXTRA_<target>)
FUZZ_EXTRA_fuzz-batch-input := client/batch-input.c
$(BUILD)/fuzz/fuzz-batch-input: $(FUZZ_EXTRA_fuzz-batch-input) client/batch-input.h
FUZZ_EXTRA_fuzz-problems := tools/eval/problems.c
$(BUILD)/fuzz/fuzz-problems: $(FUZZ_EXTRA_fuzz-problems) tools/eval/problems.h tools/eval/eval.h
$(BUILD)/fuzz/%: tests/fuzz/%.c $(FUZZ_LIB) $(wildcard lib/*.h daemon/*.h tests/fuzz/*.h)
	$(call say,FUZZ,$@)
	@mkdir -p $(@D)
	$(Q)$(CLANG) $(FUZZ_FLAGS) $< $(FUZZ_EXTRA_$*) $(FUZZ_LIB) $(STATIC_LIBS) $(SYS_LIBS) -o $@

# ---- test targets ----------------------------------------------------------
test: all $(UNIT_BIN) $(INTEG_BIN)
	$(Q)$(TEST_RUN)

# (each suite's runner call, shared by its target and check)
TEST_RUN = BUILD=$(BUILD) tests/run.sh $(UNIT_BIN) $(INTEG_BIN) $(CLI_TESTS) \
	    tests/eval/t-eval-default.sh

# The same suite built with ASan + UBSan (the tests that have one in their
# quick form, DG_TEST_QUICK), plus every fuzz target for FUZZ_SMOKE_SECONDS,
# in one runner call.  Both sanitizer builds are optimised as the plain one
# is (SAN_CFLAGS; frame pointers kept): at -O1 the CPU model's loops made
# the five longest ASan tests 167 s where -O2 takes 122, and the TSan tests
# 43 s where -O2 takes 37, on a machine of 2 CPUs.  The CPU backend's
# matrix products are checked a range at a time, not load by load
# (lib/san-range.h): side by side on that machine, t-engine under ASan
# 30.5 -> 5.7 s, t-client 52.1 -> 15.0 s, t-tp under TSan 33.7 -> 13.9 s.
# A sanitizer's report ends a program with exit status 86 (ASAN_OPTIONS
# exitcode), not ASan's 1: a leak on a path that exits 1 anyway (out of
# memory, a refused request) would otherwise pass wherever a test expects 1.
# Every allocation is filled with ASan's junk byte (0xbe), not just its
# first 4 KiB (max_malloc_fill_size): a read of bytes never written then
# sees junk, not the zeros of fresh pages, and a string left unterminated
# runs into the redzone (t-daemon-config's was found by valgrind; ASan
# reports it with the fill).  The suite's tests took 206 s with it and 211
# without, one run each, on a machine of 2 CPUs.
ASAN_BUILD := build-asan
ASAN_SANITIZE := address,undefined,$(SAN_FLOAT)
FUZZ_SMOKE_SECONDS ?= 5
SAN_CFLAGS := -O2 -g
test-asan: test-asan-build
	$(Q)$(ASAN_RUN)
test-asan-build:
	$(Q)$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) SANITIZE=$(ASAN_SANITIZE) \
	    CFLAGS="$(SAN_CFLAGS)" CUDA=0 asan-suite
ASAN_RUN = BUILD=$(ASAN_BUILD) FUZZ_DIR=$(ASAN_BUILD)/fuzz FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) \
	    ASAN_OPTIONS="exitcode=86:max_malloc_fill_size=4294967295$${ASAN_OPTIONS:+:$$ASAN_OPTIONS}" \
	    DG_TEST_QUICK=1 tests/run.sh $(UNIT_SRC:tests/unit/%.c=$(ASAN_BUILD)/tests/unit/%) \
	    $(INTEG_SRC:tests/integration/%.c=$(ASAN_BUILD)/tests/integration/%) $(CLI_TESTS) \
	    tests/fuzz/t-fuzz-smoke.sh

# The threaded tests under ThreadSanitizer (the rank threads, the
# collectives, the backend's job dispatch, the metrics writer, the tokenizing thread, the
# start-up group deadline), in their quick form; the range-checked loops' race check
# (t-san-range); and
# the whole daemon with its rank threads (t-daemon-tp: a race in the daemon
# ends it, so the test fails).
TSAN_BUILD := build-tsan
TSAN_TESTS := t-coll t-tp t-metrics-writer t-prep t-san-range t-group-deadline
TSAN_INTEG := t-daemon-tp
test-tsan: test-tsan-build
	$(Q)$(TSAN_RUN)
test-tsan-build:
	$(Q)$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) SANITIZE=thread CFLAGS="$(SAN_CFLAGS)" \
	    CUDA=0 $(TSAN_TESTS:%=$(TSAN_BUILD)/tests/unit/%) \
	    $(TSAN_INTEG:%=$(TSAN_BUILD)/tests/integration/%) $(TSAN_BUILD)/bin/dgemmad \
	    $(TSAN_BUILD)/model/random/config.json
TSAN_RUN = BUILD=$(TSAN_BUILD) DG_TEST_QUICK=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	    tests/run.sh $(TSAN_TESTS:%=$(TSAN_BUILD)/tests/unit/%) \
	    $(TSAN_INTEG:%=$(TSAN_BUILD)/tests/integration/%)

# (internal) what test-asan builds, invoked with BUILD=$(ASAN_BUILD)
.PHONY: asan-suite
asan-suite: all $(UNIT_BIN) $(INTEG_BIN) $(FUZZ_BIN)

ifeq ($(HAVE_CUDA),1)
test-gpu: all $(GPU_TEST_BIN)
	$(Q)if nvidia-smi -L >/dev/null 2>&1; then \
	    BUILD=$(BUILD) tests/run.sh $(GPU_TEST_BIN) $(GPU_TEST_SH); \
	else echo "no GPU here: built $(words $(GPU_TEST_BIN)) GPU test(s) in $(BUILD)/tests/gpu;" \
	     "run them on the GPU machine with: tests/run.sh $(GPU_TEST_BIN) $(GPU_TEST_SH)"; fi
else
test-gpu:
	@echo "test-gpu needs nvcc (CUDA toolkit); this is a CPU-only build" >&2; exit 1
endif

fuzz: $(FUZZ_BIN)
	$(Q)FUZZ_DIR=$(BUILD)/fuzz FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/t-fuzz-smoke.sh

EVAL_ARGS ?=
eval: all
	$(Q)BUILD=$(BUILD) tests/eval/run-eval.sh $(EVAL_ARGS)

check-cpu-only:
	$(Q)$(MAKE) --no-print-directory BUILD=build-cpu-only CUDA=0 all

# What CI runs: every build first (GPU objects and the GPU suite where
# nvcc is, a CPU-only build, the three suites' builds), then the CPU suite
# and the ASan/UBSan suite with the fuzz smoke run side by side, then the
# ThreadSanitizer suite alone; the last line is the total over the three.
# Each suite runs its programs one after another, so two run at once: on
# a machine of 2 CPUs the two suites took 400 s side by side where they
# took 275 + 290 s one after the other, every program's time within 1.9x
# of its time alone; the whole of .ci/run on a clean clone took 597 s
# where it had taken 807.  The CPU suite's lines show as they come, the ASan
# suite's (kept in CHECK_ASAN_LOG) once both are done.  Every suite runs
# whatever another's result; check fails if any program failed.
CHECK_TALLY = $(abspath $(BUILD))/check.tally
CHECK_ASAN_LOG = $(ASAN_BUILD)/tests/check-suite.log
check:
	$(Q)mkdir -p $(BUILD) $(ASAN_BUILD)/tests && rm -f $(CHECK_TALLY)
	$(Q)$(MAKE) --no-print-directory all $(UNIT_BIN) $(INTEG_BIN) \
	    $(if $(filter 1,$(HAVE_CUDA)),$(GPU_TEST_BIN))
	$(Q)$(MAKE) --no-print-directory check-cpu-only
	$(Q)$(MAKE) --no-print-directory test-asan-build
	$(Q)$(MAKE) --no-print-directory test-tsan-build
	$(Q)export TALLY_FILE=$(CHECK_TALLY); \
	    ( $(ASAN_RUN) ) >$(CHECK_ASAN_LOG) 2>&1 & asan=$$!; \
	    $(TEST_RUN); rc_cpu=$$?; \
	    wait $$asan; rc_asan=$$?; \
	    echo "--- the ASan/UBSan suite, run beside the CPU suite ($(CHECK_ASAN_LOG)):"; \
	    cat $(CHECK_ASAN_LOG); \
	    $(TSAN_RUN); rc_tsan=$$?; \
	    tests/tally.sh $(CHECK_TALLY); rc=$$?; \
	    if [ "$$rc_cpu$$rc_asan$$rc_tsan" != 000 ]; then \
	        echo "check: the suites' runners exited $$rc_cpu (CPU), $$rc_asan (ASan/UBSan)," \
	             "$$rc_tsan (TSan)" >&2; exit 1; fi; \
	    exit $$rc

deps:
	$(Q)tools/install-deps.sh

# ---- install ---------------------------------------------------------------
MAN_PAGES := $(wildcard man/*.[0-9])
install: all
	$(call say,INSTALL,$(DESTDIR)$(PREFIX))
	$(Q)install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(DATADIR)/model/default \
	    $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	$(Q)install -m 0755 $(BINS) $(DESTDIR)$(BINDIR)/
	$(Q)install -m 0644 $(DEFAULT_MODEL)/* $(DESTDIR)$(DATADIR)/model/default/
	$(Q)install -m 0644 client/dgemma.h $(DESTDIR)$(INCLUDEDIR)/dgemma.h
	$(Q)install -m 0644 $(LIBDGEMMA_A) $(DESTDIR)$(LIBDIR)/
	$(Q)install -m 0755 $(LIBDGEMMA_SO) $(DESTDIR)$(LIBDIR)/
	$(Q)ln -sf libdgemma.so.$(LIBDGEMMA_VERSION) $(DESTDIR)$(LIBDIR)/libdgemma.so.0
	$(Q)ln -sf libdgemma.so.0 $(DESTDIR)$(LIBDIR)/libdgemma.so
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|; s|@LIBDIR@|$(LIBDIR)|; s|@INCLUDEDIR@|$(INCLUDEDIR)|' \
	    -e 's|@VERSION@|$(LIBDGEMMA_VERSION)|' client/dgemma.pc.in \
	    >$(DESTDIR)$(LIBDIR)/pkgconfig/dgemma.pc
	$(Q)for p in $(MAN_PAGES); do s=$${p##*.}; install -d $(DESTDIR)$(MANDIR)/man$$s; \
	    install -m 0644 $$p $(DESTDIR)$(MANDIR)/man$$s/; done
	$(Q)install -d $(DESTDIR)$(SYSCONFDIR)/dgemma $(DESTDIR)$(UNITDIR) \
	    $(DESTDIR)$(SYSCONFDIR)/cron.d $(DESTDIR)$(SYSCONFDIR)/logrotate.d $(DESTDIR)$(SYSUSERSDIR)
	$(Q)test -e $(DESTDIR)$(SYSCONFDIR)/dgemma/dgemmad.yaml || \
	    install -m 0644 etc/dgemmad.yaml $(DESTDIR)$(SYSCONFDIR)/dgemma/dgemmad.yaml
	$(Q)sed 's|/usr/local/bin/|$(BINDIR)/|g; s|/etc/dgemma/|$(SYSCONFDIR)/dgemma/|g' \
	    etc/dgemmad.service >$(DESTDIR)$(UNITDIR)/dgemmad.service
	$(Q)install -m 0644 etc/dgemma.sysusers $(DESTDIR)$(SYSUSERSDIR)/dgemma.conf
	$(Q)test -e $(DESTDIR)$(SYSCONFDIR)/cron.d/dgemma-batch || \
	    sed 's|/usr/local/bin/|$(BINDIR)/|g' etc/dgemma-batch.cron \
	    >$(DESTDIR)$(SYSCONFDIR)/cron.d/dgemma-batch
	$(Q)test -e $(DESTDIR)$(SYSCONFDIR)/logrotate.d/dgemma || \
	    install -m 0644 etc/dgemma.logrotate $(DESTDIR)$(SYSCONFDIR)/logrotate.d/dgemma

uninstall:
	$(Q)for b in $(notdir $(BINS)); do rm -f $(DESTDIR)$(BINDIR)/$$b; done
	$(Q)rm -rf $(DESTDIR)$(DATADIR)/model/default
	$(Q)rm -f $(DESTDIR)$(INCLUDEDIR)/dgemma.h $(DESTDIR)$(LIBDIR)/libdgemma.* \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/dgemma.pc $(DESTDIR)$(UNITDIR)/dgemmad.service \
	    $(DESTDIR)$(SYSUSERSDIR)/dgemma.conf
	$(Q)for p in $(MAN_PAGES); do s=$${p##*.}; rm -f $(DESTDIR)$(MANDIR)/man$$s/$$(basename $$p); done
	@echo "kept: $(SYSCONFDIR)/dgemma/dgemmad.yaml, $(SYSCONFDIR)/cron.d/dgemma-batch," \
	    "$(SYSCONFDIR)/logrotate.d/dgemma"

clean:
	rm -rf build build-asan build-tsan build-cpu-only

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
