# Shared paths and helpers for the cluster scripts. Sourced, not run.
set -euo pipefail
CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$CLUSTER_DIR/../.." && pwd)"
# shellcheck source=versions.env
source "$CLUSTER_DIR/versions.env"
# Built binaries and images live outside the repo, keyed by version, so reruns are fast.
CACHE_DIR="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}"
# Cluster state (etcd data, certificates, logs, pids). down.sh removes it.
STATE_DIR="${SANDBOXRUN_CLUSTER_STATE:-/var/lib/sandboxrun-cluster}"
K8S_BIN="$CACHE_DIR/kubernetes-v$K8S_VERSION"
ETCD_BIN="$CACHE_DIR/etcd-v$ETCD_VERSION"
GVISOR_BIN="$CACHE_DIR/gvisor-$GVISOR_VERSION-p$GVISOR_PATCH"
TOOLS_BIN="$CACHE_DIR/tools-crictl-v$CRI_TOOLS_VERSION-kubectl-v$KUBECTL_VERSION-helm-v$HELM_VERSION"
CONTAINERD_BIN="$CACHE_DIR/containerd-v$CONTAINERD_VERSION"
NETPOL_BIN="$CACHE_DIR/kube-network-policies-v$KUBE_NETWORK_POLICIES_VERSION-p$KUBE_NETWORK_POLICIES_PATCH"
TRAEFIK_BIN="$CACHE_DIR/traefik-v$TRAEFIK_VERSION-p$TRAEFIK_PATCH"
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Sockets live on a short path: unix socket paths are limited to 108 bytes.
RUN_DIR=/run/sandboxrun-cluster
CONTAINERD_SOCK="$RUN_DIR/containerd.sock"
KUBECONFIG_FILE="$STATE_DIR/admin.kubeconfig"
NODE_NAME=sandboxrun-node
# The cluster's own networks. They exist only on this machine: the bridge the harness creates,
# and Service ClusterIPs that kube-proxy translates locally. Pod traffic leaving through any other
# interface is rejected (see up.sh), so nothing here can send packets off the machine.
BRIDGE=sbr0
NODE_IP=10.244.0.1
POD_PREFIX=24
POD_SUBNET=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
ETCD_PORT=23790
PAUSE_IMAGE=localhost/sandboxrun/pause:3.10
CNI_BIN_DIR=/usr/lib/cni
