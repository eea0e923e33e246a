//! How a run ends, for every tool: the terminal [`Outcome`] and the status that records it, pure
//! (`now` is a parameter). The python Pod state machine (`python::phase`), the policy gate and
//! the query executors all end a run through these.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use sandboxrun_api::{CONDITION_COMPLETED, CONDITION_STARTED, SandboxRunStatus, StatusFile};
use sandboxrun_core::files::{OmittedFile, OutputFile};
use sandboxrun_core::{Phase, Reason, Tool};

/// Reason of the `Started=False` condition of a run that ended before its code started (core's
/// [`Reason`] names why runs end, not this condition).
pub const NOT_STARTED: &str = "NotStarted";

/// The terminal result of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Succeeded, Failed, TimedOut or Rejected.
    pub phase: Phase,
    /// Why, in CamelCase: a [`Reason`] (for example `NonZeroExit`), or the kubelet's own reason
    /// for a failed Pod (`Evicted`).
    pub reason: String,
    /// Explanation for people (and for the model that called the tool).
    pub message: String,
    /// Exit code of the code, when it ran to an end.
    pub exit_code: Option<i32>,
    /// Captured stdout, already capped.
    pub stdout: Option<String>,
    /// Captured stderr, already capped.
    pub stderr: Option<String>,
    /// Whether output was cut.
    pub truncated: Option<bool>,
    /// When the code started executing.
    pub started_at: Option<Timestamp>,
    /// When the run ended.
    pub finished_at: Timestamp,
    /// Run time measured by the runner or the executor (Kubernetes timestamps only have whole
    /// seconds).
    pub duration_millis: Option<i64>,
    /// Files a python run returned, already within its caps (`sandboxrun_core::files::collect`).
    pub files: Vec<OutputFile>,
    /// Files it wrote that were left out, and why.
    pub files_omitted: Vec<OmittedFile>,
}

impl Outcome {
    /// An outcome without any output.
    pub fn bare(
        phase: Phase,
        reason: &str,
        message: String,
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
    ) -> Self {
        Self {
            phase,
            reason: reason.to_owned(),
            message,
            exit_code: None,
            stdout: None,
            stderr: None,
            truncated: None,
            started_at,
            finished_at,
            duration_millis: None,
            files: Vec::new(),
            files_omitted: Vec::new(),
        }
    }

    /// An outcome of one of sandboxrun's own reasons, without any output.
    pub fn of(
        phase: Phase,
        reason: Reason,
        message: String,
        started_at: Option<Timestamp>,
        finished_at: Timestamp,
    ) -> Self {
        Self::bare(phase, reason.as_str(), message, started_at, finished_at)
    }
}

/// A run refused before anything executed.
pub fn rejected(reason: Reason, message: String, now: Timestamp) -> Outcome {
    Outcome::of(Phase::Rejected, reason, message, None, now)
}

/// Milliseconds between two times, never negative.
pub fn millis_between(start: Timestamp, end: Timestamp) -> i64 {
    end.duration_since(start).as_millis().max(0) as i64
}

/// Sets a condition, keeping its lastTransitionTime when its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: transition,
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// The common part of every status the operator writes.
pub fn base(
    prev: &SandboxRunStatus,
    tool: Option<Tool>,
    generation: Option<i64>,
) -> SandboxRunStatus {
    SandboxRunStatus {
        tool,
        decision: prev.decision.clone(),
        approval_request: prev.approval_request.clone(),
        conditions: prev.conditions.clone(),
        observed_generation: generation,
        // How the run got its sandbox stays true to its end.
        path: prev.path,
        pool: prev.pool.clone(),
        // So does when it began waiting for one.
        queued_at: prev.queued_at.clone(),
        // And the session it runs in.
        session: prev.session.clone(),
        session_ended: prev.session_ended.clone(),
        ..Default::default()
    }
}

/// Status of a finished run.
pub fn outcome_status(
    prev: &SandboxRunStatus,
    tool: Option<Tool>,
    outcome: &Outcome,
    pod_name: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut s = base(prev, tool, generation);
    s.phase = Some(outcome.phase);
    s.reason = Some(outcome.reason.clone());
    s.message = Some(outcome.message.clone());
    s.exit_code = outcome.exit_code;
    s.stdout = outcome.stdout.clone();
    s.stderr = outcome.stderr.clone();
    s.truncated = outcome.truncated;
    // Within the bound of the status: collect kept at most the caps' files and bytes (base64
    // adds a third), and a bounded list of omissions.
    s.files = outcome.files.iter().map(StatusFile::of).collect();
    s.files_omitted = outcome.files_omitted.clone();
    // A recorded sandbox stays the run's (the CRD refuses a status that drops it).
    s.pod_name = pod_name
        .map(str::to_owned)
        .or_else(|| prev.pod_name.clone());
    s.start_time = outcome.started_at.map(Time);
    s.completion_time = Some(Time(outcome.finished_at));
    s.duration_millis = outcome.duration_millis.or_else(|| {
        outcome
            .started_at
            .map(|start| millis_between(start, outcome.finished_at))
    });
    let started = outcome.started_at.is_some();
    set_condition(
        &mut s.conditions,
        CONDITION_STARTED,
        started,
        if started {
            Reason::ContainerStarted.as_str()
        } else {
            NOT_STARTED
        },
        if started {
            "the code started executing"
        } else {
            "the code never started"
        },
        generation,
        now,
    );
    set_condition(
        &mut s.conditions,
        CONDITION_COMPLETED,
        true,
        &outcome.reason,
        &outcome.message,
        generation,
        now,
    );
    s
}
