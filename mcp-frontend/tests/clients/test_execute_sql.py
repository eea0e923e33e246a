"""execute_sql through the official Python MCP SDK over stdio, local backend, with the embedded
default policy (sql on the demo database's ledger columns in the sandbox, no SELECT *, LIMIT at
most 1000) and the embedded SQLite demo database: legitimate column queries return rows with a
LIMIT, and wildcards, injections, writes, DDL, grants, multi-statement and data-modifying CTE
queries are blocked by policy before anything runs."""

from __future__ import annotations

import contextlib

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

LEGIT = "SELECT id, account, amount FROM ledger ORDER BY id"

BLOCKED = {
    "injection-as-table-name": "SELECT id FROM ledger; DROP TABLE audit_log--",
    "drop": "DROP TABLE ledger",
    "delete": "DELETE FROM ledger",
    "update": "UPDATE ledger SET amount = 0",
    "truncate": "TRUNCATE ledger",
    "grant": "GRANT ALL ON ledger TO public",
    "multi-statement": "SELECT id FROM ledger; SELECT account FROM ledger",
    "data-modifying-cte": "WITH gone AS (DELETE FROM ledger RETURNING id) SELECT id FROM gone",
}


@contextlib.asynccontextmanager
async def session(binary: str, *extra: str):
    params = StdioServerParameters(command=binary, args=["stdio", "--backend", "local", "--enable-sql", *extra])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
        await s.initialize()
        yield s


async def legit(s: ClientSession):
    r = await s.call_tool("execute_sql", {"database": "demo", "query": LEGIT})
    assert r.is_error is False, r.content
    return r.structured_content


def test_tool_is_listed_with_schemas_and_annotations(binary):
    async def main():
        async with session(binary) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert set(tools) == {"run_python", "close_session", "execute_sql"}
            tool = tools["execute_sql"]
            assert tool.input_schema["type"] == "object"
            assert set(tool.input_schema["required"]) == {"database", "query"}
            assert "environment" in tool.input_schema["properties"]
            assert {"columns", "rows", "rowCount", "truncated", "durationMs", "runName", "verdict", "rule",
                    "reason", "phase", "executedQuery"} <= set(tool.output_schema["properties"])
            ann = tool.annotations
            assert (ann.read_only_hint, ann.destructive_hint, ann.open_world_hint) == (True, False, False)

    anyio.run(main)


def test_legit_query_returns_rows_with_a_limit(binary):
    async def main():
        async with session(binary) as s:
            sc = await legit(s)
            assert sc["phase"] == "Succeeded"
            assert sc["verdict"] == "Allow"
            assert sc["rule"] == "embedded-demo-sql"
            assert sc["columns"] == ["id", "account", "amount"]
            assert "LIMIT" in sc["executedQuery"].upper()
            assert 0 < sc["rowCount"] <= 1000
            assert sc["rowCount"] == len(sc["rows"])
            assert sc["rows"][0][0] == 1 and sc["rows"][0][1] == "umbrella"
            assert sc["truncated"] is False
            assert sc["runName"].startswith("local-")

    anyio.run(main)


def test_select_star_is_blocked_with_a_hint(binary):
    async def main():
        async with session(binary) as s:
            r = await s.call_tool("execute_sql", {"database": "demo", "query": "SELECT * FROM ledger"})
            assert r.is_error is True
            sc = r.structured_content
            assert (sc["phase"], sc["verdict"]) == ("Rejected", "Block")
            assert sc["rule"] == "embedded-demo-sql/sql-guard"
            assert sc["rows"] == [] and "executedQuery" not in sc
            text = r.content[0].text
            assert "SELECT *" in sc["reason"] or "*" in sc["reason"], sc["reason"]
            assert "column" in sc["reason"].lower(), sc["reason"]
            assert "blocked by policy" in text and sc["rule"] in text

    anyio.run(main)


def test_hostile_queries_are_blocked_and_nothing_changes(binary):
    async def main():
        async with session(binary) as s:
            before = await legit(s)
            for name, query in BLOCKED.items():
                r = await s.call_tool("execute_sql", {"database": "demo", "query": query})
                assert r.is_error is True, (name, r.content)
                sc = r.structured_content
                assert (sc["phase"], sc["verdict"]) == ("Rejected", "Block"), (name, sc)
                assert sc["reason"], name
                assert "executedQuery" not in sc, name
            after = await legit(s)
            assert after["rows"] == before["rows"]
            assert after["rowCount"] == before["rowCount"]

    anyio.run(main)


@pytest.mark.parametrize("environment", ["production", "staging"])
def test_other_environments_are_blocked_by_the_default_policy(binary, environment):
    async def main():
        async with session(binary) as s:
            r = await s.call_tool("execute_sql", {"database": "demo", "query": LEGIT, "environment": environment})
            assert r.is_error is True
            assert r.structured_content["verdict"] == "Block"
            assert "--policy-file" in r.structured_content["reason"]

    anyio.run(main)


def test_escalation_needs_cluster_mode(binary, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "rules:\n"
        "  - name: prod-approval\n"
        "    tools: [sql]\n"
        "    environments: [production]\n"
        "    verdict: escalate\n"
        "    sql:\n"
        "      databases: [demo]\n"
        "      tables: {ledger: {columns: [id, account, amount, booked_at]}}\n")

    async def main():
        async with session(binary, "--policy-file", str(policy)) as s:
            r = await s.call_tool("execute_sql", {"database": "demo", "query": LEGIT, "environment": "production"})
            assert r.is_error is True
            sc = r.structured_content
            assert (sc["verdict"], sc["rule"], sc["phase"]) == ("Escalate", "prod-approval", "Rejected")
            assert "only available in cluster mode" in r.content[0].text

    anyio.run(main)


def test_malformed_arguments_get_actionable_errors(binary):
    async def main():
        async with session(binary) as s:
            r = await s.call_tool("execute_sql", {"query": LEGIT})
            assert r.is_error and "missing required argument `database`" in r.content[0].text
            r = await s.call_tool("execute_sql", {"database": "demo", "query": LEGIT, "environment": "prod"})
            assert r.is_error and "sandbox, staging, production" in r.content[0].text
            r = await s.call_tool("execute_sql", {"database": "nope", "query": LEGIT})
            assert r.is_error and r.structured_content["verdict"] == "Block"
            assert "demo" in r.structured_content["reason"]
            # run_python is unaffected.
            r = await s.call_tool("run_python", {"code": "print(6*7)"})
            assert r.structured_content["stdout"] == "42\n"

    anyio.run(main)
