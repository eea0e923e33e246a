//! Phase derivation, pure: from what the run's status says and what its Pod shows (or that it
//! has none), decide the next step and the status that describes it. No I/O, no clock: `now` is
//! a parameter, so every transition is unit-tested.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use sandboxrun_api::{CONDITION_COMPLETED, CONDITION_STARTED, SandboxRunStatus};
use sandboxrun_core::limits::STATUS_OUTPUT_BUDGET_BYTES;
use sandboxrun_core::output::{cap_str, fit_json_budget};
use sandboxrun_core::{EnvelopeError, Limits, Phase, RunnerResult, Tool};

use crate::pod::{ACTIVE_DEADLINE_GRACE_SECONDS, CONTAINER};

/// Seconds past the Pod's own deadline after which the operator stops waiting for the kubelet
/// and ends the run itself (covers Pods that never start: unschedulable, stuck pulling).
pub const OPERATOR_DEADLINE_SLACK_SECONDS: i64 = 30;
/// Seconds after the container ended during which unreadable logs are retried before the run
/// ends Failed/NoResult.
pub const LOG_RETRY_WINDOW_SECONDS: i64 = 60;
/// Most bytes of raw sandbox log quoted in a NoResult message.
const LOG_TAIL_BYTES: usize = 1024;

/// Container waiting reasons that mean the image will not arrive.
const IMAGE_FAILURES: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// What the controller does next for a run that is not finished.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// No Pod yet and none was ever created: create it.
    CreatePod,
    /// The Pod is on its way or running: record that, wait for the next change.
    Progress(Progress),
    /// The container has ended: read its log, then finish with [`collected`].
    Collect(Exited),
    /// The run is over without a log to read.
    Finish(Outcome),
}

/// A non-terminal state of a run with a Pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    /// Pending or Running.
    pub phase: Phase,
    /// Why, in CamelCase (for example `ContainerCreating`).
    pub reason: String,
    /// Explanation for people.
    pub message: String,
    /// When the code started executing, once it has.
    pub started_at: Option<Timestamp>,
    /// When the operator gives up waiting and ends the run TimedOut.
    pub deadline: Timestamp,
}

/// How the sandbox container ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Exited {
    /// The container's exit code (the runner exits with the code's exit code).
    pub exit_code: i32,
    /// The container's terminated reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: Option<String>,
    /// When the container started.
    pub started_at: Option<Timestamp>,
    /// When the container ended.
    pub finished_at: Timestamp,
}

/// The terminal result of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Succeeded, Failed, TimedOut or Rejected.
    pub phase: Phase,
    /// Why, in CamelCase (for example `NonZeroExit`).
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
    /// Run time measured by the runner (Kubernetes timestamps only have whole seconds).
    pub duration_millis: Option<i64>,
}

impl Outcome {
    /// An outcome without any output.
    fn bare(
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
        }
    }
}

/// A run refused before anything executed.
pub fn rejected(reason: &str, message: String, now: Timestamp) -> Outcome {
    Outcome::bare(Phase::Rejected, reason, message, None, now)
}

fn ts(t: &Option<Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

fn sandbox_container(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)
}

/// When the operator stops waiting for a Pod: its deadline counted from when the kubelet
/// accepted it (or from its creation, if it never was), plus slack for the kubelet to act.
pub fn operator_deadline(pod: &Pod, timeout_seconds: u32) -> Option<Timestamp> {
    let base = pod
        .status
        .as_ref()
        .and_then(|s| ts(&s.start_time))
        .or_else(|| ts(&pod.metadata.creation_timestamp))?;
    let seconds = i64::from(timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS)
        + OPERATOR_DEADLINE_SLACK_SECONDS;
    base.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// Decides the next step for a run that is not terminal. `pod` must be fresh from the API server
/// (a direct GET): `None` then really means there is no Pod.
pub fn next(status: &SandboxRunStatus, pod: Option<&Pod>, limits: &Limits, now: Timestamp) -> Next {
    let started = ts(&status.start_time);
    let Some(pod) = pod else {
        // The status says a Pod was created, so a missing Pod was deleted by someone (or lost
        // with its node) before the result was recorded.
        return if matches!(status.phase, Some(Phase::Pending | Phase::Running)) {
            Next::Finish(Outcome::bare(
                Phase::Failed,
                "PodDeleted",
                "the sandbox Pod was deleted before the run finished".to_owned(),
                started,
                now,
            ))
        } else {
            Next::CreatePod
        };
    };

    let pod_status = pod.status.clone().unwrap_or_default();
    let container = sandbox_container(pod);
    let state = container.and_then(|c| c.state.clone()).unwrap_or_default();
    let started = state
        .running
        .as_ref()
        .and_then(|r| ts(&r.started_at))
        .or_else(|| state.terminated.as_ref().and_then(|t| ts(&t.started_at)))
        .or(started);

    // The kubelet enforced activeDeadlineSeconds: the runner itself did not stop in time.
    if pod_status.reason.as_deref() == Some("DeadlineExceeded") {
        return Next::Finish(Outcome::bare(
            Phase::TimedOut,
            "DeadlineExceeded",
            format!(
                "the sandbox exceeded its deadline ({}s timeout + {}s start-up grace) and was stopped",
                limits.timeout_seconds, ACTIVE_DEADLINE_GRACE_SECONDS
            ),
            started,
            now,
        ));
    }

    if let Some(t) = &state.terminated {
        return Next::Collect(Exited {
            exit_code: t.exit_code,
            reason: t.reason.clone(),
            started_at: started,
            finished_at: ts(&t.finished_at).unwrap_or(now),
        });
    }

    // Someone else is deleting the Pod (the operator deletes only after recording a result).
    if pod.metadata.deletion_timestamp.is_some() {
        return Next::Finish(Outcome::bare(
            Phase::Failed,
            "PodDeleted",
            "the sandbox Pod was deleted before the run finished".to_owned(),
            started,
            now,
        ));
    }

    match pod_status.phase.as_deref() {
        Some("Failed") => {
            // Failed without a terminated container: evicted, or lost with its node.
            let reason = pod_status
                .reason
                .clone()
                .unwrap_or_else(|| "PodFailed".to_owned());
            let message = pod_status
                .message
                .clone()
                .unwrap_or_else(|| "the sandbox Pod failed before the code ended".to_owned());
            return Next::Finish(Outcome::bare(Phase::Failed, &reason, message, started, now));
        }
        Some("Succeeded") => {
            // Succeeded without container status (it can be garbage-collected by the kubelet):
            // the log may still hold the result.
            return Next::Collect(Exited {
                exit_code: 0,
                reason: None,
                started_at: started,
                finished_at: now,
            });
        }
        _ => {}
    }

    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if IMAGE_FAILURES.contains(&reason.as_str()) {
            return Next::Finish(Outcome::bare(
                Phase::Failed,
                "ImageUnavailable",
                format!(
                    "the sandbox image is unavailable ({reason}): {}",
                    w.message.clone().unwrap_or_default()
                ),
                None,
                now,
            ));
        }
    }

    let deadline = operator_deadline(pod, limits.timeout_seconds).unwrap_or(now);
    if now >= deadline {
        return Next::Finish(Outcome::bare(
            Phase::TimedOut,
            "DeadlineExceeded",
            format!(
                "the sandbox did not finish within {}s of its Pod starting; the operator stopped it",
                i64::from(limits.timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS)
                    + OPERATOR_DEADLINE_SLACK_SECONDS
            ),
            started,
            now,
        ));
    }

    if state.running.is_some() {
        return Next::Progress(Progress {
            phase: Phase::Running,
            reason: "ContainerStarted".to_owned(),
            message: "the code is running".to_owned(),
            started_at: started,
            deadline,
        });
    }
    let (reason, message) = match &state.waiting {
        Some(w) => (
            w.reason
                .clone()
                .unwrap_or_else(|| "ContainerWaiting".to_owned()),
            w.message
                .clone()
                .unwrap_or_else(|| "the sandbox is starting".to_owned()),
        ),
        None => (
            "PodCreated".to_owned(),
            "the sandbox Pod was created and waits to start".to_owned(),
        ),
    };
    Next::Progress(Progress {
        phase: Phase::Pending,
        reason,
        message,
        started_at: None,
        deadline,
    })
}

/// The last `LOG_TAIL_BYTES` of a log, on a character boundary.
fn log_tail(log: &str) -> &str {
    let mut start = log.len().saturating_sub(LOG_TAIL_BYTES);
    while !log.is_char_boundary(start) {
        start += 1;
    }
    log[start..].trim()
}

/// The terminal outcome of a run whose container ended, from its log.
pub fn collected(exited: &Exited, log: &str, limits: &Limits) -> Outcome {
    let oom_by_kubelet = exited.reason.as_deref() == Some("OOMKilled");
    let parsed = sandboxrun_core::parse_envelope(log);
    let mut outcome = match &parsed {
        Ok(r) => from_result(r, limits, exited),
        Err(e) => {
            let detail = match e {
                EnvelopeError::Missing => format!(
                    "the sandbox ended (exit code {}, {}) without reporting a result",
                    exited.exit_code,
                    exited.reason.as_deref().unwrap_or("no reason")
                ),
                other => other.to_string(),
            };
            let tail = log_tail(log);
            let message = if tail.is_empty() {
                detail
            } else {
                format!("{detail}; last log output: {tail}")
            };
            Outcome::bare(
                Phase::Failed,
                "NoResult",
                message,
                exited.started_at,
                exited.finished_at,
            )
        }
    };
    if oom_by_kubelet {
        outcome.phase = Phase::Failed;
        outcome.reason = "OOMKilled".to_owned();
        outcome.message = format!(
            "the sandbox exceeded its memory limit of {} and was killed",
            limits.memory
        );
    }
    outcome
}

/// Outcome from a runner envelope: the exit code decides, with timeouts and OOM kills named.
fn from_result(r: &RunnerResult, limits: &Limits, exited: &Exited) -> Outcome {
    // The runner already capped each stream; cap again (a runner from another image version
    // must not be able to grow the status) and keep the encoded total within the status budget.
    let cap = limits.output_bytes as usize;
    let (out, err) = (cap_str(&r.stdout, cap), cap_str(&r.stderr, cap));
    let (out_fit, err_fit) = fit_json_budget(&out.text, &err.text, STATUS_OUTPUT_BUDGET_BYTES);
    let truncated =
        r.truncated() || out.truncated || err.truncated || out_fit.truncated || err_fit.truncated;

    let (phase, reason, message) = if r.timed_out {
        (
            Phase::TimedOut,
            "DeadlineExceeded",
            format!(
                "the code ran longer than its timeout of {}s and was stopped",
                limits.timeout_seconds
            ),
        )
    } else if r.exit_code == 0 {
        (
            Phase::Succeeded,
            "Succeeded",
            "the code exited with code 0".to_owned(),
        )
    } else if r.signal == Some(9) && r.oom_kill != Some(false) {
        // SIGKILL that the runner did not send: inside a sandbox that is the OOM killer (the
        // cgroup said so, or could not be read). Code that SIGKILLs itself is reported the same.
        (
            Phase::Failed,
            "OOMKilled",
            format!(
                "the code was killed by SIGKILL, most likely for exceeding its memory limit of {}",
                limits.memory
            ),
        )
    } else if let Some(sig) = r.signal {
        (
            Phase::Failed,
            "NonZeroExit",
            format!(
                "the code was killed by signal {sig} (exit code {})",
                r.exit_code
            ),
        )
    } else {
        (
            Phase::Failed,
            "NonZeroExit",
            format!("the code exited with code {}", r.exit_code),
        )
    };
    Outcome {
        phase,
        reason: reason.to_owned(),
        message,
        exit_code: Some(r.exit_code),
        stdout: Some(out_fit.text),
        stderr: Some(err_fit.text),
        truncated: Some(truncated),
        started_at: exited.started_at,
        finished_at: exited.finished_at,
        duration_millis: r
            .duration_millis
            .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
    }
}

/// The outcome when the log of an ended container cannot be read, once retrying is pointless;
/// `None` while the retry window is still open.
pub fn log_unreadable(exited: &Exited, error: &str, now: Timestamp) -> Option<Outcome> {
    let give_up = exited
        .finished_at
        .checked_add(SignedDuration::from_secs(LOG_RETRY_WINDOW_SECONDS))
        .unwrap_or(now);
    (now >= give_up).then(|| {
        Outcome::bare(
            Phase::Failed,
            "NoResult",
            format!("the sandbox ended but its log could not be read: {error}"),
            exited.started_at,
            exited.finished_at,
        )
    })
}

/// Sets a condition, keeping its lastTransitionTime when its status does not change.
pub(crate) fn set_condition(
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
fn base(prev: &SandboxRunStatus, tool: Option<Tool>, generation: Option<i64>) -> SandboxRunStatus {
    SandboxRunStatus {
        tool,
        decision: prev.decision.clone(),
        conditions: prev.conditions.clone(),
        observed_generation: generation,
        ..Default::default()
    }
}

/// Status of a run whose Pod was just created or is in progress.
pub fn progress_status(
    prev: &SandboxRunStatus,
    progress: &Progress,
    pod_name: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> SandboxRunStatus {
    let mut s = base(prev, Some(Tool::Python), generation);
    s.phase = Some(progress.phase);
    s.reason = Some(progress.reason.clone());
    s.message = Some(progress.message.clone());
    s.pod_name = Some(pod_name.to_owned());
    s.start_time = progress.started_at.map(Time);
    let running = progress.phase == Phase::Running;
    let (started_reason, started_message) = if running {
        ("ContainerStarted", "the code started executing")
    } else {
        (progress.reason.as_str(), progress.message.as_str())
    };
    set_condition(
        &mut s.conditions,
        CONDITION_STARTED,
        running,
        started_reason,
        started_message,
        generation,
        now,
    );
    set_condition(
        &mut s.conditions,
        CONDITION_COMPLETED,
        false,
        progress.phase.as_str(),
        "the run has not finished",
        generation,
        now,
    );
    s
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
    s.pod_name = pod_name.map(str::to_owned);
    s.start_time = outcome.started_at.map(Time);
    s.completion_time = Some(Time(outcome.finished_at));
    s.duration_millis = outcome.duration_millis.or_else(|| {
        outcome
            .started_at
            .map(|start| outcome.finished_at.duration_since(start).as_millis().max(0) as i64)
    });
    let started = outcome.started_at.is_some();
    set_condition(
        &mut s.conditions,
        CONDITION_STARTED,
        started,
        if started {
            "ContainerStarted"
        } else {
            "NotStarted"
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

#[cfg(test)]
#[path = "phase_tests.rs"]
mod tests;
