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
# One line that says why and what to do, before anything was installed or built.
refuse() { say "$*"; exit 1; }
as_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
truthy() { [[ ${1,,} =~ ^(1|true|yes|on)$ ]]; }
# SANDBOXRUN_MCP_BIN: a sandboxrun-mcp already built (the tests' own build); else it is built here.
BIN="${SANDBOXRUN_MCP_BIN:-}"

# Everything it needs, checked before anything is installed or built.
[[ $MODE == serve || $MODE == stdio ]] || refuse "usage: ./quickstart.sh [stdio]"
[[ "$(uname -s)" == Linux ]] || refuse "the embedded sandbox is Linux only (bubblewrap or gVisor, \
and a cgroup per run); on $(uname -s) run it in a Linux VM, or install in a cluster: docs/install.md"
# The sandbox's memory, process and CPU limits need a cgroup per run: root, or (cgroup v2 only)
# a subtree root delegated to this user with the server started inside it. The server refuses to
# start without one (and says so); said here, before the minutes of building.
if [[ $EUID -ne 0 ]] && ! truthy "${SANDBOXRUN_ALLOW_WEAK_LIMITS:-0}"; then
  weak="or accept per-process limits only (memory per process, no CPU limit): SANDBOXRUN_ALLOW_WEAK_LIMITS=1 ./quickstart.sh"
  if [[ ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
    refuse "as $(id -un) the sandbox cannot limit memory, processes and CPU: this machine's \
cgroups are v1, which only root can create; run sudo ./quickstart.sh, $weak"
  elif [[ ! -w /sys/fs/cgroup/sandboxrun ]] || ! grep -q '^0::/sandboxrun/' /proc/self/cgroup; then
    refuse "as $(id -un) the sandbox cannot limit memory, processes and CPU: no cgroup is \
delegated to this user (see \"A cgroup for a non-root user\" in docs/laptop.md); run sudo ./quickstart.sh, $weak"
  fi
fi
[[ -n $BIN ]] || command -v cargo >/dev/null ||
  refuse "Rust is needed to build the server: install it from https://rustup.rs, then run ./quickstart.sh again"
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v debootstrap >/dev/null || missing+=(debootstrap)
ROOTFS="$CACHE/rootfs/sandbox-python"
DATA_ROOTFS="$CACHE/rootfs/sandbox-python-data"
needs_root=()
((${#missing[@]})) && needs_root+=("installing ${missing[*]}")
[[ -f $ROOTFS/.sandboxrun-rootfs ]] || needs_root+=("debootstrap of the sandbox's root file system")
if [[ ${SANDBOXRUN_DATA_PROFILE:-1} != 0 && ! -f $DATA_ROOTFS/.sandboxrun-rootfs ]]; then
  needs_root+=("debootstrap of the data profile's root file system")
fi
if ((${#missing[@]})) && ! command -v apt-get >/dev/null; then
  refuse "please install ${missing[*]} with your package manager, then run ./quickstart.sh again"
fi
if ((${#needs_root[@]})) && [[ $EUID -ne 0 ]] && ! command -v sudo >/dev/null; then
  refuse "$(printf '%s, ' "${needs_root[@]}" | sed 's/, $//') needs root once and sudo is \
not installed: install sudo, or run ./quickstart.sh as root"
fi
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

if command -v go >/dev/null; then
  say "gVisor (runsc): building or reusing the cached build"
  "$REPO_ROOT/e2e/cluster/build.sh" gvisor >&2   # stdout is MCP's in stdio mode
else
  say "Go not found: skipping gVisor, the sandbox will use bubblewrap"
fi

if [[ ! -f $ROOTFS/.sandboxrun-rootfs ]]; then
  say "building the sandbox's Python root file system (debootstrap needs root once)"
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" sandbox-python >&2
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" rootfs sandbox-python "$ROOTFS" >&2
  [[ $EUID -eq 0 ]] || as_root chown -R "$(id -u):$(id -g)" "$CACHE"
fi

if [[ ${SANDBOXRUN_DATA_PROFILE:-1} != 0 && ! -f $DATA_ROOTFS/.sandboxrun-rootfs ]]; then
  say "building the data profile's root file system (numpy, pandas, scipy, matplotlib)"
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" sandbox-python-data >&2
  as_root env SANDBOXRUN_CACHE="$CACHE" "$REPO_ROOT/images/build.sh" rootfs sandbox-python-data "$DATA_ROOTFS" >&2
  [[ $EUID -eq 0 ]] || as_root chown -R "$(id -u):$(id -g)" "$CACHE"
fi

if [[ -z $BIN ]]; then
  say "building sandboxrun-mcp"
  (cd "$REPO_ROOT" && cargo build --release --locked -p sandboxrun-mcp >&2)
  BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sandboxrun-mcp"
fi

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
