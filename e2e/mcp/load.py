"""The load suite: A agents at once, each with its own key and session, making C calls one after
another through the frontend in the cluster (Streamable HTTP), mixing warm and cold run_python,
execute_sql, fetch_metrics and calls the policy blocks (stress.MIX). Then the exactly-once checks
of stress.check: 0 lost, 0 duplicated, every run ended with exactly one audit line, no Pod left;
and a floor: each kind of call reached its outcome (stress.succeeded) for at least --floor of its
calls (0.95). Prints p50/p99 per kind of call, the outcomes, the paths the Python runs took and
the throughput.

Usage (MCP_URL, MCP_API_KEY, KUBECTL as for the e2e/mcp suite; the agents' keys installed with
`stress.py keys N`, as e2e/run-tests.sh does):
    load.py [--agents 100] [--calls 20] [--floor 0.95] [--call-timeout S] [--settle S] [--refused]

The suite's self-tests (e2e/run-tests.sh) run it where it must fail: --refused makes every agent
call with the key of an agent the frontend refuses everything (stress.REFUSED_AGENT), and with the
operator scaled to 0, --call-timeout counts a call unanswered for S seconds as lost and --settle
bounds the wait for the runs to end.

The full suite is 100 × 20 (e2e/BENCHMARKS.md); .ci/run runs a short form. Exit status 1 when any
check fails. Not collected by pytest (the file name does not start with test_).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time

import stress
from operator_audit import audit_lines_all


async def main(a: argparse.Namespace) -> int:
    calls: list[stress.Call] = []
    since = time.time()
    t0 = time.perf_counter()
    key = stress.refused_key() if a.refused else None
    await asyncio.gather(*(stress.agent_loop(i, a.calls, calls, None, key=key)
                           for i in range(a.agents)))
    wall = time.perf_counter() - t0
    stress.wait_ended(calls, a.settle)
    print(f"## {a.agents} agents × {a.calls} calls\n")
    print(stress.report(calls, wall))
    runs = {r["metadata"]["name"]: r for r in
            json.loads(stress.kubectl("-n", stress.RUNS_NS, "get", "sandboxruns", "-o", "json"))["items"]}
    paths = collections.Counter((runs.get(c.run, {}).get("status") or {}).get("path", "?")
                                for c in calls if c.kind.startswith("python") and c.answers)
    print(f"Python runs by path: {dict(paths)}")
    problems = stress.check(calls, audit_lines_all(), since) + stress.floors(calls, a.floor)
    return stress.verdict(problems)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=100)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--floor", type=float, default=0.95)
    p.add_argument("--call-timeout", type=float, default=stress.CALL_TIMEOUT)
    p.add_argument("--settle", type=float, default=180)
    p.add_argument("--refused", action="store_true")
    args = p.parse_args()
    stress.CALL_TIMEOUT = args.call_timeout
    raise SystemExit(asyncio.run(main(args)))
