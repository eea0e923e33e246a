#!/usr/bin/env bash
# Unit tests of the chart's alerts, offline: the PrometheusRule as `helm template` renders it
# (e2e/chart/alert-rules.sh, default values) checked by `promtool check rules` and tested by
# `promtool test rules e2e/chart/alerts-test.yaml` (each alert fires on the series it is about and
# stays silent on healthy ones); then that the tests can fail, and that every sandboxrun metric
# the alerts and the dashboard name is one the operator or the frontend registers. promtool comes
# with the Debian prometheus package (installed when missing). Run by e2e/chart/validate.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"
command -v promtool >/dev/null || "$REPO_ROOT/e2e/prometheus/start.sh" --install-only
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
rules() { "$REPO_ROOT/e2e/chart/alert-rules.sh" "$work/rules.yaml" "$@"; }
cp "$REPO_ROOT/e2e/chart/alerts-test.yaml" "$work/"

log "promtool check rules, promtool test rules: the chart's alerts with their default values"
rules
promtool check rules "$work/rules.yaml" >&2
promtool test rules "$work/alerts-test.yaml" >&2

# The tests must be able to fail: the same series against a changed threshold or selector.
for broken in "--set prometheusRule.runsFailing.ratio=0.8" "--set prometheusRule.warmPoolEmpty.for=20m" \
  "--set prometheusRule.operatorSelector=job=\"elsewhere\""; do
  read -r -a args <<<"$broken"
  rules "${args[@]}"
  if promtool test rules "$work/alerts-test.yaml" >/dev/null 2>&1; then
    die "promtool test rules passed with $broken"
  fi
done

# Values reach the rules: extra alert labels, and no frontend alert without a frontend.
rules --set prometheusRule.alertLabels.team=platform --set frontend.enabled=false
promtool check rules "$work/rules.yaml" >/dev/null
grep -q 'team: platform' "$work/rules.yaml" || die "prometheusRule.alertLabels not in the rules"
! grep -q SandboxrunFrontendDown "$work/rules.yaml" || die "a frontend alert without the frontend"

# Every sandboxrun_* metric named is registered (counters get _total, histograms _bucket/_count/_sum).
rules
names="$(grep -ohE '\bsandboxrun_[a-z_]+' "$work/rules.yaml" "$REPO_ROOT/charts/sandboxrun/dashboards/sandboxrun.json" | sort -u)"
for name in $names; do
  base="${name%_total}"; base="${base%_bucket}"; base="${base%_count}"; base="${base%_sum}"
  case $base in
    sandboxrun_mcp_*) file=mcp-frontend/src/metrics.rs; short="${base#sandboxrun_mcp_}" ;;
    *) file=operator/src/metrics.rs; short="${base#sandboxrun_}" ;;
  esac
  grep -q "\"$short\"" "$REPO_ROOT/$file" || die "$name: no metric \"$short\" registered in $file"
done
log "alerts OK ($(wc -w <<<"$names") metric names checked)"
