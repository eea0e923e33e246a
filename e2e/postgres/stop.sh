#!/usr/bin/env bash
# Stops the PostgreSQL started by e2e/postgres/start.sh and deletes its data directory.
set -euo pipefail
PORT="${SANDBOXRUN_PG_PORT:-55432}"
BASE="${SANDBOXRUN_PG_DIR:-/tmp/sandboxrun-postgres-$PORT}"
PGBIN=/usr/lib/postgresql/15/bin
if [[ -s $BASE/data/PG_VERSION ]]; then
  if [[ $(id -u) == 0 ]]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$BASE/data" -m fast -w stop >&2 || true
  else
    "$PGBIN/pg_ctl" -D "$BASE/data" -m fast -w stop >&2 || true
  fi
fi
case "$BASE" in
  /tmp/*|"${SANDBOXRUN_PG_DIR:-}") rm -rf -- "$BASE" ;;
esac
echo "postgres: stopped, $BASE removed" >&2
