"""The frontend as installed by the Helm chart on the cluster: the official Python MCP SDK calls
run_python through the frontend's NodePort with an API key, gets the result computed by a gVisor
Pod, and the SandboxRun records the caller's agent identity.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, MCP_AGENT, KUBECONFIG, KUBECTL."""

from __future__ import annotations

import json
import os
import subprocess
import time

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
AGENT = os.environ["MCP_AGENT"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")


async def call(code: str, headers: dict[str, str]):
    async with httpx2.AsyncClient(headers=headers, timeout=180) as client:
        async with streamable_http_client(URL, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                init = await session.initialize()
                assert init.server_info.name == "sandboxrun"
                tools = (await session.list_tools()).tools
                assert "run_python" in [t.name for t in tools]
                return await session.call_tool("run_python", {"code": code})


def test_run_python_through_the_cluster_frontend_records_the_agent():
    result = anyio.run(call, "import platform\nprint(6*7)\nprint(platform.release())",
                       {"Authorization": f"Bearer {KEY}"})
    assert result.is_error is False, result
    sc = result.structured_content
    lines = sc["stdout"].splitlines()
    assert lines[0] == "42"
    assert sc["exitCode"] == 0
    run_name = sc["runName"]
    assert run_name

    run = json.loads(subprocess.run(
        [KUBECTL, "-n", "sandboxrun-runs", "get", "sandboxrun", run_name, "-o", "json"],
        check=True, capture_output=True, text=True).stdout)
    assert run["spec"]["agent"] == AGENT
    assert run["status"]["phase"] == "Succeeded"
    assert run["status"]["stdout"] == sc["stdout"]
    # It ran in a sandbox Pod under gVisor, not on the node's kernel.
    node = json.loads(subprocess.run([KUBECTL, "get", "nodes", "-o", "json"], check=True,
                                     capture_output=True, text=True).stdout)
    assert lines[1] != node["items"][0]["status"]["nodeInfo"]["kernelVersion"]


TICKS = "import sys, time\nfor i in range(3):\n    print('tick', i)\n    time.sleep(1)\nprint('done', file=sys.stderr)\n"


def test_output_reaches_the_client_while_the_sandbox_pod_runs():
    """A program printing a line a second in a sandbox Pod: the frontend follows the Pod's log
    and each line arrives as a progress message while the code runs, in order, after Running
    and long before the result; the result holds all of it."""

    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=180) as client, \
                streamable_http_client(URL, http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            seen: list[tuple[float, str]] = []

            async def on_progress(value, total, message):
                seen.append((time.monotonic(), message or ""))

            result = await session.call_tool("run_python", {"code": TICKS}, progress_callback=on_progress,
                                             read_timeout_seconds=170)
            return result, seen, time.monotonic()

    result, seen, returned = anyio.run(main)
    assert result.is_error is False, result.content
    assert result.structured_content["stdout"] == "tick 0\ntick 1\ntick 2\n"
    messages = [m for _, m in seen]
    output = [m for m in messages if m.startswith(("stdout: ", "stderr: "))]
    assert "".join(m[len("stdout: "):] for m in output if m.startswith("stdout: ")) == \
        "tick 0\ntick 1\ntick 2\n", messages
    assert "stderr: done\n" in output, messages
    running = next(i for i, m in enumerate(messages) if m.startswith("Running"))
    assert running < messages.index(output[0]), messages
    ticks = [t for t, m in seen if "tick" in m]
    assert len(ticks) == 3 and ticks[2] - ticks[0] > 1.0, seen
    assert returned - ticks[0] > 1.5, seen


def test_the_cluster_frontend_refuses_calls_without_a_valid_key():
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        response = httpx2.post(URL, headers={**headers, "Content-Type": "application/json",
                                             "Accept": "application/json, text/event-stream"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)
        assert response.status_code == 401, response.text


def test_a_cancelled_call_ends_its_run_cancelled_with_one_audit_line_and_no_pod():
    """The caller gives up mid-run (the SDK sends notifications/cancelled): the frontend cancels
    the run, which ends Cancelled with its audit line; its sandbox Pod goes, the run stays."""
    from operator_audit import the_audit_line
    marker = "cancel-me-" + os.urandom(6).hex()

    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=180) as client:
            async with streamable_http_client(URL, http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    with anyio.move_on_after(8):
                        await session.call_tool(
                            "run_python", {"code": f"# {marker}\nimport time\ntime.sleep(120)"})
                    # The session survives and serves the next call.
                    r = await session.call_tool("run_python", {"code": "print(2)"})
                    assert r.structured_content["stdout"] == "2\n", r

    anyio.run(main)

    def the_run():
        runs = json.loads(subprocess.run(
            [KUBECTL, "-n", "sandboxrun-runs", "get", "sandboxruns", "-o", "json"],
            check=True, capture_output=True, text=True).stdout)["items"]
        found = [r for r in runs if marker in (r["spec"].get("python") or {}).get("code", "")]
        assert len(found) == 1, f"one run for the call: {[r['metadata']['name'] for r in found]}"
        return found[0]

    run = the_run()
    for _ in range(60):
        if run.get("status", {}).get("phase") == "Cancelled":
            break
        anyio.run(anyio.sleep, 1)
        run = the_run()
    assert run["spec"]["cancelled"] is True, run["spec"]
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Cancelled", "CallCancelled"), run["status"]
    name = run["metadata"]["name"]
    line = the_audit_line(name)
    assert (line["phase"], line["phase_reason"]) == ("Cancelled", "CallCancelled"), line
    pods = json.loads(subprocess.run(
        [KUBECTL, "-n", "sandboxrun-runs", "get", "pods", "-l", f"sandboxrun.dev/run={name}", "-o", "json"],
        check=True, capture_output=True, text=True).stdout)["items"]
    assert [p for p in pods if not p["metadata"].get("deletionTimestamp")] == [], pods
