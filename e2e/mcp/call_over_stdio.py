"""One run_python call through `sandboxrun-mcp stdio --backend kube`, with the official Python MCP
SDK: the frontend watches its runs with whatever list the API server in KUBECONFIG serves, and
the cluster's operator runs them. e2e/run-tests.sh points it at an API server without WatchList
(e2e/cluster/apiserver-without-watchlist.sh): the frontend must fall back to a paged list and
still hand back the result.

Usage: call_over_stdio.py SANDBOXRUN_MCP_BINARY EXPECTED_LOG_TEXT
Exit status 1 unless the call printed its token and the frontend's log holds EXPECTED_LOG_TEXT.
Not collected by pytest."""

from __future__ import annotations

import os
import sys
import tempfile
import uuid

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def main(binary: str, expected_log: str) -> int:
    token = f"tok-{uuid.uuid4().hex[:12]}"
    env = dict(os.environ)
    params = StdioServerParameters(command=binary, args=["stdio", "--backend", "kube"], env=env)
    with tempfile.TemporaryFile("w+") as errlog:
        async with stdio_client(params, errlog=errlog) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            with anyio.fail_after(180):
                result = await session.call_tool("run_python", {"code": f"print({token!r})"})
        errlog.seek(0)
        log = errlog.read()
    out = result.structured_content or {}
    problems = []
    if result.is_error or out.get("stdout") != f"{token}\n":
        problems.append(f"the call did not come back with its output: {result}")
    if expected_log not in log:
        problems.append(f"the frontend's log does not say {expected_log!r}:\n{log[-3000:]}")
    for p in problems:
        print(f"PROBLEM {p}")
    if not problems:
        print(f"the call came back ({out.get('runName')}); the frontend said {expected_log!r}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    raise SystemExit(anyio.run(main, sys.argv[1], sys.argv[2]))
