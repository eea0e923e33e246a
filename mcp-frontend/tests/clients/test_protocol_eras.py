"""Both protocol eras over Streamable HTTP, each with the official Python SDK's `Client` pinned to
it: the initialize handshake (`mode="legacy"`, 2025-11-25) and the stateless 2026-07-28 revision
(`server/discover`, `Mcp-Method` headers, one POST per request). For each: the tools and their
schemas, progress (the run's phases and its output while it runs) and cancellation (the run is
stopped and counted, and the next call works)."""

from __future__ import annotations

import re
import time

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import TICKS, auth

ERAS = {"legacy": "2025-11-25", "2026-07-28": "2026-07-28"}


def client(server, era: str, http: httpx2.AsyncClient) -> Client:
    return Client(streamable_http_client(f"{server.base}/mcp", http_client=http), mode=era)


def cancelled_calls(server) -> float:
    text = httpx2.get(f"{server.base}/metrics").text
    m = re.search(r'^sandboxrun_mcp_tool_calls_total\{tool="run_python",outcome="cancelled"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.parametrize("era", ERAS)
def test_tools_and_their_schemas(era, http_server):
    async def main():
        async with httpx2.AsyncClient(headers=auth(), timeout=60) as http, client(http_server, era, http) as c:
            assert c.protocol_version == ERAS[era]
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert list(tools) == ["close_session", "run_python"]
            schema = tools["run_python"].input_schema
            assert schema["type"] == "object" and schema["required"] == ["code"]
            assert schema["properties"]["code"]["type"] == "string"
            assert schema["properties"]["timeoutSeconds"]["maximum"] == 600
            out = tools["run_python"].output_schema
            assert {"stdout", "stderr", "exitCode", "truncated", "durationMs", "runName", "phase"} <= set(
                out["properties"])
            r = await c.call_tool("run_python", {"code": "print(6*7)"})
            assert r.is_error is False and r.structured_content["stdout"] == "42\n"
            r = await c.call_tool("run_python", {"code": 7})
            assert r.is_error is True and "must be a string of Python source" in r.content[0].text

    anyio.run(main)


@pytest.mark.parametrize("era", ERAS)
def test_progress_carries_the_phases_and_the_output_while_it_runs(era, http_server):
    async def main():
        async with httpx2.AsyncClient(headers=auth(), timeout=60) as http, client(http_server, era, http) as c:
            seen: list[tuple[float, str]] = []

            async def on_progress(value, total, message):
                seen.append((time.monotonic(), message or ""))

            r = await c.call_tool("run_python", {"code": TICKS}, progress_callback=on_progress)
            returned = time.monotonic()
            assert r.is_error is False, r.content
            assert r.structured_content["stdout"] == "tick 0\ntick 1\ntick 2\n"
            messages = [m for _, m in seen]
            assert [m.split(":")[0] for m in messages[:2]] == ["Pending", "Running"], messages
            ticks = [t for t, m in seen if m.startswith("stdout: tick")]
            assert len(ticks) == 3, messages
            assert returned - ticks[0] > 1.5, seen

    anyio.run(main)


@pytest.mark.parametrize("era", ERAS)
def test_a_cancelled_call_stops_its_run(era, http_server):
    before = cancelled_calls(http_server)

    async def main():
        async with httpx2.AsyncClient(headers=auth(), timeout=60) as http, client(http_server, era, http) as c:
            with anyio.move_on_after(3) as scope:
                await c.call_tool("run_python", {"code": "import time\ntime.sleep(60)"})
            assert scope.cancelled_caught
            r = await c.call_tool("run_python", {"code": "print(2)"})
            assert r.structured_content["stdout"] == "2\n"

    started = time.monotonic()
    anyio.run(main)
    deadline = time.monotonic() + 10
    while cancelled_calls(http_server) <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cancelled_calls(http_server) == before + 1
    # Stopped, not run to its end: the 60 s sleep did not hold anything up.
    assert time.monotonic() - started < 30
