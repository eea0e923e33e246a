"""Hostile code through `sandboxrun-mcp stdio` (the embedded default), with the official Python
SDK, on each local engine: the same list the operator's e2e suite runs on the cluster. Every
attack must be contained and reported as a result, and the session must keep serving."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ENGINES = ["gvisor", "bubblewrap"]
# The test process carries a secret the sandbox must not see.
CANARY = "SANDBOXRUN_CANARY_SECRET"
os.environ[CANARY] = "do-not-leak"


@contextlib.asynccontextmanager
async def session_for(binary: str, engine: str):
    params = StdioServerParameters(
        command=binary, args=["stdio", "--backend", "local", "--isolation", engine], env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def run(binary: str, engine: str, code: str, **args):
    async def main():
        async with session_for(binary, engine) as session:
            first = await session.call_tool("run_python", {"code": code, **args})
            # The session survives whatever the code did.
            after = await session.call_tool("run_python", {"code": "print('alive')"})
            assert after.structured_content["stdout"] == "alive\n"
            return first
    return anyio.run(main)


def listener():
    """A TCP listener on loopback that counts connections; the sandbox must not reach it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    hits = []

    def accept():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            hits.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return sock, hits


PROBE = r'''
import json, os, socket
out = {"env": sorted(os.environ)}
try:
    out["traversal"] = open("../../../../etc/shadow").read()[:100]
except OSError as e:
    out["traversal"] = "error: " + e.strerror
out["hostname"] = open("/../../etc/hostname").read()
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
    out["tcp"] = "connected"
except OSError as e:
    out["tcp"] = "failed: %s" % e
with open("/proc/net/dev") as f:
    out["ifaces"] = sorted(l.split(":")[0].strip() for l in f.readlines()[2:])
for path in ("/etc/evil", "/usr/evil", "/evil"):
    try:
        open(path, "w").write("x"); out[path] = "written"
    except OSError as e:
        out[path] = "error: " + e.strerror
try:
    with open("/tmp/fill", "wb") as f:
        for _ in range(256):
            f.write(b"\0" * (1024 * 1024)); f.flush()
    out["tmpfill"] = "wrote 256 MiB"
except OSError as e:
    out["tmpfill"] = "error: " + e.strerror
print(json.dumps(out))
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_env_files_network_and_writes_are_contained(binary, engine):
    sock, hits = listener()
    try:
        port = sock.getsockname()[1]
        result = run(binary, engine, PROBE.replace("PORT", str(port)))
    finally:
        sock.close()
    assert result.is_error is False, result
    out = json.loads(result.structured_content["stdout"])
    assert CANARY not in out["env"]
    assert set(out["env"]) <= {"PATH", "HOME", "LANG", "LC_CTYPE", "PWD"}, out["env"]
    with open("/etc/hostname") as f:
        assert out["hostname"] != f.read(), "saw the host's /etc/hostname"
    # Traversal ends at the sandbox root: whatever /etc/shadow it finds (if any) is the image's.
    try:
        with open("/etc/shadow") as f:
            assert out["traversal"] != f.read()[:100], "read the host's /etc/shadow"
    except PermissionError:
        pass
    assert out["tcp"].startswith("failed"), out
    assert hits == [], "the loopback listener accepted a sandbox connection"
    assert out["ifaces"] == ["lo"], out
    for path in ("/etc/evil", "/usr/evil", "/evil"):
        assert out[path].startswith("error"), out
    assert out["tmpfill"].startswith("error"), out


@pytest.mark.parametrize("engine", ENGINES)
def test_fork_bomb_is_stopped(binary, engine):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(binary, engine, code, timeoutSeconds=10)
    assert result.is_error is True
    assert result.structured_content["phase"] != "Succeeded"


@pytest.mark.parametrize("engine", ENGINES)
def test_memory_bomb_is_stopped(binary, engine):
    result = run(binary, engine, "b = bytearray(1024 * 1024 * 1024)\nprint(len(b))")
    assert result.is_error is True
    sc = result.structured_content
    assert sc["phase"] == "Failed" and sc["stdout"] == "", sc


@pytest.mark.parametrize("engine", ENGINES)
def test_busy_loop_times_out(binary, engine):
    result = run(binary, engine, "while True: pass", timeoutSeconds=2)
    assert result.is_error is True
    assert result.structured_content["phase"] == "TimedOut"
