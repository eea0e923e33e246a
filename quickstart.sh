#!/usr/bin/env bash
# From a fresh clone to a running sandboxrun MCP server on this machine (the embedded default: no
# Kubernetes). Installs what is missing, builds, and starts the server:
#
#   ./quickstart.sh            Streamable HTTP on 127.0.0.1:8000/mcp (and legacy SSE on /sse),
#                              with an API key it creates once and prints
#   ./quickstart.sh stdio      MCP over stdin/stdout, for clients that spawn the server
#
# What it sets up (each step is skipped when already done):
#   - bubblewrap (Debian/Ubuntu package; uses sudo when not root)
#   - gVisor's runsc, built with Go from the Go module proxy when Go is installed (else the
#     sandbox uses bubblewrap only)
#   - the sandbox's Python root file system, from a Debian debootstrap (images/build.sh), and
#     that of the `data` profile (numpy, pandas, scipy, matplotlib: about 5 minutes and 0.6 GB
#     once; SANDBOXRUN_DATA_PROFILE=0 skips it, and run_python then offers the minimal profile)
#   - the sandboxrun-mcp binary (cargo build --release)
# Everything downloaded or built is cached in ~/.cache/sandboxrun.
#
# The sandbox enforces memory, pid and CPU limits with a cgroup per run, which needs root (or a
# delegated cgroup v2 subtree). Without one the server refuses to start and says so; to run
# anyway with per-process limits only (and a warning naming what is not enforced):
#   SANDBOXRUN_ALLOW_WEAK_LIMITS=1 ./quickstart.sh
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}"
CONFIG_DIR="${XDG_CONFIG_HOME:-$HOME/.config}/sandboxrun"
MODE="${1:-serve}"
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$PATH"
say() { printf 'quickstart: %s\n' "$*" >&2; }
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if ((${#missing[@]})); then
  command -v apt-get >/dev/null || { say "please install: ${missing[*]}"; exit 1; }
  say "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
command -v cargo >/dev/null || { say "Rust is needed: https://rustup.rs"; exit 1; }

if command -v go >/dev/null; then
  say "gVisor (runsc): building or reusing the cached build"
  "$REPO_ROOT/e2e/cluster/build.sh" gvisor
else
  say "Go not found: skipping gVisor, the sandbox will use bubblewrap"
fi

ROOTFS="$CACHE/rootfs/sandbox-python"
if [[ ! -f $ROOTFS/.sandboxrun-rootfs ]]; then
  say "building the sandbox's Python root file system (debootstrap needs root once)"
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" sandbox-python >&2
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" rootfs sandbox-python "$ROOTFS" >&2
  [[ $EUID -eq 0 ]] || as_root chown -R "$(id -u):$(id -g)" "$CACHE"
fi

DATA_ROOTFS="$CACHE/rootfs/sandbox-python-data"
if [[ ${SANDBOXRUN_DATA_PROFILE:-1} != 0 && ! -f $DATA_ROOTFS/.sandboxrun-rootfs ]]; then
  say "building the data profile's root file system (numpy, pandas, scipy, matplotlib)"
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" sandbox-python-data >&2
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" rootfs sandbox-python-data "$DATA_ROOTFS" >&2
  [[ $EUID -eq 0 ]] || as_root chown -R "$(id -u):$(id -g)" "$CACHE"
fi

say "building sandboxrun-mcp"
(cd "$REPO_ROOT" && cargo build --release --locked -p sandboxrun-mcp >&2)
BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sandboxrun-mcp"

if [[ $MODE == stdio ]]; then
  exec "$BIN" stdio --backend local --enable-sql --enable-metrics --rootfs "$ROOTFS" \
    --data-rootfs "$DATA_ROOTFS"
fi

# One API key for this machine, created once; only its hash is in the key file.
mkdir -p "$CONFIG_DIR"; chmod 700 "$CONFIG_DIR"
if [[ ! -f $CONFIG_DIR/api-key ]]; then
  (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$CONFIG_DIR/api-key")
  printf -- '- agent: %s\n  sha256: %s\n' "${USER:-local}" \
    "$("$BIN" hash-key < "$CONFIG_DIR/api-key")" > "$CONFIG_DIR/keys.yaml"
fi
say "MCP endpoint: http://127.0.0.1:8000/mcp  (legacy SSE: /sse)"
say "API key (Authorization: Bearer ...): $(cat "$CONFIG_DIR/api-key")   [stored in $CONFIG_DIR/api-key]"
exec "$BIN" serve --listen 127.0.0.1:8000 --backend local --enable-sql --enable-metrics --rootfs "$ROOTFS" \
  --data-rootfs "$DATA_ROOTFS" --api-keys-file "$CONFIG_DIR/keys.yaml"
