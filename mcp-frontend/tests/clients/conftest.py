"""Fixtures for the client tests: the server binary, API keys, and running HTTP servers.

These tests drive `sandboxrun-mcp` with MCP clients this project did not write (the official
Python SDK, the MCP Inspector CLI) and with raw HTTP for the security checks. run.sh builds the
binary and sets SANDBOXRUN_MCP_BIN; the local sandbox backend must work on the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx2
import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = os.environ.get("SANDBOXRUN_MCP_BIN", str(ROOT / "target" / "debug" / "sandboxrun-mcp"))

# Two agents with their keys; the key file holds only the hashes.
KEYS = {"analyst-01": "test-key-analyst", "ci-bot": "test-key-ci"}
ALLOWED_ORIGIN = "http://localhost:6274"
# A program that prints a line a second, for the tests of output streamed while the code runs.
TICKS = "import sys, time\nfor i in range(3):\n    print('tick', i)\n    time.sleep(1)\nprint('done', file=sys.stderr)\n"


def hash_key(key: str) -> str:
    out = subprocess.run([BIN, "hash-key"], input=key, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="session")
def binary() -> str:
    assert Path(BIN).exists(), f"{BIN} is missing: build it with cargo build -p sandboxrun-mcp"
    return BIN


@pytest.fixture(scope="session")
def key_file(tmp_path_factory, binary) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text("".join(f"- agent: {agent}\n  sha256: {hash_key(key)}\n" for agent, key in KEYS.items()))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `sandboxrun-mcp serve` process on a free loopback port (or on `port`, for a caller that
    must name the server's URL in its arguments)."""

    def __init__(self, binary: str, key_file: Path, log: Path, *extra: str, port: int | None = None):
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--api-keys-file", str(key_file),
             "--allowed-origin", ALLOWED_ORIGIN, "--backend", "local", *extra],
            stdout=subprocess.DEVNULL, stderr=log.open("w"),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {log.read_text()}")
            try:
                if httpx2.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy: {log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def http_server(binary, key_file, tmp_path_factory):
    server = Server(binary, key_file, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def limited_server(binary, key_file, tmp_path_factory):
    """A server with a tiny rate limit: 3 requests at once, then one a minute."""
    server = Server(binary, key_file, tmp_path_factory.mktemp("logs") / "limited.log",
                    "--rate-limit-per-minute", "1", "--rate-limit-burst", "3")
    yield server
    server.stop()


def auth(agent: str = "analyst-01") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[agent]}"}


async def call_print(session) -> None:
    """Initialize a client session and call run_python once through it: `print(6 * 7)` prints 42.
    (For the tests of documented client configurations: each must reach the server and run code.)"""
    init = await session.initialize()
    assert init.server_info.name == "sandboxrun"
    result = await session.call_tool("run_python", {"code": "print(6 * 7)"})
    assert not result.is_error, result
    assert result.structured_content["stdout"] == "42\n", result.structured_content
