# Thin front for the README's two commands. Everything real lives in CMake.
#   make demo  — install what is missing, build, run the main job on its embedded default
#   make test  — install what is missing, build, run every CPU test
#   make cuda  — also compile the CUDA kernels (needs nvcc; run them on the GPU machine)
#   make docs  — Doxygen (warnings are errors for public headers)
SHELL := /bin/bash
.DEFAULT_GOAL := demo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# ccache rewrites paths under the checkout as relative ones, so two clones share one cache.
export CCACHE_BASEDIR := $(CURDIR)

# Debian 12 packages the CPU build needs (CUDA is optional and not from Debian).
DEB_PACKAGES := cmake g++ make libeigen3-dev libboost-program-options-dev catch2 \
                doxygen libncurses-dev tmux ccache

.PHONY: demo test deps build cuda docs clean

deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
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

demo: build
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

clean:
	rm -rf build
