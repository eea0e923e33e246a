//! The audit trail: one JSON log line (tracing target `audit`) per policy decision, per approval
//! and per terminal phase of a run. With the operator's JSON logs each line reads
//! `{"timestamp":…,"level":"INFO","fields":{"message":"audit","event":"decision",
//! "run":…,"namespace":…,"agent":…,"tool":…,"environment":…,"verdict":…,"rule":…,"reason":…,
//! "phase":…,"phase_reason":…,"duration_ms":…},"target":"audit"}`; keep `audit=info` in
//! `RUST_LOG` to keep them.

use jiff::Timestamp;
use kube::ResourceExt;
use sandboxrun_api::{Decision, SandboxRun};
use sandboxrun_core::{Phase, Tool};

use crate::gate::{environment_word, verdict_word};

/// The tracing target of audit lines.
pub const TARGET: &str = "audit";

/// What an audit line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditEvent {
    /// Policy judged the run.
    Decision,
    /// A person approved an escalated run.
    Approved,
    /// The run reached a terminal phase.
    Finished,
}

impl AuditEvent {
    fn as_str(self) -> &'static str {
        match self {
            AuditEvent::Decision => "decision",
            AuditEvent::Approved => "approved",
            AuditEvent::Finished => "finished",
        }
    }
}

/// Milliseconds from the run's creation to `now` (0 when unknown).
pub fn age_millis(run: &SandboxRun, now: Timestamp) -> i64 {
    run.metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |c| now.duration_since(c.0).as_millis().max(0) as i64)
}

/// Writes one audit line about `run`.
pub fn record(
    event: AuditEvent,
    run: &SandboxRun,
    tool: Option<Tool>,
    decision: Option<&Decision>,
    phase: Option<Phase>,
    phase_reason: &str,
    now: Timestamp,
) {
    tracing::info!(
        target: TARGET,
        event = event.as_str(),
        run = %run.name_any(),
        namespace = %run.namespace().unwrap_or_default(),
        agent = %run.spec.agent,
        tool = tool.map_or("", Tool::as_str),
        environment = environment_word(run.spec.environment),
        verdict = decision.map_or("", |d| verdict_word(d.verdict)),
        rule = decision.map_or("", |d| d.rule.as_str()),
        reason = decision.map_or("", |d| d.reason.as_str()),
        phase = phase.map_or("", Phase::as_str),
        phase_reason,
        duration_ms = age_millis(run, now),
        "audit"
    );
}
