#!/usr/bin/env bash
# A throwaway Prometheus for the fetch_metrics tests (core/tests/prometheus_client.rs), from the
# Debian package (2.42 in bookworm): one server with a private data directory under /tmp (never
# in the repository), scraping itself every 2 s, so queries such as `up` have samples within
# seconds. It listens on one address only (default 127.0.0.1); the cluster tests start a second
# one on the node's bridge address (SANDBOXRUN_PROM_LISTEN=10.244.0.1), which Pods can reach.
#
# Idempotent: when it is already running it only prints the URL. The last line of the output is
#   PROMETHEUS_URL=http://<listen>:<port>
# e.g.  export "SANDBOXRUN_TEST_PROMETHEUS_URL=$(e2e/prometheus/start.sh | tail -1 | cut -d= -f2-)"
#
# Environment: SANDBOXRUN_PROM_LISTEN (default 127.0.0.1), SANDBOXRUN_PROM_PORT (default 59090),
# SANDBOXRUN_PROM_DIR (default /tmp/sandboxrun-prometheus-<port>). Stop and delete with
# e2e/prometheus/stop.sh (same environment).
set -euo pipefail
LISTEN="${SANDBOXRUN_PROM_LISTEN:-127.0.0.1}"
PORT="${SANDBOXRUN_PROM_PORT:-59090}"
BASE="${SANDBOXRUN_PROM_DIR:-/tmp/sandboxrun-prometheus-$PORT}"
URL="http://$LISTEN:$PORT"

log() { printf 'prometheus: %s\n' "$*" >&2; }

if ! command -v prometheus >/dev/null 2>&1; then
  log "installing the Debian prometheus package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # Without recommends: no node exporter. The package's own service is not used (and on
  # machines with a policy-rc.d not started); this script runs its own instance.
  apt-get install -y -qq --no-install-recommends prometheus >&2
  # Where the package's service did start (no policy-rc.d), it is not ours: stop it.
  if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now prometheus >&2 2>/dev/null || true
  fi
fi

ready() { curl -fsS --max-time 2 "$URL/-/ready" >/dev/null 2>&1; }

running() { [[ -f $BASE/pid ]] && kill -0 "$(cat "$BASE/pid")" 2>/dev/null; }

if ! running; then
  mkdir -p "$BASE/data"
  cat >"$BASE/prometheus.yml" <<YAML
global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["$LISTEN:$PORT"]
YAML
  log "starting on $URL (data in $BASE/data)"
  # setsid: the server outlives this script and the shell that ran it.
  setsid prometheus --config.file="$BASE/prometheus.yml" --storage.tsdb.path="$BASE/data" \
    --storage.tsdb.retention.time=1d --web.listen-address="$LISTEN:$PORT" \
    >"$BASE/server.log" 2>&1 </dev/null &
  echo $! >"$BASE/pid"
fi

# Ready, then at least one scrape stored (so `up` has a sample).
deadline=$((SECONDS + 60))
until ready && curl -fsS --max-time 2 "$URL/api/v1/query?query=up" | grep -q '"value"'; do
  if ! running; then
    tail -20 "$BASE/server.log" >&2
    log "the server exited"
    exit 1
  fi
  if ((SECONDS > deadline)); then
    tail -20 "$BASE/server.log" >&2
    log "not ready with a first scrape within 60 s"
    exit 1
  fi
  sleep 0.5
done

echo "PROMETHEUS_URL=$URL"
