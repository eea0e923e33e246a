//! The sandbox Pod's state machine, pure: from what the run's status says and what its Pod shows
//! (or that it has none), decide the next step ([`next`]) and the status that describes it. How
//! an ended sandbox is classified is core's ([`classify`]); [`collected`] only says what the
//! kubelet saw. No I/O, no clock: `now` is a parameter, so every transition is unit-tested.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use sandboxrun_api::{CONDITION_COMPLETED, CONDITION_STARTED, SandboxRun, SandboxRunStatus};
use sandboxrun_core::tools::python::classify;
use sandboxrun_core::{
    EnvelopeError, FileCaps, Limits, Observed, Phase, Reason, Tool, parse_envelope,
};

use super::pod::{ACTIVE_DEADLINE_GRACE_SECONDS, controlling_run, sandbox_container};
use crate::admission::Placement;
use crate::outcome::{Outcome, base, set_condition};

/// Seconds past the Pod's own deadline after which the operator stops waiting for the kubelet
/// and ends the run itself (covers Pods that never start: unschedulable, stuck pulling).
pub const OPERATOR_DEADLINE_SLACK_SECONDS: i64 = 30;
/// Seconds after the container ended during which unreadable logs are retried before the run
/// ends Failed/NoResult.
pub const LOG_RETRY_WINDOW_SECONDS: i64 = 60;
/// The kubelet's termination reason of a container killed for memory.
pub const KUBELET_OOM_KILLED: &str = "OOMKilled";
/// The kubelet's reason of a Pod stopped at its `activeDeadlineSeconds`.
const KUBELET_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Status reason of a Pending run whose container waits without saying why.
const CONTAINER_WAITING: &str = "ContainerWaiting";

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

fn ts(t: &Option<Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

/// Where `pod` stands with the scheduler: on a node, refused for room, or not yet either.
pub fn placement(pod: &Pod) -> Placement {
    if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
        Placement::Placed
    } else if unschedulable(pod) {
        Placement::Unschedulable
    } else {
        Placement::Waiting
    }
}

/// The run whose own sandbox Pod `pod` is (its name and uid), if a node has taken the Pod: what
/// the controller's watch of Pods tells the queue (`controller.rs`). `None` for a Pod
/// waiting for a node or refused one (that no node has room is for the run's reconcile to tell,
/// which knows the run still holds the Pod: a watch also shows Pods of runs that ended), and for
/// a Pod whose controller is not a run (a pool's).
///
/// Told from the watch, not from the run's next reconcile that reads its Pod: under load that
/// reconcile often never comes (the run ends on the answer read off its attach stream first),
/// so every sandbox held stayed counted as waiting for a node and holds were learned from late
/// sightings, shorter than they were (e2e/BENCHMARKS.md, "The queue told of placements by the
/// Pod watch").
pub fn placed_run(pod: &Pod) -> Option<(ObjectRef<SandboxRun>, &str)> {
    if placement(pod) != Placement::Placed {
        return None;
    }
    let namespace = pod.metadata.namespace.as_deref()?;
    let owner = controlling_run(pod)?;
    Some((ObjectRef::new(&owner.name).within(namespace), &owner.uid))
}

/// Whether the scheduler found no node for `pod` (its `PodScheduled` condition is False with
/// reason `Unschedulable`): the nodes, not the quota, have no room for another sandbox.
fn unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}

/// When the operator stops waiting for a Pod: its deadline counted from when the kubelet
/// accepted it (or from its creation, if it never was), plus slack for the kubelet to act.
pub fn operator_deadline(pod: &Pod, timeout_seconds: u32) -> Option<Timestamp> {
    let accepted = pod
        .status
        .as_ref()
        .and_then(|s| ts(&s.start_time))
        .or_else(|| ts(&pod.metadata.creation_timestamp))?;
    // A warm sandbox started long before its run: the run's time counts from its claim.
    let base = crate::pool::claimed_at(pod).map_or(accepted, |claimed| claimed.max(accepted));
    let seconds = i64::from(timeout_seconds + ACTIVE_DEADLINE_GRACE_SECONDS)
        + OPERATOR_DEADLINE_SLACK_SECONDS;
    base.checked_add(SignedDuration::from_secs(seconds)).ok()
}

/// Decides the next step for a run that is not terminal. `pod` must be fresh from the API server
/// (a direct GET): `None` then really means there is no Pod.
pub fn next(status: &SandboxRunStatus, pod: Option<&Pod>, limits: &Limits, now: Timestamp) -> Next {
    let started = ts(&status.start_time);
    let Some(pod) = pod else {
        // The status says a Pod was created (it names one), so a missing Pod was deleted by
        // someone (or lost with its node) before the result was recorded. A Pending run without
        // a Pod name waits for its turn in the queue for room: its Pod was never created.
        return if matches!(status.phase, Some(Phase::Pending | Phase::Running))
            && status.pod_name.is_some()
        {
            Next::Finish(Outcome::of(
                Phase::Failed,
                Reason::PodDeleted,
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
    if pod_status.reason.as_deref() == Some(KUBELET_DEADLINE_EXCEEDED) {
        return Next::Finish(Outcome::of(
            Phase::TimedOut,
            Reason::DeadlineExceeded,
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
        return Next::Finish(Outcome::of(
            Phase::Failed,
            Reason::PodDeleted,
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
                .unwrap_or_else(|| Reason::PodFailed.as_str().to_owned());
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
            return Next::Finish(Outcome::of(
                Phase::Failed,
                Reason::ImageUnavailable,
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
        return Next::Finish(Outcome::of(
            Phase::TimedOut,
            Reason::DeadlineExceeded,
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
            reason: Reason::ContainerStarted.as_str().to_owned(),
            message: "the code is running".to_owned(),
            started_at: started,
            deadline,
        });
    }
    let (reason, message) = match &state.waiting {
        Some(w) => (
            w.reason
                .clone()
                .unwrap_or_else(|| CONTAINER_WAITING.to_owned()),
            w.message
                .clone()
                .unwrap_or_else(|| "the sandbox is starting".to_owned()),
        ),
        None => (
            Reason::PodCreated.as_str().to_owned(),
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

/// What the kubelet saw of an ended container, as core's classification reads it. The
/// kubelet's `OOMKilled` is a definite yes; any other reason is no definite no: under gVisor the
/// sandbox's own OOM killer can kill the code inside the sandbox without the host cgroup
/// recording an OOM kill, so the kubelet then reports `Error` (`None`: it cannot tell).
pub fn observed(exited: &Exited, log: &str, envelope_error: Option<&EnvelopeError>) -> Observed {
    let oom = exited.reason.as_deref() == Some(KUBELET_OOM_KILLED);
    Observed {
        oom_killed: oom.then_some(true),
        // activeDeadlineSeconds is handled by `next` before any log is read.
        deadline_hit: false,
        pids_limit_hit: false,
        exit_code: Some(exited.exit_code),
        platform_reason: exited.reason.clone(),
        // "Missing" says no more than "without reporting a result".
        envelope_error: envelope_error
            .filter(|e| **e != EnvelopeError::Missing)
            .map(ToString::to_string),
        detail: log.to_owned(),
    }
}

/// The terminal outcome of a run whose container ended, from its log: the runner's envelope and
/// what the kubelet saw, classified by core ([`classify`]).
/// Returned files are checked against `files`, the caps of the run's policy rule.
pub fn collected(exited: &Exited, log: &str, limits: &Limits, files: FileCaps) -> Outcome {
    let parsed = parse_envelope(log);
    let envelope = parsed.as_ref().ok();
    let seen = observed(exited, log, parsed.as_ref().err());
    let c = classify(envelope, &seen, limits, files);
    // Output only when the runner reported some: a run without a result has none to show.
    let ran = envelope.is_some();
    Outcome {
        phase: c.phase,
        reason: c.reason.as_str().to_owned(),
        message: c.message,
        exit_code: c.exit_code,
        stdout: ran.then_some(c.stdout),
        stderr: ran.then_some(c.stderr),
        truncated: ran.then_some(c.truncated),
        started_at: exited.started_at,
        finished_at: exited.finished_at,
        duration_millis: c
            .duration_millis
            .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        files: c.files,
        files_omitted: c.files_omitted,
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
        Outcome::of(
            Phase::Failed,
            Reason::NoResult,
            format!("the sandbox ended but its log could not be read: {error}"),
            exited.started_at,
            exited.finished_at,
        )
    })
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
        (
            Reason::ContainerStarted.as_str(),
            "the code started executing",
        )
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

#[cfg(test)]
#[path = "phase_tests.rs"]
mod tests;
