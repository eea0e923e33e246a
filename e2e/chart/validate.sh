#!/usr/bin/env bash
# Static checks of the Helm chart, no cluster needed: `helm lint --strict`, then `helm template`
# output (defaults, the e2e install's values, every optional object on, the CRDs themselves)
# validated by kubeconform against Kubernetes schemas in strict mode.
#
# Offline: the schemas are generated here (schemagen/) from the OpenAPI document of the
# k8s.io/kubernetes module of the cluster's version (e2e/cluster/versions.env), from the chart's
# CRD and from prometheus-operator's ServiceMonitor and PrometheusRule CRDs, both modules fetched
# through the Go module proxy; kubeconform is built from the proxy too and cached under
# $SANDBOXRUN_CACHE. Then the chart's alerts' unit tests (e2e/chart/alerts-test.sh, promtool).
#
#   e2e/chart/validate.sh        (HELM=/path/to/helm to use another helm than build.sh's)
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/lib.sh"
KUBECONFORM_VERSION=0.8.0
PROMETHEUS_OPERATOR_VERSION=0.85.0
CHART="$REPO_ROOT/charts/sandboxrun"
HELM=${HELM:-$TOOLS_BIN/helm}
[[ -x $HELM ]] || die "no helm at $HELM: run e2e/cluster/build.sh tools, or set HELM"

KUBECONFORM="$CACHE_DIR/kubeconform-v$KUBECONFORM_VERSION/kubeconform"
if [[ ! -x $KUBECONFORM ]]; then
  log "building kubeconform v$KUBECONFORM_VERSION"
  rm -rf "${KUBECONFORM%/*}.tmp"
  GOBIN="${KUBECONFORM%/*}.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/yannh/kubeconform/cmd/kubeconform@v$KUBECONFORM_VERSION"
  rm -rf "${KUBECONFORM%/*}"; mv "${KUBECONFORM%/*}.tmp" "${KUBECONFORM%/*}"
fi

module_dir() { go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
k8s_dir="$(module_dir "k8s.io/kubernetes@v$K8S_VERSION")"
promop_dir="$(module_dir "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION")"
[[ -f $k8s_dir/api/openapi-spec/swagger.json ]] || die "no swagger.json in k8s.io/kubernetes@v$K8S_VERSION"

work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
log "generating Kubernetes v$K8S_VERSION schemas (+ SandboxRun, ServiceMonitor, PrometheusRule CRDs)"
(cd "$REPO_ROOT/e2e/chart/schemagen" && go run . -swagger "$k8s_dir/api/openapi-spec/swagger.json" \
  -out "$work/schemas" "$CHART"/crds/*.yaml \
  "$promop_dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
  "$promop_dir/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml")
location="$work/schemas/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"
kubeconform() { "$KUBECONFORM" -strict -summary -schema-location "$location" "$@"; }

# The validator must be able to fail: a typo and a wrong type have to be caught.
cat > "$work/broken.yaml" <<'YAML'
apiVersion: sandboxrun.dev/v1alpha1
kind: SandboxRun
metadata: {name: broken}
spec: {agent: a, python: {code: "print(1)"}, timeoutSecond: 5}
---
apiVersion: v1
kind: Service
metadata: {name: broken}
spec: {ports: [{port: "eighty"}]}
YAML
if kubeconform "$work/broken.yaml" >/dev/null 2>&1; then die "kubeconform accepted broken manifests"; fi

kube=(--kube-version "$K8S_VERSION")
case_values=(
  "defaults:"
  "e2e:--set frontend.enabled=true --set frontend.service.type=NodePort --set frontend.service.nodePort=30080 --set frontend.apiKeys[0].agent=e2e --set frontend.apiKeys[0].sha256=$(printf x | sha256sum | cut -d' ' -f1)"
  "all-features:-f $CHART/ci/all-features-values.yaml"
  "oauth-only:-f $CHART/ci/oauth-values.yaml"
)
# helm lint cannot be told about API groups; template renders the ServiceMonitors and the
# PrometheusRule with this.
monitoring=(--api-versions monitoring.coreos.com/v1/ServiceMonitor --api-versions monitoring.coreos.com/v1/PrometheusRule)
for c in "${case_values[@]}"; do
  name=${c%%:*}; read -r -a args <<<"${c#*:}"
  log "helm lint --strict, helm template | kubeconform: $name"
  "$HELM" lint --strict "$CHART" "${kube[@]}" "${args[@]}" >"$work/lint.log" 2>&1 || { cat "$work/lint.log"; die "helm lint: $name"; }
  "$HELM" template sandboxrun "$CHART" --namespace sandboxrun-system --include-crds "${kube[@]}" "${monitoring[@]}" "${args[@]}" >"$work/$name.yaml"
  kubeconform "$work/$name.yaml"
done

# Values that cannot work are refused when rendering, with a message saying what to change.
refuse() {
  local why=$1; shift
  if "$HELM" template sandboxrun "$CHART" "${kube[@]}" "$@" >/dev/null 2>"$work/err"; then
    die "helm template accepted $why"
  fi
  grep -q "$why" "$work/err" || { cat "$work/err"; die "refused, but without saying \"$why\""; }
}
refuse "needs operator.leaderElection=true" --set operator.replicas=2 --set operator.leaderElection=false
refuse "ingress.enabled needs frontend.enabled" --set ingress.enabled=true --set ingress.hosts[0]=a.example
refuse "needs the prometheus-operator CRDs" --set serviceMonitor.enabled=true
refuse "needs the prometheus-operator CRDs (monitoring.coreos.com/v1 PrometheusRule)" --set prometheusRule.enabled=true
refuse "frontend.enabled needs frontend.apiKeys" --set frontend.enabled=true
refuse "frontend.oauth.issuer needs frontend.oauth.resource" --set frontend.enabled=true --set frontend.oauth.issuer=https://auth.example.com
refuse "sandboxNamespace.name" --set sandboxNamespace.name=Not_A_Name
# A numeric image tag (a digest prefix can be all digits) given with --set is a number to helm,
# and a reused release value writes it back as 9.09742933179e+11: refused, not mangled.
refuse "/operator/image/tag" --set operator.image.tag=909742933179
refuse "/frontend/image/tag" --set frontend.enabled=true --set frontend.apiKeys[0].agent=a \
  --set frontend.apiKeys[0].sha256=$(printf x | sha256sum | cut -d' ' -f1) --set frontend.image.tag=1234
"$HELM" template sandboxrun "$CHART" "${kube[@]}" --set-string operator.image.tag=909742933179 |
  grep -q 'image: "ghcr.io/sandboxrun/operator:909742933179"' || die "--set-string tag not rendered as given"
# Every image of the defaults is the release's: from global.imageRegistry, tagged with the chart's
# appVersion (which is its version); a mirror is that one value; no `dev` image anywhere.
version="$(sed -n 's/^version: //p' "$CHART/Chart.yaml")"
app_version="$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$CHART/Chart.yaml")"
[[ $version == "$app_version" ]] || die "Chart.yaml: version $version but appVersion $app_version"
all_images=(--set frontend.enabled=true --set frontend.apiKeys[0].agent=a
  --set frontend.apiKeys[0].sha256=$(printf x | sha256sum | cut -d' ' -f1) --set warmPool.data.replicas=1)
images_of() {   # the image references a rendering names, one per line
  "$HELM" template sandboxrun "$CHART" "${kube[@]}" "${all_images[@]}" "$@" |
    sed -n 's/^ *image: "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p; s/^ *- --sandbox-image\(-data\)\{0,1\}=\(.*\)$/\2/p' | sort -u
}
want="$(printf 'ghcr.io/sandboxrun/%s:'"$version"'\n' mcp operator sandbox-python sandbox-python-data | sort -u)"
[[ "$(images_of)" == "$want" ]] || die "the defaults' images are not the release's:
$(images_of)"
[[ "$(images_of --set global.imageRegistry=mirror.example.com/m)" == "${want//ghcr.io\/sandboxrun/mirror.example.com\/m}" ]] ||
  die "global.imageRegistry does not move every image"
# The Grafana dashboard's ConfigMap carries the chart's JSON file unchanged, and it is JSON.
python3 -m json.tool "$CHART/dashboards/sandboxrun.json" >/dev/null || die "dashboards/sandboxrun.json is not JSON"
"$HELM" template sandboxrun "$CHART" "${kube[@]}" -f "$CHART/ci/all-features-values.yaml" "${monitoring[@]}" \
  --show-only templates/grafana-dashboard.yaml |
  awk 'found { sub(/^    /, ""); print } /^  sandboxrun.json: [|]-$/ { found = 1 }' |
  cmp -s - "$CHART/dashboards/sandboxrun.json" || die "the dashboard ConfigMap differs from dashboards/sandboxrun.json"
"$REPO_ROOT/e2e/chart/alerts-test.sh"
log "chart OK"
