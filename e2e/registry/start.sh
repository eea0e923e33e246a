#!/usr/bin/env bash
# A throwaway OCI registry for the release test (e2e/release/install-test.sh): Debian's
# docker-registry (the CNCF Distribution registry, 2.8 in bookworm), serving HTTPS on
# 127.0.0.1 with a certificate from a CA made here, so that helm, skopeo and the node's containerd
# talk to it exactly as to a public registry (no plain-HTTP or insecure-registry switch): each only
# gets the CA, the way a machine trusts a private registry. Its storage is a private directory
# under /tmp (never in the repository). Also installs skopeo (to push image tarballs).
#
# Idempotent: when it is already running it only prints where it is. The last lines of the output:
#   REGISTRY_CA=<path of the CA certificate>
#   REGISTRY=127.0.0.1:<port>
# e.g.  eval "$(e2e/registry/start.sh | tail -2 | sed 's/^/export /')"
#
# Environment: SANDBOXRUN_REGISTRY_PORT (default 59500), SANDBOXRUN_REGISTRY_DIR (default
# /tmp/sandboxrun-registry-<port>). Stop and delete with e2e/registry/stop.sh (same environment).
set -euo pipefail
PORT="${SANDBOXRUN_REGISTRY_PORT:-59500}"
BASE="${SANDBOXRUN_REGISTRY_DIR:-/tmp/sandboxrun-registry-$PORT}"
ADDR="127.0.0.1:$PORT"

log() { printf 'registry: %s\n' "$*" >&2; }

missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# Where the package's service started (no policy-rc.d; it may have been installed by
# e2e/cluster/install-deps.sh), it is not ours: stop it.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  systemctl disable --now docker-registry >&2 2>/dev/null || true
fi

running() { [[ -f $BASE/pid ]] && kill -0 "$(cat "$BASE/pid")" 2>/dev/null; }
ready() { curl -fsS --max-time 2 --cacert "$BASE/ca.crt" "https://$ADDR/v2/" >/dev/null 2>&1; }

if ! running; then
  rm -rf "$BASE"
  mkdir -p "$BASE/data"
  # The CA and the server's certificate (127.0.0.1 and localhost), valid for a day: a test's.
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=sandboxrun test registry CA" \
    -keyout "$BASE/ca.key" -out "$BASE/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$BASE/server.key" -out "$BASE/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$BASE/ext.cnf"
  openssl x509 -req -in "$BASE/server.csr" -CA "$BASE/ca.crt" -CAkey "$BASE/ca.key" \
    -CAcreateserial -days 1 -extfile "$BASE/ext.cnf" -out "$BASE/server.crt" 2>/dev/null
  cat >"$BASE/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $BASE/data
  delete:
    enabled: true
http:
  addr: $ADDR
  tls:
    certificate: $BASE/server.crt
    key: $BASE/server.key
YAML
  log "starting on https://$ADDR (data in $BASE/data)"
  # setsid: the server outlives this script and the shell that ran it.
  setsid docker-registry serve "$BASE/config.yml" >"$BASE/server.log" 2>&1 </dev/null &
  echo $! >"$BASE/pid"
fi

deadline=$((SECONDS + 30))
until ready; do
  if ! running || ((SECONDS > deadline)); then
    tail -20 "$BASE/server.log" >&2
    log "did not become ready on https://$ADDR"
    exit 1
  fi
  sleep 0.2
done
echo "REGISTRY_CA=$BASE/ca.crt"
echo "REGISTRY=$ADDR"
