"""The README's laptop path and its client configurations, run as written (e2e/docs/snippets.py
takes them from the README): `./quickstart.sh` and `./quickstart.sh stdio`, and the two JSON
configurations fed to the official Python SDK's clients, each making one `run_python` call.

What is not the README's: the server binary is the tests' own build (SANDBOXRUN_MCP_BIN, which
quickstart.sh takes instead of building an optimised one), `/path/to/sandboxrun` is this checkout,
`YOUR_KEY` is the key quickstart.sh printed, and HOME is a new directory (so the key is created as
on a first run); the sandbox's root file systems and runsc come from the cache CI built them in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import BIN, ROOT, call_print

sys.path.insert(0, str(ROOT / "e2e" / "docs"))
from snippets import snippet  # noqa: E402

CACHE = os.environ.get("SANDBOXRUN_CACHE", str(Path.home() / ".cache" / "sandboxrun"))


def env_for(home: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "SANDBOXRUN_CACHE": CACHE, "SANDBOXRUN_MCP_BIN": BIN}


def commands(body: str) -> list[str]:
    """The command lines of a shell snippet, comments dropped."""
    return [line.split("#", 1)[0].strip() for line in body.splitlines() if line.split("#", 1)[0].strip()]


def test_the_laptop_snippet_serves_http_and_the_http_configuration_reaches_it(tmp_path):
    serve, stdio = commands(snippet("laptop"))
    assert (serve, stdio) == ("./quickstart.sh", "./quickstart.sh stdio")
    with socket.socket() as s:   # the README's address: nothing else may hold it
        assert s.connect_ex(("127.0.0.1", 8000)) != 0, "127.0.0.1:8000 is taken; quickstart.sh serves there"
    log = tmp_path / "quickstart.log"
    proc = subprocess.Popen(shlex.split(serve), cwd=ROOT, env=env_for(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=log.open("w"), start_new_session=True)
    try:
        key = None
        deadline = time.monotonic() + 600   # a generous bound: runsc and the root file systems are cached
        while time.monotonic() < deadline:
            text = log.read_text()
            found = re.search(r"API key \(Authorization: Bearer \.\.\.\): (\S+)", text)
            if found:
                key = found.group(1)
                try:
                    if httpx2.get("http://127.0.0.1:8000/healthz", timeout=1).status_code == 200:
                        break
                except httpx2.HTTPError:
                    pass
            assert proc.poll() is None, f"quickstart.sh exited {proc.returncode}: {text}"
            time.sleep(0.2)
        else:
            pytest.fail(f"quickstart.sh did not serve within 600 s: {log.read_text()}")
        assert key == (tmp_path / ".config" / "sandboxrun" / "api-key").read_text()

        config = json.loads(snippet("client-http"))["mcpServers"]["sandboxrun"]
        headers = {k: v.replace("YOUR_KEY", key) for k, v in config["headers"].items()}

        async def main():
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=120))
                read, write, *_ = await stack.enter_async_context(
                    streamable_http_client(config["url"], http_client=client))
                await call_print(await stack.enter_async_context(ClientSession(read, write)))

        anyio.run(main)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_stdio_configuration_starts_quickstart_and_calls_run_python(tmp_path):
    config = json.loads(snippet("client-stdio"))["mcpServers"]["sandboxrun"]
    command = config["command"].replace("/path/to/sandboxrun", str(ROOT))
    assert command == str(ROOT / "quickstart.sh")
    # The stdio line of the laptop snippet is this configuration's command.
    assert commands(snippet("laptop"))[1] == "./quickstart.sh " + " ".join(config["args"])

    async def main():
        params = StdioServerParameters(command=command, args=config["args"], env=env_for(tmp_path), cwd=str(tmp_path))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await call_print(session)

    anyio.run(main)
