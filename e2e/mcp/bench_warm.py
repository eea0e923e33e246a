"""Warm against cold: `run_python print(1)` through MCP over Streamable HTTP, with the frontend
and the operator installed by the chart, in one run so the two paths share the machine's noise.

Usage (MCP_URL, MCP_API_KEY and KUBECTL as for the e2e/mcp suite):
    bench_warm.py [--sequential N] [--block B] [--think S] [--staggered N] [--rate R]
                  [--burst K] [--rounds R] [--pool NAME] [--replicas N]
                  [--profile minimal|data] [--code CODE] [--session N]

- sequential: N calls per path, one at a time, in alternating blocks of B: warm blocks with the
  pool at --replicas, cold blocks with the pool scaled to 0 (S seconds between calls, so the pool
  can refill as it would between an agent's calls);
- staggered: N calls arriving at random (Poisson, R per second) on one session, the pool at
  --replicas, each call counted under the path it took;
- burst: R rounds of K concurrent calls, each round with the pool at K and full.

- session: N calls, one at a time (S seconds apart), in one session opened for them (the opening
  call is not counted), its Pod the session's own: a call there against warm single-use ones.

--profile and --code measure another program in another profile's pool, for example
`import pandas` warm and cold: `--pool data --profile data --code 'import pandas; print(1)'`
(the code must print 1).

Each call's path is read from its SandboxRun (`status.path`), so a warm call that found the pool
empty counts as cold. Prints p50/p95/p99 per path and phase, as a Markdown table. Restores the
pool's replicas at the end. Not collected by pytest (the file name does not start with test_).

--refill makes each call of a warm block wait until the pool is full again (instead of --think
alone): the calls then measure the warm path itself, not how fast the pool refills.

--min-warm-share S fails the run (exit status 1) unless at least the share S of the calls made
with a full pool (warm blocks, staggered, bursts) went warm, and every call of a cold block (the
pool at 0) went cold: a benchmark whose calls all went cold measured nothing warm, and a "cold"
call that found a sandbox is not cold. CI runs the short form with --min-warm-share 0.8.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
NAMESPACE = "sandboxrun-runs"


def kubectl(*args: str) -> str:
    return subprocess.run([KUBECTL, "-n", NAMESPACE, *args], check=True, capture_output=True,
                          text=True).stdout


def pool_status(pool: str) -> dict:
    return json.loads(kubectl("get", "sandboxpool", pool, "-o", "json"))


def scale(pool: str, replicas: int, timeout: float = 300) -> None:
    """Scales the pool and waits until it holds exactly `replicas` ready idle sandboxes."""
    kubectl("scale", "sandboxpool", pool, f"--replicas={replicas}")
    wait_full(pool, replicas, timeout)


class PoolClaims:
    """The claims the pool's status must have counted before it is read as full: its
    claimedTotal when the benchmark began, plus each call of the benchmark that took one of its
    sandboxes. The operator counts a claim in the pool's status once the claim's hand-over is
    done (its list and status write stay off the call's
    path), so right after a call or a round the status may still show the sandboxes just claimed
    as ready; a round started on that would find the pool empty."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.expected = pool_status(pool).get("status", {}).get("claimedTotal", 0)
        self.pending: list[str] = []

    def called(self, name: str) -> None:
        self.pending.append(name)

    def settle(self) -> None:
        if not self.pending:
            return
        names = set(self.pending)
        runs = json.loads(kubectl("get", "sandboxruns", "-o", "json"))["items"]
        self.expected += sum(
            1 for r in runs
            if r["metadata"]["name"] in names
            and r.get("status", {}).get("path") == "Warm"
            and r["status"].get("pool") == self.pool)
        self.pending.clear()


CLAIMS: PoolClaims | None = None


def wait_full(pool: str, replicas: int, timeout: float = 300) -> None:
    """Waits until the pool holds exactly `replicas` ready idle sandboxes, counting every claim
    the benchmark's calls made (PoolClaims)."""
    claims = CLAIMS if CLAIMS is not None and CLAIMS.pool == pool else None
    if claims is not None:
        claims.settle()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = pool_status(pool).get("status", {})
        counted = claims is None or st.get("claimedTotal", 0) >= claims.expected
        if counted and st.get("readyReplicas", 0) == replicas and st.get("replicas", 0) == replicas:
            return
        time.sleep(0.25)
    raise SystemExit(f"pool {pool} did not reach {replicas} ready sandboxes in {timeout}s")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


ARGS = {"code": "print(1)"}


async def call(session: ClientSession, sid: str | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = await session.call_tool("run_python", ARGS if sid is None else {**ARGS, "session": sid})
    ms = (time.perf_counter() - t0) * 1000
    out = r.structured_content or {}
    assert out.get("stdout") == "1\n" and out.get("phase") == "Succeeded", r
    if CLAIMS is not None and sid is None:
        CLAIMS.called(out["runName"])
    return ms, out["runName"]


def paths_of(names: list[str]) -> dict[str, str]:
    runs = json.loads(kubectl("get", "sandboxruns", "-o", "json"))["items"]
    return {r["metadata"]["name"]: r.get("status", {}).get("path", "?") for r in runs}


async def main(a: argparse.Namespace) -> int:
    global CLAIMS
    original = pool_status(a.pool)["spec"]["replicas"]
    CLAIMS = PoolClaims(a.pool)
    results: dict[tuple[str, str], list[float]] = {}
    calls: list[tuple[str, float, str, str]] = []  # (phase, ms, run name, the path meant)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as http:
        async with streamable_http_client(URL, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                try:
                    if a.sequential:
                        done = {"warm": 0, "cold": 0}
                        while min(done.values()) < a.sequential:
                            for path, replicas in (("warm", a.replicas), ("cold", 0)):
                                scale(a.pool, replicas)
                                await call(session)  # unmeasured: the first after a scale
                                for _ in range(min(a.block, a.sequential - done[path])):
                                    if a.refill and replicas:
                                        wait_full(a.pool, replicas)
                                    ms, name = await call(session)
                                    calls.append(("sequential", ms, name, path))
                                    done[path] += 1
                                    await asyncio.sleep(a.think)
                    if a.staggered:
                        scale(a.pool, a.replicas)

                        async def arrive(delay: float) -> None:
                            await asyncio.sleep(delay)
                            ms, name = await call(session)
                            calls.append(("staggered", ms, name, "warm"))

                        t, delays = 0.0, []
                        for _ in range(a.staggered):
                            t += random.expovariate(a.rate)
                            delays.append(t)
                        await asyncio.gather(*(arrive(d) for d in delays))
                    if a.session:
                        opened = await session.call_tool("run_python", {**ARGS, "session": "new"})
                        sid = (opened.structured_content or {}).get("session")
                        assert sid, opened
                        try:
                            for _ in range(a.session):
                                ms, name = await call(session, sid)
                                calls.append(("session", ms, name, "session"))
                                await asyncio.sleep(a.think)
                        finally:
                            await session.call_tool("close_session", {"session": sid})
                    for _ in range(a.rounds if a.burst else 0):
                        scale(a.pool, a.burst)
                        burst = await asyncio.gather(*(call(session) for _ in range(a.burst)))
                        calls.extend(("burst", ms, name, "warm") for ms, name in burst)
                finally:
                    scale(a.pool, original)
    paths = paths_of([n for _, _, n, _ in calls])
    for phase, ms, name, meant in calls:
        path = "session" if meant == "session" else paths.get(name, "?")
        results.setdefault((phase, path), []).append(ms)
    print("| phase | path | n | p50 | p95 | p99 | max |")
    print("|---|---|---|---|---|---|---|")
    for (phase, path), ms in sorted(results.items()):
        print(f"| {phase} | {path} | {len(ms)} | {pct(ms, 50):.0f} ms | {pct(ms, 95):.0f} ms | "
              f"{pct(ms, 99):.0f} ms | {max(ms):.0f} ms |")
    return check_paths(calls, paths, a.min_warm_share)


def check_paths(calls: list[tuple[str, float, str, str]], paths: dict[str, str],
                min_warm_share: float | None) -> int:
    """The exit status: 1 when the calls did not take the paths they were meant to."""
    if min_warm_share is None:
        return 0
    # status.path is "Warm" or "Cold".
    took = {name: path.lower() for name, path in paths.items()}
    meant_warm = [name for _, _, name, meant in calls if meant == "warm"]
    meant_cold = [name for _, _, name, meant in calls if meant == "cold"]
    warm = sum(1 for name in meant_warm if took.get(name) == "warm")
    problems = []
    if not meant_warm:
        problems.append("no call was made with a full pool")
    elif warm < min_warm_share * len(meant_warm):
        problems.append(f"only {warm} of {len(meant_warm)} calls made with a full pool went warm "
                        f"(at least {min_warm_share:.0%} required)")
    not_cold = [name for name in meant_cold if took.get(name) != "cold"]
    if not_cold:
        problems.append(f"calls of a cold block that were not cold: "
                        f"{[(n, paths.get(n)) for n in not_cold]}")
    for p in problems:
        print(f"PROBLEM {p}")
    print(f"warm share: {warm} of {len(meant_warm)} calls made with a full pool went warm")
    return 1 if problems else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequential", type=int, default=200)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--think", type=float, default=0.5)
    p.add_argument("--staggered", type=int, default=100)
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--pool", default="default")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--profile", choices=["minimal", "data"], default="minimal")
    p.add_argument("--code", default="print(1)")
    p.add_argument("--min-warm-share", type=float, default=None)
    p.add_argument("--refill", action="store_true")
    p.add_argument("--session", type=int, default=0)
    args = p.parse_args()
    ARGS.update({"code": args.code, "profile": args.profile})
    sys.exit(asyncio.run(main(args)))
