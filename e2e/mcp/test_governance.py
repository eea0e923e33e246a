"""Governance through MCP on the cluster: the official Python MCP SDK calls execute_sql on the
frontend installed by the chart (NodePort, API key). The frontend turns each call into a
SandboxRun; the operator judges it with the policy of e2e/values-governance.yaml and runs allowed
queries against the test PostgreSQL (e2e/postgres/start.sh) as its read-only role, with the
credentials only it holds (e2e/postgres/databases-secret.sh).

Every call is checked to leave exactly one SandboxRun (found by a marker comment in its query)
and exactly one JSON audit line on the operator's log, both with the expected verdict.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, MCP_AGENT, KUBECONFIG, KUBECTL,
SANDBOXRUN_TEST_POSTGRES_URL (the read-only role's URL, to check that nothing was changed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from operator_audit import audit_lines, the_audit_line

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
AGENT = os.environ["MCP_AGENT"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
PG_URL = os.environ["SANDBOXRUN_TEST_POSTGRES_URL"]
PSQL = "/usr/lib/postgresql/15/bin/psql"

RUNS_NS = "sandboxrun-runs"
SYSTEM_NS = "sandboxrun-system"
DATABASE = "analytics"
# The same PostgreSQL, configured as production's (e2e/postgres/databases-secret.sh).
PRODUCTION_DATABASE = "analytics-production"
# From e2e/values-governance.yaml.
APPROVAL_WAIT = 20
APPROVAL_TIMEOUT = 45
SANDBOX_RULE = "e2e-sql-sandbox"
PRODUCTION_RULE = "e2e-sql-production-needs-approval"


def kubectl(*args: str) -> str:
    return subprocess.run([KUBECTL, *args], check=True, capture_output=True, text=True).stdout


def psql(query: str) -> str:
    return subprocess.run([PSQL, "-X", "-tA", PG_URL, "-c", query], check=True,
                          capture_output=True, text=True).stdout.strip()


class Call:
    """One execute_sql call: the result, the progress messages, and the marker in its query."""

    def __init__(self, query: str, environment: str, database: str = DATABASE):
        self.marker = f"call-{uuid.uuid4().hex}"
        # A leading comment keeps the marker in spec.sql.query whatever the query's tail is.
        self.query = f"/* {self.marker} */ {query}"
        self.environment = environment
        self.database = database
        self.progress: list[str] = []
        self.awaiting = anyio.Event()
        self.awaiting_run: str | None = None
        self.result = None
        self.elapsed = 0.0

    async def on_progress(self, progress: float, total: float | None, message: str | None):
        self.progress.append(message or "")
        m = re.match(r"AwaitingApproval: (run-[a-z0-9]+) ", message or "")
        if m and not self.awaiting.is_set():
            self.awaiting_run = m.group(1)
            self.awaiting.set()

    async def run(self, decide=None):
        """Calls the tool; `decide(call)` runs alongside it (e.g. to approve the run)."""
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"},
                                      timeout=240) as client:
            async with streamable_http_client(URL, http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    tools = (await session.list_tools()).tools
                    assert "execute_sql" in [t.name for t in tools]
                    started = time.monotonic()
                    async with anyio.create_task_group() as tg:
                        if decide is not None:
                            tg.start_soon(decide, self)
                        self.result = await session.call_tool(
                            "execute_sql",
                            {"database": self.database, "query": self.query,
                             "environment": self.environment},
                            read_timeout_seconds=240, progress_callback=self.on_progress)
                    self.elapsed = time.monotonic() - started
        return self


def call(query: str, environment: str = "sandbox", decide=None, database: str = DATABASE) -> Call:
    c = Call(query, environment, database)
    anyio.run(c.run, decide)
    return c


def text_of(result) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def runs_with_marker(marker: str) -> list[dict]:
    items = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxruns", "-o", "json"))["items"]
    return [r for r in items if marker in ((r["spec"].get("sql") or {}).get("query") or "")]


def the_run(c: Call, run_name: str) -> dict:
    """The call's one SandboxRun."""
    runs = runs_with_marker(c.marker)
    assert [r["metadata"]["name"] for r in runs] == [run_name], "exactly one SandboxRun per call"
    run = runs[0]
    assert run["spec"]["agent"] == AGENT
    assert run["spec"]["environment"] == c.environment
    assert run["spec"]["sql"] == {"database": c.database, "query": c.query}
    return run


def assert_recorded(c: Call, verdict: str, phase: str, rule: str, reason: str):
    """One SandboxRun and one audit line, both with this verdict, phase and rule; returns both."""
    sc = c.result.structured_content
    run = the_run(c, sc["runName"])
    st = run["status"]
    assert st["phase"] == phase, st
    assert st["decision"]["verdict"] == verdict, st
    assert st["decision"]["rule"] == rule, st
    line = the_audit_line(sc["runName"])
    assert line["agent"] == AGENT and line["tool"] == "sql", line
    assert line["environment"] == c.environment, line
    assert line["verdict"] == verdict, line  # one string form: the audit line says what the status says
    assert line["rule"] == rule, line
    assert line["phase"] == phase and line["phase_reason"] == reason, line
    assert line["duration_ms"] >= 0, line
    return run, line


def test_a_column_query_in_the_sandbox_returns_its_rows():
    c = call("SELECT id, account, amount FROM ledger WHERE id <= 3 ORDER BY id")
    assert c.result.is_error is False, text_of(c.result)
    sc = c.result.structured_content
    assert sc["columns"] == ["id", "account", "amount"]
    assert sc["rows"] == [[1, "umbrella", "-420.81"], [2, "globex", "-341.62"],
                          [3, "hooli", "-262.43"]]
    assert sc["rowCount"] == 3 and sc["truncated"] is False
    assert (sc["verdict"], sc["rule"], sc["phase"]) == ("Allow", SANDBOX_RULE, "Succeeded")
    assert sc["executedQuery"].rstrip().endswith("LIMIT 1001"), sc["executedQuery"]
    run, line = assert_recorded(c, "Allow", "Succeeded", SANDBOX_RULE, "QueryCompleted")
    assert run["status"]["result"]["rows"] == sc["rows"]
    assert line["approved"] is False


def test_the_million_row_table_is_capped_and_flagged_truncated():
    # The guard lowers the LIMIT to one row above the rule's cap (1000): 1000 of the million
    # rows come back, and the extra row marks the result truncated.
    c = call("SELECT id, amount FROM big ORDER BY id LIMIT 500000")
    assert c.result.is_error is False, text_of(c.result)
    sc = c.result.structured_content
    assert sc["rowCount"] == 1000 and len(sc["rows"]) == 1000
    assert sc["truncated"] is True
    assert sc["executedQuery"].rstrip().endswith("LIMIT 1001"), sc["executedQuery"]
    assert sc["rows"][0] == [1, "0.01"] and sc["rows"][-1][0] == 1000, sc["rows"][-1]
    run, _ = assert_recorded(c, "Allow", "Succeeded", SANDBOX_RULE, "QueryCompleted")
    assert run["status"]["truncated"] is True

    # A LIMIT below the cap is kept, and the result is complete.
    c = call("SELECT id FROM big ORDER BY id LIMIT 10")
    sc = c.result.structured_content
    assert c.result.is_error is False, text_of(c.result)
    assert sc["rowCount"] == 10 and sc["truncated"] is False
    assert sc["executedQuery"].rstrip().endswith("LIMIT 10"), sc["executedQuery"]
    assert_recorded(c, "Allow", "Succeeded", SANDBOX_RULE, "QueryCompleted")


def test_select_star_is_blocked_with_the_wildcard_reason():
    c = call("SELECT * FROM ledger")
    assert c.result.is_error is True
    sc = c.result.structured_content
    assert (sc["verdict"], sc["phase"]) == ("Block", "Rejected"), sc
    assert sc["rule"] == f"{SANDBOX_RULE}/sql-guard"
    assert "SELECT * is not allowed" in sc["reason"], sc["reason"]
    assert sc["rows"] == [] and "executedQuery" not in sc
    assert "blocked by policy" in text_of(c.result) and "SELECT * is not allowed" in text_of(c.result)
    run, _ = assert_recorded(c, "Block", "Rejected", f"{SANDBOX_RULE}/sql-guard", "PolicyBlocked")
    assert "SELECT * is not allowed" in run["status"]["decision"]["reason"]
    assert not run["status"].get("podName")


BLOCKED = {
    "injection as a table name": "SELECT id FROM ledger; DROP TABLE audit_log--",
    "injection as a quoted table name": 'SELECT id FROM "ledger; DROP TABLE audit_log--"',
    "drop": "DROP TABLE audit_log",
    "delete": "DELETE FROM ledger WHERE id = 1",
    "update": "UPDATE ledger SET amount = 0",
    "truncate": "TRUNCATE ledger",
    "grant": "GRANT ALL ON ledger TO PUBLIC",
    "multi-statement": "SELECT id FROM ledger; SELECT amount FROM ledger",
    "data-modifying cte": "WITH gone AS (DELETE FROM ledger RETURNING id) SELECT id FROM gone",
    "select into": "SELECT id INTO stolen FROM ledger",
    "locking clause": "SELECT id FROM ledger FOR UPDATE",
}


@pytest.mark.parametrize("query", BLOCKED.values(), ids=BLOCKED.keys())
def test_injections_and_writes_are_blocked(query):
    c = call(query)
    assert c.result.is_error is True, text_of(c.result)
    sc = c.result.structured_content
    assert (sc["verdict"], sc["phase"]) == ("Block", "Rejected"), sc
    assert sc["rule"] == f"{SANDBOX_RULE}/sql-guard", sc
    assert sc["reason"], sc
    run, _ = assert_recorded(c, "Block", "Rejected", f"{SANDBOX_RULE}/sql-guard", "PolicyBlocked")
    assert not run["status"].get("podName") and not run["status"].get("result")
    # Nothing was changed.
    assert psql("SELECT count(*) FROM audit_log") == "5"
    assert psql("SELECT count(*), sum(amount) <> 0 FROM ledger") == "200|t"


async def approve(c: Call, approved: bool):
    with anyio.fail_after(60):
        await c.awaiting.wait()
    run = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxrun", c.awaiting_run, "-o", "json"))
    assert run["status"]["phase"] == "AwaitingApproval", run["status"]
    assert not run["status"].get("podName")
    # The one-liner the run's message gives, run by a shell as a person would paste it (with
    # "approved":false to deny); it records who decided (kubectl auth whoami).
    message = run["status"]["message"]
    command = message.split("it waits for a person: ", 1)[1].rsplit(" (or ", 1)[0]
    if not approved:
        command = command.replace('\\"approved\\":true', '\\"approved\\":false')
    await anyio.to_thread.run_sync(lambda: subprocess.run(
        ["bash", "-c", f'kubectl() {{ "$KUBECTL" "$@"; }}\n{command}'], check=True,
        env={**os.environ, "KUBECTL": KUBECTL}))
    decided = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxrun", c.awaiting_run, "-o", "json"))
    assert decided["spec"]["approval"] == {"approved": approved, "by": whoami()}, decided["spec"]


def whoami() -> str:
    """The Kubernetes user name of this test's kubeconfig, as the approval records it."""
    return kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")


def test_a_production_call_without_rights_waits_and_runs_after_approval():
    c = call("SELECT id, amount FROM ledger WHERE id <= 2 ORDER BY id", "production",
             lambda c: approve(c, True))
    assert c.result.is_error is False, text_of(c.result)
    sc = c.result.structured_content
    assert sc["runName"] == c.awaiting_run
    assert any(m.startswith("AwaitingApproval: " + c.awaiting_run) for m in c.progress), c.progress
    assert (sc["verdict"], sc["rule"], sc["phase"]) == ("Escalate", PRODUCTION_RULE, "Succeeded")
    assert sc["rows"] == [[1, "-420.81"], [2, "-341.62"]]
    assert sc["executedQuery"].rstrip().endswith("LIMIT 101"), sc["executedQuery"]
    run, line = assert_recorded(c, "Escalate", "Succeeded", PRODUCTION_RULE, "QueryCompleted")
    assert any(x["type"] == "Approved" and x["status"] == "True"
               for x in run["status"]["conditions"]), run["status"]["conditions"]
    assert line["approved"] is True
    assert line["decided_by"] == whoami(), line


def test_a_production_call_is_rejected_after_a_denial():
    c = call("SELECT id, amount FROM ledger WHERE id <= 2", "production",
             lambda c: approve(c, False))
    assert c.result.is_error is True
    sc = c.result.structured_content
    assert (sc["verdict"], sc["phase"], sc["runName"]) == ("Escalate", "Rejected", c.awaiting_run)
    assert sc["rows"] == []
    assert "denied" in text_of(c.result), text_of(c.result)
    run, line = assert_recorded(c, "Escalate", "Rejected", PRODUCTION_RULE, "ApprovalDenied")
    assert run["status"]["reason"] == "ApprovalDenied"
    assert line["approved"] is False
    assert line["decided_by"] == whoami(), line
    assert f"{whoami()} denied it" in run["status"]["message"], run["status"]["message"]


@pytest.mark.waits
def test_an_unanswered_production_call_returns_awaiting_approval_then_times_out():
    c = call("SELECT id FROM ledger WHERE id = 7", "production")
    # The call waited for the approval wait, with progress naming the run, then said so.
    assert c.result.is_error is True
    sc = c.result.structured_content
    run_name = sc["runName"]
    assert (sc["verdict"], sc["phase"]) == ("Escalate", "AwaitingApproval"), sc
    assert text_of(c.result).startswith(f"awaiting approval: {run_name}"), text_of(c.result)
    assert c.awaiting_run == run_name, c.progress
    assert APPROVAL_WAIT - 2 <= c.elapsed < APPROVAL_TIMEOUT, c.elapsed
    # Not terminal yet: one run, no audit line so far.
    assert the_run(c, run_name)["status"]["phase"] == "AwaitingApproval"
    assert audit_lines(run_name) == []

    deadline = time.monotonic() + APPROVAL_TIMEOUT + 30
    while True:
        st = the_run(c, run_name)["status"]
        if st["phase"] != "AwaitingApproval" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (st["phase"], st["reason"]) == ("Rejected", "ApprovalTimedOut"), st
    assert not st.get("podName") and not st.get("result")
    assert_recorded(c, "Escalate", "Rejected", PRODUCTION_RULE, "ApprovalTimedOut")


def test_the_frontend_never_sees_the_database_credentials():
    password = re.match(r"postgres(?:ql)?://[^:]+:([^@]+)@", PG_URL).group(1)
    deployments = kubectl("-n", SYSTEM_NS, "get", "deployments", "-o", "json")
    frontend = [d for d in json.loads(deployments)["items"]
                if d["metadata"]["labels"].get("app.kubernetes.io/component") == "frontend"]
    assert len(frontend) == 1
    spec = json.dumps(frontend[0]["spec"])
    assert "sandboxrun-databases" not in spec and password not in spec
    operator = [d for d in json.loads(deployments)["items"]
                if d["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"]
    assert "sandboxrun-databases" in json.dumps(operator[0]["spec"])


def test_a_sandbox_call_to_a_production_database_waits_for_a_person_and_reads_nothing_before():
    """A database belongs to an environment: a call that names a laxer one is judged in the
    database's. Here the call says sandbox, the database is production's: the sandbox rule never
    applies, the run waits for a person like any production query, and it has read nothing
    (no result, no query started) until the approval, after which it returns the rows."""
    seen = {}

    async def decide(c: Call):
        with anyio.fail_after(60):
            await c.awaiting.wait()
        # Well past the moment an allowed query would have run: still nothing read.
        await anyio.sleep(3)
        seen["run"] = json.loads(kubectl("-n", RUNS_NS, "get", "sandboxrun", c.awaiting_run,
                                         "-o", "json"))
        await approve(c, True)

    c = call("SELECT id, amount FROM ledger WHERE id <= 2 ORDER BY id", "sandbox", decide,
             database=PRODUCTION_DATABASE)
    before = seen["run"]["status"]
    assert before["phase"] == "AwaitingApproval", before
    assert "result" not in before and "startTime" not in before, before
    assert before.get("reason") != "QueryStarted", before
    assert before["decision"]["rule"] == PRODUCTION_RULE, before["decision"]
    assert before["decision"]["grant"]["environment"] == "production", before["decision"]
    # After the approval: the recorded query ran, with the production rule's cap.
    assert c.result.is_error is False, text_of(c.result)
    sc = c.result.structured_content
    assert (sc["verdict"], sc["rule"], sc["phase"]) == ("Escalate", PRODUCTION_RULE, "Succeeded")
    assert sc["rows"] == [[1, "-420.81"], [2, "-341.62"]]
    assert sc["executedQuery"].rstrip().endswith("LIMIT 101"), sc["executedQuery"]
    run, line = assert_recorded(c, "Escalate", "Succeeded", PRODUCTION_RULE, "QueryCompleted")
    assert line["judged_in"] == "production", line
    assert line["decided_by"] == whoami(), line
