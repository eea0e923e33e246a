"""The frontend through a real ingress controller: the chart's Ingress (ingress.enabled, class
traefik, TLS with a test CA's certificate) served by Traefik (e2e/ingress/start.sh), with the
official Python MCP SDK as the client, over HTTPS. Each test checks what a proxy in the way
tends to break: output streamed while the code runs must arrive as it is printed (not buffered to
the end), a call whose code then prints nothing for 90 s (past the 60 s after which proxies
commonly end a quiet response) must come back whole, the legacy SSE endpoint's long-lived stream
must carry the session, an approval wait must reach the client with its decision, and a client
whose stream broke must get its call's result by resuming the stream (Last-Event-ID).

Short form in CI: the approval comes 10 s after the frontend's approval wait has started. The full form (INGRESS_FULL=1, see e2e/ingress/full.sh) holds an approval wait
for 10 minutes.

Environment (set by e2e/run-tests.sh): INGRESS_URL, INGRESS_CA, MCP_API_KEY, KUBECTL; for the
full form INGRESS_FULL=1 on an install whose approval wait and timeout exceed 10 minutes."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import time
import uuid

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

# Run by e2e/run-tests.sh once Traefik is up (it compiles beside the other suites).
pytestmark = pytest.mark.ingress

# Read when a test runs, not on import: the rest of the suite is collected before Traefik is up.
BASE = os.environ.get("INGRESS_URL", "")
CA = os.environ.get("INGRESS_CA", "")
KEY = os.environ["MCP_API_KEY"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
FULL = os.environ.get("INGRESS_FULL") == "1"

HEADERS = {"Authorization": f"Bearer {KEY}"}
# Proxies commonly end a response that has been quiet for 60 s (nginx's default
# proxy_read_timeout): the code prints a few lines, then nothing for QUIET_SECONDS. Whatever keeps
# the response open meanwhile is the frontend's business (it must, through any proxy).
TICKS = 3
TICK = 2
QUIET_SECONDS = 90


@pytest.fixture(autouse=True)
def the_ingress_is_up():
    assert BASE and CA, "INGRESS_URL and INGRESS_CA are unset: start Traefik with e2e/ingress/start.sh"


def tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=CA)


def client(timeout: float) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers=HEADERS, timeout=timeout, verify=tls())


def kubectl(*args: str) -> str:
    return subprocess.run([KUBECTL, *args], check=True, capture_output=True, text=True).stdout


def test_the_ingress_serves_the_frontend_over_tls_with_the_chart_certificate():
    r = httpx2.get(f"{BASE}/healthz", verify=tls(), timeout=10)
    assert r.status_code == 200 and r.text == "ok"
    # Without the CA the certificate is not trusted: TLS is the ingress's, with the chart's Secret.
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{BASE}/healthz", timeout=10)
    # And the frontend still asks for a credential through it.
    r = httpx2.post(f"{BASE}/mcp", json={}, verify=tls(), timeout=10,
                    headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 401, r.text


@pytest.mark.waits
def test_output_streams_through_the_ingress_and_a_call_quiet_for_90s_comes_back_whole():
    code = (f"import time\nfor i in range({TICKS}):\n"
            f"    print('tick', i, flush=True)\n    time.sleep({TICK})\n"
            f"time.sleep({QUIET_SECONDS})\nprint('done')\n")
    length = TICKS * TICK + QUIET_SECONDS

    async def main():
        async with client(length + 120) as http, \
                streamable_http_client(f"{BASE}/mcp", http_client=http) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            seen: list[tuple[float, str]] = []

            async def on_progress(value, total, message):
                seen.append((time.monotonic(), message or ""))

            started = time.monotonic()
            result = await session.call_tool(
                "run_python", {"code": code, "timeoutSeconds": length + 30},
                progress_callback=on_progress, read_timeout_seconds=length + 100)
            return result, seen, started, time.monotonic()

    result, seen, started, ended = anyio.run(main)
    assert result.is_error is False, result
    assert result.structured_content["stdout"] == \
        "".join(f"tick {i}\n" for i in range(TICKS)) + "done\n"
    assert ended - started >= length, "the call ran its whole length"
    ticks = [(t, m) for t, m in seen if m.startswith("stdout: tick")]
    assert [m.strip() for _, m in ticks] == [f"stdout: tick {i}" for i in range(TICKS)], seen
    # Unbuffered: every line came while the code was still quiet, not in a burst at its end (the
    # code sleeps QUIET_SECONDS after its last line, so this holds however slow the machine is,
    # unless the ingress or the frontend held the lines back).
    assert all(t < ended - QUIET_SECONDS / 2 for t, _ in ticks), \
        ([round(t - started, 1) for t, _ in ticks], round(ended - started, 1))


def sse_events(lines) -> list[dict]:
    """The events of an SSE body, as {"id": ..., "data": parsed JSON or None}."""
    events, event = [], {}
    for line in lines:
        if not line:
            if event:
                events.append(event)
            event = {}
        elif line.startswith("id:"):
            event["id"] = line[3:].strip()
        elif line.startswith("data:") and line[5:].strip():
            event["data"] = json.loads(line[5:].strip())
    if event:
        events.append(event)
    return events


def test_a_call_whose_stream_broke_gets_its_result_by_resuming_through_the_ingress():
    """A client whose stream broke (here: it hangs up after the first event, before the code
    has printed) reconnects with Last-Event-ID through Traefik and gets the call's result; a
    made-up id gets an empty stream."""
    version = "2025-11-25"
    with httpx2.Client(headers=HEADERS, verify=tls(), timeout=60) as http:
        accept = {"Accept": "application/json, text/event-stream"}
        init = http.post(f"{BASE}/mcp", headers=accept, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": version, "capabilities": {},
                "clientInfo": {"name": "resume-test", "version": "1"}}})
        assert init.status_code == 200, init.text
        session = {"Mcp-Session-Id": init.headers["mcp-session-id"],
                   "Mcp-Protocol-Version": version}
        note = http.post(f"{BASE}/mcp", headers={**accept, **session},
                         json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202, note.text

        code = "import time\ntime.sleep(3)\nprint('resumed', 6 * 7)\n"
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": code}}}
        first = None
        with http.stream("POST", f"{BASE}/mcp", headers={**accept, **session}, json=call) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("id:"):
                    first = line[3:].strip()
                    break
        assert first, "the call's stream has an event with an id before its result"

        # Twice: the first resumption comes while the code still runs and follows the stream to
        # the result; the second comes after the result went out, which rmcp alone can no longer
        # replay (the frontend keeps the stream's events, http/replay.rs).
        resume = {**session, "Accept": "text/event-stream"}
        for attempt in range(2):
            with http.stream("GET", f"{BASE}/mcp", headers={**resume, "Last-Event-ID": first},
                             timeout=120) as r:
                assert r.status_code == 200
                events = sse_events(r.iter_lines())
            answers = [e["data"] for e in events if e.get("data", {}).get("id") == 2]
            assert len(answers) == 1, (attempt, events)
            result = answers[0]["result"]
            assert result["isError"] is False, result
            assert result["structuredContent"]["stdout"] == "resumed 42\n", result

        made_up = http.get(f"{BASE}/mcp", headers={**resume, "Last-Event-ID": f"{uuid.uuid4().hex}.0"})
        assert made_up.status_code == 200 and sse_events(made_up.text.splitlines()) == []
        http.delete(f"{BASE}/mcp", headers=session)


def test_the_legacy_sse_endpoint_works_through_the_ingress():
    def factory(headers=None, timeout=None, auth=None):
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=tls())

    async def main():
        async with sse_client(f"{BASE}/sse", headers=HEADERS, timeout=30,
                              httpx_client_factory=factory) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            init = await session.initialize()
            assert init.server_info.name == "sandboxrun"
            tools = [t.name for t in (await session.list_tools()).tools]
            assert "run_python" in tools
            # The stream stays open across a pause longer than a short proxy idle timeout.
            await anyio.sleep(15)
            return await session.call_tool("run_python", {"code": "print(6*7)"})

    result = anyio.run(main)
    assert result.is_error is False, result
    assert result.structured_content["stdout"] == "42\n"


def test_an_approval_wait_reaches_the_client_through_the_ingress():
    """An execute_sql call in production awaits a person: it is held open through the ingress,
    with progress naming the run, until the run is approved; the rows come back on the same
    request. Short form: approved 10 s into the wait. Full form: after 10 minutes."""
    marker = f"ingress-{uuid.uuid4().hex}"
    query = f"/* {marker} */ SELECT id FROM ledger WHERE id <= 2 ORDER BY id"
    decide_after = 600 if FULL else 10
    state: dict = {}

    async def approve(awaiting: anyio.Event):
        with anyio.fail_after(90):
            await awaiting.wait()
        await anyio.sleep(decide_after)
        by = kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
        patch = json.dumps({"spec": {"approval": {"approved": True, "by": by}}})
        await anyio.to_thread.run_sync(lambda: kubectl(
            "-n", "sandboxrun-runs", "patch", "sandboxrun", state["run"], "--type", "merge", "-p", patch))
        state["approved_at"] = time.monotonic()

    async def main():
        awaiting = anyio.Event()

        async def on_progress(value, total, message):
            m = re.match(r"AwaitingApproval: (run-[a-z0-9]+) ", message or "")
            if m and not awaiting.is_set():
                state["run"] = m.group(1)
                awaiting.set()

        async with client(decide_after + 300) as http, \
                streamable_http_client(f"{BASE}/mcp", http_client=http) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(approve, awaiting)
                result = await session.call_tool(
                    "execute_sql",
                    {"database": "analytics", "query": query, "environment": "production"},
                    progress_callback=on_progress, read_timeout_seconds=decide_after + 240)
            return result, time.monotonic() - started

    result, elapsed = anyio.run(main)
    assert "approved_at" in state, "the run was approved while the call waited"
    assert result.is_error is False, result
    sc = result.structured_content
    assert (sc["runName"], sc["phase"], sc["verdict"]) == (state["run"], "Succeeded", "Escalate"), sc
    assert sc["rows"] == [[1], [2]], sc
    assert elapsed >= decide_after
