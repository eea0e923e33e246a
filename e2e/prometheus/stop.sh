#!/usr/bin/env bash
# Stops the Prometheus started by e2e/prometheus/start.sh (same environment) and deletes its data.
set -euo pipefail
PORT="${SANDBOXRUN_PROM_PORT:-59090}"
BASE="${SANDBOXRUN_PROM_DIR:-/tmp/sandboxrun-prometheus-$PORT}"
# The target refresher of SANDBOXRUN_PROM_KUBECONFIG (it would end with the server anyway).
if [[ -f $BASE/sd.pid ]]; then kill "$(cat "$BASE/sd.pid")" 2>/dev/null || true; fi
if [[ -f $BASE/pid ]]; then
  pid="$(cat "$BASE/pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
fi
rm -rf "$BASE"
