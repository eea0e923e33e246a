"""The official Python MCP SDK against sandboxrun-mcp over stdio, Streamable HTTP and legacy SSE:
initialize, list tools with their schemas, call run_python, and survive malformed calls."""

from __future__ import annotations

import contextlib
import time

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import TICKS, auth

TRANSPORTS = ["stdio", "streamable-http", "sse"]


@contextlib.asynccontextmanager
async def connect(transport: str, binary: str, http_server, headers=None):
    """An initialized ClientSession over the given transport."""
    headers = auth() if headers is None else headers
    async with contextlib.AsyncExitStack() as stack:
        if transport == "stdio":
            read, write = await stack.enter_async_context(
                stdio_client(StdioServerParameters(command=binary, args=["stdio", "--backend", "local"])))
        elif transport == "streamable-http":
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=60))
            streams = await stack.enter_async_context(
                streamable_http_client(f"{http_server.base}/mcp", http_client=client))
            read, write = streams[0], streams[1]
        else:
            read, write = await stack.enter_async_context(
                sse_client(f"{http_server.base}/sse", headers=headers, timeout=60))
        session = await stack.enter_async_context(ClientSession(read, write))
        init = await session.initialize()
        assert init.server_info.name == "sandboxrun"
        assert init.server_info.version
        assert "run_python" in (init.instructions or "")
        yield session


def http_or_none(transport, request):
    return request.getfixturevalue("http_server") if transport != "stdio" else None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_list_tools_and_run(transport, binary, request):
    server = http_or_none(transport, request)

    async def main():
        async with connect(transport, binary, server) as session:
            tools = (await session.list_tools()).tools
            assert [t.name for t in tools] == ["close_session", "run_python"]
            tool = tools[1]
            assert tool.input_schema["type"] == "object"
            assert tool.input_schema["required"] == ["code"]
            assert tool.input_schema["properties"]["code"]["type"] == "string"
            assert tool.input_schema["properties"]["timeoutSeconds"]["type"] == "integer"
            out = tool.output_schema
            assert out["type"] == "object"
            assert {"stdout", "stderr", "exitCode", "truncated", "durationMs", "runName", "phase"} <= set(
                out["properties"])
            ann = tool.annotations
            assert (ann.read_only_hint, ann.destructive_hint, ann.idempotent_hint, ann.open_world_hint) == (
                False, False, False, False)

            progress: list[str] = []

            async def on_progress(value, total, message):
                progress.append(message)

            result = await session.call_tool("run_python", {"code": "print(6*7)"}, progress_callback=on_progress)
            assert result.is_error is False
            sc = result.structured_content
            assert sc["stdout"] == "42\n"
            assert sc["exitCode"] == 0
            assert sc["phase"] == "Succeeded"
            assert sc["truncated"] is False
            assert sc["runName"].startswith("local-")
            assert isinstance(sc["durationMs"], int)
            # The same result as text, for clients that ignore structuredContent.
            assert '"stdout":"42\\n"' in result.content[0].text
            # The phases, then the output as it was printed.
            assert [m.split(":")[0] for m in progress] == ["Pending", "Running", "stdout"]
            assert progress[2] == "stdout: 42\n"

    anyio.run(main)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_output_reaches_the_client_while_the_code_runs(transport, binary, request):
    """A program that prints a line a second: each line arrives as a progress message about a
    second after the one before, the first well before the result; the result is unchanged."""
    server = http_or_none(transport, request)

    async def main():
        async with connect(transport, binary, server) as session:
            seen: list[tuple[float, str]] = []

            async def on_progress(value, total, message):
                seen.append((time.monotonic(), message or ""))

            result = await session.call_tool("run_python", {"code": TICKS}, progress_callback=on_progress)
            returned = time.monotonic()
            assert result.is_error is False, result.content
            assert result.structured_content["stdout"] == "tick 0\ntick 1\ntick 2\n"
            assert result.structured_content["stderr"] == "done\n"
            output = [(t, m) for t, m in seen if m.startswith(("stdout: ", "stderr: "))]
            assert "".join(m[len("stdout: "):] for _, m in output if m.startswith("stdout: ")) == \
                "tick 0\ntick 1\ntick 2\n", seen
            assert [m for _, m in output if m.startswith("stderr: ")] == ["stderr: done\n"], seen
            ticks = [t for t, m in output if "tick" in m]
            assert len(ticks) == 3, seen
            # A second apart as printed (not batched until the end), the first long before the
            # result.
            assert ticks[1] - ticks[0] > 0.5 and ticks[2] - ticks[1] > 0.5, seen
            assert returned - ticks[0] > 1.5, seen

    anyio.run(main)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_malformed_calls_get_actionable_errors(transport, binary, request):
    server = http_or_none(transport, request)

    async def main():
        async with connect(transport, binary, server) as session:
            r = await session.call_tool("run_python", {})
            assert r.is_error and "missing required argument `code`" in r.content[0].text

            r = await session.call_tool("run_python", {"code": 42})
            assert r.is_error and "must be a string of Python source" in r.content[0].text

            r = await session.call_tool("run_python", {"code": "print(1)", "timeoutSeconds": "soon"})
            assert r.is_error and "timeoutSeconds" in r.content[0].text

            r = await session.call_tool("run_python", {"code": "print(1)", "timeoutSeconds": 100000})
            assert r.is_error and "from 1 to 600" in r.content[0].text

            # 300 KB of code: over the 256 KiB limit, under the 1 MiB HTTP body limit.
            r = await session.call_tool("run_python", {"code": "#" * 300_000})
            assert r.is_error and "the limit is 262144 bytes" in r.content[0].text

            with pytest.raises(Exception, match="unknown tool `no_such_tool`; this server offers: close_session, run_python"):
                await session.call_tool("no_such_tool", {})

            # The session still works.
            r = await session.call_tool("run_python", {"code": "print('still here')"})
            assert r.structured_content["stdout"] == "still here\n"

    anyio.run(main)


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
def test_failures_are_tool_errors(transport, binary, request):
    server = http_or_none(transport, request)

    async def main():
        async with connect(transport, binary, server) as session:
            r = await session.call_tool(
                "run_python", {"code": "import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)"})
            assert r.is_error is True
            assert r.content[0].text == "the code exited with status 3; stderr: oops"
            assert r.structured_content["exitCode"] == 3
            assert r.structured_content["phase"] == "Failed"

            r = await session.call_tool(
                "run_python", {"code": "import time\nprint('started', flush=True)\ntime.sleep(30)",
                               "timeoutSeconds": 1})
            assert r.is_error is True
            assert r.structured_content["phase"] == "TimedOut"
            assert "1s timeout" in r.content[0].text

    anyio.run(main)


def test_cancellation_stops_the_run(binary, http_server):
    """A cancelled request (notifications/cancelled) stops its sandbox and is counted."""

    async def main():
        async with connect("streamable-http", binary, http_server) as session:
            with anyio.move_on_after(3):
                await session.call_tool("run_python", {"code": "import time\ntime.sleep(60)"})
            # The session survives and the next call works.
            r = await session.call_tool("run_python", {"code": "print(2)"})
            assert r.structured_content["stdout"] == "2\n"

    anyio.run(main)
    metrics = ""
    for _ in range(50):
        metrics = httpx2.get(f"{http_server.base}/metrics").text
        if 'outcome="cancelled"' in metrics:
            break
        anyio.run(anyio.sleep, 0.1)
    assert 'sandboxrun_mcp_tool_calls_total{tool="run_python",outcome="cancelled"}' in metrics, metrics


def test_stateless_revision_via_the_sdk_client(http_server):
    """The SDK's high-level Client discovers and picks the stateless 2026-07-28 revision."""
    from mcp import Client

    async def main():
        async with httpx2.AsyncClient(headers=auth(), timeout=60) as http:
            transport = streamable_http_client(f"{http_server.base}/mcp", http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                tools = (await client.list_tools()).tools
                assert [t.name for t in tools] == ["close_session", "run_python"]
                r = await client.call_tool("run_python", {"code": "print(6*7)"})
                assert r.is_error is False
                assert r.structured_content["stdout"] == "42\n"
                assert r.structured_content["exitCode"] == 0

    anyio.run(main)


def test_one_agent_cannot_hold_more_calls_than_its_cap(binary):
    """--max-calls-per-agent bounds the calls one agent has in flight (a key cannot take the
    whole Pod quota); the call beyond the cap is refused with a message saying so, and once a
    call ends its place comes back."""
    import time as _time

    async def main():
        params = StdioServerParameters(
            command=binary, args=["stdio", "--backend", "local", "--max-calls-per-agent", "1"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            results = {}

            async def slow():
                results["slow"] = await s.call_tool("run_python", {"code": "import time\ntime.sleep(4)\nprint('slow')"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(1.5)
                started = _time.monotonic()
                r = await s.call_tool("run_python", {"code": "print('second')"})
                refused_in = _time.monotonic() - started
            assert r.is_error is True, r
            assert "already has 1 calls in flight" in r.content[0].text, r.content
            assert refused_in < 2, "the refusal must not wait for the slow call"
            assert results["slow"].is_error is False and results["slow"].structured_content["stdout"] == "slow\n"
            r = await s.call_tool("run_python", {"code": "print('third')"})
            assert r.is_error is False and r.structured_content["stdout"] == "third\n", r.content

    anyio.run(main)
