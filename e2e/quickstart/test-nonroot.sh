#!/usr/bin/env bash
# ./quickstart.sh as a non-root user on a machine where it has never run (a new user, an empty
# home): it checks everything it needs before it installs or builds anything, and where something
# is missing that it cannot provide it stops with one line that says why and what to do.
#
# Each case runs the script as that user with a fresh home and checks: exit status 1, nothing on
# stdout, exactly one line on stderr that names the remedy, and nothing written to the home (no
# cache, no configuration: nothing was built or installed). The machine decides which refusal a
# case gets (cgroup v1, or v2 without a delegated group); each case says what it expects.
# Needs root (it adds the user `sandboxrun-quickstart`, kept for reruns).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
USER_NAME=sandboxrun-quickstart
log() { printf 'quickstart test: %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
[[ $EUID -eq 0 ]] || die "run as root (it adds a user)"
id "$USER_NAME" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$USER_NAME"
HOME_DIR="$(getent passwd "$USER_NAME" | cut -d: -f6)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The user's own checkout: this one's tracked files as they are now (CI's clone may be where
# another user cannot read, e.g. under /root).
mkdir "$WORK/checkout"
(cd "$REPO_ROOT" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$WORK/checkout"
chmod -R a+rX "$WORK"
CHECKOUT="$WORK/checkout"
runuser -u "$USER_NAME" -- test -x "$CHECKOUT/quickstart.sh" || die "$USER_NAME cannot run $CHECKOUT/quickstart.sh"

# case_ NAME EXPECTED_REGEX [VAR=VALUE...]: one run with a fresh home and a minimal environment,
# with the arguments in ARGS (none by default).
cases=0
ARGS=()
case_() {
  local name=$1 want=$2
  shift 2
  find "$HOME_DIR" -mindepth 1 -delete
  local rc=0
  (cd "$CHECKOUT" && runuser -u "$USER_NAME" -- env -i HOME="$HOME_DIR" USER="$USER_NAME" \
    PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin LANG=C.UTF-8 "$@" ./quickstart.sh "${ARGS[@]}" \
    >"$WORK/out" 2>"$WORK/err" </dev/null) || rc=$?
  [[ $rc == 1 ]] || die "$name: exit status $rc, not 1; stderr: $(cat "$WORK/err")"
  [[ ! -s $WORK/out ]] || die "$name: wrote to stdout: $(cat "$WORK/out")"
  [[ "$(wc -l <"$WORK/err")" == 1 ]] || die "$name: not one line on stderr: $(cat "$WORK/err")"
  grep -Eq "^quickstart: .*$want" "$WORK/err" || die "$name: stderr does not match /$want/: $(cat "$WORK/err")"
  local left
  left="$(find "$HOME_DIR" -mindepth 1)"
  [[ -z $left ]] || die "$name: it wrote to the home before refusing: $left"
  log "$name: refused before building: $(cat "$WORK/err")"
  cases=$((cases + 1))
}

# 1. As the README writes it: no root, no delegated cgroup, so no enforceable limits.
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  why="no cgroup is delegated to this user"
else
  why="cgroups are v1, which only root can create"
fi
case_ "no cgroup for the limits" \
  "$why; run sudo ./quickstart.sh, or accept per-process limits only .*SANDBOXRUN_ALLOW_WEAK_LIMITS=1 ./quickstart.sh$"
# 2. Weak limits accepted (each boolean spelling the README allows), no Rust on this user's PATH.
for yes in 1 true yes on; do
  case_ "weak limits ($yes), no Rust" "Rust is needed to build the server: install it from https://rustup.rs" \
    SANDBOXRUN_ALLOW_WEAK_LIMITS="$yes"
done
# 3. A server already built (so Rust is not needed) but the root file systems are not, and no
#    sudo: it cannot debootstrap. Only where sudo is absent (with sudo it would ask for a password).
if ! command -v sudo >/dev/null; then
  case_ "no root file system, no sudo" "needs root once and sudo is not installed: install sudo, or run ./quickstart.sh as root" \
    SANDBOXRUN_ALLOW_WEAK_LIMITS=1 SANDBOXRUN_MCP_BIN=/bin/false
else
  log "no root file system, no sudo: not run (sudo is installed here)"
fi
# 4. A mode it does not have.
ARGS=(server)
case_ "unknown mode" "usage: ./quickstart.sh \[stdio\]"
ARGS=()
log "$cases cases passed"
