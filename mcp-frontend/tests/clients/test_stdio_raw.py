"""Raw stdio framing: invalid JSON and malformed requests get JSON-RPC errors, and the server
keeps serving the next line (rmcp alone would drop invalid JSON silently)."""

from __future__ import annotations

import json
import subprocess


def test_invalid_json_gets_a_parse_error_then_the_next_request_works(binary):
    proc = subprocess.Popen([binary, "stdio", "--backend", "local"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        def send(line: str) -> dict:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            return json.loads(proc.stdout.readline())

        init = send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}))
        assert init["result"]["serverInfo"]["name"] == "sandboxrun"
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")

        bad = send("{this is not json")
        assert bad["error"]["code"] == -32700 and bad["id"] is None
        assert "not valid JSON" in bad["error"]["message"]

        bad = send(json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": "oops"}))
        assert bad["error"]["code"] == -32600 and bad["id"] == 5

        ok = send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                              "params": {"name": "run_python", "arguments": {"code": "print(6*7)"}}}))
        assert ok["id"] == 2
        assert ok["result"]["structuredContent"]["stdout"] == "42\n"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
