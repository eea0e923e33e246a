"""run_python sessions on the embedded server, through the official Python MCP SDK: state and files
kept between calls, a session only its agent can use (another agent naming it is told what an
unknown id is told), what a call leaves running kept out of later calls, close_session, the idle
timeout of the policy, and a call that ends its session."""

from __future__ import annotations

import contextlib

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import auth

POLICY_SHORT_IDLE = """\
default: block
rules:
  - name: sessions-idle-quickly
    agents: ["*"]
    tools: [python]
    verdict: allow
    python:
      sessions:
        maxPerAgent: 2
        idleTimeoutSeconds: 10
"""


@contextlib.asynccontextmanager
async def over_http(server, agent: str):
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx2.AsyncClient(headers=auth(agent), timeout=60))
        read, write, *_ = await stack.enter_async_context(
            streamable_http_client(f"{server.base}/mcp", http_client=client))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def over_stdio(binary: str, *extra: str):
    params = StdioServerParameters(command=binary, args=["stdio", "--backend", "local", *extra])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def run(session, code: str, sid: str | None = None):
    args = {"code": code}
    if sid is not None:
        args["session"] = sid
    return await session.call_tool("run_python", args)


def test_state_and_files_are_kept_and_only_their_agent_reaches_them(binary, http_server):
    async def main():
        async with over_http(http_server, "analyst-01") as s, over_http(http_server, "ci-bot") as other:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "session" in tools["run_python"].input_schema["properties"]
            assert tools["close_session"].input_schema["required"] == ["session"]

            r = await run(s, "x = 41\nopen('notes.txt', 'w').write('kept')", "new")
            assert r.is_error is False, r.content
            sid = r.structured_content["session"]
            assert sid.startswith("sbs-"), r.structured_content
            r = await run(s, "print(x + 1, open('notes.txt').read())", sid)
            assert r.is_error is False, r.content
            assert r.structured_content["stdout"] == "42 kept\n"
            assert r.structured_content["session"] == sid

            # Another agent naming the id, and an id nobody has: the same answer.
            theirs = await run(other, "print(x)", sid)
            unknown = await run(other, "print(x)", "sbs-00000000000000000000000000000000")
            for r, named in ((theirs, sid), (unknown, "sbs-00000000000000000000000000000000")):
                assert r.is_error is True
                assert (r.structured_content["phase"], r.structured_content["reason"]) == (
                    "Rejected", "SessionNotFound"), r.structured_content
                assert r.structured_content["stdout"] == ""
            assert theirs.content[0].text.replace(sid, "ID") == unknown.content[0].text.replace(
                "sbs-00000000000000000000000000000000", "ID")
            r = await other.call_tool("close_session", {"session": sid})
            assert r.is_error is True, r.content

            # Still there for its owner, and a call without `session` does not see it.
            r = await run(s, "print('x' in globals())")
            assert r.structured_content["stdout"] == "False\n", r.structured_content
            r = await run(s, "print(x)", sid)
            assert r.structured_content["stdout"] == "41\n", r.structured_content

            r = await s.call_tool("close_session", {"session": sid})
            assert r.is_error is False, r.content
            assert r.structured_content == {"session": sid, "closed": True}
            r = await run(s, "print(x)", sid)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content

    anyio.run(main)


def test_a_thread_left_writing_does_not_reach_the_next_call(binary):
    leave = ("import threading, time\n"
             "def spam():\n"
             "    while True:\n"
             "        print('LEAK', flush=True)\n"
             "        time.sleep(0.005)\n"
             "threading.Thread(target=spam, daemon=True).start()\n"
             "time.sleep(0.05)\n")

    async def main():
        async with over_stdio(binary) as s:
            r = await run(s, leave, "new")
            assert r.is_error is False, r.content
            sid = r.structured_content["session"]
            assert "LEAK" in r.structured_content["stdout"]
            for _ in range(3):
                r = await run(s, "import time\ntime.sleep(0.1)\nprint('clean')", sid)
                assert r.structured_content["stdout"] == "clean\n", r.structured_content

    anyio.run(main)


def test_a_call_that_ends_its_interpreter_ends_the_session(binary):
    async def main():
        async with over_stdio(binary) as s:
            r = await run(s, "y = 1", "new")
            sid = r.structured_content["session"]
            r = await run(s, "import os\nos._exit(3)", sid)
            assert r.is_error is True
            assert r.structured_content["exitCode"] == 3, r.structured_content
            assert "sessionEnded" in r.structured_content, r.structured_content
            assert "session \"new\"" in r.content[0].text, r.content[0].text
            r = await run(s, "print(y)", sid)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content

    anyio.run(main)


def test_a_session_idle_past_its_timeout_is_gone_and_the_agent_holds_at_most_its_share(binary, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_SHORT_IDLE)

    async def main():
        async with over_stdio(binary, "--policy-file", str(policy)) as s:
            first = (await run(s, "a = 1", "new")).structured_content["session"]
            second = (await run(s, "b = 2", "new")).structured_content["session"]
            r = await run(s, "c = 3", "new")
            assert (r.structured_content["phase"], r.structured_content["reason"]) == (
                "Rejected", "SessionLimit"), r.structured_content
            assert "close_session" in r.content[0].text
            # Keep the second busy past the first's idle timeout.
            for _ in range(4):
                await anyio.sleep(3)
                r = await run(s, "print(b)", second)
                assert r.structured_content["stdout"] == "2\n", r.structured_content
            r = await run(s, "print(a)", first)
            assert r.structured_content["reason"] == "SessionNotFound", r.structured_content
            # Its place is free again.
            r = await run(s, "print('third')", "new")
            assert r.is_error is False, r.content

    anyio.run(main)


def test_sessions_refused_by_policy_say_so(binary, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: block\nrules:\n  - name: no-sessions\n    agents: ['*']\n"
                      "    tools: [python]\n    verdict: allow\n")

    async def main():
        async with over_stdio(binary, "--policy-file", str(policy)) as s:
            r = await run(s, "print(1)", "new")
            assert r.is_error is True
            assert r.structured_content["reason"] == "PolicyBlocked", r.structured_content
            assert "session" in r.content[0].text, r.content[0].text
            r = await run(s, "print(1)")
            assert r.structured_content["stdout"] == "1\n", r.structured_content

    anyio.run(main)
