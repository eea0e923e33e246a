"""fetch_metrics through the frontend installed by the Helm chart (frontend.enableMetrics): the
official Python MCP SDK calls the tool through the NodePort with an API key, the frontend creates
a SandboxRun with spec.metrics, and the operator answers from the Prometheus configured with
operator.prometheus.url (started by e2e/run-tests.sh on the node address, scraping itself).

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, MCP_AGENT, KUBECONFIG, KUBECTL."""

from __future__ import annotations

import json
import os
import subprocess

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from operator_audit import the_audit_line

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
AGENT = os.environ["MCP_AGENT"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")


async def fetch(args: dict):
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx2.AsyncClient(headers=headers, timeout=180) as client:
        async with streamable_http_client(URL, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                tools = [t.name for t in (await session.list_tools()).tools]
                assert "fetch_metrics" in tools, tools
                return await session.call_tool("fetch_metrics", args)


def test_fetch_metrics_through_the_cluster_frontend_queries_prometheus():
    result = anyio.run(fetch, {"query": 'up{job="prometheus"}'})
    assert result.is_error is False, result.content
    sc = result.structured_content
    assert (sc["source"], sc["phase"], sc["verdict"]) == ("prometheus", "Succeeded", "Allow"), sc
    assert sc["resultType"] == "vector"
    assert [s["value"][1] for s in sc["result"]] == ["1"], sc
    # The call is a SandboxRun of the caller, with the query in spec.metrics.
    out = subprocess.run([KUBECTL, "-n", "sandboxrun-runs", "get", "sandboxrun", sc["runName"], "-o", "json"],
                         capture_output=True, text=True, check=True)
    run = json.loads(out.stdout)
    assert run["spec"]["agent"] == AGENT
    assert run["spec"]["metrics"]["query"] == 'up{job="prometheus"}'
    assert run["spec"]["metrics"]["time"], run["spec"]
    # Exactly one SandboxRun for the call, and exactly one audit line with its verdict.
    out = subprocess.run([KUBECTL, "-n", "sandboxrun-runs", "get", "sandboxruns", "-o", "json"],
                         capture_output=True, text=True, check=True)
    same = [r for r in json.loads(out.stdout)["items"]
            if r["spec"].get("metrics", {}).get("time") == run["spec"]["metrics"]["time"]
            and r["spec"]["metrics"]["query"] == 'up{job="prometheus"}']
    assert [r["metadata"]["name"] for r in same] == [sc["runName"]], same
    line = the_audit_line(sc["runName"])
    assert (line["agent"], line["tool"], line["verdict"], line["phase"]) == \
        (AGENT, "metrics", "Allow", "Succeeded"), line


def test_a_range_query_and_a_syntax_error():
    result = anyio.run(fetch, {"query": 'up{job="prometheus"}', "range": "30s", "step": "5s"})
    assert result.is_error is False, result.content
    sc = result.structured_content
    assert sc["resultType"] == "matrix" and sc["result"][0]["values"], sc
    assert sc["evaluated"]["stepSeconds"] == 5
    result = anyio.run(fetch, {"query": "sum(up) by job"})
    assert result.is_error is True
    assert "line 1, column 12 (at `job`)" in result.content[0].text, result.content
