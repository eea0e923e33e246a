#!/usr/bin/env bash
# Stops the authorization server of e2e/oauth/start.sh and deletes its key.
set -uo pipefail
DIR=/tmp/sandboxrun-oauth
if [[ -f $DIR/pid ]]; then
  pid=$(cat "$DIR/pid")
  kill "$pid" 2>/dev/null && for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null
fi
rm -rf "$DIR"
# Its host (start.sh): deleting the namespace deletes both ends of the veth pair.
ip route del 198.51.100.20/32 2>/dev/null
ip netns del sbr-oauth 2>/dev/null
ip link del sbroa0 2>/dev/null
true
