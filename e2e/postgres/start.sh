#!/usr/bin/env bash
# A throwaway PostgreSQL 15 for the execute_sql tests (core/tests/query_postgres.rs and, through
# the operator in the test cluster, e2e/mcp/test_governance.py), from the Debian packages: initdb +
# pg_ctl as the `postgres` OS user, on a fixed non-default port, data under /tmp (never in the
# repository).
#
# Who may connect (pg_hba.conf): the superuser only over the Unix socket; over TCP only with a
# password (scram-sha-256), from 127.0.0.1 and, for `sandboxrun_reader` on `sandboxrun_test` only,
# from the test cluster's Pod network ($SANDBOXRUN_PG_CLUSTER_CIDR, default 10.244.0.0/24: the
# operator Pod reaches the node at 10.244.0.1 on bridge sbr0). The server listens on all
# addresses because the database may start before the cluster's bridge exists; pg_hba.conf
# refuses every other client.
#
# It creates database `sandboxrun_test` with the demo schema (config/demo/demo.sql), a
# 1,000,000-row table `big`, a table `profiles` with jsonb and array columns, write probes (`probe_log`, `probe_seq`, `sandboxrun_write_probe()`)
# and the role `sandboxrun_reader`.
#
# `sandboxrun_reader` is the shape of the role deployments should give sandboxrun: LOGIN, no
# superuser/createdb/createrole, CONNECT on the database, USAGE on the schema, SELECT on the
# tables agents may read and nothing else, plus `default_transaction_read_only = on` and the
# right to set `temp_file_limit` (GRANT SET ON PARAMETER, PostgreSQL 15+). sandboxrun
# additionally runs every query in a READ ONLY transaction with a statement timeout.
#
# It also creates database `sandboxrun_state` owned by role `sandboxrun_state` (writable), for the
# agent's thread store tests; its URL is printed on the line before the last:
#   STATE_DATABASE_URL=postgres://sandboxrun_state:<password>@127.0.0.1:<port>/sandboxrun_state
#
# Idempotent: when it is already running it only prints the URLs. The last line of the output is
#   DATABASE_URL=postgres://sandboxrun_reader:<password>@127.0.0.1:<port>/sandboxrun_test
# e.g.  export "SANDBOXRUN_TEST_POSTGRES_URL=$(e2e/postgres/start.sh | tail -1 | cut -d= -f2-)"
#
# Environment: SANDBOXRUN_PG_PORT (default 55432), SANDBOXRUN_PG_DIR (default
# /tmp/sandboxrun-postgres-<port>), SANDBOXRUN_PG_CLUSTER_CIDR (default 10.244.0.0/24). Stop and
# delete with e2e/postgres/stop.sh.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${SANDBOXRUN_PG_PORT:-55432}"
BASE="${SANDBOXRUN_PG_DIR:-/tmp/sandboxrun-postgres-$PORT}"
DATA="$BASE/data"
SOCK="$BASE/socket"
PGBIN=/usr/lib/postgresql/15/bin
DB=sandboxrun_test
ROLE=sandboxrun_reader
CLUSTER_CIDR="${SANDBOXRUN_PG_CLUSTER_CIDR:-10.244.0.0/24}"
LISTEN='*'

log() { printf 'postgres: %s\n' "$*" >&2; }

if [[ ! -x $PGBIN/initdb ]]; then
  log "installing the Debian PostgreSQL 15 packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql-15 >&2 || apt-get install -y -qq postgresql >&2
fi

# initdb refuses to run as root: run the server as the `postgres` OS user.
if [[ $(id -u) == 0 ]]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
  as_pg() { runuser -u postgres -- "$@"; }
  OWNER=postgres
else
  as_pg() { "$@"; }
  OWNER="$(id -un)"
fi

mkdir -p "$BASE"
chmod 700 "$BASE"
chown "$OWNER" "$BASE"

psql_su() { as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$PORT" -U postgres "$@"; }

if [[ ! -s $DATA/PG_VERSION ]]; then
  log "initdb in $DATA"
  rm -f "$BASE/ready"
  as_pg mkdir -p "$DATA" "$SOCK"
  # Superuser only over the Unix socket in $SOCK (mode 700 directory); TCP needs a password.
  as_pg "$PGBIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 >"$BASE/initdb.log" 2>&1 \
    || { cat "$BASE/initdb.log" >&2; exit 1; }
fi

# The test cluster's Pods (the operator) may connect as the read-only role, with its password.
HBA_CLUSTER="host $DB $ROLE $CLUSTER_CIDR scram-sha-256"
hba_changed=0
if ! grep -qxF "$HBA_CLUSTER" "$DATA/pg_hba.conf"; then
  printf '# sandboxrun test cluster Pods (e2e/postgres/start.sh)\n%s\n' "$HBA_CLUSTER" \
    | as_pg tee -a "$DATA/pg_hba.conf" >/dev/null
  hba_changed=1
fi

pg_options="-c listen_addresses='$LISTEN' -p $PORT -k $SOCK -c fsync=off -c full_page_writes=off"
if as_pg "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  # Started by an older version of this script (listening on 127.0.0.1 only): restart it.
  listening="$(psql_su -d postgres -tAc 'SHOW listen_addresses')"
  if [[ $listening != "$LISTEN" ]]; then
    log "restarting to listen on all addresses (was: $listening)"
    as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$BASE/server.log" -w -t 60 -m fast \
      -o "$pg_options" restart >&2 || { tail -20 "$BASE/server.log" >&2; exit 1; }
  elif [[ $hba_changed == 1 ]]; then
    as_pg "$PGBIN/pg_ctl" -D "$DATA" reload >&2
  fi
else
  log "starting on port $PORT (TCP: 127.0.0.1 and $CLUSTER_CIDR, password only)"
  as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$BASE/server.log" -w -t 60 -o "$pg_options" start >&2 \
    || { tail -20 "$BASE/server.log" >&2; exit 1; }
fi

if [[ ! -f $BASE/ready ]]; then
  log "creating database $DB, role $ROLE, tables ledger, audit_log, big (1,000,000 rows)"
  PASSWORD="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  psql_su -d postgres <<SQL
DROP DATABASE IF EXISTS $DB;
DROP ROLE IF EXISTS $ROLE;
CREATE ROLE $ROLE LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOINHERIT
  PASSWORD '$PASSWORD';
ALTER ROLE $ROLE SET default_transaction_read_only = on;
CREATE DATABASE $DB;
REVOKE ALL ON DATABASE $DB FROM PUBLIC;
GRANT CONNECT ON DATABASE $DB TO $ROLE;
SQL
  psql_su -d "$DB" <"$REPO_ROOT/config/demo/demo.sql"
  psql_su -d "$DB" <<SQL
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO $ROLE;

CREATE TABLE big AS
  SELECT g AS id, md5(g::text) AS payload, g * 0.01 AS amount
  FROM generate_series(1, 1000000) AS g;
ALTER TABLE big ADD PRIMARY KEY (id);

-- Write probes: a query that parses as a SELECT but writes must fail.
CREATE TABLE probe_log (id serial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now());
CREATE SEQUENCE probe_seq;
CREATE FUNCTION sandboxrun_write_probe() RETURNS integer LANGUAGE sql VOLATILE
  AS 'INSERT INTO probe_log DEFAULT VALUES RETURNING id';

-- Read-only: SELECT on the readable tables, nothing else (no INSERT, no sequence USAGE).
GRANT SELECT ON ledger, audit_log, big, probe_log TO $ROLE;
ANALYZE;
SQL
  umask 077
  printf '%s\n' "$PASSWORD" >"$BASE/reader-password"
  touch "$BASE/ready"
fi

# A table with composite-ish columns (jsonb, an array) for the guard's differential test
# (core/tests/sql_explain_differential.rs): subscripts and JSON operators on them. Checked on every
# start, like the grant below.
psql_su -d "$DB" >/dev/null <<SQL
CREATE TABLE IF NOT EXISTS profiles (
  id integer PRIMARY KEY, name text NOT NULL, secret jsonb NOT NULL, tags text[] NOT NULL);
INSERT INTO profiles
  SELECT g, 'user' || g, jsonb_build_object('k', md5(g::text)), ARRAY['t' || g, 'u' || g]
  FROM generate_series(1, 50) AS g
  ON CONFLICT DO NOTHING;
GRANT SELECT ON profiles TO $ROLE;
SQL

# sandboxrun lowers temp_file_limit (a superuser-only setting) for each query it runs; PostgreSQL
# 15 lets a superuser grant a role the right to set it. Without the grant sandboxrun keeps the
# role's own temp_file_limit (ALTER ROLE ... SET temp_file_limit). Checked on every start, so an
# instance started before this existed gets it too.
psql_su -d postgres -c "GRANT SET ON PARAMETER temp_file_limit TO $ROLE" >/dev/null

# A writable database for state kept by sandboxrun itself (the agent's threads), owned by its own
# role: the reader above must stay read-only. Checked on every start, so an instance started
# before this existed gets it too.
STATE=sandboxrun_state
if [[ ! -s $BASE/state-password ]]; then
  log "creating database $STATE owned by role $STATE"
  STATE_PASSWORD="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  psql_su -d postgres <<SQL
SET client_min_messages TO warning;
DROP DATABASE IF EXISTS $STATE;
DROP ROLE IF EXISTS $STATE;
CREATE ROLE $STATE LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD '$STATE_PASSWORD';
CREATE DATABASE $STATE OWNER $STATE;
REVOKE ALL ON DATABASE $STATE FROM PUBLIC;
GRANT CONNECT ON DATABASE $STATE TO $STATE;
SQL
  (umask 077 && printf '%s\n' "$STATE_PASSWORD" >"$BASE/state-password")
fi

echo "STATE_DATABASE_URL=postgres://$STATE:$(cat "$BASE/state-password")@127.0.0.1:$PORT/$STATE"
echo "DATABASE_URL=postgres://$ROLE:$(cat "$BASE/reader-password")@127.0.0.1:$PORT/$DB"
