"""The operator's JSON audit lines (target `audit`, one per call when its run ends), read from
the logs of the operator Pods with kubectl. Shared by the cluster MCP tests.

Environment: KUBECTL (default kubectl) with KUBECONFIG."""

from __future__ import annotations

import json
import os
import subprocess
import time

KUBECTL = os.environ.get("KUBECTL", "kubectl")
SYSTEM_NS = "sandboxrun-system"


def _kubectl(*args: str) -> str:
    return subprocess.run([KUBECTL, *args], check=True, capture_output=True, text=True).stdout


def audit_lines(run_name: str) -> list[dict]:
    """The `fields` of the operator's audit lines about the run."""
    return [line for line in audit_lines_all() if line.get("run") == run_name]


def the_audit_line(run_name: str) -> dict:
    """Exactly one audit line about the run (it follows the run's terminal status closely)."""
    deadline = time.monotonic() + 20
    lines = audit_lines(run_name)
    while not lines and time.monotonic() < deadline:
        time.sleep(0.5)
        lines = audit_lines(run_name)
    # A duplicate usually follows the first line closely; one written later is caught when the
    # suite ends (conftest.py reads every audit line once more).
    time.sleep(1)
    lines = audit_lines(run_name)
    assert len(lines) == 1, f"exactly one audit line for {run_name}: {lines}"
    return lines[0]


def audit_lines_all() -> list[dict]:
    """The `fields` of every audit line on the logs of the current operator Pods."""
    pods = json.loads(_kubectl("-n", SYSTEM_NS, "get", "pods", "-l",
                               "app.kubernetes.io/component=operator", "-o", "json"))["items"]
    lines = []
    for pod in pods:
        log = _kubectl("-n", SYSTEM_NS, "logs", pod["metadata"]["name"], "--tail=-1")
        for line in log.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("target") == "audit":
                lines.append(entry["fields"])
    return lines
