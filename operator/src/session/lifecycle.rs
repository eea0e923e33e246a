//! What a session does next, from its status and its Pod (pure): the session controller
//! (`controller.rs`) does the I/O.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use sandboxrun_api::{SandboxSessionSpec, SandboxSessionStatus, SessionEndReason, SessionPhase};
use sandboxrun_core::limits::MAX_TIMEOUT_SECONDS;

use crate::python::phase::OPERATOR_DEADLINE_SLACK_SECONDS;
use crate::python::pod::{ACTIVE_DEADLINE_GRACE_SECONDS, sandbox_container};

/// How long a session's sandbox may take to start (an image pull, a slow node).
pub const START_WITHIN: SignedDuration = SignedDuration::from_secs(120);
/// How long an ended session is kept (for `kubectl get sandboxsessions`) before it is deleted.
pub const KEEP_ENDED: SignedDuration = SignedDuration::from_secs(600);
/// The longest a call can hold a session: any call's timeout, the end's grace and the
/// operator's slack. A lease older than this belongs to a run that is gone.
pub const LONGEST_CALL: SignedDuration = SignedDuration::from_secs(
    MAX_TIMEOUT_SECONDS as i64
        + ACTIVE_DEADLINE_GRACE_SECONDS as i64
        + OPERATOR_DEADLINE_SLACK_SECONDS,
);

/// How long after its sandbox ended a call that holds the session has to end the session itself
/// (it reads its result off the stream it holds, at once, or the sandbox's log) before the
/// session ends lost. Also how much later a call whose sandbox died without a result (killed
/// for memory) hears that its session was lost: it waits for this end.
pub const CALL_ENDS_WITHIN: SignedDuration = SignedDuration::from_secs(10);

/// The next step for a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ended: its Pod is deleted, and the session itself at `forget_at`.
    Clean { forget_at: Timestamp },
    /// Record the name of its Pod (before the Pod exists: a restart asks for the same one).
    RecordPod,
    /// Create its Pod (recorded, not there yet).
    CreatePod,
    /// Its sandbox started: it is Ready for calls.
    MarkReady,
    /// End it.
    End(SessionEndReason, String),
    /// Nothing to do until `at` (or until its Pod or status changes).
    WaitUntil(Timestamp),
}

/// When `session` was created (`now` for one not read from the API server).
pub fn created(session: &sandboxrun_api::SandboxSession, now: Timestamp) -> Timestamp {
    session
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0)
}

/// When the session started its life: its sandbox's start, else its creation.
fn started(status: &SandboxSessionStatus, created: Timestamp) -> Timestamp {
    status.start_time.as_ref().map_or(created, |t| t.0)
}

/// When the session reaches its longest life.
pub fn lifetime_end(
    spec: &SandboxSessionSpec,
    status: &SandboxSessionStatus,
    created: Timestamp,
) -> Timestamp {
    started(status, created)
        .saturating_add(SignedDuration::from_secs(spec.max_lifetime().into()))
        .unwrap_or(created)
}

/// When an idle session ends: its last call's end (or its start) plus the idle timeout, at
/// most its longest life.
pub fn expiry(
    spec: &SandboxSessionSpec,
    status: &SandboxSessionStatus,
    created: Timestamp,
) -> Timestamp {
    let start = started(status, created);
    let last = status
        .last_call_time
        .as_ref()
        .map_or(start, |t| t.0)
        .max(start);
    last.saturating_add(SignedDuration::from_secs(spec.idle_timeout().into()))
        .unwrap_or(last)
        .min(lifetime_end(spec, status, created))
}

/// Whether the session's sandbox runs and takes calls: its container started (for a data
/// session, once the imports are done: the startup probe).
pub fn sandbox_started(pod: &Pod) -> bool {
    sandbox_container(pod).is_some_and(|c| {
        c.started == Some(true) && c.state.as_ref().is_some_and(|s| s.running.is_some())
    })
}

/// The session's sandbox container's end, if the kubelet reports one.
fn sandbox_terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    sandbox_container(pod)?.state.as_ref()?.terminated.as_ref()
}

/// When the session's sandbox container ended, if the kubelet says.
fn sandbox_finished_at(pod: &Pod) -> Option<Timestamp> {
    sandbox_terminated(pod)?.finished_at.as_ref().map(|t| t.0)
}

/// Why the session's sandbox is gone, if it ended.
pub fn sandbox_ended(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref().unwrap_or_default();
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return Some("its sandbox reached its deadline".to_owned());
    }
    if let Some(done) = sandbox_terminated(pod) {
        return Some(format!(
            "its sandbox exited ({}, code {})",
            done.reason.as_deref().unwrap_or("no reason"),
            done.exit_code
        ));
    }
    matches!(phase, "Succeeded" | "Failed").then(|| format!("its sandbox Pod is {phase}"))
}

/// The next step for the session `spec`/`status`, created at `created`, whose Pod is `pod`
/// (`None`: none, or not the session's own).
pub fn next(
    spec: &SandboxSessionSpec,
    status: &SandboxSessionStatus,
    created: Timestamp,
    pod: Option<&Pod>,
    now: Timestamp,
) -> Step {
    if status.ended() {
        let ended = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ended")
            .map_or(now, |c| c.last_transition_time.0);
        return Step::Clean {
            forget_at: ended.saturating_add(KEEP_ENDED).unwrap_or(ended),
        };
    }
    if status.pod_name.is_none() {
        return Step::RecordPod;
    }
    let phase = status.phase.unwrap_or(SessionPhase::Pending);
    let Some(pod) = pod else {
        return if phase == SessionPhase::Pending {
            Step::CreatePod
        } else {
            Step::End(
                SessionEndReason::SandboxLost,
                "its sandbox Pod was deleted".to_owned(),
            )
        };
    };
    if let Some(why) = sandbox_ended(pod) {
        // A call that holds the session ends it itself, with what its result says (the code
        // ended the interpreter: InterpreterExited), and the session ends lost only if that
        // call does not in time (its run is gone). Ended here at once, a call's `os._exit`
        // raced the call's own reconcile and its session read SandboxLost (seen in CI).
        if status.active_run.is_some()
            && let Some(ended) = sandbox_finished_at(pod)
        {
            let give_up = ended.saturating_add(CALL_ENDS_WITHIN).unwrap_or(ended);
            if now < give_up {
                return Step::WaitUntil(give_up);
            }
        }
        return Step::End(SessionEndReason::SandboxLost, why);
    }
    let lifetime = lifetime_end(spec, status, created);
    if now >= lifetime {
        return Step::End(
            SessionEndReason::MaxLifetime,
            format!("it reached its longest life ({} s)", spec.max_lifetime()),
        );
    }
    match phase {
        SessionPhase::Pending if sandbox_started(pod) => Step::MarkReady,
        SessionPhase::Pending => {
            let give_up = created.saturating_add(START_WITHIN).unwrap_or(created);
            if now >= give_up {
                Step::End(
                    SessionEndReason::SandboxLost,
                    format!("its sandbox did not start within {START_WITHIN:#}"),
                )
            } else {
                Step::WaitUntil(give_up)
            }
        }
        _ => match (&status.active_run, &status.active_since) {
            // A call runs: it ends the idle time; a lease older than any call is a run's that
            // is gone without giving it back, whose code may still run.
            (Some(_), since) => {
                let since = since.as_ref().map_or(now, |t| t.0);
                let stale = since.saturating_add(LONGEST_CALL).unwrap_or(since);
                if now >= stale {
                    Step::End(
                        SessionEndReason::CallCancelled,
                        "a call held it past any call's timeout".to_owned(),
                    )
                } else {
                    Step::WaitUntil(stale.min(lifetime))
                }
            }
            (None, _) => {
                let idle = expiry(spec, status, created);
                if now >= idle {
                    Step::End(
                        SessionEndReason::IdleTimeout,
                        format!("no call came for {} s", spec.idle_timeout()),
                    )
                } else {
                    Step::WaitUntil(idle)
                }
            }
        },
    }
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
