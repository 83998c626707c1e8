#!/usr/bin/env bash
# `make image`: the operator image from ./Dockerfile, built with buildah (no Docker engine, no
# registry), written as an OCI archive that containerd imports (`ctr -n k8s.io images import`)
# or `kind load image-archive` takes. Also the pause image a node without a registry needs.
#
#   BASE=<image>   build on this base (any Debian-based image with python3 3.11 and python3-venv);
#                  default: one made here with debootstrap from the machine's Debian mirror, cached
#                  in buildah's storage under a name that records its recipe.
#   IMAGE=<name>   the tag (default: the chart's default repository and appVersion, so
#                  `helm install` with default values finds the imported image).
# Writes build/undolog-image.oci.tar and build/pause-image.oci.tar; prints the image ID.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) stops the build too

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/build"
PY="${PY:-$ROOT/.venv/bin/python}"
VERSION=$("$PY" -c 'import undolog.version as v; print(v.__version__)')
IMAGE="${IMAGE:-ghcr.io/undolog/undolog:$VERSION}"
PAUSE_IMAGE="${PAUSE_IMAGE:-localhost/undolog/pause:local}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm  # Python 3.11, as the lock is resolved for
BASE_PACKAGES=python3,python3-venv,ca-certificates
export BUILDAH_FORMAT=oci

step() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
have_image() { buildah inspect --type image "$1" > /dev/null 2>&1; }
mkdir -p "$OUT"
start=$SECONDS

make_base() { # a minimal Debian with python3: debootstrap into a folder, then one layer
  local name="localhost/undolog/base:$SUITE-$(echo "$MIRROR $BASE_PACKAGES" | sha256sum | cut -c1-12)"
  if have_image "$name"; then echo "$name"; return; fi
  step "base: debootstrap $SUITE ($BASE_PACKAGES) from $MIRROR" >&2
  local rootfs="$OUT/base-rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$MIRROR" > "$OUT/debootstrap.log" 2>&1 \
    || { tail -20 "$OUT/debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  local container
  container=$(buildah from scratch)
  tar -C "$rootfs" -cf "$OUT/base-rootfs.tar" .
  buildah add "$container" "$OUT/base-rootfs.tar" / > /dev/null  # a tar archive is unpacked
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/sh --label "io.undolog.base=debootstrap $SUITE $BASE_PACKAGES" "$container"
  buildah commit --rm --quiet "$container" "$name" > /dev/null
  rm -rf "$rootfs" "$OUT/base-rootfs.tar"
  echo "$name"
}

# The locked wheels and the project's own: the build itself needs no network.
step "wheels: requirements/operator.txt and undolog $VERSION"
rm -rf "$OUT/wheels"
"$PY" -m pip download --quiet --require-hashes --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -r "$ROOT/requirements/operator.txt" -d "$OUT/wheels"
"$PY" -m pip wheel --quiet --no-deps "$ROOT" -w "$OUT/wheels"

base="${BASE:-$(make_base)}"
step "image $IMAGE on $base"
# runc (Debian's, as the node uses), not buildah's default crun: crun refuses a machine whose
# cgroups are in hybrid mode ("cgroups in hybrid mode not supported"), which runc handles.
# Without runc, buildah would fall back to crun and fail there: say what is missing instead.
runtime=$(command -v runc) || { echo "tools/image.sh: runc is missing (make image-deps installs it)" >&2; exit 1; }
buildah bud --quiet --layers --network none --runtime "$runtime" --build-arg "BASE=$base" -t "$IMAGE" \
  -f "$ROOT/Dockerfile" "$ROOT" > /dev/null
rm -f "$OUT/undolog-image.oci.tar"
buildah push --quiet "$IMAGE" "oci-archive:$OUT/undolog-image.oci.tar:$IMAGE"

# The sandbox ("pause") image: Kubernetes' own pause.c from the module cache, linked statically.
if ! have_image "$PAUSE_IMAGE"; then
  step "pause image from k8s.io/kubernetes/build/pause"
  source "$ROOT/tools/versions.env"
  pause_c="$(go env GOMODCACHE)/k8s.io/kubernetes@$KUBERNETES_VERSION/build/pause/linux/pause.c"
  [[ -f "$pause_c" ]] || (cd "$ROOT/tools/kubernetes" && go mod download "k8s.io/kubernetes@$KUBERNETES_VERSION")
  gcc -Os -static -DVERSION="$KUBERNETES_VERSION" -o "$OUT/pause" "$pause_c"
  container=$(buildah from scratch)
  buildah copy "$container" "$OUT/pause" /pause > /dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$container"
  buildah commit --rm --quiet "$container" "$PAUSE_IMAGE" > /dev/null
fi
rm -f "$OUT/pause-image.oci.tar"
buildah push --quiet "$PAUSE_IMAGE" "oci-archive:$OUT/pause-image.oci.tar:$PAUSE_IMAGE"

step "done in $((SECONDS - start)) s: $OUT/undolog-image.oci.tar ($(du -h "$OUT/undolog-image.oci.tar" | cut -f1))"
buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE" | sed "s|^|$IMAGE sha256:|"
