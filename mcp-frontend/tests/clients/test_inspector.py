"""The MCP Inspector's CLI (npm @modelcontextprotocol/inspector) against sandboxrun-mcp over
stdio, Streamable HTTP and legacy SSE: list tools, call run_python. run.sh installs the
Inspector and sets INSPECTOR_NODE and INSPECTOR_JS."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import KEYS

NODE = os.environ.get("INSPECTOR_NODE")
JS = os.environ.get("INSPECTOR_JS")
pytestmark = pytest.mark.skipif(not (NODE and JS), reason="run.sh sets INSPECTOR_NODE and INSPECTOR_JS")


def inspector(*args: str) -> dict:
    out = subprocess.run([NODE, JS, "--cli", *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MCP_CATALOG_PATH": os.devnull})
    assert out.returncode == 0, f"inspector failed ({out.returncode}): {out.stderr}"
    return json.loads(out.stdout)


def targets(binary, server):
    header = f"Authorization: Bearer {KEYS['analyst-01']}"
    return {
        "stdio": [binary, "stdio", "--backend", "local"],
        "http": [f"{server.base}/mcp", "--transport", "http", "--header", header],
        "sse": [f"{server.base}/sse", "--transport", "sse", "--header", header],
    }


@pytest.mark.parametrize("transport", ["stdio", "http", "sse"])
def test_inspector_lists_and_calls(transport, binary, http_server):
    target = targets(binary, http_server)[transport]
    tools = inspector(*target, "--method", "tools/list")["tools"]
    assert [t["name"] for t in tools] == ["close_session", "run_python"]
    assert tools[1]["inputSchema"]["required"] == ["code"]
    assert "stdout" in tools[1]["outputSchema"]["properties"]

    result = inspector(*target, "--method", "tools/call", "--tool-name", "run_python",
                       "--tool-arg", "code=print(6*7)")
    assert result["isError"] is False
    assert result["structuredContent"]["stdout"] == "42\n"
    assert result["structuredContent"]["exitCode"] == 0


@pytest.mark.parametrize("transport", ["stdio", "http", "sse"])
def test_a_call_longer_than_the_task_window_comes_back_as_its_result(transport, binary, http_server):
    # The Inspector declares the tasks extension under the initialize handshake too, but takes only
    # a tool's result there: a call past the two-second task window (mcp-frontend/src/tasks.rs)
    # must still come back as its result, not as a task it cannot follow.
    target = targets(binary, http_server)[transport]
    result = inspector(*target, "--method", "tools/call", "--tool-name", "run_python",
                       "--tool-arg", "code=import time; time.sleep(3); print(6*7)")
    assert "error" not in result, result
    assert result["isError"] is False, result
    assert result["structuredContent"]["stdout"] == "42\n"
