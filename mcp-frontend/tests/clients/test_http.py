"""Raw HTTP against `serve`: authentication, Origin/Host checks, rate limit, body limit,
invalid JSON, health and metrics. Every refusal is a JSON-RPC error body a client can show."""

from __future__ import annotations

import httpx2
import pytest

from conftest import ALLOWED_ORIGIN, KEYS, auth

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw-test", "version": "1"}}}


def post(server, body=None, headers=None, content=None, path="/mcp"):
    h = {**ACCEPT, **(headers or {})}
    return httpx2.post(f"{server.base}{path}", json=body, content=content, headers=h, timeout=30)


def error_message(resp) -> str:
    body = resp.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    return body["error"]["message"]


def test_initialize_with_key_works_and_names_the_server(http_server):
    r = post(http_server, INIT, auth())
    assert r.status_code == 200
    assert "mcp-session-id" in r.headers
    assert '"name":"sandboxrun"' in r.text


def test_x_api_key_header_works(http_server):
    r = post(http_server, INIT, {"X-Api-Key": KEYS["ci-bot"]})
    assert r.status_code == 200


def test_no_key_is_401(http_server):
    for path in ("/mcp", "/messages?sessionId=x"):
        r = post(http_server, INIT, path=path)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "missing API key" in error_message(r)
    r = httpx2.get(f"{http_server.base}/sse", timeout=10)
    assert r.status_code == 401


def test_wrong_key_is_401(http_server):
    r = post(http_server, INIT, {"Authorization": "Bearer not-a-key"})
    assert r.status_code == 401
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    assert "invalid API key" in error_message(r)
    r = post(http_server, INIT, {"Authorization": f"Bearer {KEYS['analyst-01'].upper()}"})
    assert r.status_code == 401


def test_foreign_origin_is_403_allowed_origin_passes(http_server):
    r = post(http_server, INIT, {**auth(), "Origin": "https://evil.example"})
    assert r.status_code == 403
    assert "Origin https://evil.example is not allowed" in error_message(r)
    r = post(http_server, INIT, {**auth(), "Origin": ALLOWED_ORIGIN})
    assert r.status_code == 200


def test_unlisted_host_is_403(http_server):
    r = post(http_server, INIT, {**auth(), "Host": "attacker.example"})
    assert r.status_code == 403
    assert "Host" in error_message(r)


def test_over_the_rate_is_429_per_agent(limited_server):
    codes = [post(limited_server, INIT, auth("analyst-01")).status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200]
    assert codes[3:] == [429, 429]
    r = post(limited_server, INIT, auth("analyst-01"))
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    assert "rate limit exceeded for agent analyst-01" in error_message(r)
    # Another agent has its own bucket.
    assert post(limited_server, INIT, auth("ci-bot")).status_code == 200


def test_oversized_body_is_413_and_the_server_keeps_serving(http_server):
    big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"x" * (2 << 20) + b'"}}'
    r = post(http_server, headers=auth(), content=big)
    assert r.status_code == 413
    assert "the limit is 1048576 bytes" in error_message(r)
    assert post(http_server, INIT, auth()).status_code == 200


@pytest.mark.parametrize("path", ["/mcp", "/messages?sessionId=whatever"])
def test_invalid_json_is_a_parse_error_and_the_server_keeps_serving(http_server, path):
    r = post(http_server, headers=auth(), content=b"{not json", path=path)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32700
    assert "not valid JSON" in r.json()["error"]["message"]
    assert post(http_server, INIT, auth()).status_code == 200


def test_sse_session_belongs_to_its_agent(http_server):
    with httpx2.stream("GET", f"{http_server.base}/sse", headers=auth("analyst-01"), timeout=30) as stream:
        lines = stream.iter_lines()
        assert next(lines) == "event: endpoint"
        endpoint = next(lines).removeprefix("data: ")
        assert endpoint.startswith("/messages?sessionId=")
        other = post(http_server, INIT, auth("ci-bot"), path=endpoint)
        assert other.status_code == 404
        mine = post(http_server, INIT, auth("analyst-01"), path=endpoint)
        assert mine.status_code == 202


def test_health_and_metrics_need_no_key(http_server):
    assert httpx2.get(f"{http_server.base}/healthz").text == "ok"
    post(http_server, INIT)  # one refusal to count
    metrics = httpx2.get(f"{http_server.base}/metrics").text
    assert 'sandboxrun_mcp_http_rejections_total{reason="unauthorized"}' in metrics


def test_streamable_session_belongs_to_its_agent(http_server):
    session = post(http_server, INIT, auth("analyst-01")).headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    other = post(http_server, ping, {**auth("ci-bot"), "Mcp-Session-Id": session})
    assert other.status_code == 404
    assert "session not found" in error_message(other)
    mine = post(http_server, ping, {**auth("analyst-01"), "Mcp-Session-Id": session,
                                    "Mcp-Protocol-Version": "2025-06-18"})
    assert mine.status_code != 404


def test_a_key_targets_only_the_environments_its_entry_lists(binary, tmp_path):
    """The caller chooses a call's environment; what it may choose is bound to its API key: a
    key whose entry lists no environments may target only the sandbox, one that lists staging
    may target staging, and a refused call says what the key allows, before policy or any run."""
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from conftest import Server, hash_key

    keys = tmp_path / "keys.yaml"
    keys.write_text(
        f"- agent: sandbox-only\n  sha256: {hash_key('key-sandbox')}\n"
        f"- agent: stager\n  sha256: {hash_key('key-staging')}\n  environments: [sandbox, staging]\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: block\nrules:\n  - {name: metrics-anywhere, tools: [metrics], verdict: allow}\n")
    server = Server(binary, keys, tmp_path / "serve.log", "--enable-metrics", "--policy-file", str(policy))
    query = {"query": "sum(sandboxrun_tool_calls_total)"}

    async def call(key, environment):
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as client, \
                streamable_http_client(f"{server.base}/mcp", http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            return await s.call_tool("fetch_metrics", {**query, "environment": environment})

    try:
        async def main():
            r = await call("key-sandbox", "sandbox")
            assert r.is_error is False, r.content
            for environment in ("staging", "production"):
                r = await call("key-sandbox", environment)
                assert r.is_error is True
                text = r.content[0].text
                assert f"may not target the {environment} environment" in text, text
                assert "allows only sandbox" in text, text
            r = await call("key-staging", "staging")
            assert r.is_error is False, r.content
            r = await call("key-staging", "production")
            assert r.is_error is True and "allows only sandbox, staging" in r.content[0].text

        anyio.run(main)
    finally:
        server.stop()
