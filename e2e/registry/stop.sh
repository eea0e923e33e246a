#!/usr/bin/env bash
# Stops the registry started by e2e/registry/start.sh (same environment) and deletes its data.
set -euo pipefail
PORT="${SANDBOXRUN_REGISTRY_PORT:-59500}"
BASE="${SANDBOXRUN_REGISTRY_DIR:-/tmp/sandboxrun-registry-$PORT}"
if [[ -f $BASE/pid ]]; then
  pid="$(cat "$BASE/pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
fi
rm -rf "$BASE"
