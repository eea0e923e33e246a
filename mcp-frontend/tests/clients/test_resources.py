"""Resources through the official Python MCP SDK over Streamable HTTP, local backend, with a
policy that gives two agents different rules on the demo database:

- the schema resource `sandboxrun://databases/demo/schema` shows each agent exactly the tables
  and columns its own rule lets its queries read (with their types), no more; an agent without an
  sql rule reads nothing and is not offered the resource; a query written from the schema passes
  the guard and a column the schema leaves out does not;
- a file a run returned is readable as `sandboxrun://runs/{run}/files/{name}` by the agent that
  made the run and by no other; malformed and traversing URIs name nothing.
"""

from __future__ import annotations

import contextlib
import json

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import Server, hash_key

KEYS = {"analyst-01": "res-key-analyst", "ci-bot": "res-key-ci", "outsider": "res-key-outsider"}
SCHEMA = "sandboxrun://databases/demo/schema"

POLICY = """\
default: block
rules:
  - name: analyst-sql
    agents: [analyst-01]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, amount]}
        audit_log: {columns: "*"}
  - name: ci-sql
    agents: [ci-bot]
    tools: [sql]
    environments: [sandbox]
    verdict: escalate
    limits: {rows: 10}
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [account, booked_at]}
      maxLimit: 10
  - name: everyone-python
    agents: ["*"]
    tools: [python]
    environments: [sandbox]
    verdict: allow
"""


@pytest.fixture(scope="module")
def server(binary, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resources")
    keys = tmp / "keys.yaml"
    keys.write_text("".join(f"- agent: {a}\n  sha256: {hash_key(k)}\n" for a, k in KEYS.items()))
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    server = Server(binary, keys, tmp / "serve.log", "--enable-sql", "--policy-file", str(policy),
                    "--rate-limit-per-minute", "100000", "--rate-limit-burst", "10000")
    yield server
    server.stop()


@contextlib.asynccontextmanager
async def connect(server: Server, agent: str):
    headers = {"Authorization": f"Bearer {KEYS[agent]}"}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as client, \
            streamable_http_client(f"{server.base}/mcp", http_client=client) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


async def schema(session: ClientSession) -> dict:
    result = await session.read_resource(SCHEMA)
    (contents,) = result.contents
    assert contents.mime_type == "application/json"
    return json.loads(contents.text)


def tables(doc: dict) -> dict[str, list[tuple[str, str]]]:
    return {t["name"]: [(c["name"], c["type"]) for c in t["columns"]] for t in doc["tables"]}


def test_each_agent_sees_exactly_what_its_rule_lets_it_query(server):
    async def main():
        async with connect(server, "analyst-01") as s:
            doc = await schema(s)
            assert doc["database"] == "demo" and doc["dialect"] == "sqlite"
            assert doc["rule"] == "analyst-sql" and doc["verdict"] == "Allow"
            assert tables(doc) == {
                "audit_log": [("id", "INTEGER"), ("at", "TIMESTAMP WITH TIME ZONE"), ("actor", "TEXT"),
                              ("action", "TEXT"), ("detail", "TEXT")],
                "ledger": [("id", "INTEGER"), ("amount", "NUMERIC(12, 2)")],
            }, doc
            assert doc["allowWildcard"] is False and doc["maxRows"] == 1000
            # What the schema shows, the guard accepts; what it leaves out, the guard refuses.
            ok = await s.call_tool("execute_sql", {"database": "demo", "query": "SELECT id, amount FROM ledger"})
            assert ok.is_error is False, ok.content
            no = await s.call_tool("execute_sql", {"database": "demo", "query": "SELECT account FROM ledger"})
            assert no.is_error is True and no.structured_content["verdict"] == "Block"
        async with connect(server, "ci-bot") as s:
            doc = await schema(s)
            assert doc["rule"] == "ci-sql"
            assert tables(doc) == {"ledger": [("account", "TEXT"), ("booked_at", "TIMESTAMP WITH TIME ZONE")]}
            assert doc["maxRows"] == 10
            # Its queries escalate; its schema does not wait for a person, and says so.
            assert "approval" in doc["reason"], doc["reason"]
            blob = json.dumps(doc)
            assert "audit_log" not in blob and '"amount"' not in blob and '"id"' not in blob

    anyio.run(main)


def test_an_agent_without_an_sql_rule_reads_no_schema_and_is_offered_none(server):
    async def main():
        async with connect(server, "outsider") as s:
            with pytest.raises(MCPError) as refused:
                await s.read_resource(SCHEMA)
            assert refused.value.error.code == -32002, refused.value.error
            assert "blocked by policy" in refused.value.error.message
            listed = [str(r.uri) for r in (await s.list_resources()).resources]
            assert SCHEMA not in listed, listed
        async with connect(server, "analyst-01") as s:
            listed = [str(r.uri) for r in (await s.list_resources()).resources]
            assert SCHEMA in listed, listed
            templates = {t.uri_template for t in (await s.list_resource_templates()).resource_templates}
            assert templates == {"sandboxrun://databases/{database}/schema", "sandboxrun://runs/{run}/files/{name}"}
            with pytest.raises(MCPError) as unknown:
                await s.read_resource("sandboxrun://databases/nope/schema")
            assert unknown.value.error.code == -32002

    anyio.run(main)


def test_a_returned_file_is_readable_by_its_agent_and_no_other(server):
    code = ("open('/tmp/outputs/report.txt', 'w').write('north,220\\n')\n"
            "open('/tmp/outputs/raw.bin', 'wb').write(bytes(range(8)))\n")

    async def main():
        async with connect(server, "analyst-01") as s:
            run = await s.call_tool("run_python", {"code": code})
            assert run.is_error is False, run.content
            name = run.structured_content["runName"]
            uri = f"sandboxrun://runs/{name}/files/report.txt"
            (text,) = (await s.read_resource(uri)).contents
            assert text.text == "north,220\n" and text.mime_type == "text/plain"
            (blob,) = (await s.read_resource(f"sandboxrun://runs/{name}/files/raw.bin")).contents
            assert blob.blob == "AAECAwQFBgc=" and blob.mime_type == "application/octet-stream"
            listed = [str(r.uri) for r in (await s.list_resources()).resources]
            assert uri in listed, listed
            for bad in [f"sandboxrun://runs/{name}/files/missing.txt",
                        f"sandboxrun://runs/{name}/files/..%2F..%2Fetc%2Fpasswd",
                        f"sandboxrun://runs/{name}/files/.",
                        f"sandboxrun://runs/{name}/files/report.txt/x",
                        "sandboxrun://runs/../files/report.txt",
                        "file:///tmp/outputs/report.txt"]:
                with pytest.raises(MCPError) as gone:
                    await s.read_resource(bad)
                assert gone.value.error.code == -32002, (bad, gone.value.error)
        async with connect(server, "ci-bot") as s:
            with pytest.raises(MCPError) as other:
                await s.read_resource(uri)
            # The same answer as for a run that does not exist: the name reveals nothing.
            assert other.value.error.code == -32002
            assert "north" not in other.value.error.message
            listed = [str(r.uri) for r in (await s.list_resources()).resources]
            assert not any(name in u for u in listed), listed

    anyio.run(main)
