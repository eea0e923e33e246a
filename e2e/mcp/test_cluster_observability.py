"""The chart's ops kit against a real Prometheus: the node's test Prometheus (e2e/run-tests.sh
starts it with SANDBOXRUN_PROM_KUBECONFIG and SANDBOXRUN_PROM_RULES: e2e/prometheus/start.sh)
scrapes the operator and the frontend as the chart's ServiceMonitors would, and evaluates the
chart's alerts as e2e/chart/alert-rules.sh renders them with e2e/values-alerts.yaml (thresholds
and `for` lowered). After a few tool calls through the frontend (most of them failing) and one
run left waiting for an approval:
- SandboxrunRunsFailing and SandboxrunApprovalsWaiting fire (and were silent before), and the
  approval alert goes once its run is gone; SandboxrunWarmPoolEmpty fires for a pool of 0
  replicas and goes with the pool;
- every query of every panel of charts/sandboxrun/dashboards/sandboxrun.json, its variables
  substituted, is accepted and returns data (reconcile errors aside: there may be none);
- every sandboxrun metric the dashboard and the alerts name is one the components export.

Environment (set by e2e/run-tests.sh): MCP_URL, MCP_API_KEY, KUBECONFIG, KUBECTL,
SANDBOXRUN_E2E_PROMETHEUS_URL (default http://10.244.0.1:59091)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

# The alerts watched here fire on any test's failing calls and waiting approvals: this module runs
# alone, after the rest of the suite (e2e/run-tests.sh).
pytestmark = pytest.mark.quiet_cluster

URL = os.environ["MCP_URL"]
KEY = os.environ["MCP_API_KEY"]
KUBECTL = os.environ.get("KUBECTL", "kubectl")
PROM = os.environ.get("SANDBOXRUN_E2E_PROMETHEUS_URL", "http://10.244.0.1:59091").rstrip("/")
DASHBOARD = Path(__file__).resolve().parents[2] / "charts/sandboxrun/dashboards/sandboxrun.json"
NAMESPACE = "sandboxrun-system"
RUNS_NAMESPACE = "sandboxrun-runs"
OPERATOR_JOB = "sandboxrun-operator-metrics"
FRONTEND_JOB = "sandboxrun-mcp"
ALERTS = {"SandboxrunRunsFailing", "SandboxrunRunsStuck", "SandboxrunSlowStarts",
          "SandboxrunApprovalsWaiting", "SandboxrunWarmPoolEmpty", "SandboxrunOperatorDown",
          "SandboxrunFrontendDown"}
# The dashboard's variables as a person would pick them; the rate window ($__rate_interval) is
# set where it is used: wide enough to cover this module's calls, however long ago they were.
VARIABLES = {"$namespace": NAMESPACE, "$job": ".+"}
# Before the module's first call, in the rate window: a few scrapes (2 s apart, start.sh).
WINDOW_MARGIN_SECONDS = 30
# (panel, refId) that may have no series: a counter with no label set until its first event.
MAY_BE_EMPTY = {("Reconciles and errors", "B")}
# Metrics that exist only once something happened (a reconcile failed).
MAY_BE_MISSING = {"sandboxrun_reconcile_errors_total"}
FAILING_CALLS = 5


def prom(path: str, **params) -> dict | list:
    response = httpx2.get(f"{PROM}{path}", params=params, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (path, params, body)
    return body["data"]


def scalar(query: str) -> float:
    result = prom("/api/v1/query", query=query)["result"]
    return float(result[0]["value"][1]) if result else 0.0


def firing(alertname: str) -> list[dict]:
    return [a for a in prom("/api/v1/alerts")["alerts"]
            if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def wait_for(what: str, seconds: float, check):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.5)


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run([KUBECTL, *args], input=stdin, check=True, capture_output=True,
                          text=True).stdout


async def calls(codes: list[str]) -> list:
    results: list = [None] * len(codes)
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=180) as client:
        async with streamable_http_client(URL, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()

                async def one(i: int, code: str):
                    results[i] = await session.call_tool("run_python", {"code": code})

                async with anyio.create_task_group() as tg:
                    for i, code in enumerate(codes):
                        tg.start_soon(one, i, code)
    return results


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every target of every panel, rows' panels included."""
    out = []

    def walk(panels):
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                out.append((panel["title"], target["refId"], target["expr"]))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    # Longest names first: $__rate_interval before a shorter variable that prefixes it.
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name[1:] + "}", variables[name]).replace(name, variables[name])
    assert "$" not in expr, f"a dashboard variable the test does not know in {expr}"
    return expr


@pytest.fixture(scope="module")
def traffic():
    """Once for the module: the scrape and the rules are in place, the two alerts are silent,
    then one run waits for an approval and a few calls mostly fail."""
    def targets_up():
        active = prom("/api/v1/targets", state="active")["activeTargets"]
        up = {t["labels"].get("job") for t in active
              if t["health"] == "up" and t["labels"].get("namespace") == NAMESPACE}
        return {OPERATOR_JOB, FRONTEND_JOB} <= up
    wait_for("the test Prometheus scrapes the operator and the frontend (start.sh with "
             "SANDBOXRUN_PROM_KUBECONFIG)", 30, targets_up)
    rules = {r["name"] for g in prom("/api/v1/rules")["groups"] for r in g["rules"]}
    assert ALERTS <= rules, f"the chart's alerts are not loaded (SANDBOXRUN_PROM_RULES): {rules}"
    # Silent first, so that firing below is these calls' doing (other tests' failures or
    # approvals leave the windows within seconds: 30 s, 3 s).
    wait_for("SandboxrunRunsFailing and SandboxrunApprovalsWaiting silent before the calls", 50,
             lambda: not firing("SandboxrunRunsFailing") and not firing("SandboxrunApprovalsWaiting"))
    before = {
        "operator": scalar(f'sum(sandboxrun_tool_calls_total{{job="{OPERATOR_JOB}"}})'),
        "frontend": scalar(f'sum(sandboxrun_mcp_tool_calls_total{{job="{FRONTEND_JOB}"}})'),
        "rejections": scalar(f'sum(sandboxrun_mcp_http_rejections_total{{job="{FRONTEND_JOB}"}})'),
    }
    started = time.time()
    # Escalated by the chart's default policy (python in production): it waits for a person.
    name = "obs-approval-" + os.urandom(4).hex()
    kubectl("create", "-f", "-", stdin=json.dumps({
        "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxRun",
        "metadata": {"name": name, "namespace": RUNS_NAMESPACE},
        "spec": {"agent": "e2e-observability", "environment": "production",
                 "python": {"code": "print('never approved')"}}}))
    try:
        results = anyio.run(calls, ["raise SystemExit(3)"] * FAILING_CALLS + ["print(1)"])
        assert [r.is_error for r in results] == [True] * FAILING_CALLS + [False], results
        # One request the frontend refuses before MCP.
        response = httpx2.post(URL, headers={"Authorization": "Bearer not-the-key"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)
        assert response.status_code == 401
        calls_made = FAILING_CALLS + 1
        wait_for("the test Prometheus has scraped the calls", 30, lambda: (
            scalar(f'sum(sandboxrun_tool_calls_total{{job="{OPERATOR_JOB}"}})')
            >= before["operator"] + calls_made
            and scalar(f'sum(sandboxrun_mcp_tool_calls_total{{job="{FRONTEND_JOB}"}})')
            >= before["frontend"] + calls_made
            and scalar(f'sum(sandboxrun_mcp_http_rejections_total{{job="{FRONTEND_JOB}"}})')
            > before["rejections"]))
        yield {"started": started, "approval_run": name}
    finally:
        kubectl("-n", RUNS_NAMESPACE, "delete", "sandboxrun", name, "--ignore-not-found", "--wait=false")


def active_since(alert: dict) -> float:
    # activeAt: RFC 3339 with up to nanoseconds.
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", alert["activeAt"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def test_failing_calls_fire_the_runs_failing_alert(traffic):
    alerts = wait_for("SandboxrunRunsFailing firing", 30, lambda: firing("SandboxrunRunsFailing"))
    [alert] = [a for a in alerts if a["labels"].get("tool") == "run_python"]
    assert alert["labels"]["severity"] == "warning", alert
    assert active_since(alert) >= traffic["started"] - 1, alert
    assert "of the run_python runs that ended in the last 30s failed or timed out" in \
        alert["annotations"]["summary"], alert


def test_a_run_awaiting_approval_fires_the_approvals_alert_until_it_is_gone(traffic):
    [alert] = wait_for("SandboxrunApprovalsWaiting firing", 30,
                       lambda: firing("SandboxrunApprovalsWaiting"))
    assert alert["labels"]["severity"] == "info", alert
    assert active_since(alert) >= traffic["started"] - 1, alert
    waiting = scalar(f'sum(sandboxrun_unfinished_runs{{job="{OPERATOR_JOB}",phase="AwaitingApproval"}})')
    assert waiting >= 1, waiting
    kubectl("-n", RUNS_NAMESPACE, "delete", "sandboxrun", traffic["approval_run"], "--wait=true")
    wait_for("SandboxrunApprovalsWaiting resolved once its run is deleted", 30,
             lambda: not firing("SandboxrunApprovalsWaiting"))


def test_an_empty_pool_fires_the_warm_pool_alert_until_it_is_deleted(traffic):
    """A pool of 0 replicas has no ready sandbox: the alert fires for it; once deleted, its
    series goes (the operator drops a deleted pool's gauge) and so does the alert."""
    name = "obs-empty-" + os.urandom(4).hex()
    pool = f"{RUNS_NAMESPACE}/{name}"
    kubectl("create", "-f", "-", stdin=json.dumps({
        "apiVersion": "sandboxrun.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": name, "namespace": RUNS_NAMESPACE},
        "spec": {"replicas": 0, "cpu": "1", "memory": "1Gi", "pids": 64}}))
    try:
        [alert] = wait_for(f"SandboxrunWarmPoolEmpty firing for {pool}", 30, lambda: [
            a for a in firing("SandboxrunWarmPoolEmpty") if a["labels"].get("pool") == pool])
        assert alert["labels"]["severity"] == "warning", alert
    finally:
        kubectl("-n", RUNS_NAMESPACE, "delete", "sandboxpool", name, "--ignore-not-found")
    selector = f'sandboxrun_pool_ready_sandboxes{{job="{OPERATOR_JOB}",pool="{pool}"}}'
    wait_for(f"{pool}'s series gone and its alert resolved", 30, lambda: (
        not prom("/api/v1/query", query=selector)["result"]
        and not [a for a in firing("SandboxrunWarmPoolEmpty") if a["labels"].get("pool") == pool]))


def test_every_dashboard_query_is_accepted_and_returns_data(traffic):
    queries = dashboard_queries()
    assert len(queries) >= 30, queries
    # The calls, and what they started, are in the window: the alerts' tests before this one wait
    # on Prometheus, and how long they took must not decide what a panel shows.
    window = math.ceil(time.time() - traffic["started"]) + WINDOW_MARGIN_SECONDS
    variables = VARIABLES | {"$__rate_interval": f"{window}s"}
    problems = []
    for title, ref, expr in queries:
        query = substitute(expr, variables)
        response = httpx2.get(f"{PROM}/api/v1/query", params={"query": query}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            problems.append(f"{title}/{ref}: refused: {body.get('error')}\n  {query}")
            continue
        values = [float(s["value"][1]) for s in body["data"]["result"]]
        if (title, ref) in MAY_BE_EMPTY:
            continue
        if not any(math.isfinite(v) for v in values):
            problems.append(f"{title}/{ref}: no data ({values})\n  {query}")
    assert not problems, "\n".join(problems)
    # The variables' own queries (label_values) list this release.
    namespaces = prom("/api/v1/label/namespace/values", **{"match[]": "sandboxrun_reconciles_total"})
    assert NAMESPACE in namespaces, namespaces
    jobs = prom("/api/v1/label/job/values", **{"match[]": f'up{{namespace=~"{NAMESPACE}"}}'})
    assert {OPERATOR_JOB, FRONTEND_JOB} <= set(jobs), jobs


def test_every_metric_the_dashboard_and_the_alerts_name_is_exported(traffic):
    exported = set(prom("/api/v1/label/__name__/values",
                        **{"match[]": f'{{namespace="{NAMESPACE}",job=~"{OPERATOR_JOB}|{FRONTEND_JOB}"}}'}))
    named = {m for _, _, expr in dashboard_queries() for m in re.findall(r"\bsandboxrun_\w+", expr)}
    rules = [r for g in prom("/api/v1/rules")["groups"] for r in g["rules"] if r["name"] in ALERTS]
    named |= {m for r in rules for m in re.findall(r"\bsandboxrun_\w+", r["query"])}
    assert len(named) >= 15, named
    missing = named - exported - MAY_BE_MISSING
    assert not missing, f"named but not exported: {sorted(missing)}"
