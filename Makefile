# UndoLog. `make demo` and `make test` bootstrap everything they need (venv, Go builds).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Binaries built by `make tools` come first, so kubectl and helm are the pinned ones.
export PATH := $(CURDIR)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export UNDOLOG_BIN_DIR ?= $(CURDIR)/bin

.PHONY: help venv tools crds lint test demo bench chaos cluster-up cluster-down clean

help:
	@echo "make demo          run the onboarding saga on a local control plane (builds what it needs)"
	@echo "make test          lint, type-check and run every test against a real apiserver"
	@echo "make tools         build etcd, kube-apiserver, kube-controller-manager, kubectl, helm into bin/"
	@echo "make cluster-up    start the local control plane (.cluster/kubeconfig); cluster-down stops it"
	@echo "make crds          regenerate crds/ from the API models"
	@echo "make bench         every benchmark; tables in the terminal, JSON in bench/results, docs/throughput.png"
	@echo "make chaos         the fault-injection scenarios at full size (counts in bench/results/chaos.json)"

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

tools:
	tools/build.sh

crds: venv
	$(PY) -m undolog.crds crds

lint: venv tools
	$(VENV)/bin/ruff check operator tests bench examples
	$(VENV)/bin/ruff format --check operator tests bench examples
	$(VENV)/bin/mypy -p undolog
	bin/helm lint --strict charts/undolog
	bin/helm template undolog charts/undolog --kube-version 1.37.2 > /dev/null
	bin/helm template undolog charts/undolog --kube-version 1.37.2 --set watchNamespaces='{team-a,team-b}' \
		--set metrics.serviceMonitor.enabled=true > /dev/null

test: venv tools lint
	$(VENV)/bin/pytest

cluster-up: venv tools
	$(VENV)/bin/undolog cluster up

cluster-down: venv
	$(VENV)/bin/undolog cluster down

clean: cluster-down
	rm -rf .cluster

demo: venv tools
	$(PY) -m examples.onboarding.demo

bench: venv tools
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m bench.compensation --sizes 1 10 100 1000
	$(PY) -m bench.forward --concurrency 1 100
	$(PY) -m bench.sqlite_ledger
	$(PY) -m bench.scale --sizes 1000 10000
	$(PY) -m bench.plot

chaos: venv tools
	UNDOLOG_CHAOS=full $(VENV)/bin/pytest tests/chaos -s
