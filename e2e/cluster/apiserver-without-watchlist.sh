#!/usr/bin/env bash
# A second API server for the local cluster (e2e/cluster/up.sh), on the same etcd, with the
# WatchList feature off: the API server of Kubernetes 1.33 (where it is off by default), of
# releases before 1.32, or of any cluster that turned it off. The components must fall back to
# paged lists there (crds/src/list_strategy.rs); e2e/run-tests.sh runs the operator and the
# frontend against it.
#
#   e2e/cluster/apiserver-without-watchlist.sh start   # prints KUBECONFIG=<path> last
#   e2e/cluster/apiserver-without-watchlist.sh stop
#
# Started from the running API server's own command line (so it has exactly the cluster's
# flags), on port 6446, without reconciling the `kubernetes` Service's endpoints (the cluster's
# Pods keep talking to the first one).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"

PORT=6446
NAME=kube-apiserver-without-watchlist
PIDFILE="$STATE_DIR/pids/$NAME.pid"
KUBECONFIG_OUT="$STATE_DIR/without-watchlist.kubeconfig"
PKI="$STATE_DIR/pki"

stop() {
  [[ -f $PIDFILE ]] || return 0
  local pid
  pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  log "$NAME stopped"
}

start() {
  stop
  local pid argv=() arg
  pid="$(cat "$STATE_DIR/pids/kube-apiserver.pid")"
  while IFS= read -r -d '' arg; do
    case $arg in
      --secure-port=*) argv+=("--secure-port=$PORT") ;;
      --feature-gates=*) die "the cluster's API server already sets feature gates ($arg): merge WatchList=false into them here" ;;
      *) argv+=("$arg") ;;
    esac
  done < "/proc/$pid/cmdline"
  argv[0]="$(readlink "/proc/$pid/exe")"
  argv+=(--feature-gates=WatchList=false --endpoint-reconciler-type=none)
  log "starting $NAME on port $PORT"
  setsid "${argv[@]}" > "$STATE_DIR/logs/$NAME.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  local deadline=$((SECONDS + 90))
  until curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://$NODE_IP:$PORT/readyz" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      tail -n 30 "$STATE_DIR/logs/$NAME.log" >&2
      die "$NAME did not become ready"
    fi
    sleep 0.2
  done
  sed "s|https://$NODE_IP:6443|https://$NODE_IP:$PORT|" "$KUBECONFIG_FILE" > "$KUBECONFIG_OUT"
  grep -q ":$PORT" "$KUBECONFIG_OUT" || die "the admin kubeconfig does not name https://$NODE_IP:6443"
  log "$NAME ready"
  echo "KUBECONFIG=$KUBECONFIG_OUT"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  *) die "usage: $0 start|stop" ;;
esac
