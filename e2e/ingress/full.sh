#!/usr/bin/env bash
# The full form of the Ingress tests (CI runs the short form, in e2e/run-tests.sh): a call held
# open through the ingress controller for a 10-minute approval wait. On a cluster set up as
# e2e/run-tests.sh sets it up (E2E_KEEP_CLUSTER=1 leaves it running), with the same environment
# (KUBECONFIG, MCP_API_KEY, INGRESS_URL, INGRESS_CA). The release's approval wait and approval
# timeout are raised past 10 minutes for the test and put back afterwards.
#
#   e2e/ingress/full.sh      about 12 minutes
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
: "${KUBECONFIG:?} ${MCP_API_KEY:?} ${INGRESS_URL:?} ${INGRESS_CA:?}"
BIN="$(dirname "$KUBECONFIG")/bin"
helm_upgrade() {
  "$BIN/helm" upgrade sandboxrun "$REPO_ROOT/charts/sandboxrun" --namespace sandboxrun-system \
    --reset-then-reuse-values --wait --timeout 3m "$@"
}
trap 'helm_upgrade -f "$REPO_ROOT/e2e/values-governance.yaml" >/dev/null' EXIT
helm_upgrade --set frontend.approvalWait=15m --set policy.approvalTimeout=20m >/dev/null
INGRESS_FULL=1 KUBECTL="$BIN/kubectl" "${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}/venv-mcp/bin/python" \
  -m pytest -q -p no:cacheprovider "$REPO_ROOT/e2e/mcp/test_ingress.py" -k approval
