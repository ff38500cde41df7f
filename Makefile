# The two commands a new user runs: `make demo` and `make test`.
# Both create .venv on first use; torch is pinned here (the CPU wheel), not in the package.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-fast verify lint typecheck tlc bench clean proto image

# what the demo needs: the package, torch (the CPU wheel) and matplotlib for its picture
$(DEMO_STAMP): pyproject.toml Makefile
	@echo "make: creating $(VENV) with $$($(PY) --version) (once; about 1.5 GB, a few minutes)"
	$(PY) -m venv $(VENV)
	@echo "make: installing pip, then $(TORCH_PIN) (the CPU build, the largest part)"
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	@echo "make: installing aegis-flow and what the demo needs (nats-server, matplotlib)"
	$(BIN)/pip install -q -e ".[torch,report]" "$(TORCH_PIN)"
	touch $(DEMO_STAMP)

# and what the tests need besides: pytest, ruff, mypy, hera, the kubernetes client, NVML
$(STAMP): $(DEMO_STAMP)
	@echo "make: installing the test and cluster extras (pytest, ruff, mypy, hera, kubernetes)"
	$(BIN)/pip install -q -e ".[dev,torch,k8s,report,gpu]" "$(TORCH_PIN)"
	@echo "make: fetching nats-server 2.10 (the cluster image's) for the security tests"
	$(BIN)/python tests/tools/fetch_nats_210.py $(VENV)/nats-2.10
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m aegis_flow.demo

# Both tiers run three tests at a time on the 2 cores, worksteal keeping the long ones apart:
# the unit, property and model tests (the model checkers are CPU work, the Argo rehearsals
# mostly wait for their pods: 5.6 min two at a time, 4.5 three at a time), then the end-to-end
# jobs, which mostly wait (lost timeouts of 2-3 s, pauses, recoveries, training that sleeps
# between steps) and leave the cores ~70 % idle one at a time (25-26 min one at a time, 11 three
# at a time; four at a time took 9.5 and brought out a race under the load, fixed since, so
# 3 leaves headroom for the jobs' timings). E2E_JOBS=1 runs them one at a time. 2026-12-05.
E2E_JOBS ?= 3
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not e2e" -n 3 --dist worksteal --durations=8
	$(BIN)/python -m pytest -q -m e2e -n $(E2E_JOBS) --dist worksteal --durations=12
	$(BIN)/ruff check aegis_flow tests bench examples workflows
	$(BIN)/mypy

# the inner loop: unit, property and model tests, no end-to-end job processes (make test runs all)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not e2e" -n 3 --dist worksteal
	$(BIN)/ruff check aegis_flow tests bench examples workflows

verify: $(STAMP)
	$(BIN)/aegis-flow verify --workers 3 --max-retry 2 --message-layer

# TLC (needs Java) on spec/P0.cfg and spec/P1.cfg, then spec/code conformance of P1.
tlc: $(STAMP)
	$(BIN)/python -m aegis_flow.verify.tlc_cli --conformance spec/P0.cfg spec/P1.cfg

bench: $(STAMP)
	$(BIN)/python bench/verify_bench.py

proto: $(STAMP)  # regenerate aegis_flow/rpc/aegis_pb2*.py from proto/aegis.proto (committed)
	$(BIN)/python -m aegis_flow.rpc.generate

# the aegis image (Dockerfile; README "Building the aegis image"), tagged with pyproject's
# version: the tag the rendered workflows use (jobspec.DEFAULT_AEGIS_IMAGE). DOCKER=podman works.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -n 1)
AEGIS_IMAGE ?= ghcr.io/aegis-flow/aegis-flow:$(VERSION)
DOCKER ?= docker

image:
	@command -v $(DOCKER) >/dev/null 2>&1 || { echo "make image: '$(DOCKER)' is not installed:" \
	  "install Docker (or set DOCKER=podman) to build $(AEGIS_IMAGE) from the Dockerfile" >&2; exit 1; }
	@$(DOCKER) info >/dev/null 2>&1 || { echo "make image: '$(DOCKER) info' failed: no Docker" \
	  "daemon to build $(AEGIS_IMAGE) with (start it, or build on a machine that has one)" >&2; exit 1; }
	$(DOCKER) build -t $(AEGIS_IMAGE) .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info
