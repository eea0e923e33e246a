#!/usr/bin/env bash
# Stops every process up.sh started (by pid), removes the Pods' containers, undoes the host
# changes (sysctls, iptables chains, bridge, routes, mounts) and deletes the cluster state, so the
# next up.sh starts clean. Safe to run when nothing is up.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set +e  # teardown goes on past individual failures

# stop TIMEOUT_S NAME...: SIGTERM to each, then SIGKILL to those still running after TIMEOUT_S.
# All at once: one after the other they cost 45 s of every CI run (2026-12-04), 15 of them the API
# server's graceful shutdown, which serves nobody here (its state is deleted below).
stop() {
  local timeout=$1 name pid pids=() i alive
  shift
  for name in "$@"; do
    local pidfile="$STATE_DIR/pids/$name.pid"
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile"); rm -f "$pidfile"
    if kill -0 "$pid" 2>/dev/null; then
      log "stopping $name ($pid)"
      kill -TERM "$pid"; pids+=("$pid")
    fi
  done
  for ((i = 0; i < timeout * 10; i++)); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && { alive=1; break; }; done
    ((alive)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  return 0
}

# The kubelet first so it does not restart what we remove, then every pod through the CRI (this
# stops the runc and runsc shims cleanly and tears down pod networking), then the control plane
# (`apiserver-without-watchlist.sh`'s server too, if a run left it up) and containerd.
stop 15 kube-proxy kubelet
if [[ -S $CONTAINERD_SOCK ]]; then
  crictl=("$TOOLS_BIN/crictl" --runtime-endpoint "unix://$CONTAINERD_SOCK" --timeout 20s)
  "${crictl[@]}" stopp $("${crictl[@]}" pods -q 2>/dev/null) >/dev/null 2>&1
  "${crictl[@]}" rmp -fa >/dev/null 2>&1
fi
stop 3 kube-scheduler kube-controller-manager kube-apiserver-without-watchlist kube-apiserver etcd containerd
# Shims outlive containerd by design; any left belong to our socket and are ours to end.
for pid in $(pgrep -f "containerd-shim.*-address $CONTAINERD_SOCK"); do kill -KILL "$pid" 2>/dev/null; done
for pid in $(pgrep -f "runsc.*$RUN_DIR"); do kill -KILL "$pid" 2>/dev/null; done

# kube-proxy removes its own iptables chains.
[[ -x $K8S_BIN/kube-proxy ]] && "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1
iptables -w -D FORWARD -j SANDBOXRUN-EGRESS 2>/dev/null
iptables -w -F SANDBOXRUN-EGRESS 2>/dev/null; iptables -w -X SANDBOXRUN-EGRESS 2>/dev/null
# kube-network-policies removes its table when stopped; a killed one leaves it, and its fail-closed
# queue rules would drop the traffic of addresses a later cluster hands out again.
nft delete table inet kube-network-policies 2>/dev/null
# Network namespaces the NetworkPolicy tests make (e2e/tests/network_policy.rs), should one be left.
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^sbr-/ {print $1}'); do ip netns del "$ns"; done
# The bridge plugin's masquerade/forward chains, should any exist.
ip route del unreachable "$SERVICE_CIDR" 2>/dev/null
ip link del "$BRIDGE" 2>/dev/null
rm -rf /var/lib/cni/networks/sandboxrun

# Restore the sysctls up.sh recorded (the kubelet, kube-proxy and the bridge plugin change some).
if [[ -f $STATE_DIR/sysctl.orig ]]; then
  while IFS='=' read -r key value; do sysctl -qw "$key=$value" 2>/dev/null; done < "$STATE_DIR/sysctl.orig"
fi

# Unmount everything below our directories, deepest first (pod volumes, the kubelet's bind mount,
# containerd's overlay snapshots, network namespaces).
for dir in "$STATE_DIR" "$RUN_DIR"; do
  awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
done
remove_pod_netns() {
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e $ns ]] || continue
    # Only namespaces no process uses any more (ours are gone by now).
    ip netns pids "$(basename "$ns")" 2>/dev/null | grep -q . ||
      { umount "$ns" 2>/dev/null; rm -f "$ns" 2>/dev/null; }
  done
}
remove_pod_netns
# A namespace still there is hidden under a bind mount of /run/netns made after it (see up.sh):
# detach that mount, remove what it hid, and leave the directory a shared mount point again.
if compgen -G '/run/netns/cni-*' >/dev/null && mountpoint -q /run/netns; then
  umount -l /run/netns
  remove_pod_netns
  mount --bind /run/netns /run/netns && mount --make-shared /run/netns
fi
for ns in /run/netns/cni-*; do [[ -e $ns ]] && log "left behind (still in use): $ns"; done

# Kubelet cgroups for pods.
for c in /sys/fs/cgroup/*/kubepods; do
  [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
done

rm -rf "$STATE_DIR" "$RUN_DIR"
log "cluster down"
exit 0
