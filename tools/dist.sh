#!/usr/bin/env bash
# `make dist`: what a release publishes, built here into dist/:
#   undolog-<v>.tar.gz, undolog-<v>-py3-none-any.whl   the Python distribution (twine check --strict)
#   undolog-<v>.tgz                                     the chart (helm package; helm lint of the package)
#   undolog-image-<v>.oci.tar                           the operator image (make image), an OCI archive
#   undolog-image-<v>.cdx.json                          its SBOM (CycloneDX) of the Python environment it installs
#   SHA256SUMS
# and checks that the wheel installs in a clean venv and brings the SDK and the command.
set -euo pipefail
shopt -s inherit_errexit

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
RELEASE_PY="${RELEASE_PY:-$ROOT/.venv-release/bin/python}"  # build, twine, cyclonedx-bom (make dist installs them)
OUT="$ROOT/dist"
VERSION=$("$PY" -c 'import undolog.version as v; print(v.__version__)')
step() { printf '[dist %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

rm -rf "$OUT" && mkdir -p "$OUT"
step "sdist and wheel $VERSION"
"$RELEASE_PY" -m build --sdist --wheel --outdir "$OUT" "$ROOT" > "$OUT/.build.log" 2>&1 || { cat "$OUT/.build.log"; exit 1; }
rm -f "$OUT/.build.log"
"$RELEASE_PY" -m twine check --strict "$OUT"/undolog-"$VERSION"*

step "chart"
"$ROOT/bin/helm" package "$ROOT/charts/undolog" -d "$OUT" > /dev/null
"$ROOT/bin/helm" lint --strict "$OUT/undolog-$VERSION.tgz"

step "image and its SBOM"
cp "$ROOT/build/undolog-image.oci.tar" "$OUT/undolog-image-$VERSION.oci.tar"
"$RELEASE_PY" -m cyclonedx_py requirements "$ROOT/requirements/operator.txt" \
    --pyproject "$ROOT/pyproject.toml" --output-reproducible --output-file "$OUT/undolog-image-$VERSION.cdx.json"

step "the wheel in a clean venv"
fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
"$PY" -m venv "$fresh/venv"
"$fresh/venv/bin/pip" install -q "$OUT/undolog-$VERSION-py3-none-any.whl"
"$fresh/venv/bin/python" -c 'import undolog, undolog.sdk; print("undolog", undolog.__version__, "SDK imported")'
# The SDK installs lean: the command says what to add rather than failing on an import.
said=$("$fresh/venv/bin/undolog" version 2>&1 || true)
grep -qF "pip install 'undolog[cli]'" <<< "$said" || { echo "the lean install's command said: $said"; exit 1; }

(cd "$OUT" && sha256sum -- * > SHA256SUMS)
step "done: $(cd "$OUT" && ls | tr '\n' ' ')"
