"""Embedded run_python is judged by the policy file, as a cluster run is by the operator: through
the official Python MCP SDK over stdio, a call the policy blocks and a call it escalates (which
needs a person, whom only a cluster can ask) come back as actionable tool errors without running
anything, an allowed call runs, and all three are in the call record with their verdicts."""

from __future__ import annotations

import contextlib

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

POLICY = """\
default: block
rules:
  - name: interns-need-review
    agents: [intern]
    tools: [python]
    verdict: escalate
    reason: code from interns is reviewed by a person
  - name: analysts-run-python
    agents: [analyst]
    tools: [python, metrics]
    verdict: allow
"""


@contextlib.asynccontextmanager
async def session(binary: str, policy: str, agent: str):
    params = StdioServerParameters(
        command=binary,
        args=["stdio", "--backend", "local", "--enable-metrics", "--policy-file", policy, "--agent", agent],
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


def test_blocked_and_escalated_python_calls_do_not_run(binary, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # What ran shows in stdout: a refused call has none.
    code = "print('ran')"

    async def main():
        async with session(binary, str(policy), "stranger") as s:
            r = await s.call_tool("run_python", {"code": code})
            assert r.is_error is True
            sc = r.structured_content
            assert (sc["phase"], sc["reason"]) == ("Rejected", "PolicyBlocked"), sc
            assert sc["stdout"] == "" and "exitCode" not in sc, sc
            text = r.content[0].text
            assert text.startswith("the run was rejected (PolicyBlocked)"), text
            assert "blocked by rule default" in text, text

        async with session(binary, str(policy), "intern") as s:
            r = await s.call_tool("run_python", {"code": code})
            assert r.is_error is True
            sc = r.structured_content
            assert (sc["phase"], sc["reason"]) == ("Rejected", "ApprovalUnavailable"), sc
            assert sc["stdout"] == "", sc
            text = r.content[0].text
            assert "rule interns-need-review escalated" in text, text
            assert "code from interns is reviewed by a person" in text, text
            assert "only available in cluster mode" in text, text

        async with session(binary, str(policy), "analyst") as s:
            r = await s.call_tool("run_python", {"code": code})
            assert r.is_error is False, r.content
            assert r.structured_content["stdout"] == "ran\n"
            r = await s.call_tool("fetch_metrics", {
                "query": 'sum by (verdict) (sandboxrun_tool_calls_total{tool="run_python"})'})
            assert r.is_error is False, r.content
            got = {x["metric"]["verdict"]: x["value"][1] for x in r.structured_content["result"]}
            assert got == {"Allow": "1"}, got

    anyio.run(main)
