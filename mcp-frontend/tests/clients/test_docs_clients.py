"""The client configurations of docs/clients.md, as written there (e2e/docs/snippets.py takes
them from the page), fed to the official Python SDK's clients, each making one `run_python` call
through the server: stdio, Cursor's and VS Code's remote configurations with an API key, and
mcp-remote (the pinned version, installed by run.sh) bridging stdio to Streamable HTTP. The OAuth
configuration is test_oauth.py's.

What a test replaces, and only this (docs/clients.md says so too): the URL
`https://mcp.example.com/mcp` becomes the test server's, the binary's path this build's, a key
the client would read from the environment or ask for (`${env:...}`, `${input:...}`, `KEY`) the
test's key, and `npx -y mcp-remote@V` the same version from run.sh's npm install on Node 22.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import BIN, KEYS, ROOT, call_print

sys.path.insert(0, str(ROOT / "e2e" / "docs"))
from snippets import snippet  # noqa: E402

EXAMPLE_URL = "https://mcp.example.com/mcp"
KEY = KEYS["analyst-01"]


def config(text: str) -> dict:
    """The server entry of a client configuration (Cursor's `mcpServers` or VS Code's `servers`)."""
    document = json.loads(text)
    servers = document.get("mcpServers") or document["servers"]
    return servers["sandboxrun"] | ({"inputs": document["inputs"]} if "inputs" in document else {})


async def call_over_http(url: str, headers: dict[str, str]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=120))
        read, write, *_ = await stack.enter_async_context(streamable_http_client(url, http_client=client))
        await call_print(await stack.enter_async_context(ClientSession(read, write)))


def test_the_stdio_configuration(tmp_path):
    c = config(snippet("clients-stdio"))
    assert c["command"] == "/path/to/sandboxrun/target/release/sandboxrun-mcp", c

    async def main():
        params = StdioServerParameters(command=BIN, args=c["args"], env={**os.environ}, cwd=str(tmp_path))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await call_print(session)

    anyio.run(main)


def test_cursors_configuration_with_an_api_key(http_server):
    c = config(snippet("clients-cursor"))
    assert c["url"] == EXAMPLE_URL
    # Cursor puts the environment variable's value where ${env:NAME} stands.
    headers = {k: re.sub(r"\$\{env:SANDBOXRUN_KEY\}", KEY, v) for k, v in c["headers"].items()}
    anyio.run(call_over_http, c["url"].replace("https://mcp.example.com", http_server.base), headers)


def test_vs_codes_configuration_with_an_api_key(http_server):
    c = config(snippet("clients-vscode"))
    assert c["type"] == "http" and c["url"] == EXAMPLE_URL
    # VS Code asks for each input it names (a password prompt here) and puts the answer in place.
    [prompt] = c["inputs"]
    assert prompt["type"] == "promptString" and prompt["password"] is True
    headers = {k: v.replace("${input:" + prompt["id"] + "}", KEY) for k, v in c["headers"].items()}
    anyio.run(call_over_http, c["url"].replace("https://mcp.example.com", http_server.base), headers)


def test_mcp_remote_bridges_a_stdio_client_to_the_server(http_server, tmp_path):
    c = config(snippet("clients-mcp-remote"))
    assert c["command"] == "npx"
    assert c["args"][:2] == ["-y", f"mcp-remote@{os.environ['MCP_REMOTE_VERSION']}"], c["args"]
    url_at = c["args"].index(EXAMPLE_URL)
    args = [*c["args"][2:]]
    args[url_at - 2] = f"{http_server.base}/mcp"
    # mcp-remote allows plain http only to localhost, and keeps its state under HOME.
    args[url_at - 2] = args[url_at - 2].replace("127.0.0.1", "localhost")
    env = {**os.environ, "HOME": str(tmp_path),
           **{k: v.replace("KEY", KEY) for k, v in c["env"].items()}}

    async def main():
        params = StdioServerParameters(command=os.environ["MCP_REMOTE_NODE"],
                                       args=[os.environ["MCP_REMOTE_JS"], *args], env=env, cwd=str(tmp_path))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await call_print(session)

    anyio.run(main)
