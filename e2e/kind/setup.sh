#!/usr/bin/env bash
# Creates a kind cluster with gVisor for the e2e suite, for people who have Docker and kind.
# Not run in CI (CI has no Docker engine; it uses e2e/cluster/up.sh). Prints KUBECONFIG=... last.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"

# runsc and its shim, built from the Go module proxy exactly as the local harness does.
"$REPO_ROOT/e2e/cluster/build.sh" gvisor
mkdir -p /tmp/sandboxrun-kind-bin
cp "$GVISOR_BIN/runsc" "$GVISOR_BIN/containerd-shim-runsc-v1" /tmp/sandboxrun-kind-bin/

kind create cluster --config "$HERE/kind-config.yaml" --kubeconfig "$HERE/kubeconfig"
node=sandboxrun-control-plane
docker cp "$REPO_ROOT/config/runtime/runsc.toml" "$node:/etc/containerd/runsc.toml"
docker exec "$node" sh -c 'ln -sf /usr/local/sandboxrun-bin/* /usr/local/bin/ && systemctl restart containerd'

# The images the suite uses: built without Docker by images/build.sh, loaded with kind.
"$REPO_ROOT/images/build.sh"
for tar in "$CACHE_DIR"/images/*.oci.tar; do
  kind load image-archive "$tar" --name sandboxrun
done
kubectl --kubeconfig "$HERE/kubeconfig" apply -f "$REPO_ROOT/config/runtime/runtimeclasses.yaml"
kubectl --kubeconfig "$HERE/kubeconfig" wait --for=condition=Ready node --all --timeout=120s
echo "KUBECONFIG=$HERE/kubeconfig"
