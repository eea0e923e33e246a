"""The frontend as installed by the Helm chart on the cluster: the official Python MCP SDK calls
run_python through the frontend's NodePort with an API key, gets the result computed by a gVisor
Pod, and the SandboxRun records the caller's agent identity.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, MCP_AGENT, KUBECONFIG, KUBECTL."""

from __future__ import annotations

import json
import os
import subprocess

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
