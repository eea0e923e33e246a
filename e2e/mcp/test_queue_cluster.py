"""The fair queue for sandboxes, on the cluster: with room for one sandbox Pod in the runs
namespace (its ResourceQuota lowered for the test, the warm pools scaled to 0), calls of two
agents with unequal load take turns, each caller hears its place in the queue as progress
notifications, a call that cannot get a sandbox in time is refused at once with a retry hint,
and the calls waiting get the sandbox in turn as soon as it is freed.

Marked `quiet_cluster`: it takes the namespace's room away from every other test, so it runs alone,
after the rest (e2e/run-tests.sh).

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, KUBECTL."""

from __future__ import annotations

import json
import time
import uuid

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from stress import RUNS_NS, URL, agent_key, kubectl

pytestmark = pytest.mark.quiet_cluster

QUOTA = "sandboxrun-runs"
# Load agents' keys (installed by e2e/run-tests.sh); agents of their own, so no other queue
# entry shares their turns.
HEAVY, LIGHT, HOLDER, LATE = 90, 91, 92, 93
WAITERS = [94, 95, 96]


def sandbox_pods() -> list[dict]:
    pods = json.loads(kubectl("-n", RUNS_NS, "get", "pods", "-o", "json"))["items"]
    return [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]


def wait_for(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def set_pod_quota(pods: str) -> None:
    kubectl("-n", RUNS_NS, "patch", "resourcequota", QUOTA, "--type", "merge",
            "-p", json.dumps({"spec": {"hard": {"pods": pods}}}))
    # The API server admits against the quota's status, which its controller syncs.
    wait_for(f"the quota's status to show pods={pods}", lambda: json.loads(
        kubectl("-n", RUNS_NS, "get", "resourcequota", QUOTA, "-o", "json")
    )["status"].get("hard", {}).get("pods") == pods)


@pytest.fixture
def one_sandbox_at_a_time():
    """Room for exactly one sandbox Pod; the pools and the quota restored afterwards."""
    pools = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxpools", "-o", "json"))["items"]
    replicas = {p["metadata"]["name"]: p["spec"].get("replicas", 0) for p in pools}
    quota = json.loads(kubectl("-n", RUNS_NS, "get", "resourcequota", QUOTA, "-o", "json"))
    pods_before = quota["spec"]["hard"]["pods"]
    try:
        for name in replicas:
            kubectl("-n", RUNS_NS, "scale", "sandboxpool", name, "--replicas=0")
        wait_for("the namespace to hold no sandbox Pod", lambda: not sandbox_pods())
        set_pod_quota("1")
        # One call to the end first, so the queue has a pace to judge arrivals by: a leader that
        # has seen no sandbox held bounds each wait by the longest it could be (every sandbox
        # ahead held for the run's whole timeout), and would refuse the calls these tests queue.
        pace = Call("pace", HOLDER, "print('pace')")
        anyio.run(pace.run)
        assert pace.structured.get("phase") == "Succeeded", pace.structured
        yield
    finally:
        set_pod_quota(pods_before)
        for name, n in replicas.items():
            kubectl("-n", RUNS_NS, "scale", "sandboxpool", name, f"--replicas={n}")


class Call:
    """One run_python call of one agent: when it ended, what it answered, what it heard."""

    def __init__(self, name: str, agent: int, code: str):
        self.name, self.agent, self.code = name, agent, code
        self.token = f"queue-{name}-{uuid.uuid4().hex[:8]}"
        self.arguments: dict = {}
        self.progress: list[str] = []
        self.result = None
        self.began = self.ended = 0.0

    async def run(self) -> None:
        async def heard(progress, total, message):
            self.progress.append(message or "")

        headers = {"Authorization": f"Bearer {agent_key(self.agent)}"}
        async with httpx2.AsyncClient(headers=headers, timeout=240) as client, \
                streamable_http_client(URL, http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            self.began = time.monotonic()
            self.result = await session.call_tool(
                "run_python", {"code": f"# {self.token}\n{self.code}", **self.arguments},
                read_timeout_seconds=230, progress_callback=heard)
            self.ended = time.monotonic()

    @property
    def structured(self) -> dict:
        return self.result.structured_content or {}

    def positions(self) -> list[int]:
        """The places in the queue its progress notifications named, in order."""
        found = []
        for m in self.progress:
            if "in the queue" in m:
                found.append(int(m.split("number ", 1)[1].split(" ", 1)[0]))
        return found

    def runs(self) -> list[dict]:
        runs = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxruns", "-o", "json"))["items"]
        return [r for r in runs if self.token in ((r["spec"].get("python") or {}).get("code") or "")]

    def run_name(self) -> str:
        mine = [r["metadata"]["name"] for r in self.runs()]
        assert len(mine) == 1, f"{self.name}: runs {mine}"
        return mine[0]

    def status(self) -> dict:
        """Its run's status, empty before the run exists."""
        mine = self.runs()
        return (mine[0].get("status") or {}) if mine else {}

    async def until(self, what: str, check) -> None:
        """Waits (up to 60 s) until `check` holds of its run's status: the next step of a test
        waits for this one's effect, never for a time it guessed (a busy machine is slower)."""
        await anyio.to_thread.run_sync(
            lambda: wait_for(f"{self.name} {what}", lambda: check(self.status()), timeout=60))

    async def holds_the_sandbox(self) -> None:
        await self.until("to hold the sandbox", lambda s: s.get("phase") == "Running")

    async def queued(self) -> None:
        await self.until("to join the queue", lambda s: s.get("queuedAt"))

    def cancel(self) -> None:
        kubectl("-n", RUNS_NS, "patch", "sandboxrun", self.run_name(), "--type", "merge",
                "-p", '{"spec":{"cancelled":true}}')


SHORT = "import time\ntime.sleep(1)\nprint('done')"
# Holds the sandbox until the test cancels it, once every other call has joined the queue.
HOLD = "import time\ntime.sleep(100)\nprint('done')"


def test_agents_take_turns_and_hear_their_place(one_sandbox_at_a_time):
    holder = Call("a1", HEAVY, HOLD)
    holder.arguments = {"timeoutSeconds": 120}
    heavy = [Call(f"a{i}", HEAVY, SHORT) for i in range(2, 5)]
    light = [Call(f"b{i}", LIGHT, SHORT) for i in range(1, 3)]

    async def main():
        async with anyio.create_task_group() as tg:
            # a1 takes the one sandbox (it may queue first, behind the pace call's Pod on its
            # way out: what follows waits until it holds the sandbox, not for a guessed time).
            tg.start_soon(holder.run)
            await holder.holds_the_sandbox()
            # a2, a3, a4 find no room and join the queue in that order; b1 and b2 come last.
            for call in heavy + light:
                tg.start_soon(call.run)
                await call.queued()
            # The sandbox is freed: the calls waiting get it one at a time.
            holder.cancel()

    anyio.run(main)
    assert holder.structured.get("phase") == "Cancelled", holder.structured
    calls = heavy + light
    for call in calls:
        assert not call.result.is_error, f"{call.name}: {call.result.content}"
        assert call.structured.get("phase") == "Succeeded", call.structured
    # One sandbox at a time: the order calls ended is the order they were let in. The light
    # agent's two calls, though they came last, go between the heavy agent's.
    order = [c.name for c in sorted(calls, key=lambda c: c.ended)]
    assert order == ["a2", "b1", "a3", "b2", "a4"], f"{order}\n{describe([holder] + calls)}"
    # Every queued call heard where it stood; b1 joined the queue second (ahead of a3 and a4).
    for call in calls:
        assert call.positions(), f"{call.name} heard no place: {call.progress}"
    assert call_by(calls, "b1").positions()[0] == 2, call_by(calls, "b1").progress
    assert call_by(calls, "a4").positions()[0] >= 3, call_by(calls, "a4").progress
    # A waiting run keeps when it began to wait; its place goes with the wait. (A place may move
    # back: b1 and b2 went ahead of a3 and a4 after those had joined.)
    for call in calls:
        run = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxrun", call.run_name(), "-o", "json"))
        assert run["status"].get("queuedAt"), run["status"]
        assert "queuePosition" not in run["status"], run["status"]


def describe(calls: list[Call]) -> str:
    """What a failed order is read by: when each call began and ended (the test's clock), and
    when its run joined the queue and where it heard it stood."""
    t0 = min(c.began for c in calls)
    lines = []
    for c in calls:
        status = c.status()
        lines.append(f"{c.name}: began {c.began - t0:.2f} s, ended {c.ended - t0:.2f} s, "
                     f"queuedAt {status.get('queuedAt')}, heard {c.positions()}, "
                     f"{status.get('phase')} {status.get('message', '')[:120]!r}")
    return "\n".join(lines)


def call_by(calls: list[Call], name: str) -> Call:
    return next(c for c in calls if c.name == name)


def test_a_call_that_cannot_start_in_time_is_refused_at_once_and_the_waiting_ones_run(
        one_sandbox_at_a_time):
    # The one sandbox is held by a long run; three calls wait behind it. Once it has been held
    # for 20 s, the queue expects each place to take at least that long: a fourth call, with
    # three ahead (and the holder), could not start within the 60 s a call may wait, and is
    # refused at once. (A slower machine only makes the holder's hold longer.)
    holder = Call("holder", HOLDER, "import time\ntime.sleep(50)\nprint('held')")
    holder.arguments = {"timeoutSeconds": 90}
    waiters = [Call(f"waiter{i}", WAITERS[i], f"print('my turn {i}')") for i in range(3)]
    late = Call("late", LATE, "print('too late')")
    answered_while_held: list[bool] = []

    async def main():
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder.run)
            await holder.holds_the_sandbox()
            for waiter in waiters:
                tg.start_soon(waiter.run)
                await waiter.queued()
            await anyio.sleep(20)
            await late.run()
            # Answered while the one sandbox was still held: the refusal did not wait for room.
            answered_while_held.append(holder.result is None)
            # Free the sandbox: the holder's run is cancelled, and the waiters get it in turn.
            holder.cancel()

    anyio.run(main)
    # Refused at once, with nothing executed and a hint a model can act on.
    assert late.result.is_error, late.structured
    assert late.structured.get("phase") == "Rejected", late.structured
    assert late.structured.get("reason") == "NoCapacity", late.structured
    assert late.structured.get("retryAfterSeconds", 0) >= 1, late.structured
    text = " ".join(getattr(c, "text", "") for c in late.result.content)
    assert "retry in" in text, text
    assert answered_while_held == [True], "the refusal waited for the sandbox to be freed"
    print(f"refused in {late.ended - late.began:.2f} s: {text[:300]}")
    # The waiting calls were never refused: they waited and ran once the sandbox was freed.
    assert holder.structured.get("phase") == "Cancelled", holder.structured
    for i, waiter in enumerate(waiters):
        assert waiter.structured.get("phase") == "Succeeded", waiter.structured
        assert f"my turn {i}" in waiter.structured.get("stdout", ""), waiter.structured
        assert waiter.positions(), waiter.progress
