"""fetch_metrics through the official Python MCP SDK over stdio, local backend: the embedded
frontend records every tool call (allowed, blocked, failed, malformed) and answers PromQL over
that record, so after N run_python calls "how many run_python calls in the last hour?" is N."""

from __future__ import annotations

import contextlib

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

PYTHON_LAST_HOUR = 'sum(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))'


@contextlib.asynccontextmanager
async def session(binary: str, *extra: str):
    params = StdioServerParameters(command=binary,
                                   args=["stdio", "--backend", "local", "--enable-metrics", *extra])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


async def fetch(s: ClientSession, query: str, **args) -> dict:
    r = await s.call_tool("fetch_metrics", {"query": query, **args})
    assert r.is_error is False, r.content
    sc = r.structured_content
    assert (sc["source"], sc["phase"], sc["verdict"]) == ("embedded", "Succeeded", "Allow"), sc
    return sc


def single_value(sc: dict) -> float:
    assert sc["resultType"] == "vector", sc
    assert len(sc["result"]) == 1, sc
    return float(sc["result"][0]["value"][1])


def test_tool_is_listed_with_schemas_and_annotations(binary):
    async def main():
        async with session(binary) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"run_python", "close_session", "fetch_metrics"}
            tool = tools["fetch_metrics"]
            assert tool.input_schema["required"] == ["query"]
            assert {"time", "range", "start", "end", "step", "environment"} <= set(tool.input_schema["properties"])
            assert {"resultType", "result", "truncated", "seriesTotal", "source", "evaluated", "runName",
                    "verdict", "rule", "reason", "phase"} <= set(tool.output_schema["properties"])
            assert "sandboxrun_tool_calls_total" in tool.description
            ann = tool.annotations
            assert (ann.read_only_hint, ann.destructive_hint) == (True, False)

    anyio.run(main)


def test_n_run_python_calls_in_the_last_hour(binary):
    async def main():
        async with session(binary, "--agent", "analyst-07") as s:
            # Nothing yet: the sum over no series is empty, as in Prometheus.
            sc = await fetch(s, PYTHON_LAST_HOUR)
            assert sc["result"] == [], sc

            # N calls that ran (two succeed, one exits non-zero) and one with malformed arguments.
            for code in ["print(1)", "print(2)", "raise SystemExit(3)"]:
                await s.call_tool("run_python", {"code": code})
            r = await s.call_tool("run_python", {"source": "print(1)"})
            assert r.is_error is True
            n = 4

            assert single_value(await fetch(s, PYTHON_LAST_HOUR)) == n
            # The same through a range query: seven steps over the hour, but the series only
            # exists since the first call (seconds ago), so only the last step has a sample: N.
            sc = await fetch(s, PYTHON_LAST_HOUR, range="1h", step="10m")
            assert sc["resultType"] == "matrix"
            assert sc["evaluated"]["stepSeconds"] == 600
            values = sc["result"][0]["values"]
            assert [float(v) for _, v in values] == [n], values

            # Per phase and verdict, with the caller as agent.
            sc = await fetch(s, 'sum by (phase, verdict, agent) '
                                '(increase(sandboxrun_tool_calls_total{tool="run_python"}[1h]))')
            got = {(x["metric"]["phase"], x["metric"].get("verdict"), x["metric"]["agent"]): x["value"][1]
                   for x in sc["result"]}
            assert got == {("Succeeded", "Allow", "analyst-07"): "2", ("Failed", "Allow", "analyst-07"): "1",
                           ("InvalidArguments", None, "analyst-07"): "1"}, got

            # fetch_metrics calls count too (four so far, this one is recorded after it answers).
            sc = await fetch(s, 'sum(sandboxrun_tool_calls_total{tool="fetch_metrics"})')
            assert single_value(sc) == 4

    anyio.run(main)


def test_blocked_calls_are_recorded_and_errors_are_actionable(binary, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "default: block\n"
        "rules:\n"
        "  - name: metrics-outside-production\n"
        "    tools: [metrics]\n"
        "    environments: [sandbox, staging]\n"
        "    verdict: allow\n")

    async def main():
        async with session(binary, "--policy-file", str(policy)) as s:
            r = await s.call_tool("fetch_metrics", {"query": PYTHON_LAST_HOUR, "environment": "production"})
            assert r.is_error is True
            sc = r.structured_content
            assert (sc["verdict"], sc["phase"], sc["rule"]) == ("Block", "Rejected", "default"), sc
            assert "blocked by policy" in r.content[0].text

            sc = await fetch(s, 'sum(increase(sandboxrun_tool_calls_total{verdict="Block",'
                                'environment="production"}[1h]))', environment="staging")
            assert single_value(sc) == 1

            # A syntax error names its position; an unknown metric says what the store holds.
            r = await s.call_tool("fetch_metrics", {"query": "sum(rate(x[5m])) by job"})
            assert r.is_error is True
            assert "not valid PromQL" in r.content[0].text, r.content
            assert "line 1, column 21 (at `job`)" in r.content[0].text, r.content
            r = await s.call_tool("fetch_metrics", {"query": "up"})
            assert r.is_error is True
            assert "sandboxrun_tool_calls_total" in r.content[0].text
            assert r.structured_content["phase"] == "Failed"
            r = await s.call_tool("fetch_metrics", {"query": "up", "time": "now", "range": "1h"})
            assert r.is_error is True and "not both" in r.content[0].text

    anyio.run(main)


def test_an_agent_sees_only_its_own_calls_unless_policy_says_otherwise(binary, key_file, tmp_path):
    """Over Streamable HTTP with two agents' keys: each agent's fetch_metrics answers over its
    own calls only (the query is pinned to agent="<caller>", however it is written); a policy
    rule with metrics.allAgents lets an agent read every agent's calls, and metrics.names limits
    which metrics a query may name."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from conftest import Server, auth

    @contextlib.asynccontextmanager
    async def as_agent(server, agent):
        async with httpx2.AsyncClient(headers=auth(agent), timeout=60) as client, \
                streamable_http_client(f"{server.base}/mcp", http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            yield s

    everyone = "sum by (agent) (sandboxrun_tool_calls_total)"
    sneaky = 'sum by (agent) (sandboxrun_tool_calls_total{agent=~".+"}) + sum by (agent) (sandboxrun_tool_calls_total{agent="analyst-01"})'

    async def calls_by_agent(s, query):
        sc = await fetch(s, query)
        return {x["metric"].get("agent"): x["value"][1] for x in sc["result"]}

    default = Server(binary, key_file, tmp_path / "default.log", "--enable-metrics")
    try:
        async def main():
            async with as_agent(default, "analyst-01") as a:
                r = await a.call_tool("run_python", {"code": "print(1)"})
                assert r.is_error is False, r.content
            async with as_agent(default, "ci-bot") as b:
                assert await calls_by_agent(b, everyone) == {}, "ci-bot saw another agent's calls"
                assert await calls_by_agent(b, sneaky) == {}, "a matcher of its own widened the pin"
            async with as_agent(default, "analyst-01") as a:
                got = await calls_by_agent(a, everyone)
                assert set(got) == {"analyst-01"}, got

        anyio.run(main)
    finally:
        default.stop()

    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "default: block\n"
        "rules:\n"
        "  - {name: python, tools: [python], verdict: allow}\n"
        "  - name: auditor-reads-everyone\n"
        "    agents: [ci-bot]\n"
        "    tools: [metrics]\n"
        "    verdict: allow\n"
        "    metrics: {allAgents: true, names: [sandboxrun_tool_calls_total]}\n"
        "  - {name: others-read-their-own, tools: [metrics], verdict: allow}\n")
    scoped = Server(binary, key_file, tmp_path / "scoped.log", "--enable-metrics", "--policy-file", str(policy))
    try:
        async def main():
            async with as_agent(scoped, "analyst-01") as a:
                r = await a.call_tool("run_python", {"code": "print(1)"})
                assert r.is_error is False, r.content
            async with as_agent(scoped, "ci-bot") as b:
                got = await calls_by_agent(b, everyone)
                assert got.get("analyst-01") == "1", got
                r = await b.call_tool("fetch_metrics", {"query": "sandboxrun_mcp_tool_calls_total"})
                assert r.is_error is True
                assert "does not allow the metric sandboxrun_mcp_tool_calls_total" in r.content[0].text, r.content

        anyio.run(main)
    finally:
        scoped.stop()
