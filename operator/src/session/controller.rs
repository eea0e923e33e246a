//! The SandboxSession controller: gives each session its sandbox Pod, marks it Ready once the
//! sandbox runs, ends it (idle, longest life, sandbox lost) and deletes its Pod, and forgets an
//! ended session after a while. Calls are the runs' business (`call.rs`); both write the
//! session's status only over the status they read (a resourceVersion precondition).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use sandboxrun_api::{SandboxSession, SandboxSessionStatus, SessionEndReason, SessionPhase};
use tracing::{info, warn};

use super::lifecycle::{self, Step};
use super::pod as session_pod;
use crate::controller::{Context, Error, refused_for_good, until};
use crate::python::pod::{LABEL_MANAGED_BY, MANAGER};

/// The condition an ended session carries (its transition time is when it ended).
pub const CONDITION_ENDED: &str = "Ended";

/// Writes `status` over `session` as it was read: `Ok(None)` when the session changed since
/// (or is gone): the caller reads it again.
pub async fn write_status(
    api: &Api<SandboxSession>,
    session: &SandboxSession,
    status: SandboxSessionStatus,
) -> Result<Option<SandboxSession>, kube::Error> {
    let mut next = session.clone();
    next.status = Some(status);
    next.metadata.managed_fields = None;
    match api
        .replace_status(&session.name_any(), &PostParams::default(), &next)
        .await
    {
        Ok(written) => Ok(Some(written)),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// `status`, ended for `reason`: final, with no call holding it.
pub fn ended_status(
    status: &SandboxSessionStatus,
    reason: SessionEndReason,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> SandboxSessionStatus {
    let mut ended = SandboxSessionStatus {
        phase: Some(SessionPhase::Ended),
        end_reason: Some(reason),
        message: Some(format!("the session ended: {message}")),
        active_run: None,
        active_since: None,
        expiry_time: None,
        observed_generation: generation,
        ..status.clone()
    };
    ended.conditions.retain(|c| c.type_ != CONDITION_ENDED);
    ended.conditions.push(Condition {
        type_: CONDITION_ENDED.to_owned(),
        status: "True".to_owned(),
        reason: format!("{reason:?}"),
        message: message.to_owned(),
        last_transition_time: Time(now),
        observed_generation: generation,
    });
    ended
}

/// Ends `session` for `reason` and deletes its sandbox Pod. `Ok(false)`: the session changed
/// under the write (read it again).
pub async fn end(
    api: &Api<SandboxSession>,
    pods: &Api<Pod>,
    session: &SandboxSession,
    reason: SessionEndReason,
    message: &str,
    now: Timestamp,
) -> Result<bool, kube::Error> {
    let status = session.status.clone().unwrap_or_default();
    if !status.ended() {
        let ended = ended_status(&status, reason, message, session.metadata.generation, now);
        if write_status(api, session, ended).await?.is_none() {
            return Ok(false);
        }
        info!(session = %session.name_any(), reason = ?reason, message, "session ended");
    }
    if let Some(pod) = status.pod_name.as_deref() {
        crate::controller::delete_pod(pods, pod).await?;
    }
    Ok(true)
}

/// Reconciles one SandboxSession.
async fn reconcile(session: Arc<SandboxSession>, ctx: Arc<Context>) -> Result<Action, Error> {
    if session.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the Pod through its ownerReference.
        return Ok(Action::await_change());
    }
    let ns = session.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<SandboxSession> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    // Decide on the session as it is now: the runs write its status too.
    let Some(session) = api.get_opt(&session.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let name = session.name_any();
    let status = session.status.clone().unwrap_or_default();
    let pod_name = status
        .pod_name
        .clone()
        .unwrap_or_else(|| session_pod::pod_name(&name));
    let pod = pods
        .get_opt(&pod_name)
        .await?
        .filter(|p| session_pod::belongs_to(p, &session));
    let now = Timestamp::now();
    let created = lifecycle::created(&session, now);
    let generation = session.metadata.generation;
    let again = Action::requeue(Duration::from_millis(200));
    match lifecycle::next(&session.spec, &status, created, pod.as_ref(), now) {
        Step::Clean { forget_at } => {
            if pod.is_some() {
                crate::controller::delete_pod(&pods, &pod_name).await?;
            }
            if now >= forget_at {
                match api.delete(&name, &DeleteParams::background()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                return Ok(Action::await_change());
            }
            Ok(Action::requeue(until(forget_at, now)))
        }
        Step::RecordPod => {
            let recorded = SandboxSessionStatus {
                phase: Some(SessionPhase::Pending),
                pod_name: Some(pod_name.clone()),
                calls: Some(0),
                message: Some(format!("starting sandbox Pod {pod_name}")),
                observed_generation: generation,
                ..status
            };
            Ok(match write_status(&api, &session, recorded).await? {
                Some(_) => Action::requeue(Duration::ZERO),
                None => again,
            })
        }
        Step::CreatePod => {
            let desired = match session_pod::build(&session, &ctx.sandbox) {
                Ok(pod) => pod,
                Err(e) => {
                    end(
                        &api,
                        &pods,
                        &session,
                        SessionEndReason::Rejected,
                        &e.to_string(),
                        now,
                    )
                    .await?;
                    return Ok(Action::await_change());
                }
            };
            match ctx.runner_files.ensure(&ns).await {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if refused_for_good(&e) => {
                    let why = crate::runner_files::refused(&e.message);
                    end(&api, &pods, &session, SessionEndReason::Rejected, &why, now).await?;
                    return Ok(Action::await_change());
                }
                Err(e) => return Err(e.into()),
            }
            match pods.create(&PostParams::default(), &desired).await {
                Ok(_) => info!(session = %name, pod = %pod_name, "created session sandbox pod"),
                Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists" => {}
                Err(kube::Error::Api(e)) if refused_for_good(&e) => {
                    let why = format!("the API server refused its sandbox Pod: {}", e.message);
                    end(&api, &pods, &session, SessionEndReason::Rejected, &why, now).await?;
                    return Ok(Action::await_change());
                }
                Err(e) => return Err(e.into()),
            }
            Ok(Action::requeue(Duration::from_secs(5)))
        }
        Step::MarkReady => {
            let start = Time(now);
            let mut ready = SandboxSessionStatus {
                phase: Some(SessionPhase::Ready),
                start_time: Some(start),
                message: Some("its sandbox waits for a call".to_owned()),
                observed_generation: generation,
                ..status
            };
            ready.expiry_time = Some(Time(lifecycle::expiry(&session.spec, &ready, created)));
            Ok(match write_status(&api, &session, ready).await? {
                Some(_) => Action::requeue(Duration::ZERO),
                None => again,
            })
        }
        Step::End(reason, message) => Ok(
            match end(&api, &pods, &session, reason, &message, now).await? {
                true => Action::requeue(Duration::ZERO),
                false => again,
            },
        ),
        Step::WaitUntil(at) => Ok(Action::requeue(until(at, now))),
    }
}

fn error_policy(session: Arc<SandboxSession>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(session = %session.name_any(), error = %error, "session reconcile failed");
    Action::requeue(Duration::from_secs(2))
}

/// Runs the session controller until `shutdown`: sessions, and their Pods.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (sessions, pods): (Api<SandboxSession>, Api<Pod>) = match namespace {
        None => (Api::all(client.clone()), Api::all(client)),
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
    };
    let pod_watch = watcher::Config::default().labels(&format!(
        "{LABEL_MANAGED_BY}={MANAGER},{}",
        session_pod::LABEL_SESSION
    ));
    let controller =
        Controller::new(sessions, watcher::Config::default().any_semantic()).owns(pods, pod_watch);
    // While this controller runs, the metrics report the open sessions (the leader's count).
    let metrics = ctx.metrics.clone();
    metrics.watch_sessions(Some(controller.store()));
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "session reconcile error");
            }
        })
        .await;
    metrics.watch_sessions(None);
}
