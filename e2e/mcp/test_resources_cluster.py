"""Resources on the cluster through the official Python MCP SDK (the frontend's NodePort, API
keys): the schema of the test PostgreSQL (`sandboxrun://databases/analytics/schema`) as each of two
agents' rules let their queries read it (e2e/values-governance.yaml: e2e-sql-sandbox for the test
agent, e2e-sql-narrow for e2e-narrow), read by the operator as a SandboxRun of its own
(`spec.sql.schema`) with its decision and exactly one audit line; and a file a run returned, read
back from the run's status by the agent that made the run and by no other.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, MCP_AGENT, KUBECTL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from operator_audit import the_audit_line
from stress import NARROW_AGENT, narrow_key

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
AGENT = os.environ["MCP_AGENT"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
RUNS_NS = "sandboxrun-runs"
SCHEMA = "sandboxrun://databases/analytics/schema"


@contextlib.asynccontextmanager
async def connect(key: str):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120) as client, \
            streamable_http_client(URL, http_client=client) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


def run_json(name: str) -> dict:
    return json.loads(subprocess.run([KUBECTL, "-n", RUNS_NS, "get", "sandboxrun", name, "-o", "json"],
                                     check=True, capture_output=True, text=True).stdout)


async def read_schema(key: str) -> dict:
    async with connect(key) as s:
        (contents,) = (await s.read_resource(SCHEMA)).contents
        assert contents.mime_type == "application/json"
        return json.loads(contents.text)


def columns(doc: dict) -> dict[str, list[str]]:
    return {t["name"]: [c["name"] for c in t["columns"]] for t in doc["tables"]}


def test_two_agents_see_exactly_their_own_rules_tables_and_columns():
    wide = anyio.run(read_schema, KEY)
    assert wide["rule"] == "e2e-sql-sandbox" and wide["dialect"] == "postgres", wide
    assert columns(wide) == {"big": ["id", "amount"], "ledger": ["id", "account", "amount", "booked_at"]}, wide
    ledger = {c["name"]: c["type"] for t in wide["tables"] if t["name"] == "ledger" for c in t["columns"]}
    assert ledger == {"id": "integer", "account": "text", "amount": "numeric",
                      "booked_at": "timestamp with time zone"}, ledger
    narrow = anyio.run(read_schema, narrow_key())
    assert narrow["rule"] == "e2e-sql-narrow", narrow
    assert columns(narrow) == {"ledger": ["account"]}, narrow
    assert narrow["maxRows"] == 50
    # Each read was a SandboxRun the operator decided, executed and audited once.
    for doc, agent in [(wide, AGENT), (narrow, NARROW_AGENT)]:
        run = run_json(doc["runName"])
        assert run["spec"]["agent"] == agent
        assert run["spec"]["sql"] == {"database": "analytics", "schema": True}, run["spec"]
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert run["status"]["decision"]["rule"] == doc["rule"]
        line = the_audit_line(doc["runName"])
        assert line["agent"] == agent and line["tool"] == "sql" and line["schema_read"] is True, line


def test_a_schema_is_judged_in_its_databases_environment():
    async def main():
        async with connect(narrow_key()) as s:
            # The production database is judged in production, whatever the read names: not the
            # narrow agent's sandbox rule but the production rule, which escalates its queries
            # and still shows its schema.
            (contents,) = (await s.read_resource("sandboxrun://databases/analytics-production/schema")).contents
            doc = json.loads(contents.text)
            assert doc["rule"] == "e2e-sql-production-needs-approval", doc
            assert "approval" in doc["reason"] and doc["maxRows"] == 100, doc
            assert columns(doc) == {"ledger": ["id", "account", "amount", "booked_at"]}, doc
            # A database no rule of the agent covers shows nothing.
            with pytest.raises(MCPError) as refused:
                await s.read_resource("sandboxrun://databases/nope/schema")
            assert refused.value.error.code == -32002, refused.value.error
            assert "blocked by policy" in refused.value.error.message, refused.value.error.message

    anyio.run(main)


def test_a_returned_file_is_readable_by_its_agent_and_no_other():
    async def main():
        async with connect(KEY) as s:
            run = await s.call_tool("run_python", {
                "code": "open('/tmp/outputs/totals.csv', 'w').write('north,220\\n')\n"})
            assert run.is_error is False, run.content
            name = run.structured_content["runName"]
            uri = f"sandboxrun://runs/{name}/files/totals.csv"
            (contents,) = (await s.read_resource(uri)).contents
            assert contents.text == "north,220\n" and contents.mime_type == "text/csv", contents
            with pytest.raises(MCPError) as missing:
                await s.read_resource(f"sandboxrun://runs/{name}/files/other.csv")
            assert missing.value.error.code == -32002
        async with connect(narrow_key()) as s:
            with pytest.raises(MCPError) as other:
                await s.read_resource(uri)
            assert other.value.error.code == -32002
            assert "north" not in other.value.error.message

    anyio.run(main)
