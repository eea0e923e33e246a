#!/usr/bin/env bash
# The release as a user gets it. e2e/release.sh publishes this checkout's version to a real OCI
# registry on this machine (e2e/registry/start.sh: Distribution, TLS with a CA of its own); then the
# README's own commands (snippets cluster-install and cluster-call, taken from README.md by
# e2e/docs/snippets.py) install it from there with helm and call run_python through it; then the
# kubelet's image pulls are checked: every image of the release came from that registry.
#
# What differs from the README, and only this: the registry (ghcr.io/sandboxrun becomes
# 127.0.0.1:PORT/sandboxrun), the trust of its CA (helm: SSL_CERT_FILE, the system's roots plus
# it; the node's containerd: a hosts.toml, as for any private registry), and `npx -y
# @modelcontextprotocol/inspector@V`, which runs that same version from the client tests' npm
# install on Node 22 (no npx download at test time).
#
# Needs the local cluster (KUBECONFIG) without a sandboxrun release (run-tests.sh runs it after the
# chart's uninstall test) and the workspace's dev binaries (CARGO_TARGET_DIR). Leaves nothing:
# the release is uninstalled and the registry stopped.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$REPO_ROOT/e2e/cluster/lib.sh"
export PATH="$STATE_DIR/bin:$TOOLS_BIN:$PATH"
export KUBECONFIG="${KUBECONFIG:-$KUBECONFIG_FILE}"
cd "$REPO_ROOT"
NAMESPACE=sandboxrun-system       # the README's
SANDBOX_NAMESPACE=sandboxrun-runs # the chart's default
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)"
PHASE="${1:-all}"
[[ $PHASE =~ ^(all|publish|install)$ ]] || die "usage: $0 [publish|install]"
# What `publish` leaves for `install`: the release's files, the registry's address and CA.
WORK="${TMPDIR:-/tmp}/sandboxrun-release-test"
HOSTS_DIR=""
cleanup() {
  local rc=$?
  if ((rc != 0)) && [[ $PHASE != publish ]]; then
    kubectl get pods -A -o wide 2>&1 | grep -v kube-system | head -30 >&2 || true
    kubectl -n "$NAMESPACE" logs deploy/sandboxrun-operator --tail=30 >&2 2>/dev/null || true
  fi
  if ((rc == 0)) && [[ $PHASE == publish ]]; then
    exit 0
  fi
  [[ $PHASE == publish ]] || helm uninstall sandboxrun -n "$NAMESPACE" --wait --timeout 2m >/dev/null 2>&1 || true
  [[ -n $HOSTS_DIR ]] && rm -rf "$HOSTS_DIR"
  "$REPO_ROOT/e2e/registry/stop.sh" || true
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

if [[ $PHASE != install ]]; then
rm -rf "$WORK"
mkdir -p "$WORK"
registry_out="$("$REPO_ROOT/e2e/registry/start.sh")"
REGISTRY="$(sed -n 's/^REGISTRY=//p' <<<"$registry_out")"
REGISTRY_CA="$(sed -n 's/^REGISTRY_CA=//p' <<<"$registry_out")"
log "registry: https://$REGISTRY"
printf 'REGISTRY=%q\nREGISTRY_CA=%q\n' "$REGISTRY" "$REGISTRY_CA" > "$WORK/registry.env"

log "e2e/release.sh --registry $REGISTRY/sandboxrun --version $VERSION"
SANDBOXRUN_PREBUILT=1 SANDBOXRUN_CARGO_PROFILE=dev "$REPO_ROOT/e2e/release.sh" \
  --registry "$REGISTRY/sandboxrun" --version "$VERSION" --out "$WORK/dist" --ca-file "$REGISTRY_CA"
(cd "$WORK/dist" && sha256sum --check --quiet SHA256SUMS) || die "the release's SHA256SUMS do not match"
python3 - "$WORK/dist/sandboxrun-$VERSION.spdx.json" <<'PY' || die "the SBOM is incomplete"
import json, sys
doc = json.load(open(sys.argv[1]))
names = {p["name"] for p in doc["packages"]}
assert doc["spdxVersion"] == "SPDX-2.3", doc["spdxVersion"]
need = {"sandboxrun-operator", "sandboxrun-mcp", "kubectl-sandboxrun", "sandboxrun-agent", "operator", "mcp",
        "sandbox-python", "sandbox-python-data", "kube", "tokio", "rmcp", "python3", "python3-pandas"}
assert need <= names, need - names
PY
log "release $VERSION: published to $REGISTRY"
[[ $PHASE == publish ]] && exit 0
fi

[[ -f $WORK/registry.env ]] || die "nothing published: run $0 publish first"
source "$WORK/registry.env"
# The node trusts the registry's CA, as an administrator sets up a private registry.
HOSTS_DIR="$STATE_DIR/containerd/certs.d/$REGISTRY"
mkdir -p "$HOSTS_DIR"
cp "$REGISTRY_CA" "$HOSTS_DIR/ca.crt"
cat >"$HOSTS_DIR/hosts.toml" <<TOML
server = "https://$REGISTRY"
[host."https://$REGISTRY"]
  capabilities = ["pull", "resolve"]
  ca = "$HOSTS_DIR/ca.crt"
TOML
# No image of this registry on the node, so each one the release runs is pulled.
ctr --address "$CONTAINERD_SOCK" -n k8s.io images ls -q | { grep "^$REGISTRY/" || true; } |
  xargs -r ctr --address "$CONTAINERD_SOCK" -n k8s.io images rm >/dev/null

# The README's commands. The uninstall before may still be deleting the sandbox namespace.
kubectl wait --for=delete "namespace/$SANDBOX_NAMESPACE" --timeout=120s >/dev/null 2>&1 || true
install="$(python3 e2e/docs/snippets.py cluster-install)"
call="$(python3 e2e/docs/snippets.py cluster-call)"
[[ $install == *"oci://ghcr.io/sandboxrun/charts/sandboxrun --version $VERSION "* ]] ||
  die "the README's cluster-install snippet does not install oci://ghcr.io/sandboxrun/charts/sandboxrun $VERSION"
install="${install//ghcr.io\/sandboxrun/$REGISTRY/sandboxrun}"
inspector="$(sed -n 's/^INSPECTOR_VERSION=//p' mcp-frontend/tests/clients/run.sh)"
[[ $call == *"npx -y @modelcontextprotocol/inspector@$inspector "* ]] ||
  die "the README's cluster-call snippet does not run the inspector the client tests pin ($inspector)"
cat /etc/ssl/certs/ca-certificates.crt "$REGISTRY_CA" >"$WORK/roots.pem"
mkdir -p "$WORK/bin"
cat >"$WORK/bin/npx" <<SH
#!/usr/bin/env bash
# npx -y @modelcontextprotocol/inspector@$inspector ARGS...: the client tests' install of it.
[[ \$1 == -y && \$2 == @modelcontextprotocol/inspector@$inspector ]] || { echo "npx shim: \$*" >&2; exit 2; }
shift 2
exec "\$INSPECTOR_NODE" "\$INSPECTOR_JS" "\$@"
SH
chmod +x "$WORK/bin/npx"
# The inspector's node and script, as mcp-frontend/tests/clients/run.sh installs them.
eval "$(mcp-frontend/tests/clients/run.sh --print-inspector)"
export INSPECTOR_NODE INSPECTOR_JS

log "the README's cluster-install snippet"
# One shell for both snippets (the call uses the install's $KEY); its port-forward ends with it.
PATH="$WORK/bin:$PATH" SSL_CERT_FILE="$WORK/roots.pem" timeout 600 bash -c '
set -euo pipefail
trap "kill \$(jobs -p) 2>/dev/null || true" EXIT
'"$install"'
# (a person types the next command after the port-forward listens)
for _ in $(seq 300); do (echo >/dev/tcp/127.0.0.1/8000) 2>/dev/null && break; sleep 0.1; done
echo "--- cluster-call"
'"$call" >"$WORK/call.out" 2>"$WORK/call.err" || {
  cat "$WORK/call.err" "$WORK/call.out" >&2
  die "the README's commands failed"
}
cat "$WORK/call.out"
# After helm's output, the inspector's JSON result, then kubectl's table; the port-forward's own
# lines among them.
sed '1,/^--- cluster-call$/d' "$WORK/call.out" | grep -Ev '^(Forwarding from|Handling connection)' |
  sed '/^NAME /,$d' >"$WORK/result.json"
python3 - "$WORK/result.json" <<'PY' || die "run_python through the installed release did not print 42"
import json, sys
result = json.load(open(sys.argv[1]))
assert result["structuredContent"]["stdout"] == "42\n", result
assert result["structuredContent"]["phase"] == "Succeeded", result
PY
sed -n '/^NAME /,$p' "$WORK/call.out" | grep -Eq "^[a-z0-9-]+ +me +[a-z_]+ +Succeeded " ||
  die "kubectl get sandboxruns shows no Succeeded run of agent me"

# Every image of the release was pulled from the registry by the kubelet.
# (The data pool's sandbox may still be pulling its image: wait for its event, up to 5 minutes.)
pulled() {
  kubectl get events -A --field-selector reason=Pulled -o jsonpath='{range .items[*]}{.message}{"\n"}{end}'
}
for name in operator mcp sandbox-python sandbox-python-data; do
  for _ in $(seq 300); do
    grep -q "Successfully pulled image \"$REGISTRY/sandboxrun/$name:$VERSION\"" <<<"$(pulled)" && continue 2
    sleep 1
  done
  die "no pull of $REGISTRY/sandboxrun/$name:$VERSION by the kubelet; Pulled events: $(pulled)"
done
log "release $VERSION: pushed to $REGISTRY, installed with the README's commands, run_python answered, all four images pulled from the registry"
