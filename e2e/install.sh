#!/usr/bin/env bash
# Builds the sandboxrun binaries, packs them into images (images/build.sh app, no Docker needed),
# imports them into the local cluster's containerd and installs the Helm chart with
# `helm upgrade --install`, exactly as an operator would. Used by run-tests.sh; also handy alone:
#
#   sudo e2e/install.sh            # against the cluster from e2e/cluster/up.sh
#
# Images are tagged with a digest of their binary, so a changed binary rolls the Deployment.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"
export PATH="$HOME/.cargo/bin:$STATE_DIR/bin:$PATH"
export KUBECONFIG="${KUBECONFIG:-$KUBECONFIG_FILE}"
cd "$REPO_ROOT"

RELEASE=${SANDBOXRUN_RELEASE:-sandboxrun}
RELEASE_NAMESPACE=${SANDBOXRUN_NAMESPACE:-sandboxrun-system}
APPS=(operator)
[[ -d mcp-frontend ]] && APPS+=(mcp)
# The Cargo profile the images are built with: release (what ships) unless told otherwise. CI
# passes dev: the unit tests have just built every binary in that profile, so the images cost
# no second 7-minute optimised build; the documented benchmarks use release.
PROFILE=${SANDBOXRUN_CARGO_PROFILE:-release}
case $PROFILE in
  release) TARGET_DIR="${CARGO_TARGET_DIR:-target}/release" ;;
  dev) TARGET_DIR="${CARGO_TARGET_DIR:-target}/debug" ;;
  *) die "SANDBOXRUN_CARGO_PROFILE must be release or dev, not '$PROFILE'" ;;
esac

# SANDBOXRUN_PREBUILT=1: the caller built them (run-tests.sh compiles the whole workspace once,
# with one feature set; building two packages alone here would resolve others and compile again).
if [[ ${SANDBOXRUN_PREBUILT:-} == 1 ]]; then
  for app in "${APPS[@]}"; do
    [[ -x $TARGET_DIR/sandboxrun-$app ]] || die "SANDBOXRUN_PREBUILT=1 but $TARGET_DIR/sandboxrun-$app is not built"
  done
else
  log "building $PROFILE binaries: ${APPS[*]}"
  cargo build --profile "$PROFILE" --locked $(for app in "${APPS[@]}"; do printf -- '-p sandboxrun-%s ' "$app"; done)
fi

declare -A TAGS
for app in "${APPS[@]}"; do
  binary="$TARGET_DIR/sandboxrun-$app"
  tag="$(sha256sum "$binary" | cut -c1-12)"
  "$REPO_ROOT/images/build.sh" app "$app" "$binary" --import-address "$CONTAINERD_SOCK" >&2
  ctr --address "$CONTAINERD_SOCK" -n k8s.io images tag --force \
    "localhost/sandboxrun/$app:dev" "localhost/sandboxrun/$app:$tag" >/dev/null
  TAGS[$app]=$tag
done

# The images imported above (localhost/sandboxrun/NAME), not the release's from its registry.
helm_args=(--namespace "$RELEASE_NAMESPACE" --create-namespace --wait --timeout 3m
  --set global.imageRegistry=localhost/sandboxrun --set-string sandbox.image.tag=dev
  --set-string sandbox.dataImage.tag=dev --set-string "operator.image.tag=${TAGS[operator]}")
[[ -n ${TAGS[mcp]:-} ]] && helm_args+=(--set-string "frontend.image.tag=${TAGS[mcp]}")
# Helm installs a chart's crds/ only on first install and never upgrades them, so a changed
# SandboxRun schema would be silently pruned on an upgrade: apply it first, as docs/install.md says.
log "kubectl apply --server-side -f charts/sandboxrun/crds/"
kubectl apply --server-side --force-conflicts -f charts/sandboxrun/crds/ >&2
log "helm upgrade --install $RELEASE charts/sandboxrun ${helm_args[*]} $*"
helm upgrade --install "$RELEASE" charts/sandboxrun "${helm_args[@]}" "$@" >&2
kubectl -n "$RELEASE_NAMESPACE" rollout status deployment --timeout=120s >&2
# A new ResourceQuota refuses every create of a resource it counts ("status unknown for quota")
# until the quota controller reports usage for it: wait until every counted resource has a usage,
# so the first run passes (the SandboxRun count limit is added later by the operator: run_quota.rs).
for _ in $(seq 180); do
  pending="$(kubectl get resourcequota -A -l "app.kubernetes.io/instance=$RELEASE" \
    -o go-template='{{range .items}}{{$used := .status.used}}{{range $k, $v := .spec.hard}}{{if not (and $used (index $used $k))}}{{$k}} {{end}}{{end}}{{end}}')"
  [[ -z $pending ]] && break
  sleep 0.5
done
[[ -z $pending ]] || die "ResourceQuota reports no usage after 90 s for: $pending"
log "sandboxrun installed in $RELEASE_NAMESPACE (runs go to the chart's sandbox namespace)"
