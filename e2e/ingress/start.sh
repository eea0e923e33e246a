#!/usr/bin/env bash
# A real ingress controller for the local cluster: Traefik (built by e2e/cluster/build.sh
# traefik), run on the node as the cluster's other components are, watching the cluster's
# Ingress objects (its Kubernetes Ingress provider, through the admin kubeconfig) and serving
# them over TLS on the node's ports. It routes to the Pods behind each Ingress's Service, as it
# would inside the cluster.
#
# Made here: a test CA and a certificate for `localhost` (the Ingress host of the tests), the
# TLS Secret the chart's Ingress names, and the IngressClass `traefik`. Traefik runs with its
# defaults otherwise (timeouts included), so the tests hold what an install would meet.
#
# Idempotent. The last lines of the output are
#   INGRESS_URL=https://localhost:<port>
#   INGRESS_CA=<the CA's certificate>
# Environment: KUBECONFIG (the cluster's), SANDBOXRUN_INGRESS_PORT (default 8443),
# SANDBOXRUN_INGRESS_NAMESPACE (default sandboxrun-system), SANDBOXRUN_INGRESS_SECRET (default
# sandboxrun-ingress-tls). Stop with e2e/ingress/stop.sh.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../cluster" && pwd)/lib.sh"

PORT="${SANDBOXRUN_INGRESS_PORT:-8443}"
NAMESPACE="${SANDBOXRUN_INGRESS_NAMESPACE:-sandboxrun-system}"
SECRET="${SANDBOXRUN_INGRESS_SECRET:-sandboxrun-ingress-tls}"
DIR=/tmp/sandboxrun-ingress
: "${KUBECONFIG:?KUBECONFIG of the cluster}"
KUBECTL="$(dirname "$KUBECONFIG")/bin/kubectl"
[[ -x $KUBECTL ]] || KUBECTL=kubectl

"$CLUSTER_DIR/build.sh" traefik
mkdir -p "$DIR"

if [[ ! -s $DIR/tls.crt ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=sandboxrun ingress test CA" -keyout "$DIR/ca.key" -out "$DIR/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
    -keyout "$DIR/tls.key" -out "$DIR/tls.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$DIR/ext.cnf"
  openssl x509 -req -in "$DIR/tls.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial \
    -days 30 -extfile "$DIR/ext.cnf" -out "$DIR/tls.crt" 2>/dev/null
fi
"$KUBECTL" create namespace "$NAMESPACE" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" -n "$NAMESPACE" create secret tls "$SECRET" --cert "$DIR/tls.crt" --key "$DIR/tls.key" \
  --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
"$KUBECTL" apply -f - >/dev/null <<'YAML'
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: traefik
spec:
  controller: traefik.io/ingress-controller
YAML

if [[ -f $DIR/pid ]] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; then
  log "traefik is running (pid $(cat "$DIR/pid"))"
else
  log "starting traefik v$TRAEFIK_VERSION on :$PORT"
  KUBECONFIG="$KUBECONFIG" setsid "$TRAEFIK_BIN/traefik" \
    --entryPoints.websecure.address=":$PORT" \
    --entryPoints.websecure.http.tls=true \
    --providers.kubernetesingress=true \
    --providers.kubernetesingress.ingressClass=traefik \
    --ping=true --ping.entryPoint=websecure \
    --log.level=INFO --accesslog=true --global.checkNewVersion=false \
    --global.sendAnonymousUsage=false \
    > "$DIR/traefik.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pid"
fi
# Until the chart's Ingress exists, Traefik presents its own default certificate: the liveness
# check does not verify it (the tests do, once the Ingress's Secret is served).
for _ in $(seq 1 100); do
  curl -fsSk "https://localhost:$PORT/ping" >/dev/null 2>&1 && break
  kill -0 "$(cat "$DIR/pid")" 2>/dev/null || { tail -20 "$DIR/traefik.log" >&2; die "traefik exited"; }
  sleep 0.2
done
curl -fsSk "https://localhost:$PORT/ping" >/dev/null ||
  { tail -20 "$DIR/traefik.log" >&2; die "traefik did not answer /ping"; }
echo "INGRESS_URL=https://localhost:$PORT"
echo "INGRESS_CA=$DIR/ca.crt"
