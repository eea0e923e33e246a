#!/usr/bin/env bash
# Creates (or updates) the Secret the operator reads its databases from (chart value
# operator.databasesSecret, see e2e/values-governance.yaml): database `analytics` is the test
# PostgreSQL of e2e/postgres/start.sh, as its read-only role `sandboxrun_reader`, reached from
# the cluster's Pods at the node address (bridge sbr0). Only the operator mounts this Secret; the
# MCP frontend never sees the password.
#
#   e2e/postgres/databases-secret.sh 'postgres://sandboxrun_reader:...@127.0.0.1:55432/sandboxrun_test'
#
# The URL is start.sh's DATABASE_URL; its host is replaced by the node address. Environment:
# KUBECONFIG, SANDBOXRUN_NAMESPACE (default sandboxrun-system), SANDBOXRUN_DATABASES_SECRET
# (default sandboxrun-databases).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"
export PATH="$STATE_DIR/bin:$PATH"
export KUBECONFIG="${KUBECONFIG:-$KUBECONFIG_FILE}"
URL="${1:?usage: databases-secret.sh DATABASE_URL (the last line of e2e/postgres/start.sh)}"
NAMESPACE="${SANDBOXRUN_NAMESPACE:-sandboxrun-system}"
SECRET="${SANDBOXRUN_DATABASES_SECRET:-sandboxrun-databases}"

# postgres://user:password@HOST:port/db -> the same with the node address as HOST.
[[ $URL =~ ^(postgres(ql)?://[^@/]+@)[^:/]+(:[0-9]+/.+)$ ]] \
  || { echo "databases-secret.sh: not a postgres://user:password@host:port/db URL" >&2; exit 1; }
CLUSTER_URL="${BASH_REMATCH[1]}$NODE_IP${BASH_REMATCH[3]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 077
printf '%s' "$CLUSTER_URL" >"$work/analytics-url"
cat >"$work/databases.yaml" <<YAML
# Database name (execute_sql's \`database\`) -> dialect and where the URL is (another key of this
# Secret, mounted next to this file). Every database belongs to an environment (absent:
# production): the same test database twice, as the sandbox's and as production's (a call naming
# the sandbox is judged in production there: e2e/mcp/test_governance.py).
analytics:
  dialect: postgres
  environment: sandbox
  urlFile: /etc/sandboxrun-databases/analytics-url
  maxConnections: 4
analytics-production:
  dialect: postgres
  environment: production
  urlFile: /etc/sandboxrun-databases/analytics-url
  maxConnections: 2
YAML

kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
applied="$(kubectl -n "$NAMESPACE" create secret generic "$SECRET" \
  --from-file=databases.yaml="$work/databases.yaml" --from-file=analytics-url="$work/analytics-url" \
  --dry-run=client -o yaml | kubectl apply -f -)"
# The operator reads its databases at start-up: a changed Secret (a new PostgreSQL, a new
# password) needs a restart of an operator that is already running.
if [[ $applied == *configured* ]] \
    && kubectl -n "$NAMESPACE" get deployment -l app.kubernetes.io/component=operator -o name | grep -q .; then
  kubectl -n "$NAMESPACE" rollout restart deployment -l app.kubernetes.io/component=operator >&2
fi
log "Secret $NAMESPACE/$SECRET: database analytics at $NODE_IP (read-only role, password not shown)"
