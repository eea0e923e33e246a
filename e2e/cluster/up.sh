#!/usr/bin/env bash
# Brings up a single-node Kubernetes cluster on this machine from upstream pieces: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kube-proxy, on Debian's
# containerd with runc and gVisor (runsc) runtime handlers and the bridge CNI plugin.
#
# Idempotent: with the cluster already up and healthy it only prints the kubeconfig line.
# The last line of output is always `KUBECONFIG=<absolute path>`.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ $EUID -eq 0 ]] || die "must run as root (it starts containerd and a kubelet)"

if "$CLUSTER_DIR/status.sh" >/dev/null 2>&1; then
  log "cluster already up"
  echo "KUBECONFIG=$KUBECONFIG_FILE"
  exit 0
fi
# A half-started cluster (a crashed component, a previous run killed midway) is torn down first so
# every start is from clean state.
if [[ -d $STATE_DIR ]]; then
  log "found stale cluster state; running down.sh first"
  "$CLUSTER_DIR/down.sh"
fi

# The kubelet evicts every Pod below 1 GiB free (templates/kubelet.yaml); fail here with the reason
# instead of with Pods that end `Evicted`.
avail_kib=$(df -Pk "$(dirname "$STATE_DIR")" | awk 'NR==2 {print $4}')
(( avail_kib >= 3 * 1024 * 1024 )) ||
  die "only $((avail_kib / 1024)) MiB free on $(dirname "$STATE_DIR"); the cluster needs at least 3 GiB"

started=$SECONDS
"$CLUSTER_DIR/install-deps.sh"
# The cluster's own components (Traefik, the Ingress tests' controller, is e2e/ingress/start.sh's).
"$CLUSTER_DIR/build.sh" etcd containerd gvisor netpol tools kubernetes
"$REPO_ROOT/images/build.sh" >&2

mkdir -p "$STATE_DIR"/{pids,logs,pki,etcd,kubelet,cni/net.d,cni/cache,containerd/root,containerd/certs.d,bin,runsc-logs} "$RUN_DIR"

# ---------------------------------------------------------------------------------------------
# Host preparation. Record every host setting we change so down.sh can restore it.
# ---------------------------------------------------------------------------------------------
save_sysctl() { # key
  local path="/proc/sys/${1//.//}"
  [[ -e $path ]] && echo "$1=$(cat "$path")" >> "$STATE_DIR/sysctl.orig"
}
: > "$STATE_DIR/sysctl.orig"
for key in net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables \
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys \
  kernel.keys.root_maxbytes; do
  save_sysctl "$key"
done

# The cluster bridge: its address is the node IP, the API server's advertise address and the pods'
# gateway. It is not loopback so that Pods can reach the API server through the `kubernetes`
# Service (kube-proxy DNATs the ClusterIP to this address).
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
fi
ip addr replace "$NODE_IP/$POD_PREFIX" dev "$BRIDGE"
ip link set "$BRIDGE" up
sysctl -qw net.ipv4.ip_forward=1
# Containment for the test machine itself: no packet from a Pod may leave through any interface but
# the cluster bridge, and a ClusterIP that kube-proxy does not translate goes nowhere instead of
# out of the default route. (Sandbox Pods have no network at all; this covers runc system Pods.)
iptables -w -N SANDBOXRUN-EGRESS 2>/dev/null || iptables -w -F SANDBOXRUN-EGRESS
iptables -w -A SANDBOXRUN-EGRESS -s "$POD_SUBNET" ! -o "$BRIDGE" -j REJECT
iptables -w -C FORWARD -j SANDBOXRUN-EGRESS 2>/dev/null || iptables -w -I FORWARD 1 -j SANDBOXRUN-EGRESS
ip route replace unreachable "$SERVICE_CIDR"

# Binaries on containerd's and kubelet's PATH: the gVisor shim and runsc, plus crictl for humans.
ln -sf "$GVISOR_BIN/runsc" "$GVISOR_BIN/containerd-shim-runsc-v1" "$STATE_DIR/bin/"
ln -sf "$TOOLS_BIN/crictl" "$TOOLS_BIN/helm" "$TOOLS_BIN/kubectl" "$STATE_DIR/bin/"
ln -sf "$CONTAINERD_BIN/ctr" "$CONTAINERD_BIN/containerd-shim-runc-v2" "$STATE_DIR/bin/"
export PATH="$STATE_DIR/bin:$K8S_BIN:$ETCD_BIN:$PATH"

# ---------------------------------------------------------------------------------------------
# PKI: one CA for everything, a service-account signing key, and client certificates.
# ---------------------------------------------------------------------------------------------
"$CLUSTER_DIR/pki.sh" "$STATE_DIR/pki"
PKI="$STATE_DIR/pki"

kubeconfig() { # file user
  local file=$1 user=$2
  kubectl config --kubeconfig="$file" set-cluster local --server="https://$NODE_IP:6443" \
    --certificate-authority="$PKI/ca.crt" --embed-certs >/dev/null
  kubectl config --kubeconfig="$file" set-credentials "$user" \
    --client-certificate="$PKI/$user.crt" --client-key="$PKI/$user.key" --embed-certs >/dev/null
  kubectl config --kubeconfig="$file" set-context local --cluster=local --user="$user" >/dev/null
  kubectl config --kubeconfig="$file" use-context local >/dev/null
}
kubeconfig "$KUBECONFIG_FILE" admin
kubeconfig "$STATE_DIR/controller-manager.kubeconfig" controller-manager
kubeconfig "$STATE_DIR/scheduler.kubeconfig" scheduler
kubeconfig "$STATE_DIR/kubelet.kubeconfig" kubelet
kubeconfig "$STATE_DIR/kube-proxy.kubeconfig" kube-proxy
export KUBECONFIG="$KUBECONFIG_FILE"

# ---------------------------------------------------------------------------------------------
# Processes. Each runs in the background with its pid in $STATE_DIR/pids and its log in logs/.
# ---------------------------------------------------------------------------------------------
start() { # name command...
  local name=$1; shift
  log "starting $name"
  # setsid: its own session, so a Ctrl-C in the calling shell does not kill the cluster.
  setsid "$@" > "$STATE_DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE_DIR/pids/$name.pid"
}
wait_for() { # description timeout_s command...
  local what=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "timed out after ${timeout}s waiting for $what; last log lines:"
      tail -n 30 "$STATE_DIR"/logs/*.log >&2 || true
      die "$what did not become ready"
    fi
    sleep 0.2
  done
}
https_ok() { curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$1"; }

# containerd, with a config of our own (socket, root and state under $STATE_DIR/$RUN_DIR) so it
# never interferes with a containerd the machine may already run.
sed -e "s|@STATE@|$STATE_DIR|g" -e "s|@RUN@|$RUN_DIR|g" -e "s|@CNI_BIN@|$CNI_BIN_DIR|g" \
  "$CLUSTER_DIR/templates/containerd.toml" > "$STATE_DIR/containerd.toml"
sed -e "s|@STATE@|$STATE_DIR|g" "$REPO_ROOT/config/runtime/runsc.toml" > "$STATE_DIR/runsc.toml"
sed -e "s|@BRIDGE@|$BRIDGE|g" -e "s|@SUBNET@|$POD_SUBNET|g" -e "s|@GATEWAY@|$NODE_IP|g" \
  "$CLUSTER_DIR/templates/cni.conflist" > "$STATE_DIR/cni/net.d/10-sandboxrun.conflist"
# /run/netns, where containerd bind-mounts every Pod's network namespace, must be a shared mount
# point of its own before the first Pod starts. Otherwise the first `ip netns add` (the
# NetworkPolicy tests run it) makes it one, as iproute2 does, by bind-mounting the directory onto
# itself: that hides every Pod namespace mounted before it, and the kubelet can no longer remove
# them (umount: EINVAL, unlink: EBUSY), so those Pods stay Terminating for ever. A cluster then
# cannot uninstall its chart. iproute2 finds the mount point already there and leaves it alone.
mkdir -p /run/netns
mountpoint -q /run/netns || mount --bind /run/netns /run/netns
mount --make-shared /run/netns
start containerd "$CONTAINERD_BIN/containerd" --config "$STATE_DIR/containerd.toml"
wait_for containerd 30 ctr --address "$CONTAINERD_SOCK" version

"$REPO_ROOT/images/build.sh" import --address "$CONTAINERD_SOCK" >&2

start etcd etcd --name sandboxrun --data-dir "$STATE_DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "sandboxrun=http://127.0.0.1:$((ETCD_PORT + 1))" \
  --listen-metrics-urls "http://127.0.0.1:$((ETCD_PORT + 2))" \
  --quota-backend-bytes 2147483648 --log-level warn
wait_for etcd 30 curl -fsS "http://127.0.0.1:$((ETCD_PORT + 2))/health"

start kube-apiserver kube-apiserver \
  --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port=6443 \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --profiling=false --v=1
wait_for kube-apiserver 90 https_ok "https://$NODE_IP:6443/readyz"

start kube-controller-manager kube-controller-manager \
  --kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
  --use-service-account-credentials=true --root-ca-file="$PKI/ca.crt" \
  --service-account-private-key-file="$PKI/sa.key" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" --allocate-node-cidrs=false \
  --controllers='*,-cloud-node-lifecycle' --profiling=false --v=1
start kube-scheduler kube-scheduler \
  --kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false --v=1

sed -e "s|@STATE@|$STATE_DIR|g" -e "s|@RUN@|$RUN_DIR|g" -e "s|@PKI@|$PKI|g" -e "s|@NODE_IP@|$NODE_IP|g" \
  "$CLUSTER_DIR/templates/kubelet.yaml" > "$STATE_DIR/kubelet.yaml"
start kubelet kubelet --config="$STATE_DIR/kubelet.yaml" --kubeconfig="$STATE_DIR/kubelet.kubeconfig" \
  --root-dir="$STATE_DIR/kubelet" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" \
  --pod-infra-container-image="$PAUSE_IMAGE" --v=1

sed -e "s|@STATE@|$STATE_DIR|g" -e "s|@NODE@|$NODE_NAME|g" -e "s|@SUBNET@|$POD_SUBNET|g" \
  "$CLUSTER_DIR/templates/kube-proxy.yaml" > "$STATE_DIR/kube-proxy.yaml"
start kube-proxy kube-proxy --config="$STATE_DIR/kube-proxy.yaml" --v=1

wait_for "node $NODE_NAME Ready" 120 \
  kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
kubectl apply -f "$REPO_ROOT/config/runtime/runtimeclasses.yaml" >&2
# Pods can only be created once the service-account controller made the namespace's default SA.
wait_for "default service account" 60 kubectl -n default get serviceaccount default
wait_for "kubernetes Service endpoints" 60 \
  sh -c "kubectl -n default get endpointslices -l kubernetes.io/service-name=kubernetes -o name | grep -q ."

# NetworkPolicy enforcement: kube-network-policies as a DaemonSet on the host network, its image
# built from the cached binary and tagged with its digest (a rebuilt binary rolls the Pod).
netpol_tag="$(sha256sum "$NETPOL_BIN/kube-network-policies" | cut -c1-12)"
"$REPO_ROOT/images/build.sh" app kube-network-policies "$NETPOL_BIN/kube-network-policies" \
  --import-address "$CONTAINERD_SOCK" >&2
ctr --address "$CONTAINERD_SOCK" -n k8s.io images tag --force \
  localhost/sandboxrun/kube-network-policies:dev "localhost/sandboxrun/kube-network-policies:$netpol_tag" >/dev/null
sed -e "s|@TAG@|$netpol_tag|g" -e "s|@NODE_IP@|$NODE_IP|g" "$CLUSTER_DIR/templates/kube-network-policies.yaml" | kubectl apply -f - >&2
kubectl -n kube-system rollout status daemonset/kube-network-policies --timeout=120s >&2
# Ready means started; enforcing means its rules are loaded (the table it writes on each sync).
wait_for "kube-network-policies' nftables rules" 60 nft list table inet kube-network-policies

log "cluster up in $((SECONDS - started))s (state: $STATE_DIR, logs: $STATE_DIR/logs)"
echo "KUBECONFIG=$KUBECONFIG_FILE"
