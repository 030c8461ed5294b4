# Thin front for the README's two commands. Everything real lives in CMake.
#   make demo  — install what is missing, build, run the main job on its embedded default
#   make test  — install what is missing, build, run every CPU test
#   make cuda  — also compile the CUDA kernels (needs nvcc; run them on the GPU machine)
#   make docs  — Doxygen (warnings are errors for public headers)
#   make test-sanitize — the whole CPU suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#   make fuzz  — every libFuzzer target in fuzz/ for FUZZ_SECONDS each (clang-14, ASan + UBSan)
SHELL := /bin/bash
.DEFAULT_GOAL := demo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# ccache rewrites paths under the checkout as relative ones, so two clones share one cache.
export CCACHE_BASEDIR := $(CURDIR)

# Debian 12 packages the CPU build needs (CUDA is optional and not from Debian).
DEB_PACKAGES := cmake g++ make libeigen3-dev libboost-program-options-dev catch2 \
                doxygen libncurses-dev tmux ccache python3-pytest python3-numpy
# What `make fuzz` needs on top: clang and its libFuzzer/sanitizer runtimes.
FUZZ_PACKAGES := clang-14 libclang-rt-14-dev
FUZZ_SECONDS ?= 600

.PHONY: demo test deps fuzz-deps install-missing build cuda docs clean test-sanitize fuzz

deps:
	@$(MAKE) --no-print-directory install-missing PACKAGES="$(DEB_PACKAGES)"

fuzz-deps: deps
	@$(MAKE) --no-print-directory install-missing PACKAGES="$(FUZZ_PACKAGES)"

# Installs the Debian packages in PACKAGES that are missing (as root), or prints the line to run.
install-missing:
	@missing=""; \
	for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ]; then \
	  echo "flashlab: installing:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	else \
	  echo "flashlab: missing Debian packages:$$missing" >&2; \
	  echo "flashlab: run:  sudo apt-get install -y$$missing" >&2; \
	  exit 1; \
	fi

build: deps
	cmake --preset cpu
	cmake --build --preset cpu -j $(JOBS)

# The demo runs one program: build only it (and what it links), not the tests.
demo: deps
	cmake --preset cpu
	cmake --build --preset cpu -j $(JOBS) --target flashlab
	./build/cpu/app/flashlab demo

test: build
	ctest --preset cpu -j $(JOBS)

cuda: deps
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  PATH="$$PATH:/usr/local/cuda/bin" cmake --preset cuda && \
	  PATH="$$PATH:/usr/local/cuda/bin" cmake --build --preset cuda -j $(JOBS); \
	else \
	  echo "flashlab: note: no nvcc found — CUDA parts skipped"; \
	fi

docs: deps
	cmake --preset cpu
	cmake --build --preset cpu --target docs

test-sanitize: deps
	cmake --preset debug
	cmake --build --preset debug -j $(JOBS)
	ctest --preset debug -j $(JOBS)

# Each target fuzzes for FUZZ_SECONDS from its seed corpus (fuzz/corpus/NAME, read only); what it
# finds new goes to build/fuzz/corpus/NAME, crashes to build/fuzz/artifacts/ (then: fix, add the
# input to fuzz/corpus/NAME, and the replay test keeps it fixed).
fuzz: fuzz-deps
	cmake --preset fuzz
	cmake --build --preset fuzz -j $(JOBS)
	@mkdir -p build/fuzz/artifacts; \
	for bin in build/fuzz/fuzz/fuzz_*; do \
	  [ -f "$$bin" ] && [ -x "$$bin" ] || continue; \
	  name=$$(basename $$bin); name=$${name#fuzz_}; \
	  mkdir -p build/fuzz/corpus/$$name; \
	  echo "flashlab: fuzzing $$name for $(FUZZ_SECONDS) s"; \
	  $$bin -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 -artifact_prefix=build/fuzz/artifacts/$$name- \
	    build/fuzz/corpus/$$name fuzz/corpus/$$name || exit 1; \
	done

clean:
	rm -rf build
