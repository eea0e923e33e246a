"""What holds across the whole cluster MCP suite.

Each test that reads a run's audit line (operator_audit.the_audit_line) can only wait a moment
for a duplicate; one written later would be missed there. So when the suite ends, every audit
line on the operator's log (those of the Rust cluster suite before it included) is read once
more, and a run named by two lines fails the suite. (e2e/run-tests.sh runs the suite in a few
processes, the markers below; each checks at its end, and the last one's check covers them all.)"""

from __future__ import annotations

import collections

import pytest

from operator_audit import audit_lines_all


def pytest_configure(config):
    # How e2e/run-tests.sh schedules the suite: it mostly waits on the cluster, not the CPU.
    config.addinivalue_line(
        "markers", "waits: mostly waits on a clock (a quiet call, an approval's timeout); "
        "run in a process of its own beside the rest of the suite")
    config.addinivalue_line(
        "markers", "quiet_cluster: needs the cluster to itself (watches cluster-wide alerts "
        "that other tests' failing calls and waiting approvals would fire, or takes the runs "
        "namespace's room away); run alone, after the rest")
    config.addinivalue_line(
        "markers", "ingress: through the ingress controller, which is built beside the suites; "
        "run once it is up")


@pytest.fixture(scope="session", autouse=True)
def every_run_has_at_most_one_audit_line():
    yield
    lines = audit_lines_all()
    assert lines, "the operator's log holds no audit line at all: the audit trail is not written"
    per_run = collections.Counter(line.get("run") for line in lines)
    twice = {run: n for run, n in per_run.items() if n > 1}
    assert not twice, f"runs with more than one audit line: {twice}"
