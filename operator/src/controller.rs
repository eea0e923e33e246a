//! The SandboxRun controller: `reconcile` and `error_policy` over a shared [`Context`]. Every
//! decision is derived from the run and its Pod as they are now (see `phase`), so reconciling
//! twice, or after a restart, converges on the same state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use sandboxrun_api::{SandboxRun, SandboxRunStatus};
use sandboxrun_core::metrics::PrometheusClient;
use sandboxrun_core::{Databases, Phase, PolicyStore, Tool, Verdict};
use serde_json::json;
use tracing::{info, warn};

use crate::audit;
use crate::events::Events;
use crate::gate::{self, Gate};
use crate::metrics::Metrics;
use crate::phase::{self, Next, Outcome, Progress};
use crate::pod::{self, BuildError, SandboxConfig};
use crate::{result, ttl};

/// The one field manager of every status write (server-side apply).
pub const FIELD_MANAGER: &str = "sandboxrun-operator";
/// Longest wait between retries of a failing reconciliation.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What every reconciliation shares.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Sandbox Pod settings from the configuration.
    pub sandbox: SandboxConfig,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Event publisher.
    pub events: Events,
    /// The policy judging every run; `None` allows every run (no `--policy-file`).
    pub policy: Option<Arc<PolicyStore>>,
    /// How long an escalated run waits for a person's approval.
    pub approval_timeout: SignedDuration,
    /// Databases sql runs query; `None`: sql runs end Rejected.
    pub databases: Option<Databases>,
    /// The Prometheus metrics runs query; `None`: metrics runs end Rejected.
    pub prometheus: Option<PrometheusClient>,
    /// Consecutive failures per run, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<SandboxRun>, u32>>,
}

impl Context {
    /// A context with no failures recorded.
    pub fn new(
        client: Client,
        sandbox: SandboxConfig,
        metrics: Arc<Metrics>,
        events: Events,
        policy: Option<Arc<PolicyStore>>,
        approval_timeout: SignedDuration,
    ) -> Self {
        Self {
            client,
            sandbox,
            metrics,
            events,
            policy,
            approval_timeout,
            databases: None,
            prometheus: None,
            failures: Mutex::default(),
        }
    }

    /// The same context, executing metrics runs against `prometheus`.
    pub fn with_prometheus(mut self, prometheus: Option<PrometheusClient>) -> Self {
        self.prometheus = prometheus;
        self
    }

    /// The same context, executing sql runs against `databases`.
    pub fn with_databases(mut self, databases: Option<Databases>) -> Self {
        self.databases = databases;
        self
    }

    /// What policy says about `run` now (everything is allowed without a policy).
    fn decide(&self, run: &SandboxRun, tool: Tool) -> sandboxrun_core::Decision {
        let call = gate::call_context(&run.spec, tool);
        match &self.policy {
            Some(store) => store.evaluate(&call),
            None => gate::allow_all(&call),
        }
    }
}

/// Why a reconciliation failed; all of these are retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The run is not namespaced (cannot happen for objects read from the API).
    #[error("the run has no namespace")]
    NoNamespace,
    /// The sandbox Pod could not be built.
    #[error("building the sandbox Pod: {0}")]
    Build(#[from] BuildError),
    /// The finished sandbox's log could not be read yet (retried until the retry window ends).
    #[error("reading the log of Pod {pod}: {source}")]
    LogUnreadable {
        /// The Pod.
        pod: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Error {
    /// Short name for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "Kube",
            Error::NoNamespace => "NoNamespace",
            Error::Build(_) => "Build",
            Error::LogUnreadable { .. } => "LogUnreadable",
        }
    }
}

/// Writes the whole status with server-side apply: fields the operator stops setting are removed.
async fn apply_status(
    runs: &Api<SandboxRun>,
    name: &str,
    status: &SandboxRunStatus,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": SandboxRun::api_version(&()),
        "kind": SandboxRun::kind(&()),
        "status": status,
    });
    runs.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Deletes a Pod; one that is already gone is fine.
async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<(), Error> {
    match pods.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Requeue delay until `deadline` (at least a second: the Pod watch usually comes first).
fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    let left = deadline.duration_since(now).as_millis().max(1000);
    Duration::from_millis(left as u64)
}

/// Reconciles one SandboxRun.
pub async fn reconcile(run: Arc<SandboxRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let action = reconcile_inner(&run, &ctx).await?;
    ctx.failures
        .lock()
        .expect("not poisoned")
        .remove(&ObjectRef::from_obj(run.as_ref()));
    Ok(action)
}

async fn reconcile_inner(run: &SandboxRun, ctx: &Context) -> Result<Action, Error> {
    let ns = run.namespace().ok_or(Error::NoNamespace)?;
    let name = run.name_any();
    if run.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the Pod through its ownerReference.
        return Ok(Action::await_change());
    }
    let runs: Api<SandboxRun> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let now = Timestamp::now();
    let mut prev = run.status.clone().unwrap_or_default();

    if prev.phase.is_some_and(Phase::is_terminal) {
        return finished(run, &prev, &runs, &pods, now).await;
    }

    let Some(tool) = run.spec.tool() else {
        let outcome = phase::rejected(
            "NoTool",
            "the run sets none of python, sql or metrics".to_owned(),
            now,
        );
        return finish(run, ctx, &prev, None, &outcome, None, &runs, &pods, now).await;
    };
    let generation = run.metadata.generation;

    // Policy judges a run once, on its first reconciliation. Runs that predate the policy gate
    // (a phase but no decision) are left to finish as they started.
    let mut decided: Option<sandboxrun_core::Decision> = None;
    if prev.decision.is_none() && prev.phase.is_none() {
        // The cache may lag our own decision write: decide on the run as it is now.
        match runs.get_opt(&name).await? {
            Some(fresh) => prev = fresh.status.unwrap_or_default(),
            None => return Ok(Action::await_change()),
        }
        if prev.phase.is_some_and(Phase::is_terminal) {
            return finished(run, &prev, &runs, &pods, now).await;
        }
        if prev.decision.is_none() && prev.phase.is_none() {
            let decision = ctx.decide(run, tool);
            let record = gate::recorded(&decision);
            info!(run = %name, namespace = %ns, decision = %decision, "policy decision");
            ctx.events.decided(run, &record).await;
            if record.verdict == Verdict::Allow {
                // Recorded before anything executes; Block and Escalate record it with their
                // phase just below.
                let status = gate::decided_status(&prev, tool, record, generation);
                apply_status(&runs, &name, &status).await?;
                prev = status;
            } else {
                prev.decision = Some(record);
            }
            decided = Some(decision);
        }
    }

    if let Some(decision) = prev.decision.clone() {
        let approval = gate::approval_state(run.spec.approval.as_ref(), generation);
        let since = gate::awaiting_since(&prev, run.metadata.creation_timestamp.as_ref(), now);
        let awaiting = prev.phase == Some(Phase::AwaitingApproval);
        match gate::gate(&decision, approval, since, ctx.approval_timeout, now) {
            Gate::Reject(outcome) => {
                if decision.verdict == Verdict::Escalate {
                    gate::mark_not_approved(
                        &mut prev,
                        &outcome.reason,
                        &outcome.message,
                        generation,
                        now,
                    );
                }
                return finish(
                    run,
                    ctx,
                    &prev,
                    Some(tool),
                    &outcome,
                    None,
                    &runs,
                    &pods,
                    now,
                )
                .await;
            }
            Gate::Await { deadline } => {
                if !awaiting {
                    let approve = gate::approve_command(&name, &ns);
                    let status = gate::awaiting_status(&prev, tool, &approve, generation, now);
                    apply_status(&runs, &name, &status).await?;
                    info!(run = %name, namespace = %ns, "run awaits approval");
                    ctx.metrics.entered(Phase::AwaitingApproval);
                }
                // A change of spec.approval wakes the run up before this.
                return Ok(Action::requeue(until(deadline, now)));
            }
            Gate::Proceed => {
                let newly_approved = decision.verdict == Verdict::Escalate
                    && !prev
                        .conditions
                        .iter()
                        .any(|c| c.type_ == gate::CONDITION_APPROVED && c.status == "True");
                if newly_approved {
                    gate::mark_approved(&mut prev, generation, now);
                    apply_status(&runs, &name, &prev).await?;
                    info!(run = %name, namespace = %ns, "run approved");
                    ctx.events.approved(run).await;
                }
            }
        }
    }

    if tool == Tool::Sql || tool == Tool::Metrics {
        // The query runs here, in the reconcile: a reconcile woken by our own earlier status
        // write may still see the run before its terminal status, so ask the API server first.
        if let Some(done) = terminal_now(&runs, &name).await? {
            return finished(run, &done, &runs, &pods, now).await;
        }
        let (outcome, result) = if tool == Tool::Sql {
            crate::sql::execute(
                run,
                ctx.databases.as_ref(),
                ctx.policy.as_deref(),
                Timestamp::now(),
            )
            .await
        } else {
            crate::promql::execute(
                run,
                ctx.prometheus.as_ref(),
                ctx.policy.as_deref(),
                Timestamp::now(),
            )
            .await
        };
        let status = SandboxRunStatus {
            result,
            ..phase::outcome_status(&prev, Some(tool), &outcome, None, generation, now)
        };
        return finish_with_status(
            run,
            ctx,
            status,
            Some(tool),
            &outcome,
            None,
            &runs,
            &pods,
            now,
        )
        .await;
    }

    if tool != Tool::Python {
        let outcome = phase::rejected(
            "ToolNotImplemented",
            format!(
                "the {tool} tool is not executed by this version of sandboxrun yet; only python, sql and metrics runs"
            ),
            now,
        );
        return finish(
            run,
            ctx,
            &prev,
            Some(tool),
            &outcome,
            None,
            &runs,
            &pods,
            now,
        )
        .await;
    }

    let pod_name = pod::pod_name(&name);
    // Always read the Pod from the API server, never a cache: "no Pod" must mean no Pod.
    let pod = pods.get_opt(&pod_name).await?;
    // The limits the Pod was built with (policy may have lowered the requested ones).
    let limits = pod
        .as_ref()
        .and_then(pod::limits_of)
        .unwrap_or_else(|| run.spec.limits.effective());
    if pod.is_none() {
        // The cached run may lag our own last status write (for example the terminal one,
        // just before we deleted the Pod): decide on the run as it is now.
        match runs.get_opt(&name).await? {
            Some(fresh) => prev = fresh.status.unwrap_or_default(),
            None => return Ok(Action::await_change()),
        }
        if prev.phase.is_some_and(Phase::is_terminal) {
            return finished(run, &prev, &runs, &pods, now).await;
        }
    }

    match phase::next(&prev, pod.as_ref(), &limits, now) {
        Next::CreatePod => {
            // The decision's limits: the requested ones, lowered to the policy rule's ceilings.
            let limits = match decided {
                Some(d) => d.limits,
                None => ctx.decide(run, tool).limits,
            };
            let desired = pod::build_with_limits(run, &ctx.sandbox, &limits)?;
            match pods.create(&PostParams::default(), &desired).await {
                Ok(_) => {
                    info!(run = %name, namespace = %ns, pod = %pod_name, "created sandbox pod");
                    // Counted here, once per Pod: a lagging cache can show "no phase" again.
                    ctx.metrics.entered(Phase::Pending);
                    ctx.events.pod_created(run, &pod_name).await;
                }
                // Created before a restart, or by a concurrent reconcile: same Pod, same name.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                // Refused for good (admission, quota, Pod Security, unknown RuntimeClass):
                // retrying would fail the same way.
                Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                    let outcome = phase::rejected(
                        "PodCreationFailed",
                        format!("the API server refused the sandbox Pod: {}", e.message),
                        now,
                    );
                    let outcome = Outcome {
                        phase: Phase::Failed,
                        ..outcome
                    };
                    return finish(
                        run,
                        ctx,
                        &prev,
                        Some(tool),
                        &outcome,
                        None,
                        &runs,
                        &pods,
                        now,
                    )
                    .await;
                }
                Err(e) => return Err(e.into()),
            }
            let deadline = now
                .checked_add(SignedDuration::from_secs(
                    i64::from(limits.timeout_seconds + pod::ACTIVE_DEADLINE_GRACE_SECONDS)
                        + phase::OPERATOR_DEADLINE_SLACK_SECONDS,
                ))
                .unwrap_or(now);
            let progress = Progress {
                phase: Phase::Pending,
                reason: "PodCreated".to_owned(),
                message: format!("created sandbox Pod {pod_name}"),
                started_at: None,
                deadline,
            };
            progress_to(run, ctx, &prev, &progress, &pod_name, &runs, now).await
        }
        Next::Progress(progress) => {
            progress_to(run, ctx, &prev, &progress, &pod_name, &runs, now).await
        }
        Next::Collect(exited) => {
            let outcome = match result::read_log(&pods, &pod_name, &limits).await {
                Ok(log) => phase::collected(&exited, &log, &limits),
                Err(source) => match phase::log_unreadable(&exited, &source.to_string(), now) {
                    Some(outcome) => outcome,
                    None => {
                        return Err(Error::LogUnreadable {
                            pod: pod_name,
                            source,
                        });
                    }
                },
            };
            finish(
                run,
                ctx,
                &prev,
                Some(tool),
                &outcome,
                Some(&pod_name),
                &runs,
                &pods,
                now,
            )
            .await
        }
        Next::Finish(outcome) => {
            finish(
                run,
                ctx,
                &prev,
                Some(tool),
                &outcome,
                Some(&pod_name),
                &runs,
                &pods,
                now,
            )
            .await
        }
    }
}

/// Records a non-terminal state (only when it changed) and waits for the Pod to move.
async fn progress_to(
    run: &SandboxRun,
    ctx: &Context,
    prev: &SandboxRunStatus,
    progress: &Progress,
    pod_name: &str,
    runs: &Api<SandboxRun>,
    now: Timestamp,
) -> Result<Action, Error> {
    let status = phase::progress_status(prev, progress, pod_name, run.metadata.generation, now);
    if &status != prev {
        apply_status(runs, &run.name_any(), &status).await?;
    }
    if prev.phase != Some(progress.phase) && progress.phase == Phase::Running {
        ctx.metrics.entered(Phase::Running);
        ctx.events.started(run, pod_name).await;
        if let (Some(start), Some(created)) = (
            progress.started_at,
            run.metadata.creation_timestamp.as_ref(),
        ) {
            // Whole seconds: Kubernetes timestamps have no finer resolution.
            let wait = start.duration_since(created.0).as_secs_f64();
            ctx.metrics.queue_to_start.observe(wait.max(0.0));
        }
    }
    Ok(Action::requeue(until(progress.deadline, now)))
}

/// Records a terminal outcome, then deletes the Pod and schedules the TTL.
#[allow(clippy::too_many_arguments)]
async fn finish(
    run: &SandboxRun,
    ctx: &Context,
    prev: &SandboxRunStatus,
    tool: Option<Tool>,
    outcome: &Outcome,
    pod_name: Option<&str>,
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    now: Timestamp,
) -> Result<Action, Error> {
    let status = phase::outcome_status(prev, tool, outcome, pod_name, run.metadata.generation, now);
    finish_with_status(run, ctx, status, tool, outcome, pod_name, runs, pods, now).await
}

/// [`finish`] with the terminal status already built (sql runs add `result`).
#[allow(clippy::too_many_arguments)]
async fn finish_with_status(
    run: &SandboxRun,
    ctx: &Context,
    status: SandboxRunStatus,
    tool: Option<Tool>,
    outcome: &Outcome,
    pod_name: Option<&str>,
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    now: Timestamp,
) -> Result<Action, Error> {
    let name = run.name_any();
    // A run ends once: one terminal status, one audit line, even when this reconcile started from
    // a cached copy that predates a terminal status written by the previous one.
    if let Some(done) = terminal_now(runs, &name).await? {
        return finished(run, &done, runs, pods, now).await;
    }
    // The status first: the Pod (and its log) must outlive the only record of the result.
    apply_status(runs, &name, &status).await?;
    info!(run = %name, phase = %outcome.phase, reason = %outcome.reason, "run finished");
    // The call's one audit line: the run is terminal from here on.
    audit::record(run, tool, &status, outcome.phase, &outcome.reason, now);
    ctx.metrics.entered(outcome.phase);
    ctx.metrics.finished_call(
        tool,
        &run.spec.agent,
        run.spec.environment,
        status.decision.as_ref().map(|d| d.verdict),
        outcome.phase,
    );
    if let Some(start) = outcome.started_at {
        let secs = outcome.finished_at.duration_since(start).as_secs_f64();
        ctx.metrics.run_duration.observe(secs.max(0.0));
    }
    ctx.events
        .finished(run, outcome.phase, &outcome.reason, &outcome.message)
        .await;
    if let Some(pod) = pod_name {
        delete_pod(pods, pod).await?;
    }
    Ok(after_ttl(run, &status, now))
}

/// The run's status as the API server has it now, if that is terminal. Reconciles start from
/// the watch cache, which can lag the operator's own last status write.
async fn terminal_now(
    runs: &Api<SandboxRun>,
    name: &str,
) -> Result<Option<SandboxRunStatus>, Error> {
    Ok(runs
        .get_opt(name)
        .await?
        .and_then(|fresh| fresh.status)
        .filter(|status| status.phase.is_some_and(Phase::is_terminal)))
}

/// Time left before a finished run is deleted (`None`: due now). Counted from its completion
/// time, or from its creation should the completion time be missing.
fn ttl_left(run: &SandboxRun, status: &SandboxRunStatus, now: Timestamp) -> Option<Duration> {
    let completed = status
        .completion_time
        .as_ref()
        .or(run.metadata.creation_timestamp.as_ref())
        .map_or(now, |t| t.0);
    ttl::time_left(completed, run.spec.ttl_seconds_after_finished, now)
}

/// Requeue for the TTL of a run that just finished.
fn after_ttl(run: &SandboxRun, status: &SandboxRunStatus, now: Timestamp) -> Action {
    // When due already, reconcile again right away: the terminal path deletes the run.
    Action::requeue(ttl_left(run, status, now).unwrap_or(Duration::from_millis(1)))
}

/// A run in a terminal phase: make sure its Pod is gone, delete the run once its TTL passed.
async fn finished(
    run: &SandboxRun,
    status: &SandboxRunStatus,
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    now: Timestamp,
) -> Result<Action, Error> {
    if let Some(pod) = &status.pod_name {
        // Covers a crash between recording the result and deleting the Pod.
        delete_pod(pods, pod).await?;
    }
    match ttl_left(run, status, now) {
        Some(left) => Ok(Action::requeue(left)),
        None => {
            info!(run = %run.name_any(), "TTL expired, deleting run");
            match runs
                .delete(&run.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => Ok(Action::await_change()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// Retries a failed reconciliation with exponential backoff per run: 1 s, 2 s, 4 s ... 60 s.
pub fn error_policy(run: Arc<SandboxRun>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(error.kind());
    let mut failures = ctx.failures.lock().expect("not poisoned");
    let n = failures
        .entry(ObjectRef::from_obj(run.as_ref()))
        .or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(6)).min(MAX_BACKOFF);
    warn!(run = %run.name_any(), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Runs the controller until `shutdown` completes; in-flight reconciliations finish first.
pub async fn run(
    ctx: Arc<Context>,
    namespace: &str,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (runs, pods): (Api<SandboxRun>, Api<Pod>) = if namespace.is_empty() {
        (Api::all(client.clone()), Api::all(client))
    } else {
        (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client, namespace),
        )
    };
    if let Err(e) = runs.list(&ListParams::default().limit(1)).await {
        warn!(error = %e, "cannot list SandboxRuns: is the CRD installed and RBAC granted?");
    }
    let pod_watch =
        watcher::Config::default().labels(&format!("{}={}", pod::LABEL_MANAGED_BY, pod::MANAGER));
    Controller::new(runs, watcher::Config::default().any_semantic())
        .owns(pods, pod_watch)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(run = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}
