//! The cluster backend: each call becomes a SandboxRun that the operator executes in a gVisor
//! Pod. The frontend creates it, follows it through the one watch all calls share
//! ([`run_watch`](super::run_watch); no polling) until its phase is terminal, and cancels it (`spec.cancelled`) when the caller goes away: the operator
//! then ends it `Cancelled`, stops its sandbox and writes its audit line, so a cancelled call is
//! on the audit trail like any other.
//!
//! A run that policy escalated waits in `AwaitingApproval` for a person. With an approval wait of
//! zero (the default) the call returns at once with an "awaiting approval: <run>" result; with a
//! positive wait the call keeps following the run for that long, sending a progress
//! notification (naming the run) when the wait starts and every [`APPROVAL_PROGRESS_INTERVAL`],
//! and returns the final result when a person decides in time, else the "awaiting approval"
//! result. Either way the run stays for the person to decide: once it awaits approval, a caller
//! that goes away no longer cancels it (it is in a person's hands and on the audit trail, and
//! ends Rejected at the operator's approval timeout at the latest).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use sandboxrun_api::{ClusterTool, SandboxRun, SandboxRunSpec, SandboxRunStatus, SandboxSession};
use sandboxrun_core::{OutputFn, Phase};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::live_log::LogFollower;
use super::run_watch::{Seen, Subscribers, Subscription};
use super::{BackendError, ProgressFn};

/// Label on every SandboxRun this frontend creates, so operators can tell them apart.
const CREATED_BY_LABEL: (&str, &str) = ("app.kubernetes.io/created-by", "sandboxrun-mcp");

/// How often a call waiting for an approval repeats its progress notification: clients that
/// reset their request timeout on progress keep waiting, and a person watching sees it is alive.
pub const APPROVAL_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

/// Attempts at creating a run that meets conflicts (see `KubeBackend::create`).
const CREATE_ATTEMPTS: u32 = 5;

/// How one call follows its run: where its phases and output go, and how long it waits for an
/// approval.
struct Follow {
    progress: ProgressFn,
    output: Option<OutputFn>,
    approval_wait: Duration,
}

/// Creates SandboxRuns in one namespace and waits for their results.
#[derive(Clone)]
pub struct KubeBackend {
    api: Api<SandboxRun>,
    /// The sessions of `run_python` (`close_session` deletes them).
    sessions: Api<SandboxSession>,
    /// The sandbox Pods, whose logs carry a run's output while it runs.
    pods: Api<Pod>,
    namespace: String,
    /// Time allowed on top of a run's own timeout for scheduling, image start and result
    /// collection before the frontend gives up on the operator.
    grace: Duration,
    /// How long a call follows a run that awaits approval before it returns the "awaiting
    /// approval" result (zero: return at once).
    approval_wait: Duration,
    /// The calls following their runs through the shared watch.
    subscribers: Arc<Subscribers>,
}

impl KubeBackend {
    /// Connects with the ambient configuration (KUBECONFIG, or the in-cluster service account).
    /// `approval_wait` is how long a call follows a run awaiting approval (zero: not at all);
    /// `rate` limits the requests of every call together.
    pub async fn connect(
        namespace: String,
        grace: Duration,
        approval_wait: Duration,
        rate: sandboxrun_api::client::ClientRate,
    ) -> anyhow::Result<Self> {
        let client = kube::client::ClientBuilder::try_from(kube::Config::infer().await?)?
            .with_layer(&sandboxrun_api::client::RateLimitLayer::new(rate))
            .build();
        let api = Api::namespaced(client.clone(), &namespace);
        let sessions = Api::namespaced(client.clone(), &namespace);
        let pods = Api::namespaced(client, &namespace);
        let subscribers = Arc::new(Subscribers::default());
        let (key, value) = CREATED_BY_LABEL;
        tokio::spawn(super::run_watch::run(
            api.clone(),
            format!("{key}={value}"),
            subscribers.clone(),
        ));
        Ok(Self {
            api,
            sessions,
            pods,
            namespace,
            grace,
            approval_wait,
            subscribers,
        })
    }

    /// Ends `agent`'s session `id`: deletes its SandboxSession (its sandbox Pod goes with it, and
    /// a call running in it ends Cancelled). Another agent's session, an ended one and an
    /// unknown id get the same words.
    pub async fn close_session(&self, agent: &str, id: &str) -> Result<(), String> {
        let unavailable = |e: kube::Error| {
            format!("could not close session {id}: the cluster did not answer ({e}); try again")
        };
        let session = self.sessions.get_opt(id).await.map_err(unavailable)?;
        let Some(session) = session
            .filter(|s| s.spec.agent == agent && !s.status.as_ref().is_some_and(|st| st.ended()))
        else {
            return Err(sandboxrun_core::tools::python_session::not_found(id));
        };
        // Only the session read: one of the same name made since is not this agent's to close.
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: session.metadata.uid.clone(),
                resource_version: None,
            }),
            ..kube::api::DeleteParams::background()
        };
        match self.sessions.delete(id, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                Err(sandboxrun_core::tools::python_session::not_found(id))
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The SandboxRun of `agent`'s call: generated name `run-…`, the frontend's label.
    pub fn build(spec: SandboxRunSpec) -> SandboxRun {
        with_metadata(SandboxRun::new("", spec))
    }

    /// Runs one call as a SandboxRun. The call returns when the run is terminal, or when it
    /// awaits a person's approval and the approval wait is over (at once by default; the result
    /// then lands in the run's status). `approval_wait` replaces the configured wait for this
    /// call (a call made as an MCP task follows an approval for as long as the task lives).
    pub async fn call<T: ClusterTool>(
        &self,
        agent: &str,
        call: T::Call,
        progress: ProgressFn,
        output: Option<OutputFn>,
        cancel: CancellationToken,
        approval_wait: Option<Duration>,
    ) -> Result<T::Output, BackendError> {
        let run = Self::build(T::spec(agent, &call));
        let timeout = T::timeout_seconds(&call).max(run.spec.limits.timeout_seconds);
        let follow = Follow {
            progress,
            output,
            approval_wait: approval_wait.unwrap_or(self.approval_wait),
        };
        self.create_and_follow(run, timeout, follow, cancel, |name, status| {
            T::output(name, status, &call)
        })
        .await
    }

    /// The files run `name` returned, when `agent` made it and it is still kept (`None`: no such
    /// run of this agent, which is all another agent learns). A file whose status entry is not
    /// base64 is left out.
    pub async fn run_files(
        &self,
        agent: &str,
        name: &str,
        cancel: CancellationToken,
    ) -> Result<Option<Vec<sandboxrun_core::OutputFile>>, BackendError> {
        let run = tokio::select! {
            run = self.api.get_opt(name) => run,
            () = cancel.cancelled() => return Err(BackendError::Cancelled),
        };
        match run {
            Ok(Some(run)) if run.spec.agent == agent => Ok(Some(
                run.status
                    .map(|s| s.files.iter().filter_map(|f| f.output()).collect())
                    .unwrap_or_default(),
            )),
            Ok(_) => Ok(None),
            Err(e) => Err(BackendError::Unavailable(format!(
                "the run {name} could not be read from the Kubernetes API: {e}"
            ))),
        }
    }

    /// Creates `run`, follows it until `read` returns a result, and cancels it when the caller
    /// goes away first.
    async fn create_and_follow<T>(
        &self,
        run: SandboxRun,
        timeout_seconds: u32,
        follow: Follow,
        cancel: CancellationToken,
        read: impl Fn(&str, &SandboxRunStatus) -> Option<T>,
    ) -> Result<T, BackendError> {
        let agent = run.spec.agent.clone();
        let name = run.name_any();
        // Before the create, so that no event of the run can come before the call follows it.
        let subscription = self.subscribers.subscribe(&name);
        self.create(&run).await?;
        subscription.created();
        tracing::info!(run = %name, agent = %agent, "created SandboxRun");
        (follow.progress)(Phase::Pending, &name, None);
        // From here on the run exists: whatever ends this future (cancellation, a dropped
        // request, a shutdown) cancels it unless a result was read or it awaits approval.
        let guard = CancelOnDrop::new(self.api.clone(), name.clone());
        let armed = guard.armed.clone();
        let keep = move || armed.store(false, Ordering::Relaxed);
        // The call gives up on the operator after the run's own time and the grace; a run that
        // awaits approval gets the approval wait on top, from when it starts waiting (an
        // approval may come at the end of it, and the run then still needs its own time).
        let own_time = Duration::from_secs(u64::from(timeout_seconds)) + self.grace;
        let started = tokio::time::Instant::now();
        let (deadline, mut deadline_rx) = watch::channel(started + own_time);
        let expired = async move {
            loop {
                let at = *deadline_rx.borrow_and_update();
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        if *deadline_rx.borrow() <= at {
                            return;
                        }
                    }
                    changed = deadline_rx.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep_until(at).await;
                            return;
                        }
                    }
                }
            }
        };
        let extend = move |wait: Duration| {
            deadline.send_replace(tokio::time::Instant::now() + wait + own_time);
        };

        let result = tokio::select! {
            r = self.follow(&name, subscription, &follow, &keep, &extend, &read) => r,
            () = cancel.cancelled() => Err(BackendError::Cancelled),
            () = expired => match self.final_look(&name, &read).await {
                Some(output) => Ok(output),
                None => Err(BackendError::Unavailable(format!(
                "SandboxRun {name} did not finish within {}s and was cancelled: the cluster may \
                 be busy (retry later) or the sandboxrun operator is not running or not watching \
                 namespace {}", started.elapsed().as_secs(), self.namespace))),
            },
        };
        if result.is_ok() {
            // A finished run stays for its TTL: the audit trail.
            guard.disarm();
        }
        result
    }

    /// Creates the run. Its name is this call's own (chosen here, never generated by the
    /// server), so an "already exists" means an earlier attempt of this very create committed
    /// (the client retries a POST whose answer was lost, a 504 say): that run is this call's,
    /// and it is followed instead of creating a second one. Any other 409 is a conflict on the
    /// way in, the ResourceQuota's usage update above all ("Operation cannot be fulfilled on
    /// resourcequotas": the load suite met 7 in 2,000 calls of 100 agents), and is tried again.
    async fn create(&self, run: &SandboxRun) -> Result<(), BackendError> {
        let name = run.name_any();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self.api.create(&PostParams::default(), run).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 && e.reason == "AlreadyExists" => {
                    tracing::info!(run = %name, "the SandboxRun exists already (a retried create committed); following it");
                    return Ok(());
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < CREATE_ATTEMPTS => {
                    tracing::info!(run = %name, attempt, reason = %e.message, "create met a conflict; trying again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(e) => {
                    return Err(BackendError::Unavailable(format!(
                        "could not create a SandboxRun in namespace {}: {e}; check that the \
                         sandboxrun CRD is installed and the frontend may create sandboxruns",
                        self.namespace
                    )));
                }
            }
        }
    }

    /// The run's result if it has one now, read from the API server: the last look before a
    /// call gives up at its deadline, which can coincide with the run's own end (the operator's
    /// deadline for the run and the frontend's for the call are close for a run that waited).
    async fn final_look<T>(
        &self,
        name: &str,
        read: &impl Fn(&str, &SandboxRunStatus) -> Option<T>,
    ) -> Option<T> {
        let run = self.api.get_opt(name).await.ok().flatten()?;
        let status = run.status.as_ref()?;
        status
            .phase
            .is_some_and(Phase::is_terminal)
            .then(|| read(name, status))
            .flatten()
    }

    /// Watches the named SandboxRun until `read` returns a result. A result read while the run
    /// awaits approval is returned at once when the approval wait is zero; otherwise the watch
    /// goes on (with progress) until the run moves on or the wait is over, and only then is the
    /// awaiting result returned. `keep` is called once the run awaits approval: from then on
    /// the run must outlive the call. With `output`, the run's sandbox log is followed once its
    /// Pod is known, and what the code prints goes there while it runs.
    async fn follow<T>(
        &self,
        name: &str,
        mut subscription: Subscription,
        follow: &Follow,
        keep: &(dyn Fn() + Send + Sync),
        extend_deadline: &(dyn Fn(Duration) + Send + Sync),
        read: &impl Fn(&str, &SandboxRunStatus) -> Option<T>,
    ) -> Result<T, BackendError> {
        let (progress, output, approval_wait) = (
            &follow.progress,
            follow.output.as_ref(),
            follow.approval_wait,
        );
        // Running is reported once: when the status says so, or before the first output.
        let reported_running = Arc::new(AtomicBool::new(false));
        let report_running = {
            let (progress, reported, name) =
                (progress.clone(), reported_running.clone(), name.to_owned());
            move || {
                if !reported.swap(true, Ordering::Relaxed) {
                    progress(Phase::Running, &name, None);
                }
            }
        };
        let mut log: Option<LogFollower> = None;
        // The place in the queue for a sandbox last reported.
        let mut queue_position: Option<u32> = None;
        // The result to return when the approval wait is over, while the run awaits approval.
        let mut awaiting: Option<T> = None;
        let wait_over = tokio::time::sleep(approval_wait);
        tokio::pin!(wait_over);
        let mut heartbeat = tokio::time::interval(APPROVAL_PROGRESS_INTERVAL);
        loop {
            let event = tokio::select! {
                event = subscription.next() => event,
                () = &mut wait_over, if awaiting.is_some() => {
                    tracing::info!(run = %name, wait_seconds = approval_wait.as_secs(),
                        "no approval decision within the approval wait; returning");
                    return awaiting.take().ok_or_else(|| deleted(name));
                }
                _ = heartbeat.tick(), if awaiting.is_some() => {
                    progress(Phase::AwaitingApproval, name, None);
                    continue;
                }
            };
            let Some(event) = event else { break };
            // A watch outage is retried by the shared watch; a lasting one ends at the caller's
            // deadline.
            let run = match event {
                Seen::Run(run) => run,
                Seen::Deleted => return Err(deleted(name)),
            };
            let Some(status) = run.status.as_ref() else {
                continue;
            };
            if status.phase == Some(Phase::AwaitingApproval) {
                let Some(output) = read(name, status) else {
                    continue;
                };
                keep();
                if approval_wait.is_zero() {
                    return Ok(output);
                }
                if awaiting.is_none() {
                    tracing::info!(run = %name, wait_seconds = approval_wait.as_secs(),
                        "run awaits approval; waiting for a decision");
                    extend_deadline(approval_wait);
                    wait_over
                        .as_mut()
                        .reset(tokio::time::Instant::now() + approval_wait);
                    // The first tick is immediate: the progress notification goes out now.
                    heartbeat.reset_immediately();
                }
                awaiting = Some(output);
                continue;
            }
            // Approved (or decided otherwise): the approval wait no longer applies.
            awaiting = None;
            if let Some(result) = read(name, status) {
                if let Some(log) = log.take() {
                    log.finish().await;
                }
                return Ok(result);
            }
            if log.is_none()
                && let (Some(output), Some(pod)) = (output, status.pod_name.as_deref())
            {
                let (output, report_running) = (output.clone(), report_running.clone());
                let output: OutputFn = Arc::new(move |chunk| {
                    report_running();
                    output(chunk);
                });
                log = Some(LogFollower::start(
                    self.pods.clone(),
                    pod.to_owned(),
                    output,
                ));
            }
            if status.phase == Some(Phase::Running) {
                report_running();
            } else if status.phase == Some(Phase::Pending)
                && status.queue_position.is_some()
                && status.queue_position != queue_position
            {
                // Waiting for a sandbox: the caller hears its place each time it moves.
                queue_position = status.queue_position;
                progress(Phase::Pending, name, status.message.as_deref());
            }
        }
        Err(BackendError::Unavailable(format!(
            "the watch of SandboxRun {name} ended unexpectedly; try again"
        )))
    }
}

/// Name and label of every SandboxRun this frontend creates. The name is chosen here (`run-` and
/// 20 random hex digits), not generated by the API server: a create that is retried after its
/// answer was lost then meets its own first attempt (409) instead of making a second run that
/// would run the code again.
fn with_metadata(mut run: SandboxRun) -> SandboxRun {
    let id = uuid::Uuid::new_v4().simple().to_string();
    run.metadata = ObjectMeta {
        name: Some(format!("run-{}", &id[..20])),
        labels: Some(
            [CREATED_BY_LABEL]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
        ),
        ..ObjectMeta::default()
    };
    run
}

fn deleted(name: &str) -> BackendError {
    BackendError::Unavailable(format!(
        "SandboxRun {name} was deleted before it finished; try again"
    ))
}

/// Cancels a SandboxRun (`spec.cancelled: true`) when dropped while armed: the operator ends it
/// `Cancelled` and deletes its sandbox, so a cancelled call leaves nothing running and keeps its
/// terminal phase and audit line (deleting the run would have lost both).
struct CancelOnDrop {
    api: Api<SandboxRun>,
    name: String,
    /// Shared so that the watch can disarm the guard while the call still runs.
    armed: Arc<AtomicBool>,
}

impl CancelOnDrop {
    fn new(api: Api<SandboxRun>, name: String) -> Self {
        Self {
            api,
            name,
            armed: Arc::new(AtomicBool::new(true)),
        }
    }

    fn disarm(&self) {
        self.armed.store(false, Ordering::Relaxed);
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let (api, name) = (self.api.clone(), std::mem::take(&mut self.name));
        // Drop cannot await; outside a runtime (process exit) the run's TTL still applies.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let cancel = serde_json::json!({ "spec": { "cancelled": true } });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&cancel))
                    .await
                {
                    Ok(_) => tracing::info!(run = %name, "cancelled unfinished SandboxRun"),
                    Err(e) => {
                        tracing::warn!(run = %name, error = %e, "could not cancel SandboxRun")
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxrun_core::tools::python::{PythonCall, RunPython};

    #[test]
    fn built_run_has_a_name_of_its_own_and_the_frontends_label() {
        let call = PythonCall {
            code: "print(1)".into(),
            profile: sandboxrun_core::Profile::Minimal,
            files: Vec::new(),
            limits: sandboxrun_core::Limits::default(),
            max_timeout_seconds: 600,
            session: None,
        };
        let run = KubeBackend::build(RunPython::spec("analyst-01", &call));
        // A name of its own, so that a retried create cannot make a second run.
        let name = run.metadata.name.clone().unwrap();
        assert!(name.starts_with("run-") && name.len() == 24, "{name}");
        assert_eq!(run.metadata.generate_name, None);
        let again = KubeBackend::build(RunPython::spec("analyst-01", &call));
        assert_ne!(again.metadata.name, run.metadata.name);
        assert_eq!(run.spec.agent, "analyst-01");
        assert_eq!(
            run.labels()["app.kubernetes.io/created-by"],
            "sandboxrun-mcp"
        );
    }
}
