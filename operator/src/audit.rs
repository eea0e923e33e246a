//! The audit trail: one JSON log line (tracing target `audit`) per call, written when the run
//! reaches its terminal phase (owed until then, and written by the next replica if the operator
//! dies first: `CONDITION_AUDITED`; twice, identically, only if it dies between the line and
//! that record), so the line holds everything decided about the call: who
//! asked for what (agent, tool, environment), what policy decided (verdict, rule, reason),
//! whether a person approved it, how it ended (phase, phase reason) and how long it took from
//! creation. With the operator's JSON logs each line reads
//! `{"timestamp":…,"level":"INFO","fields":{"message":"audit","run":…,"namespace":…,"agent":…,
//! "tool":…,"schema_read":…,"environment":…,"verdict":…,"rule":…,"reason":…,"approved":…,"decided_by":…,
//! "approval_reason":…,"phase":…,"phase_reason":…,"duration_ms":…},"target":"audit"}`; keep
//! `audit=info` in `RUST_LOG`. `approval_reason` is what the person who approved or denied the run
//! gave as their reason (`spec.approval.reason`; empty when nobody decided or they gave none).
//! `verdict` is the API's word (`Allow`, `Block`, `Escalate`: `Verdict::as_str`), `environment`
//! and `tool` the resource's (`sandbox`, `python`); `schema_read` is true for an sql run that read
//! the schema resource (what the agent's queries may read) instead of running a query.
//!
//! The steps in between (decision, approval) are Kubernetes Events on the run and ordinary log
//! lines; a run still awaiting approval has no audit line yet (it ends Rejected at the approval
//! timeout at the latest).

use jiff::Timestamp;
use kube::ResourceExt;
use sandboxrun_api::{SandboxRun, SandboxRunStatus};
use sandboxrun_core::{Phase, Tool};

use crate::gate::{CONDITION_APPROVED, approval_state};

/// The tracing target of audit lines.
pub const TARGET: &str = "audit";

/// Milliseconds from the run's creation to `now` (0 when unknown).
pub fn age_millis(run: &SandboxRun, now: Timestamp) -> i64 {
    run.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |c| now.duration_since(c.0).as_millis().max(0) as i64)
}

/// Whether a person approved the run (its `Approved` condition is True).
pub fn approved(status: &SandboxRunStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_APPROVED && c.status == "True")
}

/// Writes the audit line of `run`, which ended in `phase` (reason `phase_reason`) with the
/// terminal `status`.
pub fn record(
    run: &SandboxRun,
    tool: Option<Tool>,
    status: &SandboxRunStatus,
    phase: Phase,
    phase_reason: &str,
    now: Timestamp,
) {
    let decision = status.decision.as_ref();
    let decided = approval_state(
        run.spec.approval.as_ref(),
        status.approval_request.as_ref(),
        run.metadata.generation,
    );
    // Where policy judged it: the run's environment, or its database's or Prometheus's when
    // that is more sensitive.
    let judged_in = decision
        .and_then(|d| d.grant.as_ref())
        .map_or("", |g| g.environment.as_str());
    tracing::info!(
        target: TARGET,
        run = %run.name_any(),
        namespace = %run.namespace().unwrap_or_default(),
        agent = %run.spec.agent,
        tool = tool.map_or("", Tool::as_str),
        // An sql run that read what queries may read (the schema resource), not rows.
        schema_read = run.spec.sql.as_ref().is_some_and(|s| s.schema),
        environment = run.spec.environment.as_str(),
        judged_in,
        verdict = decision.map_or("", |d| d.verdict.as_str()),
        rule = decision.map_or("", |d| d.rule.as_str()),
        reason = decision.map_or("", |d| d.reason.as_str()),
        approved = approved(status),
        // Who approved or denied the escalated run (`spec.approval.by`; empty: nobody did).
        decided_by = decided.by().unwrap_or_default(),
        // Why they decided so (`spec.approval.reason`; empty: they did not say, or nobody did).
        approval_reason = decided.reason().unwrap_or_default(),
        phase = phase.as_str(),
        phase_reason,
        duration_ms = age_millis(run, now),
        "audit"
    );
}
