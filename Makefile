# UndoLog. `make demo` and `make test` bootstrap everything they need (venv, Go builds).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Binaries built by `make tools` come first, so kubectl and helm are the pinned ones.
export PATH := $(CURDIR)/bin:$(CURDIR)/$(VENV)/bin:$(PATH)
export UNDOLOG_BIN_DIR ?= $(CURDIR)/bin
LOCK := $(VENV)/bin/uv pip compile pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--generate-hashes --quiet
PYTHON_SOURCES := operator tests bench examples devtools
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: help venv venv-demo screenshots tools tools-control-plane tools-helm dist browser faketime postgres crds lock lint test unit demo bench chaos traces cluster-up cluster-down cluster-reset clean \
	image image-deps mcp-agent mcp-servers mcp-conformance participant-kit node-deps node-up node-down e2e demo-helm alerts

help:
	@echo "make demo          run the onboarding saga on a local control plane (builds what it needs)"
	@echo "make test          lint, type-check, check the layering, and run every test against a real apiserver"
	@echo "make unit          the unit tests alone (no control plane, about a minute)"
	@echo "make browser       install Debian's chromium for the dashboard tests"
	@echo "make screenshots   the browser suite, its screenshots written over docs/ (make test keeps them in build/)"
	@echo "make tools         build the control plane, a node (kubelet, containerd, ...), kubectl and helm into bin/"
	@echo "                   (each target builds only the groups it needs: tools/build.sh control-plane|helm|node)"
	@echo "make image         the operator image from the Dockerfile, without Docker: build/undolog-image.oci.tar"
	@echo "make cluster-up    start the local control plane (.cluster/kubeconfig), or restart what died on its data"
	@echo "make cluster-down  stop it (data kept); make cluster-reset deletes its data (every saga)"
	@echo "make node-up       the control plane with a node that runs pods (kubelet, containerd, runc; root)"
	@echo "make node-down     stop them, the pods, and undo the node's network and kernel settings"
	@echo "make e2e           helm install the chart with the built image on that node, and prove it works"
	@echo "make dist          what a release publishes, built and checked in dist/ (wheel, sdist, chart, image, SBOM)"
	@echo "make demo-helm     the onboarding story against the operator running as pods on the node"
	@echo "make crds          regenerate crds/ from the API models"
	@echo "make lock          re-resolve requirements/*.txt (exact versions, hashes) from pyproject.toml's ranges"
	@echo "make bench         every benchmark; tables in the terminal, JSON in bench/results, docs/throughput.png"
	@echo "make chaos         the long fault scenarios (marked fault) at full size (counts in bench/results/chaos.json)"
	@echo "make traces        an SDK saga's trace read back from Jaeger (built from the Go module proxy)"
	@echo "make alerts        the chart's alerts evaluated by Prometheus (built from the Go module proxy) on a real scrape"

venv: $(VENV)/.installed

venv-demo: $(VENV)/.installed-demo

# The venv with one lock's exact, hash-checked versions; the project itself in development mode.
install_lock = $(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q --upgrade pip && \
	$(PY) -m pip install -q --require-hashes -r $(1) && $(PY) -m pip install -q --no-deps -e .

# Then whatever an earlier lock installed and this one does not list is removed (uv keeps pip),
# so a warm venv runs the tests with what a clean clone gets; the project goes back in after.
$(VENV)/.installed: pyproject.toml requirements/dev.txt
	$(call install_lock,requirements/dev.txt)
	$(VENV)/bin/uv pip sync -q --python $(PY) --require-hashes requirements/dev.txt && $(PY) -m pip install -q --no-deps -e .
	touch $@

# The demo and the local control plane need the product and devtools' two libraries, not the
# test and lint tools; a venv with the development lock has them all already.
$(VENV)/.installed-demo: pyproject.toml requirements/demo.txt
	if [ $(VENV)/.installed -nt pyproject.toml ] && [ $(VENV)/.installed -nt requirements/demo.txt ]; \
	  then touch $@; else $(call install_lock,requirements/demo.txt) && touch $@; fi

# make dist's tools (build, twine, cyclonedx-bom) in a venv of their own: pyproject.toml says why.
RELEASE_VENV := .venv-release
$(RELEASE_VENV)/.installed: requirements/release.txt
	$(PYTHON) -m venv $(RELEASE_VENV) && $(RELEASE_VENV)/bin/python -m pip install -q --upgrade pip && \
	$(RELEASE_VENV)/bin/python -m pip install -q --require-hashes -r requirements/release.txt
	touch $@

lock: venv
	$(LOCK) --extra operator --extra cli --extra dashboard --extra gateway -o requirements/operator.txt
	$(LOCK) --extra dev -o requirements/dev.txt
	$(LOCK) --extra demo -c requirements/dev.txt -o requirements/demo.txt
	$(LOCK) --extra dev --extra bench -o requirements/bench.txt
	$(LOCK) --extra release -o requirements/release.txt

tools:
	tools/build.sh

# Each target builds the groups it needs: the demo and the tests no node, only make e2e does.
tools-control-plane:
	tools/build.sh control-plane
tools-helm:
	tools/build.sh helm

# The dashboard tests drive Debian's chromium (never a browser downloaded at run time).
browser: /usr/bin/chromium
/usr/bin/chromium:
	$(SUDO) apt-get install -y -q chromium || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }

# The TypeScript agent of the MCP gateway tests: the official MCP SDK from npm, as its lock pins it.
mcp-agent: tests/mcp_agent/node_modules/.package-lock.json
tests/mcp_agent/node_modules/.package-lock.json: tests/mcp_agent/package-lock.json
	cd tests/mcp_agent && npm ci --no-audit --no-fund --loglevel=error

# Real MCP servers from the npm registry, the peers of the gateway's catalog tests (stdio).
mcp-servers: tests/mcp_servers/node_modules/.package-lock.json
tests/mcp_servers/node_modules/.package-lock.json: tests/mcp_servers/package-lock.json
	cd tests/mcp_servers && npm ci --no-audit --no-fund --loglevel=error

# The MCP conformance suite (its server scenarios judge the gateway), on Node 22 from npm.
mcp-conformance: tests/conformance/node_modules/.package-lock.json
tests/conformance/node_modules/.package-lock.json: tests/conformance/package-lock.json
	cd tests/conformance && npm ci --no-audit --no-fund --loglevel=error

# The TypeScript participant kit: its npm dependencies as its lock pins them, compiled to dist/.
participant-kit: participant-kit/dist/index.js
participant-kit/node_modules/.package-lock.json: participant-kit/package-lock.json
	cd participant-kit && npm ci --no-audit --no-fund --loglevel=error
participant-kit/dist/index.js: participant-kit/node_modules/.package-lock.json participant-kit/tsconfig.json participant-kit/src/*.ts
	cd participant-kit && npx tsc -p .

# Debian's libfaketime sets a test operator's clock off, as on a node with a bad clock.
faketime: /usr/bin/faketime
/usr/bin/faketime:
	$(SUDO) apt-get install -y -q faketime || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q faketime; }

# The archive's tests run a real PostgreSQL server: Debian's, started by the tests as an unprivileged user.
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl > /dev/null 2>&1 || $(SUDO) apt-get install -y -q postgresql \
		|| { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q postgresql; }

# buildah builds the Dockerfile with Debian's runc (tools/image.sh: buildah's crun refuses this
# machine's cgroups); debootstrap makes a base when no registry is reachable.
image-deps:
	@command -v buildah > /dev/null && command -v debootstrap > /dev/null && command -v runc > /dev/null \
		|| $(SUDO) apt-get install -y -q buildah debootstrap runc \
		|| { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q buildah debootstrap runc; }

image: venv tools image-deps
	$(SUDO) PY=$(PY) tools/image.sh

# A node: Debian's runc, the CNI plugins and iptables (kubelet, containerd come from make tools).
node-deps:
	@command -v runc > /dev/null && test -x /usr/lib/cni/bridge && command -v iptables > /dev/null \
		|| $(SUDO) apt-get install -y -q runc containernetworking-plugins iptables \
		|| { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q runc containernetworking-plugins iptables; }

NODE_CLUSTER ?= .cluster-node
node-up: venv tools node-deps image
	$(SUDO) $(PY) -m devtools.cluster up --node --state-dir $(NODE_CLUSTER)

node-down: venv
	$(SUDO) $(PY) -m devtools.cluster down --state-dir $(NODE_CLUSTER)

demo-helm: node-up
	$(SUDO) $(PY) -m examples.onboarding.demo_helm $(NODE_CLUSTER)/kubeconfig

e2e: venv tools node-deps dist
	$(SUDO) UNDOLOG_E2E=1 $(VENV)/bin/pytest tests/e2e -s

# What a release publishes (tools/dist.sh): sdist and wheel, the chart package, the image archive
# and its SBOM, checksums; each checked. The e2e tests install this chart package.
dist: venv $(RELEASE_VENV)/.installed tools-helm image
	PY=$(PY) RELEASE_PY=$(RELEASE_VENV)/bin/python tools/dist.sh

# Jaeger v2 from the Go module proxy (tools/jaeger/go.mod pins it), for `make traces`.
bin/jaeger: tools/jaeger/go.mod tools/jaeger/go.sum
	cd tools/jaeger && go build -trimpath -o $(CURDIR)/bin/jaeger github.com/jaegertracing/jaeger/cmd/jaeger

# Ory Hydra from the Go module proxy (tools/hydra/go.mod pins it; its replace of pop as Hydra's own
# go.mod has it), with SQLite built in for its in-memory store: the authorization server that
# issues the JWTs of the gateway's authentication tests.
bin/hydra: tools/hydra/go.mod tools/hydra/go.sum
	cd tools/hydra && CGO_ENABLED=1 go build -trimpath -tags sqlite,sqlite_omit_load_extension -o $(CURDIR)/bin/hydra github.com/ory/hydra/v2

traces: venv tools-control-plane bin/jaeger
	UNDOLOG_TRACES=1 $(VENV)/bin/pytest tests/traces -s

# Prometheus from the Go module proxy (tools/prometheus/go.mod pins it), for `make alerts`.
bin/prometheus: tools/prometheus/go.mod tools/prometheus/go.sum
	cd tools/prometheus && go build -trimpath -o $(CURDIR)/bin/prometheus github.com/prometheus/prometheus/cmd/prometheus

alerts: venv tools-control-plane tools-helm bin/prometheus
	UNDOLOG_ALERTS=1 $(VENV)/bin/pytest tests/alerts -s

crds: venv
	$(PY) -m devtools.crds crds

lint: venv tools-helm
	$(VENV)/bin/ruff check $(PYTHON_SOURCES)
	$(VENV)/bin/ruff format --check $(PYTHON_SOURCES)
	$(VENV)/bin/mypy -p undolog
	$(VENV)/bin/mypy $(filter-out operator,$(PYTHON_SOURCES))
	$(VENV)/bin/lint-imports
	bin/helm lint --strict charts/undolog
	bin/helm template undolog charts/undolog --kube-version 1.37.2 > /dev/null
	bin/helm template undolog charts/undolog --kube-version 1.37.2 --set watchNamespaces='{team-a,team-b}' \
		--set metrics.serviceMonitor.enabled=true > /dev/null

# Two workers, each with a control plane of its own; a file's tests stay together, in order.
TEST_WORKERS ?= 2
test: venv tools-control-plane tools-helm browser faketime postgres mcp-agent mcp-servers mcp-conformance participant-kit bin/hydra lint
	$(VENV)/bin/pytest -m "not fault" -n $(TEST_WORKERS) --dist loadfile --durations=15

# The browser suite, its screenshots written over docs/ (make test leaves them in build/screenshots/).
screenshots: venv tools-control-plane browser postgres
	UNDOLOG_SCREENSHOTS=$(CURDIR)/docs $(VENV)/bin/pytest tests/browser -q

# The pure decisions and the operator layer through its seams: no control plane, no tools.
unit: venv
	$(VENV)/bin/pytest tests/unit -q

cluster-up: venv-demo tools-control-plane
	$(PY) -m devtools.cluster up

cluster-down: venv-demo
	$(PY) -m devtools.cluster down

cluster-reset: venv-demo
	$(PY) -m devtools.cluster reset

clean: cluster-reset

demo: venv-demo tools-control-plane
	$(PY) -m examples.onboarding.demo

# bench's Go clients (no dependencies), so the client is not the bottleneck: the raw API ceiling,
# and the floor of the abort-to-first-call figure (the least any controller does).
GO_CLIENTS := $(wildcard bench/goclients/*/*.go) bench/goclients/go.mod
bin/undolog-bench-ceiling bin/undolog-bench-floor: bin/undolog-bench-%: $(GO_CLIENTS)
	cd bench/goclients && go build -trimpath -o $(CURDIR)/$@ ./$*

# Temporal's CLI and dev server (Server 1.29.1) from the Go module proxy, for bench.temporal;
# newer CLI releases need a module the proxy does not serve. Cached: built once per version.
TEMPORAL_CLI := v1.5.1
bin/.temporal-$(TEMPORAL_CLI):
	GOBIN=$(CURDIR)/bin go install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI)
	touch $@

bench: venv tools-control-plane postgres participant-kit mcp-conformance mcp-servers bin/hydra bin/undolog-bench-ceiling bin/undolog-bench-floor bin/.temporal-$(TEMPORAL_CLI)
	$(PY) -m pip install -q --require-hashes -r requirements/bench.txt
	$(PY) -m bench.compensation --sizes 1 10 100 1000
	$(PY) -m bench.forward --concurrency 1 100
	$(PY) -m bench.sqlite_ledger
	$(PY) -m bench.scale --sizes 1000 10000
	$(PY) -m bench.replicas --replicas 1 2 4 --sagas 300
	$(PY) -m bench.temporal --idle-samples 100 --sizes 10 100
	$(PY) -m bench.footprint --sagas 400
	$(PY) -m bench.saga_writes --writes 40
	$(PY) -m bench.archive --sagas 1000
	$(PY) -m bench.deep --depths 2000 10000
	$(PY) -m bench.wave --sagas 500 --down 60 --limit 50
	$(PY) -m bench.gateway --calls 200
	$(PY) -m bench.guard --compensations 200
	$(PY) -m bench.participant_kit --calls 500
	$(PY) -m bench.conformance
	$(PY) -m bench.residue
	$(PY) -m bench.plot
	$(PY) -m bench.summary

chaos: venv tools-control-plane postgres participant-kit mcp-servers
	UNDOLOG_CHAOS=full $(VENV)/bin/pytest -m fault -s
