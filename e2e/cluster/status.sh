#!/usr/bin/env bash
# Exits 0 when every cluster process is running and the node is Ready. Used by up.sh for
# idempotence and by people to check the cluster.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ -f $KUBECONFIG_FILE ]] || { echo "no cluster state in $STATE_DIR"; exit 1; }
for name in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  pidfile="$STATE_DIR/pids/$name.pid"
  if [[ ! -f $pidfile ]] || ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "$name is not running"; exit 1
  fi
done
"$TOOLS_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s
