# zaya.c - build, test, demo.  `make` builds ./zaya with cc, libc (pthreads) and libm only.
CC      ?= cc
# arm64 (Apple Silicon with clang, ARM servers with gcc or clang): -mcpu=native, which both take there (Apple
# clang before 15 refuses -march=native on arm64); the NEON kernels need nothing more (kernels.c)
ifneq ($(filter arm64 aarch64,$(shell uname -m)),)
CFLAGS  ?= -O3 -mcpu=native
else
CFLAGS  ?= -O3 -march=native
endif
WARN     = -std=c11 -Wall -Wextra -Werror -Wno-unknown-pragmas
# (not a warning, but on every line that has $(WARN)): no fused multiply-add where the C has a * b + c,
# so a build gives the same bits on every machine and compiler (gcc -std=c11 is off already; clang is not)
WARN    += -ffp-contract=off
COMMIT  := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DEFS     = -DZAYA_COMMIT=\"$(COMMIT)\"
LIB      = zaya.c blob.c kernels.c ggml_round.c tokenizer.c trace.c zmath.c torch_cpu.c vision.c image.c
CLI      = dump.c kld.c replay.c
SRC      = $(LIB) $(CLI) main.c
HDR      = zaya.h tensor.h kernels.h ggml_round.h tokenizer.h trace.h dump.h kld.h replay.h zmath.h torch_cpu.h vision.h image.h
LIBS     = -pthread -lm
# compare.py and the tests need numpy: PYTHON is the first of python3, /usr/bin/python3 that imports it
NUMPY_HINT = compare.py needs numpy: apt-get install python3-numpy (tried python3 and /usr/bin/python3; or make PYTHON=...)
PYTHON  ?= $(or $(firstword $(foreach p,python3 /usr/bin/python3,$(shell $(p) -c 'import numpy' >/dev/null 2>&1 && echo $(p)))),python3)
FIXTURES ?= test/fixtures
CKPT    ?= $(FIXTURES)/checkpoint_native

.PHONY: all debug test demo demo-chat demo-vl docs fuzz clean capture arm64
all: zaya

zaya: $(SRC) $(HDR)
	$(CC) $(CFLAGS) $(WARN) $(DEFS) -o $@ $(SRC) $(LIBS)

# debug: AddressSanitizer + UndefinedBehaviorSanitizer, portable C kernels (no -march=native; ZAYA_PORTABLE:
# no NEON on arm64 either, where every compiler turns it on), the twin test/test_simd.py compares ./zaya with
debug: zaya_debug
zaya_debug: $(SRC) $(HDR)
	$(CC) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all $(WARN) $(DEFS) -DZAYA_PORTABLE -o $@ $(SRC) $(LIBS)

# test/test_kernels.c: every fast kernel against its reference twin (kernels.c)
build/test_kernels: test/test_kernels.c $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_kernels.c $(LIB) $(LIBS)

# test/test_zmath.c: zmath.c's functions' ulp error over sweeps, against libm in double
build/test_zmath: test/test_zmath.c zmath.c zmath.h
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_zmath.c zmath.c -lm

# test/test_ggml_round.c: ggml_round.c's quantizers against ggml's recorded ones, and the placement in matmul
build/test_ggml_round: test/test_ggml_round.c $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_ggml_round.c $(LIB) $(LIBS)

# test/test_sample.c includes main.c whole, to test the command line's static sampler
build/test_sample: test/test_sample.c $(SRC) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_sample.c $(LIB) $(CLI) $(LIBS)

# test/test_decode.c: a token decoded without a tap = the same token with one (--dump), any thread count
build/test_decode: test/test_decode.c $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_decode.c $(LIB) $(LIBS)

# test/test_bf16_steps.c: each step of forward() in bf16 on the official bf16 run's inputs (includes zaya.c)
build/test_bf16_steps: test/test_bf16_steps.c $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_bf16_steps.c $(filter-out zaya.c,$(LIB)) $(LIBS)

# test/test_vision.c: vision.c's tower on raw float32 inputs, every tap written out (test/test_vision.py)
build/test_vision: test/test_vision.c vision.c vision.h kernels.c kernels.h ggml_round.c ggml_round.h tensor.h zmath.c zmath.h torch_cpu.c torch_cpu.h
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_vision.c vision.c kernels.c ggml_round.c zmath.c torch_cpu.c $(LIBS)

# test/test_torch_cpu.c: torch_cpu.c and matmul_chain on raw float32 inputs (test/test_torch_cpu.py)
build/test_torch_cpu: test/test_torch_cpu.c kernels.c kernels.h ggml_round.c ggml_round.h tensor.h zmath.c zmath.h torch_cpu.c torch_cpu.h
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_torch_cpu.c kernels.c ggml_round.c zmath.c torch_cpu.c $(LIBS)

# test/test_image.c: image.c's PNG/PPM decoding and the processor's preprocessing on one file (test/test_vl.py)
build/test_image: test/test_image.c image.c image.h vision.h tensor.h
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ test/test_image.c image.c -lm

# bench/decode_vs_read.c: decode steps alternating with plain reads of the same weight bytes (bench.sh)
build/decode_vs_read: bench/decode_vs_read.c bench/read_sum.h $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) -fopenmp $(WARN) -I. -o $@ bench/decode_vs_read.c $(LIB) $(LIBS)

# bench/matmul_rate.c: one product's speed on one thread against a read of its weight bytes
build/matmul_rate: bench/matmul_rate.c bench/read_sum.h $(LIB) $(HDR)
	mkdir -p build
	$(CC) $(CFLAGS) $(WARN) -I. -o $@ bench/matmul_rate.c $(LIB) $(LIBS)

test: zaya zaya_debug build/test_kernels build/test_zmath build/test_ggml_round build/test_sample build/decode_vs_read build/matmul_rate build/test_decode build/test_bf16_steps build/test_vision build/test_image build/test_torch_cpu
	@$(PYTHON) -c 'import numpy' 2>/dev/null || { echo "make test: $(NUMPY_HINT)" >&2; exit 1; }
	$(PYTHON) test/run_tests.py --fixtures $(FIXTURES)

# arm64 cross builds on an x86 Debian machine (gcc-aarch64-linux-gnu; run with qemu-aarch64 -L /usr/aarch64-linux-gnu):
# NEON kernels with the dot-product extension, and the portable loops; test/test_arm.py builds its own
ARM64_CC ?= aarch64-linux-gnu-gcc
arm64: build/zaya-arm64 build/zaya-arm64-portable
build/zaya-arm64: $(SRC) $(HDR)
	mkdir -p build
	$(ARM64_CC) -O3 -march=armv8.2-a+dotprod $(WARN) $(DEFS) -o $@ $(SRC) $(LIBS)
build/zaya-arm64-portable: $(SRC) $(HDR)
	mkdir -p build
	$(ARM64_CC) -O3 -march=armv8-a+nosimd $(WARN) $(DEFS) -o $@ $(SRC) $(LIBS)

# the main job on real input: export a hub-format checkpoint (default: the repository's compact fixture,
# whose weights are random, so its text is noise; CKPT=dir for a real one), generate from an English prompt
DEMO_BLOB   = build/demo_$(notdir $(abspath $(CKPT))).bin
DEMO_PROMPT = The old lighthouse keeper climbed the spiral stairs
DEMO_CHAT   = Write one sentence about lighthouses.
$(DEMO_BLOB): $(CKPT)/config.json export_weights.py export_tokenizer.py
	mkdir -p build
	$(PYTHON) export_weights.py $(CKPT) $@

demo: zaya $(DEMO_BLOB)
	@echo "prompt: $(DEMO_PROMPT)"
	./zaya $(DEMO_BLOB) -i "$(DEMO_PROMPT)" -n 32 -t 0.8 -s 42

# one chat turn, non-interactively: the user line goes to ./zaya -m chat on stdin
demo-chat: zaya $(DEMO_BLOB)
	@echo "user: $(DEMO_CHAT)"
	echo "$(DEMO_CHAT)" | ./zaya $(DEMO_BLOB) -m chat -y "You are a helpful assistant." --no-think -n 48 -t 0.8 -s 42

# ZAYA1-VL: the compact VL fixture (test/fixtures/vl, composed by tools/vl_checkpoint.py; random weights, so
# noise text) reading one of its images; VL_CKPT=dir and VL_IMAGE=file.png for a real checkpoint and image
VL_CKPT  ?= build/vl_checkpoint
VL_IMAGE ?= $(FIXTURES)/vl/image_a/image.png
VL_BLOB   = build/demo_vl_$(notdir $(abspath $(VL_CKPT))).bin
build/vl_checkpoint/config.json: $(FIXTURES)/vl/config.json $(FIXTURES)/vl/extra.safetensors \
		$(FIXTURES)/checkpoint_native/model.safetensors tools/vl_checkpoint.py
	$(PYTHON) tools/vl_checkpoint.py $(FIXTURES) build/vl_checkpoint > /dev/null
$(VL_BLOB): $(VL_CKPT)/config.json export_weights.py export_tokenizer.py
	$(PYTHON) export_weights.py $(VL_CKPT) $@

demo-vl: zaya $(VL_BLOB)
	@echo "image: $(VL_IMAGE)"
	./zaya $(VL_BLOB) --image $(VL_IMAGE) -i "Describe this image." -n 32 -t 0.8 -s 42

# regenerate the --trace blocks of docs/walkthrough.md from the fixture (test_walkthrough checks them)
docs: zaya
	mkdir -p build
	$(PYTHON) export_weights.py $(CKPT) build/walkthrough.bin > /dev/null
	$(PYTHON) docs/make_walkthrough.py --blob build/walkthrough.bin --fixtures $(FIXTURES)

# libFuzzer on model blobs for FUZZ_TIME seconds (needs clang; see test/fuzz/README.md for the other targets)
FUZZ_TIME ?= 600
fuzz:
	mkdir -p build
	clang -g -O1 -march=native -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 \
	    -I. test/fuzz/fuzz_blob.c $(LIB) $(LIBS) -o build/fuzz_blob
	$(PYTHON) test/fuzz/make_seeds.py build/fuzz_blob_corpus
	mkdir -p build/fuzz_blob_crashes
	cd build && ./fuzz_blob fuzz_blob_corpus -max_len=32768 -timeout=10 -rss_limit_mb=2048 \
	    -max_total_time=$(FUZZ_TIME) -artifact_prefix=fuzz_blob_crashes/

# optional, not part of all/test: tools/llama_capture.cpp against a built llama.cpp checkout (docs/compare.md §9)
# make capture LLAMA=~/llama.cpp [LLAMA_LIB=~/llama.cpp/build/bin]
LLAMA_LIB ?= $(LLAMA)/build/bin
capture: tools/llama_capture.cpp
	@test -n "$(LLAMA)" || { echo "make capture: set LLAMA to a built llama.cpp checkout (LLAMA=~/llama.cpp)"; exit 2; }
	mkdir -p build
	g++ -O2 -std=c++17 -I$(LLAMA)/include -I$(LLAMA)/ggml/include -o build/llama_capture tools/llama_capture.cpp \
		-L$(LLAMA_LIB) -lllama -lggml -lggml-base -Wl,-rpath,$(LLAMA_LIB)

clean:
	rm -rf zaya zaya_debug build
