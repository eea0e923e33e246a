#!/usr/bin/env bash
# The latency benchmark in one run (e2e/BENCHMARKS.md, "Warm, cold and preloaded, in one run"):
# release binaries, every path side by side so they share the machine's noise.
#
#   E2E_INSTALL_ONLY=1 e2e/run-tests.sh > install.log    # the cluster and its services, left up
#   source <(grep '^export' install.log)                  # its environment (MCP_URL, ...)
#   e2e/bench-latency.sh [N]                              # N calls per path (default 100)
#
# 1. Reinstalls the chart with release images (e2e/install.sh --reuse-values).
# 2. In the cluster, through MCP over Streamable HTTP (e2e/mcp/bench_warm.py): `print(1)` warm
#    (a pool of 4) against cold in alternating blocks, 0.5 s between calls; bursts of 10 with a
#    full pool of 10; `import pandas, matplotlib.pyplot; print(1)` warm (the data pool) against
#    cold, each warm call once the pool's replacement has imported its stack (a cold data
#    sandbox takes 5-8 s here: 3 s between calls measured claims of sandboxes still importing).
# 3. Embedded, through MCP stdio (mcp-frontend/tests/clients/bench_latency.py, the release
#    sandboxrun-mcp): `print(1)` with armed sandboxes against none, bubblewrap and gVisor; the
#    data program with an armed data sandbox, both engines.
# Prints each part's table; BENCHMARKS.md records one run.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
N=${1:-100}
: "${MCP_URL:?source the environment printed by E2E_INSTALL_ONLY=1 e2e/run-tests.sh}"
: "${KUBECTL:?}" "${MCP_API_KEY:?}"
export PATH="$HOME/.cargo/bin:$PATH"
PYTHON="${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}/venv-mcp/bin/python"
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
say() { printf '\n==> %s\n' "$*"; }

say "release images (bursts of 10 need more than the default 8 calls in flight per agent)"
cargo build --release --locked -p sandboxrun-operator -p sandboxrun-mcp
SANDBOXRUN_CARGO_PROFILE=release SANDBOXRUN_PREBUILT=1 e2e/install.sh --reuse-values \
  --set frontend.maxCallsPerAgent=20

say "cluster: print(1) warm against cold, and bursts of 10"
"$PYTHON" e2e/mcp/bench_warm.py --sequential "$N" --block 25 --think 0.5 --staggered 0 \
  --burst 10 --rounds 3 --replicas 4 --min-warm-share 0.8

say "cluster: import pandas, matplotlib.pyplot warm (the data pool) against cold"
"$PYTHON" e2e/mcp/bench_warm.py --pool data --profile data \
  --code $'import pandas, matplotlib.pyplot\nprint(1)' --sequential $((N / 5)) --block 10 \
  --think 3 --refill --staggered 0 --burst 0 --replicas 1 --min-warm-share 0.8
"$KUBECTL" -n sandboxrun-runs scale sandboxpool data --replicas=0 > /dev/null

say "embedded: print(1), armed sandboxes against none; the data program with an armed data sandbox"
bench() { SANDBOXRUN_MCP_BIN="$TARGET/release/sandboxrun-mcp" "$PYTHON" \
  mcp-frontend/tests/clients/bench_latency.py "$@"; }
for engine in bubblewrap gvisor; do
  # An agent's pause between calls (0.7 s), in which the armed sandboxes are replaced.
  BENCH_THINK_MS=700 SANDBOXRUN_ARMED_SANDBOXES=2 bench "$N" --backend local --isolation "$engine"
  BENCH_THINK_MS=700 SANDBOXRUN_ARMED_SANDBOXES=0 bench $((N / 3)) --backend local --isolation "$engine"
  # 4 s: the armed data sandbox's replacement imports its stack meanwhile.
  BENCH_THINK_MS=4000 BENCH_PROFILE=data BENCH_CODE=$'import pandas, matplotlib.pyplot\nprint(1)' \
    bench $((N / 5)) --backend local --isolation "$engine"
done
