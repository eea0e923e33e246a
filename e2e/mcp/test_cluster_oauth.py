"""OAuth through the installed chart: the frontend in the cluster, installed with
frontend.oauth.issuer naming a real authorization server (panva's oidc-provider, e2e/oauth/start.sh,
on a host of its own outside the cluster's addresses) and its NetworkPolicy's egress opened to it
(networkPolicy.frontend.extraEgress), accepts the access tokens that server issues for its
resource, runs calls under the token's subject with what its scopes grant, and refuses tokens
for another resource or with a broken signature. The frontend fetches the server's metadata and
keys from its Pod, through its NetworkPolicy: the issuer's port is reachable from the Pod, and
another port of the same host is dropped by the policy (a timeout, where an ungoverned path
would be refused at once).

Environment (set by e2e/run-tests.sh): MCP_URL (the frontend's NodePort, also the chart's
frontend.oauth.resource), OAUTH_ISSUER, KUBECTL."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["MCP_URL"]
ISSUER = os.environ.get("OAUTH_ISSUER", "")
KUBECTL = os.environ.get("KUBECTL", "kubectl")

pytestmark = pytest.mark.skipif(not ISSUER, reason="OAUTH_ISSUER is not set (e2e/run-tests.sh sets it)")


def token(resource: str, scope: str) -> str:
    """A client_credentials token of the provider's static client `svc` for `resource`."""
    r = httpx2.post(f"{ISSUER}/token", timeout=30, data={
        "grant_type": "client_credentials", "client_id": "svc", "client_secret": "svc-secret",
        "resource": resource, "scope": scope})
    assert r.status_code == 200, r.text
    return r.json()["access_token"]


def claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def post_init(bearer: str) -> httpx2.Response:
    return httpx2.post(URL, timeout=30, headers={
        "Authorization": f"Bearer {bearer}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "oauth-test", "version": "1"}}})


async def call(bearer: str, tool: str, args: dict):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=120) as http, \
            streamable_http_client(URL, http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        return tools, await session.call_tool(tool, args)


def exec_in_frontend(script: str, *args: str) -> subprocess.CompletedProcess:
    """bash in the frontend's container (its image has bash and coreutils, no curl)."""
    pod = subprocess.run(
        [KUBECTL, "-n", "sandboxrun-system", "get", "pods", "-l", "app.kubernetes.io/component=frontend",
         "-o", "jsonpath={.items[0].metadata.name}"], check=True, capture_output=True, text=True).stdout
    return subprocess.run([KUBECTL, "-n", "sandboxrun-system", "exec", pod, "-c", "mcp", "--",
                           "bash", "-c", script, "_", *args], capture_output=True, text=True, timeout=60)


def test_the_frontend_reaches_the_issuer_only_through_its_egress_rule():
    host, port = ISSUER.removeprefix("http://").rsplit(":", 1)
    connect = 'timeout 5 bash -c \'exec 3<>"/dev/tcp/$0/$1"\' "$1" "$2"; echo "exit $?"'
    allowed = exec_in_frontend(connect, host, port)
    assert allowed.stdout.strip() == "exit 0", (allowed.stdout, allowed.stderr)
    # Nothing listens on the next port: without a policy the host would refuse at once (exit 1,
    # "Connection refused"); the policy drops the packets, so the attempt times out (124).
    other = exec_in_frontend(connect, host, str(int(port) + 1))
    assert other.stdout.strip() == "exit 124", (other.stdout, other.stderr)


def test_the_frontend_names_the_installed_issuer():
    r = httpx2.get(URL.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"), timeout=30)
    assert r.status_code == 200, r.text
    meta = r.json()
    assert meta["resource"] == URL and meta["authorization_servers"] == [ISSUER], meta
    # A request without a credential is pointed there.
    r = httpx2.post(URL, json={}, timeout=30, headers={"Accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and "resource_metadata" in r.headers.get("www-authenticate", ""), r.headers


def test_a_token_the_issuer_signed_for_this_server_runs_python_as_its_subject():
    bearer = token(URL, "sandboxrun:run_python")
    assert claims(bearer)["aud"] == URL and claims(bearer)["iss"] == ISSUER
    marker = f"oauth-{uuid.uuid4().hex[:12]}"
    tools, result = anyio.run(call, bearer, "run_python", {"code": f"print({marker!r})"})
    # Only what the token's scope grants is offered (close_session goes with run_python).
    assert set(tools) == {"run_python", "close_session"}, tools
    assert result.is_error is False, result
    assert result.structured_content["stdout"] == f"{marker}\n"
    run = json.loads(subprocess.run(
        [KUBECTL, "-n", "sandboxrun-runs", "get", "sandboxrun", result.structured_content["runName"],
         "-o", "json"], check=True, capture_output=True, text=True).stdout)
    assert run["spec"]["agent"] == "oauth:svc", run["spec"]


def test_a_scope_that_does_not_grant_the_tool_is_refused():
    bearer = token(URL, "sandboxrun:run_python")
    try:
        _, result = anyio.run(call, bearer, "execute_sql",
                              {"database": "analytics", "query": "SELECT 1"})
    except MCPError as e:  # refused as a protocol error: also a refusal
        assert "execute_sql" in str(e) or "scope" in str(e) or "not" in str(e), e
        return
    assert result.is_error, result
    assert "rows" not in (result.structured_content or {}), result


@pytest.mark.parametrize("which", ["another resource", "a broken signature"])
def test_tokens_not_for_this_server_are_refused(which):
    if which == "another resource":
        bearer = token("http://10.244.0.1:1/mcp", "sandboxrun:run_python")
    else:
        good = token(URL, "sandboxrun:run_python")
        head, payload, signature = good.split(".")
        flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
        bearer = f"{head}.{payload}.{flipped}"
    r = post_init(bearer)
    assert r.status_code == 401, (which, r.status_code, r.text)
    assert "invalid_token" in r.headers.get("www-authenticate", ""), r.headers
