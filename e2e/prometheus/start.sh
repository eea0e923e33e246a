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
# e2e/prometheus/stop.sh (same environment). Opt-in, for the cluster's observability test
# (e2e/mcp/test_cluster_observability.py):
#   SANDBOXRUN_PROM_KUBECONFIG  also scrape the chart's Services (label app.kubernetes.io/name:
#       sandboxrun; ports metrics and http) in SANDBOXRUN_PROM_NAMESPACE (default
#       sandboxrun-system) every 2 s, labelled as the chart's ServiceMonitors label them:
#       job=<Service>, namespace, service, pod. Debian's Prometheus has no Kubernetes service
#       discovery, so a loop next to the server writes the Pod addresses of the Services'
#       EndpointSlices (routable from the node) into a file_sd file every 5 s, with kubectl
#       (SANDBOXRUN_PROM_KUBECTL, default: kubectl on PATH, else bin/kubectl next to the kubeconfig).
#   SANDBOXRUN_PROM_RULES  a rule file (e.g. the chart's alerts: e2e/chart/alert-rules.sh),
#       evaluated every 2 s.
# A running server whose configuration or rules differ is reloaded with them (SIGHUP).
#   e2e/prometheus/start.sh --install-only    only install the package (promtool comes with it)
set -euo pipefail
LISTEN="${SANDBOXRUN_PROM_LISTEN:-127.0.0.1}"
PORT="${SANDBOXRUN_PROM_PORT:-59090}"
BASE="${SANDBOXRUN_PROM_DIR:-/tmp/sandboxrun-prometheus-$PORT}"
URL="http://$LISTEN:$PORT"
KUBECONFIG_FILE="${SANDBOXRUN_PROM_KUBECONFIG:-}"
SCRAPE_NAMESPACE="${SANDBOXRUN_PROM_NAMESPACE:-sandboxrun-system}"
RULES="${SANDBOXRUN_PROM_RULES:-}"
KUBECTL="${SANDBOXRUN_PROM_KUBECTL:-$(command -v kubectl || echo "$(dirname "${KUBECONFIG_FILE:-.}")/bin/kubectl")}"

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
[[ ${1:-} == --install-only ]] && exit 0

ready() { curl -fsS --max-time 2 "$URL/-/ready" >/dev/null 2>&1; }

running() { [[ -f $BASE/pid ]] && kill -0 "$(cat "$BASE/pid")" 2>/dev/null; }

config() {
  cat <<YAML
global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["$LISTEN:$PORT"]
YAML
  if [[ -n $KUBECONFIG_FILE ]]; then
    cat <<YAML
  - job_name: sandboxrun
    file_sd_configs:
      - files: ["$BASE/sandboxrun-targets.yml"]
        refresh_interval: 2s
YAML
  fi
  if [[ -n $RULES ]]; then
    printf 'rule_files: ["%s"]\n' "$BASE/rules.yml"
  fi
}

[[ -z $KUBECONFIG_FILE || -r $KUBECONFIG_FILE ]] || { log "no kubeconfig at $KUBECONFIG_FILE"; exit 1; }
[[ -z $RULES || -r $RULES ]] || { log "no rule file at $RULES"; exit 1; }
mkdir -p "$BASE/data"
changed_rules=0
if [[ -n $RULES ]] && ! cmp -s "$RULES" "$BASE/rules.yml"; then
  cp "$RULES" "$BASE/rules.yml"
  changed_rules=1
fi
if running; then
  # Asked for scraping or rules the running server does not have: reload it with them.
  if [[ -n $KUBECONFIG_FILE$RULES ]] && { ! config | cmp -s - "$BASE/prometheus.yml" || ((changed_rules)); }; then
    config >"$BASE/prometheus.yml"
    loads() { grep -c "Completed loading of configuration file" "$BASE/server.log" || true; }
    before="$(loads)"
    log "reloading $URL with the new configuration"
    kill -HUP "$(cat "$BASE/pid")"
    for _ in $(seq 100); do (("$(loads)" > before)) && break; sleep 0.1; done
    curl -fsS --max-time 2 "$URL/api/v1/status/runtimeinfo" | grep -q '"reloadConfigSuccess":true' ||
      { tail -5 "$BASE/server.log" >&2; log "reload failed"; exit 1; }
  fi
else
  config >"$BASE/prometheus.yml"
  log "starting on $URL (data in $BASE/data)"
  # setsid: the server outlives this script and the shell that ran it.
  setsid prometheus --config.file="$BASE/prometheus.yml" --storage.tsdb.path="$BASE/data" \
    --storage.tsdb.retention.time=1d --web.listen-address="$LISTEN:$PORT" \
    >"$BASE/server.log" 2>&1 </dev/null &
  echo $! >"$BASE/pid"
fi

# The targets of the sandboxrun job: each EndpointSlice address of a metrics or http port.
targets_template='{{range $s := .items}}{{$svc := index $s.metadata.labels "kubernetes.io/service-name"}}'\
'{{range $p := $s.ports}}{{if or (eq $p.name "metrics") (eq $p.name "http")}}{{range $e := $s.endpoints}}'\
'{{range $a := $e.addresses}}- targets: ["{{$a}}:{{$p.port}}"]
  labels: {job: "{{$svc}}", namespace: "{{$s.metadata.namespace}}", service: "{{$svc}}"'\
'{{with $e.targetRef}}, pod: "{{.name}}"{{end}}}
{{end}}{{end}}{{end}}{{end}}{{end}}'
refresh_targets() {
  local out="$BASE/sandboxrun-targets.yml"
  if KUBECONFIG="$KUBECONFIG_FILE" "$KUBECTL" -n "$SCRAPE_NAMESPACE" get endpointslices \
    -l app.kubernetes.io/name=sandboxrun -o go-template="$targets_template" >"$out.tmp" 2>/dev/null; then
    [[ -s $out.tmp ]] || echo '[]' >"$out.tmp"
    cmp -s "$out.tmp" "$out" || mv "$out.tmp" "$out"
  fi
}
if [[ -n $KUBECONFIG_FILE ]] && ! { [[ -f $BASE/sd.pid ]] && kill -0 "$(cat "$BASE/sd.pid")" 2>/dev/null; }; then
  [[ -x $KUBECTL ]] || command -v "$KUBECTL" >/dev/null || { log "no kubectl at $KUBECTL"; exit 1; }
  refresh_targets
  # Until the server exits (stop.sh also stops it); setsid, as the server.
  export BASE KUBECONFIG_FILE KUBECTL SCRAPE_NAMESPACE targets_template
  setsid bash -c "$(declare -f refresh_targets)"'
    while kill -0 "$1" 2>/dev/null; do sleep 5; refresh_targets; done' refresher "$(cat "$BASE/pid")" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$BASE/sd.pid"
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
