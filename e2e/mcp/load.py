"""The load suite: A agents at once, each with its own key and session, making C calls one after
another through the frontend in the cluster (Streamable HTTP), mixing warm and cold run_python,
execute_sql, fetch_metrics and calls the policy blocks (stress.MIX). Then the exactly-once checks
of stress.check: 0 lost, 0 duplicated, every run ended with exactly one audit line, no Pod left;
and a floor: each kind of call reached its outcome (stress.succeeded) for at least --floor of its
calls (0.95). Prints p50/p99 per kind of call, the outcomes, the paths the Python runs took and
the throughput.

With --saturation S it also measures the saturation throughput of Python alone: the same agents
making only the mix's Python calls for S seconds, their successes a second, once before the mixed
load and once after it. The mixed load's Python throughput (its Python calls' successes over the
span they were made in) must be at least --throughput-share (0.9) of the mean of the two: the
queue, the refusals and the other tools cost Python at most a tenth of what the machine can do.
All three phases come from one run on one machine, as the comparison needs, and the two alone
phases bracket the mix because this machine's pace can drift within a run (e2e/BENCHMARKS.md:
one run made 81-83 Python successes a minute alone and 52-66 late in its mix, the same build
0.86-1.34 calls/s alone from run to run; another made 1.22 calls/s alone before its mix and 1.22
after): with one alone phase, before the mix, a drift counted as the mix's cost.

With --refusal-within S every refusal for capacity must reach its caller within S seconds (the
caller's clock, from the call to its answer). A benchmark criterion (e2e/BENCHMARKS.md), not a
check for CI's short form: how soon an answer comes depends on the machine.

Usage (MCP_URL, MCP_API_KEY, KUBECTL as for the e2e/mcp suite; the agents' keys installed with
`stress.py keys N`, as e2e/run-tests.sh does):
    load.py [--agents 100] [--calls 20] [--floor 0.95] [--call-timeout S] [--settle S] [--refused]
            [--saturation S [--throughput-share 0.9]] [--refusal-within S]

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


PYTHON_KINDS = {"python", "python_slow"}


def python_throughput(calls: list[stress.Call]) -> tuple[int, float]:
    """The Python calls that succeeded, and the span from the first Python call's start to the
    last one's answer (seconds)."""
    cs = [c for c in calls if c.kind in PYTHON_KINDS and c.started]
    ok = [c for c in cs if stress.succeeded(c)]
    if not ok:
        return 0, 0.0
    span = max(c.started + c.ms / 1000 for c in ok) - min(c.started for c in cs)
    return len(ok), span


async def saturation(a: argparse.Namespace) -> tuple[list[stress.Call], float]:
    """Python alone: the agents make only the mix's Python calls for a.saturation seconds."""
    calls: list[stress.Call] = []
    stop = asyncio.Event()
    mix = [(k, w) for k, w in stress.MIX if k in PYTHON_KINDS]
    loops = asyncio.gather(*(stress.agent_loop(i, 10**6, calls, stop, mix=mix)
                             for i in range(a.agents)))
    await asyncio.sleep(a.saturation)
    stop.set()
    await loops
    ok, span = python_throughput(calls)
    return calls, ok / span if span else 0.0


def slow_refusals(calls: list[stress.Call], within: float | None) -> list[str]:
    """The refusals for capacity answered later than `within` seconds (None: not checked)."""
    if within is None:
        return []
    slow = [c for c in calls if c.refused_for_capacity and c.ms > within * 1000]
    return [f"refused late: {len(slow)} refusals for capacity answered after more than "
            f"{within:g} s (slowest {max(c.ms for c in slow):.0f} ms)"] if slow else []


async def alone(a: argparse.Namespace, label: str) -> tuple[float, list[str]]:
    """One phase of Python alone, reported and checked; its throughput and its problems."""
    since = time.time()
    calls, rate = await saturation(a)
    stress.wait_ended(calls, a.settle)
    print(f"## Python alone, {label}: {a.agents} agents for {a.saturation:.0f} s\n")
    print(stress.report(calls, a.saturation))
    print(f"\nsaturation throughput, Python alone ({label}): {rate:.2f} successful calls/s\n")
    problems = stress.check(calls, audit_lines_all(), since) + slow_refusals(calls, a.refusal_within)
    return rate, [f"alone {label}: {p}" for p in problems]


async def main(a: argparse.Namespace) -> int:
    problems: list[str] = []
    rates: list[float] = []
    if a.saturation:
        rate, found = await alone(a, "before the mix")
        rates.append(rate)
        problems += found
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
    problems += stress.check(calls, audit_lines_all(), since) + stress.floors(calls, a.floor)
    problems += slow_refusals(calls, a.refusal_within)
    ok, span = python_throughput(calls)
    mixed = ok / span if span else 0.0
    print(f"Python throughput in the mix: {ok} successful calls in {span:.0f} s, {mixed:.2f}/s\n")
    if a.saturation:
        rate, found = await alone(a, "after the mix")
        rates.append(rate)
        problems += found
        base = sum(rates) / len(rates)
        share = mixed / base if base else 0.0
        print(f"Python in the mix: {share:.1%} of {base:.2f}/s, the mean of the two phases alone "
              f"({rates[0]:.2f} before it, {rates[1]:.2f} after it; at least "
              f"{a.throughput_share:.0%} required)")
        if share < a.throughput_share:
            problems.append(f"throughput: Python in the mix made {mixed:.2f} successful calls/s, "
                            f"{share:.1%} of the {base:.2f}/s it made alone (the mean of "
                            f"{rates[0]:.2f} before the mix and {rates[1]:.2f} after it)")
    return stress.verdict(problems)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=100)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--floor", type=float, default=0.95)
    p.add_argument("--call-timeout", type=float, default=stress.CALL_TIMEOUT)
    p.add_argument("--settle", type=float, default=180)
    p.add_argument("--refused", action="store_true")
    p.add_argument("--saturation", type=float, default=0.0)
    p.add_argument("--throughput-share", type=float, default=0.9)
    p.add_argument("--refusal-within", type=float, default=None)
    args = p.parse_args()
    stress.CALL_TIMEOUT = args.call_timeout
    raise SystemExit(asyncio.run(main(args)))
