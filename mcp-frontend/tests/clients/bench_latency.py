"""Latency of `run_python print(1)` through MCP over stdio, with the official Python SDK.

Usage: bench_latency.py [N] [extra sandboxrun-mcp stdio args...], e.g.
    bench_latency.py 20 --backend local --isolation bubblewrap
Prints p50/p99 of the whole call as the client sees it, of `durationMs` (the code's own run
time reported by the sandbox), and of a `tools/list` round trip (client, transport and server
without any sandbox), so the frontend's and the sandbox start-up's shares are visible.
BENCH_PROFILE=data and BENCH_CODE='import pandas; print(1)' measure another program in another
profile (the code must print 1), e.g. the data profile's `import pandas`.
BENCH_SESSION=1 also measures the same calls in one open session (`session`), after the
single-use ones, in the same run (embedded; in a cluster: e2e/mcp/bench_warm.py --session).
Not collected by pytest (the file name does not start with test_).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

BIN = os.environ.get("SANDBOXRUN_MCP_BIN", "target/debug/sandboxrun-mcp")
# Seconds between calls (BENCH_THINK_MS, default 0: back to back).
THINK_S = float(os.environ.get("BENCH_THINK_MS", "0")) / 1000
CALL = {"code": os.environ.get("BENCH_CODE", "print(1)"),
        "profile": os.environ.get("BENCH_PROFILE", "minimal")}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def main(n: int, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items()
           if k in ("KUBECONFIG", "SANDBOXRUN_CACHE", "HOME", "SANDBOXRUN_ARMED_SANDBOXES",
                    "SANDBOXRUN_ARMED_DATA_SANDBOXES")}
    params = StdioServerParameters(command=BIN, args=["stdio", *args], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("run_python", CALL)  # warm-up
        protocol = []
        for _ in range(n):
            t0 = time.perf_counter()
            await session.list_tools()
            protocol.append((time.perf_counter() - t0) * 1000)
        wall, inner = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            r = await session.call_tool("run_python", CALL)
            wall.append((time.perf_counter() - t0) * 1000)
            assert r.structured_content["stdout"] == "1\n", r
            inner.append(float(r.structured_content["durationMs"]))
            # An agent's calls come with its thinking in between; armed sandboxes refill then.
            await anyio.sleep(THINK_S)
        print(f"{CALL['profile']} {' '.join(args)}: n={n} call p50={pct(wall, 50):.0f}ms p99={pct(wall, 99):.0f}ms "
              f"mean={statistics.mean(wall):.0f}ms | durationMs p50={pct(inner, 50):.0f}ms "
              f"p99={pct(inner, 99):.0f}ms | tools/list (MCP round trip alone) p50={pct(protocol, 50):.1f}ms")
        if os.environ.get("BENCH_SESSION") == "1":
            opened = await session.call_tool("run_python", {**CALL, "session": "new"})
            assert opened.is_error is False, opened.content
            sid = opened.structured_content["session"]
            in_session = {**CALL, "session": sid}
            wall, inner = [], []
            for _ in range(n):
                t0 = time.perf_counter()
                r = await session.call_tool("run_python", in_session)
                wall.append((time.perf_counter() - t0) * 1000)
                assert r.structured_content["stdout"] == "1\n", r
                inner.append(float(r.structured_content["durationMs"]))
                await anyio.sleep(THINK_S)
            await session.call_tool("close_session", {"session": sid})
            print(f"{CALL['profile']} {' '.join(args)} in a session: n={n} call p50={pct(wall, 50):.0f}ms "
                  f"p99={pct(wall, 99):.0f}ms mean={statistics.mean(wall):.0f}ms | durationMs "
                  f"p50={pct(inner, 50):.0f}ms p99={pct(inner, 99):.0f}ms")


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    anyio.run(main, count, sys.argv[2:] or ["--backend", "local"])
