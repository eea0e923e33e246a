#!/usr/bin/env bash
# Renders the chart's alerts (templates/prometheusrule.yaml, their one definition) with
# `helm template` and writes the PrometheusRule's spec to OUT: a Prometheus rule file, for
# promtool (e2e/chart/alerts-test.sh) and for the cluster test's Prometheus (e2e/run-tests.sh,
# SANDBOXRUN_PROM_RULES of e2e/prometheus/start.sh). Release sandboxrun in sandboxrun-system with
# the frontend on (a placeholder API key), as e2e/install.sh installs it; further arguments go to
# helm (e.g. -f e2e/values-alerts.yaml).
#
#   e2e/chart/alert-rules.sh OUT [helm template arguments]
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"
HELM=${HELM:-$TOOLS_BIN/helm}
[[ -x $HELM ]] || die "no helm at $HELM: run e2e/cluster/build.sh tools, or set HELM"
(($# >= 1)) || die "usage: $0 OUT [helm template arguments]"
out=$1; shift
rendered="$("$HELM" template sandboxrun "$REPO_ROOT/charts/sandboxrun" --namespace sandboxrun-system \
  --api-versions monitoring.coreos.com/v1/PrometheusRule --set prometheusRule.enabled=true \
  --set frontend.enabled=true --set 'frontend.apiKeys[0].agent=alerts' \
  --set "frontend.apiKeys[0].sha256=$(printf x | sha256sum | cut -d' ' -f1)" \
  --show-only templates/prometheusrule.yaml "$@")"
# The template renders one document whose last key is `spec`: what follows it, one level out.
awk 'found { sub(/^  /, ""); print } /^spec:$/ { found = 1 }' <<<"$rendered" >"$out"
grep -q '^groups:' "$out" || die "no spec.groups in the rendered PrometheusRule"
