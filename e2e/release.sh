#!/usr/bin/env bash
# e2e/release.sh --registry R --version V [--out DIR] [--ca-file CA]
#
# Builds one release of sandboxrun and publishes it the way users consume it:
#
#   R/operator:V  R/mcp:V  R/sandbox-python:V  R/sandbox-python-data:V   the images (OCI)
#   oci://R/charts/sandboxrun, version V                                  the Helm chart
#
# The chart is the repository's, packaged at version V with `global.imageRegistry: R`, so that
# `helm install sandboxrun oci://R/charts/sandboxrun --version V` pulls exactly these images.
# DIR (default dist/V) receives what a release page lists: the chart's .tgz, the CRDs as one
# manifest (kubectl apply before `helm upgrade`: helm never upgrades CRDs), the binaries for a
# laptop or a workstation (sandboxrun-mcp, sandboxrun-agent, kubectl-sandboxrun) in one tarball,
# images.txt (each image by tag and digest), an SPDX SBOM (e2e/release/sbom.py) and SHA256SUMS of
# every other file.
#
# Refuses unless V is the version of the crates (Cargo.toml) and of the chart (Chart.yaml,
# version and appVersion): bump them, with CHANGELOG.md and docs/upgrading.md, before releasing.
#
# Credentials: whatever skopeo and helm hold for R (`skopeo login R`, `helm registry login R`).
# --ca-file: a CA certificate to trust for R (a private registry; CI's test registry).
# Environment: SANDBOXRUN_CARGO_PROFILE release (default: what ships) or dev (CI, which has just
# built every binary in that profile); SANDBOXRUN_PREBUILT=1: the binaries are built already.
# Runs on a Debian/Ubuntu machine without Docker: images/build.sh builds the images (debootstrap,
# root once), skopeo pushes them, helm pushes the chart. .github/workflows/release.yml runs it on a
# tag; CI runs it against a registry of its own (e2e/release/install-test.sh).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"
export PATH="$HOME/.cargo/bin:$TOOLS_BIN:$PATH"
cd "$REPO_ROOT"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
REGISTRY="" VERSION="" OUT="" CA_FILE=""
while (($#)); do
  case $1 in
    --registry) REGISTRY=${2:?--registry needs a value}; shift 2 ;;
    --version) VERSION=${2:?--version needs a value}; shift 2 ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --ca-file) CA_FILE=${2:?--ca-file needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
[[ -n $REGISTRY && -n $VERSION ]] || { usage >&2; die "--registry and --version are required"; }
REGISTRY=${REGISTRY%/}
OUT=${OUT:-$REPO_ROOT/dist/$VERSION}
[[ -z $CA_FILE || -r $CA_FILE ]] || die "no CA certificate at $CA_FILE"

# The version is the repository's, everywhere, before anything is built.
crate_version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
chart_version="$(sed -n 's/^version: //p' charts/sandboxrun/Chart.yaml)"
chart_app_version="$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' charts/sandboxrun/Chart.yaml)"
for pair in "Cargo.toml:$crate_version" "Chart.yaml version:$chart_version" \
  "Chart.yaml appVersion:$chart_app_version"; do
  [[ ${pair##*:} == "$VERSION" ]] || die "${pair%:*} says ${pair##*:}, not $VERSION: bump the versions first"
done
grep -q "^## \[$VERSION\]" CHANGELOG.md || die "CHANGELOG.md has no section for $VERSION"
for tool in skopeo helm python3; do
  command -v "$tool" >/dev/null || die "$tool is needed (skopeo: apt-get install skopeo; helm: e2e/cluster/build.sh)"
done

PROFILE=${SANDBOXRUN_CARGO_PROFILE:-release}
case $PROFILE in
  release) BIN_DIR="${CARGO_TARGET_DIR:-target}/release" ;;
  dev) BIN_DIR="${CARGO_TARGET_DIR:-target}/debug" ;;
  *) die "SANDBOXRUN_CARGO_PROFILE must be release or dev, not '$PROFILE'" ;;
esac
# package:binary of every shipped binary
BINARIES=(sandboxrun-operator:sandboxrun-operator sandboxrun-mcp:sandboxrun-mcp
  sandboxrun-agent:sandboxrun-agent sandboxrun-kubectl:kubectl-sandboxrun)
if [[ ${SANDBOXRUN_PREBUILT:-} != 1 ]]; then
  log "building the $PROFILE binaries"
  cargo build --profile "$PROFILE" --locked $(for b in "${BINARIES[@]}"; do printf -- '-p %s ' "${b%%:*}"; done)
fi
for b in "${BINARIES[@]}"; do
  [[ -x $BIN_DIR/${b#*:} ]] || die "$BIN_DIR/${b#*:} is not built"
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT"

# The images: the sandboxes' and the two services' (base + the binary).
log "building the images (images/build.sh)"
images/build.sh build sandbox-python sandbox-python-data base >&2
images/build.sh app operator "$BIN_DIR/sandboxrun-operator" >&2
images/build.sh app mcp "$BIN_DIR/sandboxrun-mcp" >&2

skopeo_tls=()
helm_tls=()
if [[ -n $CA_FILE ]]; then
  mkdir -p "$WORK/certs"
  cp "$CA_FILE" "$WORK/certs/ca.crt"
  skopeo_tls=(--dest-cert-dir "$WORK/certs")
  helm_tls=(--ca-file "$CA_FILE")
fi
IMAGES=(operator mcp sandbox-python sandbox-python-data)
image_args=()
: >"$OUT/images.txt"
for name in "${IMAGES[@]}"; do
  tarball="$(images/build.sh path "$name")"
  ref="$REGISTRY/$name:$VERSION"
  log "pushing $ref"
  skopeo copy --quiet "${skopeo_tls[@]}" --digestfile "$WORK/$name.digest" \
    "oci-archive:$tarball" "docker://$ref" >&2
  echo "$ref@$(cat "$WORK/$name.digest")" >>"$OUT/images.txt"
  image_args+=(--image "$name=$ref=$tarball")
done

# The chart, at V, defaulting to the images just pushed.
log "packaging and pushing the chart to oci://$REGISTRY/charts"
cp -r charts/sandboxrun "$WORK/sandboxrun"
values="$WORK/sandboxrun/values.yaml"
[[ "$(grep -c '^  imageRegistry: ' "$values")" == 1 ]] || die "values.yaml: no single global.imageRegistry line"
sed -i "s|^  imageRegistry: .*|  imageRegistry: $REGISTRY|" "$values"
helm package "$WORK/sandboxrun" --destination "$OUT" >&2
helm push "$OUT/sandboxrun-$VERSION.tgz" "oci://$REGISTRY/charts" "${helm_tls[@]}" >&2
cat charts/sandboxrun/crds/*.yaml >"$OUT/sandboxrun-crds-$VERSION.yaml"

# The binaries a laptop or a workstation runs, with the licence.
bundle="sandboxrun-$VERSION-linux-$(uname -m)"
mkdir -p "$WORK/$bundle"
for b in sandboxrun-mcp sandboxrun-agent kubectl-sandboxrun; do cp "$BIN_DIR/$b" "$WORK/$bundle/"; done
cp LICENSE README.md CHANGELOG.md "$WORK/$bundle/"
tar -C "$WORK" --owner=0 --group=0 --numeric-owner -czf "$OUT/$bundle.tar.gz" "$bundle"

log "writing the SBOM"
cargo metadata --format-version 1 --locked --filter-platform "$(uname -m)-unknown-linux-gnu" \
  >"$WORK/metadata.json"
python3 e2e/release/sbom.py --version "$VERSION" --metadata "$WORK/metadata.json" --lock Cargo.lock \
  --out "$OUT/sandboxrun-$VERSION.spdx.json" \
  $(for b in "${BINARIES[@]}"; do printf -- '--binary %s ' "$b"; done) "${image_args[@]}" >&2

(cd "$OUT" && sha256sum -- * >SHA256SUMS)
log "released $VERSION to $REGISTRY; files in $OUT:"
ls -l "$OUT" >&2
