#!/usr/bin/env bash
# Builds the local control plane from source through the Go module proxy into bin/, by group:
#   control-plane  etcd, kube-apiserver, kube-controller-manager, kubectl (make demo, make test)
#   helm           helm (make test's chart tests, make e2e)
#   node           kubelet, kube-scheduler, kube-proxy, containerd, ctr, its runc shim, crictl
#                  (make e2e: a node that runs pods)
# `tools/build.sh GROUP...` builds those; no argument builds every group. Each group is skipped
# when bin/.stamp-<group> already records the pinned version.
# Go's caches live under $HOME, so a second build on the same machine is mostly cache hits.
set -euo pipefail

TOOLS="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$TOOLS")"
BIN="${BIN:-$ROOT/bin}"
# shellcheck source=versions.env
source "$TOOLS/versions.env"

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false -trimpath"
export GOCACHE="${GOCACHE:-$HOME/.cache/go-build}"
export GOMODCACHE="${GOMODCACHE:-$HOME/go/pkg/mod}"
export GOPATH="${GOPATH:-$HOME/go}"
mkdir -p "$BIN"

step() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

fresh() { # fresh GROUP VERSION FILE...: true when the stamp matches and every file exists
  local group=$1 version=$2; shift 2
  [[ "$(cat "$BIN/.stamp-$group" 2>/dev/null)" == "$version" ]] || return 1
  for f in "$@"; do [[ -x "$BIN/$f" ]] || return 1; done
}

build_kubernetes() { # build_kubernetes STAMP BINARY...: k8s.io/kubernetes commands, one go build
  local v=$KUBERNETES_VERSION group=$1; shift
  local binaries=("$@")
  if fresh "$group" "$v" "${binaries[@]}"; then
    step "kubernetes $v ($group): up to date"; return
  fi
  local minor=${v#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local ldflags="-s -w"
  # The same variables hack/lib/version.sh sets, so /version reports the release (helm reads it).
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date -X $pkg.gitCommit=module-proxy"
  done
  step "kubernetes $v: building ${binaries[*]} (cold: minutes)"
  (cd "$TOOLS/kubernetes" && go build -p 2 -ldflags "$ldflags" -o "$BIN/" \
      "${binaries[@]/#/k8s.io/kubernetes/cmd/}")
  echo "$v" > "$BIN/.stamp-$group"
  step "kubernetes $v ($group): done"
}

build_etcd() {
  local v=$ETCD_VERSION
  if fresh etcd "$v" etcd; then step "etcd $v: up to date"; return; fi
  step "etcd $v: building"
  (cd "$TOOLS/etcd" && go build -p 2 -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
  echo "$v" > "$BIN/.stamp-etcd"
  step "etcd $v: done"
}

build_helm() {
  local v=$HELM_VERSION
  # The Kubernetes version `helm template` assumes without a cluster comes from its client-go,
  # as helm's own Makefile sets it (without these flags it is 1.20 and kubeVersion checks fail).
  local gomod minor
  gomod=$(go mod download -json "helm.sh/helm/v3@$v" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod")
  local stamp="$v+kube1.$minor"
  if fresh helm "$stamp" helm; then step "helm $stamp: up to date"; return; fi
  step "helm $stamp: building"
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$v"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    flags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
  done
  GOBIN="$BIN" go install -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$v"
  echo "$stamp" > "$BIN/.stamp-helm"
  step "helm $stamp: done"
}

build_containerd() {
  local v="$CONTAINERD_VERSION+crictl-$CRI_TOOLS_VERSION"
  if fresh containerd "$v" containerd ctr containerd-shim-runc-v2 crictl; then
    step "containerd $v: up to date"; return
  fi
  step "containerd $v: building containerd, ctr, containerd-shim-runc-v2, crictl"
  # Static and without the snapshotters that need C libraries (btrfs, devmapper); overlayfs is enough.
  local tags="urfave_cli_no_docs no_btrfs no_devmapper osusergo netgo static_build"
  local m=github.com/containerd/containerd/v2/cmd
  GOBIN="$BIN" go install -tags "$tags" "$m/containerd@$CONTAINERD_VERSION" "$m/ctr@$CONTAINERD_VERSION"
  GOBIN="$BIN" go install -tags "$tags no_grpc" "$m/containerd-shim-runc-v2@$CONTAINERD_VERSION"
  # crictl: node-down stops pods through the CRI, so their networks are torn down too.
  GOBIN="$BIN" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
  echo "$v" > "$BIN/.stamp-containerd"
  step "containerd $v: done"
}

build_group() {
  case $1 in
    control-plane)
      build_etcd
      build_kubernetes kubernetes-control-plane kube-apiserver kube-controller-manager kubectl ;;
    helm) build_helm ;;
    node)
      build_kubernetes kubernetes-node kubelet kube-scheduler kube-proxy
      build_containerd ;;
    *) echo "tools/build.sh: no group $1 (control-plane, helm, node)" >&2; exit 2 ;;
  esac
}

start=$SECONDS
groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(control-plane helm node)
for group in "${groups[@]}"; do build_group "$group"; done
step "${groups[*]} ready in $((SECONDS - start)) s: $(cd "$BIN" && ls | tr '\n' ' ')"
