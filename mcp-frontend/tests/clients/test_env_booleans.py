"""Boolean environment variables as people write them (docs/laptop.md and quickstart.sh write
`SANDBOXRUN_ALLOW_WEAK_LIMITS=1`): `1`, `yes`, `on`, `true` in any case turn a switch on; `0`, `no`, `off`,
`false` leave it off; anything else stops the server at start-up with a message
naming the variable's accepted values. Checked through the official Python SDK over stdio: the
switch decides whether `execute_sql` is offered."""

from __future__ import annotations

import os
import subprocess

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def offered(binary: str, value: str) -> set[str]:
    env = dict(os.environ, SANDBOXRUN_ENABLE_SQL=value)
    params = StdioServerParameters(command=binary, args=["stdio", "--backend", "local", "--armed-sandboxes", "0"],
                                   env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        return {t.name for t in (await s.list_tools()).tools}


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", "y"])
def test_a_true_spelling_turns_the_switch_on(binary, value):
    assert "execute_sql" in anyio.run(offered, binary, value)


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "n"])
def test_a_false_spelling_leaves_it_off(binary, value):
    assert "execute_sql" not in anyio.run(offered, binary, value)


def test_another_value_stops_the_server_with_a_message(binary):
    done = subprocess.run([binary, "stdio", "--backend", "local", "--armed-sandboxes", "0"],
                          env=dict(os.environ, SANDBOXRUN_ENABLE_SQL="maybe"), input="",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "maybe" in done.stderr and "--enable-sql" in done.stderr, done.stderr
