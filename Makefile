# UndoLog. `make demo` and `make test` bootstrap everything they need (venv, Go builds).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Binaries built by `make tools` come first, so kubectl and helm are the pinned ones.
export PATH := $(CURDIR)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export UNDOLOG_BIN_DIR ?= $(CURDIR)/bin

.PHONY: help venv tools crds lint test demo cluster-up cluster-down clean

help:
	@echo "make demo          run the onboarding saga on a local control plane (builds what it needs)"
	@echo "make test          lint, type-check and run every test against a real apiserver"
	@echo "make tools         build etcd, kube-apiserver, kube-controller-manager, kubectl, helm into bin/"
	@echo "make cluster-up    start the local control plane (.cluster/kubeconfig); cluster-down stops it"
	@echo "make crds          regenerate crds/ from the API models"

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
