//! The SandboxRun controller: `reconcile` and `error_policy` over a shared [`Context`]. One
//! reconciliation is a [`Reconcile`] that runs stages: decide (policy judges the run once),
//! gate (the approval), execute (the python Pod state machine of `python/`, or a query of
//! `query.rs`, with its claim protocol), finish. Every decision is derived from the run and its Pod as they are now,
//! so reconciling twice, or after a restart, converges on the same state.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use sandboxrun_api::list_strategy::ListStrategy;
use sandboxrun_api::{CONDITION_AUDITED, SandboxRun, SandboxRunStatus};
use sandboxrun_core::metrics::PrometheusClient;
use sandboxrun_core::{
    CallContext, Databases, Decision, Environment, Phase, PolicyStore, Reason, Tool, Verdict,
};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::admission::Placement;
use crate::events::Events;
use crate::gate::{self, Gate};
use crate::metrics::Metrics;
use crate::outcome::{self, Outcome};
use crate::python::phase;
use crate::python::pod::{self, BuildError, SandboxConfig};
use crate::{audit, ttl};

/// The one field manager of every status write (server-side apply).
pub const FIELD_MANAGER: &str = "sandboxrun-operator";
/// The field manager of the `Audited` condition alone: applying it as [`FIELD_MANAGER`] would
/// drop every other status field that manager wrote.
const AUDIT_FIELD_MANAGER: &str = "sandboxrun-operator-audit";
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
    /// The policy judging every run; `None` (no `--policy-file`) blocks every run unless
    /// [`Context::allow_without_policy`] says otherwise.
    pub policy: Option<Arc<PolicyStore>>,
    /// Whether a missing policy allows every run (`--allow-all-without-policy`, for test
    /// clusters): the operator fails closed otherwise.
    pub allow_without_policy: bool,
    /// How long an escalated run waits for a person's approval.
    pub approval_timeout: SignedDuration,
    /// Databases sql runs query; `None`: sql runs end Rejected.
    pub databases: Option<Databases>,
    /// The Prometheus metrics runs query; `None`: metrics runs end Rejected.
    pub prometheus: Option<PrometheusClient>,
    /// The environment the Prometheus belongs to (`--prometheus-environment`): metrics runs are
    /// judged in it when it is more sensitive than the one they name.
    pub prometheus_environment: Environment,
    /// How long one read of a finished sandbox's log may take (`python::log::LOG_READ_TIMEOUT`).
    pub log_read_timeout: Duration,
    /// This replica's name (the Pod's), recorded in the claim of a query it executes.
    pub identity: String,
    /// Programs being handed to sandboxes (`python/feed.rs`).
    pub feeds: crate::python::feed::Feeds,
    /// Whether a created sandbox is attached to as soon as its container runs, before the
    /// kubelet reports it (on by default; reconcile tests turn it off to see each step).
    pub early_feed: bool,
    /// Longest one reconciliation may take (a query run gets its own timeout on top): every API
    /// call in it is bounded, whatever the client's retries of a 504 would wait.
    pub reconcile_timeout: Duration,
    /// The warm pools, as the pool controller's watch has them (`pool.rs`); empty without one.
    pub pools: kube::runtime::reflector::Store<sandboxrun_api::SandboxPool>,
    /// The pools' idle Pods, as a watch has them (`pool.rs::mirror_idle_pods`); empty without
    /// one (a claim then lists the pool's Pods).
    pub idle_pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    /// Claims not yet counted in their pool's status.
    pub pool_claims: crate::pool::Claims,
    /// Warm claims whose outcome is unknown, by run uid (`pool.rs`, settled in `python/warm.rs`).
    pub claims_in_doubt: crate::pool::ClaimsInDoubt,
    /// Pods this operator claimed lately: never a claim's candidate again (`pool.rs`).
    pub claimed_pods: crate::pool::ClaimedPods,
    /// When runs wanted a sandbox of each pool (`pool_scale.rs`; shared with the pools').
    pub pool_demand: crate::pool_scale::Demand,
    /// Streams the pools opened to their ready sandboxes (`pool_streams.rs`; shared with them).
    pub held: crate::pool_streams::HeldStreams,
    /// The queues of runs waiting for room for a sandbox (`admission.rs`; shared with the pools,
    /// whose Pods take the same room).
    pub admission: Arc<crate::admission::Admission>,
    /// The room the namespaces' quotas have for sandbox Pods, as a watch has it
    /// (`quota_room.rs`); nothing known without one.
    pub quota_room: crate::quota_room::QuotaRoom,
    /// The operator's Pods, as the room's watch has them (`quota_room::watch_pods`); empty
    /// without one.
    pub sandbox_pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    /// The sandbox Pods as this controller's own watch has them, while it runs (`run`): where
    /// a reconcile reads its run's Pod first (`watched_pods.rs`).
    pub watched_pods: crate::watched_pods::WatchedPods,
    /// Held while a run opens a session: an agent's open sessions are counted and the new one
    /// created under it (`session/call.rs`).
    pub sessions_opening: tokio::sync::Mutex<()>,
    /// The runner's ConfigMap of each namespace, made before its first sandbox Pod
    /// (`runner_files.rs`).
    pub runner_files: Arc<crate::runner_files::RunnerFiles>,
    /// Consecutive failures per run, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<SandboxRun>, u32>>,
    /// Terminal statuses whose write failed, by run uid, with their audit line still to write:
    /// the write may have committed with its answer lost (a 504, a dropped connection), and then
    /// the next reconcile finds the run already terminal (see [`Reconcile::finished`]).
    unaudited: Mutex<HashMap<String, Unaudited>>,
    /// Runs whose audit line this process wrote and whose `Audited` condition is not recorded
    /// yet, by uid: recording it is retried without writing the line again.
    audit_written: Mutex<std::collections::HashSet<String>>,
    /// Runs this process wrote a status to while its cache still showed them undecided, by uid,
    /// until the cache shows them decided: their cached copy lags this process's own write, so
    /// they are decided on the run as the API server has it ([`Reconcile::decide`]).
    written_undecided: Mutex<std::collections::HashSet<String>>,
    /// Runs this process ended whose cached copy has not shown the end yet, by uid, and when
    /// they ended: a reconcile of such a copy (woken by the run's Pod, whose event came first)
    /// does nothing ([`Reconcile::stages`]). Acting on the copy from before the end took a run
    /// that waited in the queue, then ended on a warm sandbox, for one still waiting: it joined
    /// the queue again as nobody, at its old place, and wrote a place over its end (refused by
    /// the CRD's forward-only rule, four times in the full load of 2026-12-08).
    ended_uncached: Mutex<HashMap<String, Timestamp>>,
    /// Sandbox Pods of finished runs this process deleted, by `namespace/name`, and when: a
    /// finished run's reconcile deletes its Pod again only where this process did not (it
    /// stopped in between), for [`POD_CLEANUP_WINDOW`].
    pods_deleted: Mutex<HashMap<String, Timestamp>>,
}

/// An end whose terminal status write failed, as [`Context::unaudited`] keeps it.
#[derive(Clone, Debug)]
pub(crate) struct Unaudited {
    /// The terminal status that was written.
    pub(crate) status: SandboxRunStatus,
    /// Its phase.
    pub(crate) phase: Phase,
    /// Its reason.
    pub(crate) reason: String,
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
            runner_files: crate::runner_files::RunnerFiles::new(client.clone()),
            client,
            sandbox,
            metrics,
            events,
            policy,
            allow_without_policy: false,
            approval_timeout,
            databases: None,
            prometheus: None,
            prometheus_environment: Environment::Production,
            log_read_timeout: crate::python::log::LOG_READ_TIMEOUT,
            identity: "sandboxrun-operator".to_owned(),
            feeds: crate::python::feed::Feeds::default(),
            early_feed: true,
            reconcile_timeout: RECONCILE_TIMEOUT,
            pools: kube::runtime::reflector::store().0,
            idle_pods: kube::runtime::reflector::store().0,
            pool_claims: crate::pool::Claims::default(),
            claims_in_doubt: Default::default(),
            claimed_pods: Default::default(),
            pool_demand: crate::pool_scale::Demand::default(),
            held: crate::pool_streams::HeldStreams::default(),
            admission: Arc::new(crate::admission::Admission::new(
                crate::admission::DEFAULT_ALLOWANCE,
            )),
            quota_room: crate::quota_room::QuotaRoom::default(),
            sandbox_pods: kube::runtime::reflector::store().0,
            watched_pods: Default::default(),
            sessions_opening: tokio::sync::Mutex::default(),
            failures: Mutex::default(),
            unaudited: Mutex::default(),
            pods_deleted: Mutex::default(),
            audit_written: Mutex::default(),
            written_undecided: Mutex::default(),
            ended_uncached: Mutex::default(),
        }
    }

    /// The same context, allowing every run when it has no policy (`--allow-all-without-policy`).
    pub fn allowing_all_without_policy(mut self, allow: bool) -> Self {
        self.allow_without_policy = allow;
        self
    }

    /// The same context, executing metrics runs against `prometheus`, which belongs to
    /// `environment`.
    pub fn with_prometheus(
        mut self,
        prometheus: Option<PrometheusClient>,
        environment: Environment,
    ) -> Self {
        self.prometheus = prometheus;
        self.prometheus_environment = environment;
        self
    }

    /// The same context, attaching to a sandbox only once the kubelet reports it running.
    #[cfg(test)]
    pub fn without_early_feed(mut self) -> Self {
        self.early_feed = false;
        self
    }

    /// The same context, holding streams to the pools' ready sandboxes or (`hold` false) not.
    pub fn holding_streams(mut self, hold: bool) -> Self {
        self.held = crate::pool_streams::HeldStreams::enabled(hold);
        self
    }

    /// The same context, letting a run wait `allowance` for room for its sandbox.
    pub fn with_queue_allowance(mut self, allowance: Duration) -> Self {
        self.admission = Arc::new(crate::admission::Admission::new(allowance));
        self
    }

    /// The same context, claiming warm sandboxes from the pools in `pools`.
    pub fn with_pools(
        mut self,
        pools: kube::runtime::reflector::Store<sandboxrun_api::SandboxPool>,
        idle_pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        self.pools = pools;
        self.idle_pods = idle_pods;
        self
    }

    /// The same context, weighing the room for a run's Pod with `quota_room`, which weighs the
    /// operator's Pods in `sandbox_pods`.
    pub fn with_quota_room(
        mut self,
        quota_room: crate::quota_room::QuotaRoom,
        sandbox_pods: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        self.quota_room = quota_room;
        self.sandbox_pods = sandbox_pods;
        self
    }

    /// The same context, named `identity` (this replica) in the claims of queries.
    pub fn with_identity(mut self, identity: String) -> Self {
        self.identity = identity;
        self
    }

    /// The same context, executing sql runs against `databases`.
    pub fn with_databases(mut self, databases: Option<Databases>) -> Self {
        self.databases = databases;
        self
    }

    /// Everything policy sees of `run`: the call as the run states it, completed by the tool's
    /// one context builder in core with what this operator's configuration knows of its target
    /// (an sql run's database: dialect and environment; a metrics run's Prometheus: its
    /// environment). The embedded server builds the same context with the same functions.
    pub fn call_context(&self, run: &SandboxRun, tool: Tool) -> CallContext {
        let prometheus = self
            .prometheus
            .as_ref()
            .map(|_| self.prometheus_environment);
        gate::full_context(&run.spec, tool, self.databases.as_ref(), prometheus)
    }

    /// What policy says about `run` now, as it is recorded in `status.decision`: judged on the
    /// run's full context ([`Context::call_context`]). Without a policy every run is blocked,
    /// unless the operator was explicitly told to allow them all.
    pub fn decide(&self, run: &SandboxRun, tool: Tool) -> sandboxrun_api::Decision {
        let call = self.call_context(run, tool);
        let decision = self.judge(&call);
        sandboxrun_api::Decision::record(&decision, call.environment)
    }

    /// Policy's verdict on `call`.
    pub fn judge(&self, call: &CallContext) -> Decision {
        match &self.policy {
            Some(store) => store.evaluate(call),
            None if self.allow_without_policy => gate::allow_all(call),
            None => gate::block_all(call),
        }
    }

    /// Whether this process wrote a status to the run `uid` that its cache has not shown yet
    /// while the run looked undecided there.
    fn wrote_undecided(&self, uid: &str) -> bool {
        self.written_undecided
            .lock()
            .expect("not poisoned")
            .contains(uid)
    }

    /// This process wrote a status to the run `uid` while its cache shows it undecided.
    fn wrote_while_undecided(&self, uid: &str) {
        self.written_undecided
            .lock()
            .expect("not poisoned")
            .insert(uid.to_owned());
    }

    /// The cache shows the run `uid` decided, or going: it lags no write of this process's
    /// that [`Self::wrote_undecided`] tracks.
    fn caught_up(&self, uid: &str) {
        self.written_undecided
            .lock()
            .expect("not poisoned")
            .remove(uid);
    }

    /// This process wrote the end of the run `uid` at `now`; its cache may not show it yet.
    fn ended_here(&self, uid: &str, now: Timestamp) {
        let mut ended = self.ended_uncached.lock().expect("not poisoned");
        // A run deleted before its cache showed its end is never seen again.
        ended.retain(|_, at| now.duration_since(*at) < POD_CLEANUP_WINDOW);
        ended.insert(uid.to_owned(), now);
    }

    /// Whether this process ended the run `uid` and its cache has not shown the end since.
    fn ended_uncached(&self, uid: &str) -> bool {
        self.ended_uncached
            .lock()
            .expect("not poisoned")
            .contains_key(uid)
    }

    /// The cache shows the run `uid` ended, or going: it lags no end of this process's.
    fn end_cached(&self, uid: &str) {
        self.ended_uncached
            .lock()
            .expect("not poisoned")
            .remove(uid);
    }

    /// The end of the run `uid` whose terminal status write failed, if any (still to be
    /// audited).
    pub(crate) fn unaudited_end(&self, uid: &str) -> Option<Unaudited> {
        self.unaudited
            .lock()
            .expect("not poisoned")
            .get(uid)
            .cloned()
    }

    /// The decision a run executes: its record (`status.decision`), rebuilt; a run decided by an
    /// operator that recorded no grant is judged again on its full context (the only case of a
    /// second judgement, for runs from before the record).
    pub fn recorded(&self, run: &SandboxRun, status: &SandboxRunStatus, tool: Tool) -> Decision {
        status
            .decision
            .as_ref()
            .and_then(sandboxrun_api::Decision::taken)
            .unwrap_or_else(|| self.judge(&self.call_context(run, tool)))
    }
}

/// Whether the API server refused a create for good: 400 (bad request), 403 (RBAC, admission,
/// Pod Security, a full quota) or 422 (invalid). Sent again it would meet the same answer, so the
/// run or session ends on it instead of retrying; a caller for whom a full quota means waiting
/// (a python run's own Pod, python/mod.rs) tells that 403 apart before asking.
pub fn refused_for_good(e: &kube::core::Status) -> bool {
    matches!(e.code, 400 | 403 | 422)
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
    /// The reconciliation took longer than its budget (a stalled API server, say); retried. What
    /// it left half done is safe to redo: every step checks what the API server has first.
    #[error("the reconciliation did not finish within {0:?}")]
    Timeout(Duration),
    /// The run was decided on its cached copy and someone wrote it since: nothing was written,
    /// claimed or created for that decision, and the run is looked at again in a moment.
    #[error("the run changed since the copy it was decided on")]
    Changed,
    /// The program could not be handed to the started sandbox yet (retried; the Pod's deadline
    /// bounds the retries).
    #[error("sending the program to Pod {pod}: {source}")]
    Feed {
        /// The Pod.
        pod: String,
        /// What failed.
        source: crate::python::feed::FeedError,
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
            Error::Feed { .. } => "Feed",
            Error::Timeout(_) => "Timeout",
            Error::Changed => "Changed",
        }
    }
}

/// The outcome of a stage: go on to the next stage with a `T`, or end this reconciliation with
/// an [`Action`].
pub type Stage<T> = Result<ControlFlow<Action, T>, Error>;

/// A decision policy took in this reconciliation.
pub struct Decided {
    pub decision: Decision,
    /// Not in the run's status yet (an Allow of a run that is not a call in a session): the
    /// execute stage writes it with its first status write, which comes before anything
    /// executes (a python run's, or a query's claim).
    pub unrecorded: bool,
}

/// Whether a terminal status still owes its audit line (see `CONDITION_AUDITED`). A run that
/// ended before the condition existed owes nothing: its line was written then.
fn owes_audit(status: &SandboxRunStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_AUDITED && c.status == "False")
}

/// The `Audited` condition's reasons.
const AUDIT_OWED: &str = "Owed";
const AUDIT_WRITTEN: &str = "Written";

/// Whether a status is in a terminal phase.
pub fn is_terminal(status: &SandboxRunStatus) -> bool {
    status.phase.is_some_and(Phase::is_terminal)
}

/// Requeue delay until `deadline` (at least a second: the Pod watch usually comes first).
pub fn until(deadline: Timestamp, now: Timestamp) -> Duration {
    let left = deadline.duration_since(now).as_millis().max(1000);
    Duration::from_millis(left as u64)
}

/// One reconciliation of one run: the run as the watch delivered it, the shared context, the
/// APIs of its namespace and the clock, read once. The stages are its methods: [`decide`]
/// (first reconciliation: policy judges the run), [`gate`] (the approval), [`execute`] (the
/// python Pod state machine in `python/`, or a query), and [`finish`] / [`finished`].
///
/// [`decide`]: Reconcile::decide
/// [`gate`]: Reconcile::gate
/// [`execute`]: Reconcile::execute
/// [`finish`]: Reconcile::finish
/// [`finished`]: Reconcile::finished
pub struct Reconcile<'a> {
    /// The run, as the watch cache has it (may lag the operator's own last status write).
    pub run: &'a SandboxRun,
    /// What every reconciliation shares.
    pub ctx: &'a Context,
    /// SandboxRuns of the run's namespace.
    pub runs: Api<SandboxRun>,
    /// Pods of the run's namespace.
    pub pods: Api<Pod>,
    /// The run's name.
    pub name: String,
    /// The run's namespace.
    pub ns: String,
    /// When this reconciliation started.
    pub now: Timestamp,
    /// The run's `metadata.generation`, recorded as `observedGeneration`.
    pub generation: Option<i64>,
    /// The run's resourceVersion as this reconciliation last read it from the API server,
    /// decided it on its cached copy or wrote its status, if it did ([`Self::known_version`]).
    known_version: std::sync::Mutex<Option<String>>,
    /// Whether the run was decided on its cached copy: then the reconcile's next status write
    /// is conditional on that copy's resourceVersion ([`Reconcile::decide`]).
    fenced: std::sync::atomic::AtomicBool,
}

impl<'a> Reconcile<'a> {
    /// A reconciliation of `run`, now.
    pub fn new(run: &'a SandboxRun, ctx: &'a Context) -> Result<Self, Error> {
        let ns = run.namespace().ok_or(Error::NoNamespace)?;
        Ok(Self {
            run,
            ctx,
            runs: Api::namespaced(ctx.client.clone(), &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            name: run.name_any(),
            ns,
            now: Timestamp::now(),
            generation: run.metadata.generation,
            known_version: std::sync::Mutex::default(),
            fenced: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The run's resourceVersion as this reconciliation last read it fresh ([`Self::fresh_status`]),
    /// decided it on its cached copy ([`Self::decide`]) or wrote its status: the run as it is
    /// now unless someone else wrote it since, for a write
    /// conditional on it (such a write then fails, and the run is looked at again) without
    /// reading the run once more.
    pub fn known_version(&self) -> Option<String> {
        self.known_version.lock().expect("not poisoned").clone()
    }

    fn know_version(&self, version: Option<String>) {
        *self.known_version.lock().expect("not poisoned") = version;
    }

    /// Whether the run was decided on its cached copy and nothing was written since: the next
    /// status write is conditional on that copy ([`Self::decide`]).
    fn fenced(&self) -> bool {
        self.fenced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The stages, in order; each either hands over to the next or ends the reconciliation.
    async fn stages(&self) -> Result<Action, Error> {
        if self.run.metadata.deletion_timestamp.is_some() {
            self.ctx.caught_up(&self.uid());
            self.ctx.end_cached(&self.uid());
            // Garbage collection removes the Pod through its ownerReference.
            return Ok(Action::await_change());
        }
        let prev = self.run.status.clone().unwrap_or_default();
        if !undecided(&prev) {
            // The cache shows what this process wrote (or something later).
            self.ctx.caught_up(&self.uid());
        }
        if is_terminal(&prev) {
            self.ctx.end_cached(&self.uid());
            return self.finished(&prev).await;
        }
        if self.ctx.ended_uncached(&self.uid()) {
            // This process ended the run and the copy is from before: whatever it says the
            // run waits for is over. The end's own watch event reconciles the run again; the
            // requeue is for a watch that lost it.
            debug!(run = %self.name, "the cached run predates this process's own end of it; waiting for the cache");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        if self.run.spec.cancelled {
            return self.cancel(&prev).await;
        }
        let Some(tool) = self.run.spec.tool() else {
            let outcome = outcome::rejected(
                Reason::NoTool,
                "the run sets none of python, sql or metrics".to_owned(),
                self.now,
            );
            return self.end(&prev, None, &outcome, None).await;
        };
        let (prev, decided) = match self.decide(prev, tool).await? {
            ControlFlow::Continue(next) => next,
            ControlFlow::Break(action) => return Ok(action),
        };
        let prev = match self.gate(prev, tool).await? {
            ControlFlow::Continue(next) => next,
            ControlFlow::Break(action) => return Ok(action),
        };
        self.execute(prev, tool, decided).await
    }

    /// Stage 1, on the first reconciliation only: policy judges the run, and the decision is
    /// recorded (an Allow right away, before anything executes; a Block or an Escalate with the
    /// phase the gate gives it). Goes on with the status to build on and the full decision when
    /// one was taken now. Runs that predate the policy gate (a phase but no decision) are left
    /// to finish as they started.
    async fn decide(
        &self,
        prev: SandboxRunStatus,
        tool: Tool,
    ) -> Stage<(SandboxRunStatus, Option<Decided>)> {
        if !undecided(&prev) {
            return Ok(ControlFlow::Continue((prev, None)));
        }
        let mut prev = if self.ctx.wrote_undecided(&self.uid()) {
            // The cache lags this process's own write: decide on the run as it is now.
            let Some(fresh) = self.fresh_status().await? else {
                return Ok(ControlFlow::Break(Action::await_change()));
            };
            if is_terminal(&fresh) {
                return self.finished(&fresh).await.map(ControlFlow::Break);
            }
            if !undecided(&fresh) {
                return Ok(ControlFlow::Continue((fresh, None)));
            }
            fresh
        } else {
            // Nothing this process wrote is missing from the cached run: decide on it, without
            // a read on every call's path. Someone else may have written the run since (its
            // caller's cancel, an operator before a restart): the reconcile's next status write
            // is conditional on the cached copy, so it fails instead of writing over theirs,
            // and the run is looked at again. Nothing is claimed, created, sent or executed
            // before that write, except a warm sandbox whose record is that write: claimed
            // only once a read found the run unchanged (`unchanged_since_decided`), and given
            // up if the write fails so all the same (`python/warm.rs`, `run_warm`).
            self.know_version(self.run.resource_version());
            self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
            prev
        };
        let record = self.ctx.decide(self.run, tool);
        let decision = record
            .taken()
            .expect("a decision recorded now carries its grant");
        info!(run = %self.name, namespace = %self.ns, decision = %decision, "policy decision");
        self.ctx.events.decided(self.run, &record).await;
        // Recorded before anything executes; Block and Escalate record it with their phase in
        // the gate. A run's own next stage makes a status write before anything executes (a
        // python run's place in the queue, its refusal, or the write just before a sandbox is
        // claimed or created for it; a query's claim): its Allow goes out with that write, one
        // fewer on the call's path. A call in a session is the session's to record.
        let unrecorded = record.verdict == Verdict::Allow && !self.is_session_call();
        if record.verdict == Verdict::Allow {
            let status = gate::decided_status(&prev, tool, record, self.generation);
            if !unrecorded {
                self.apply(&status).await?;
            }
            prev = status;
        } else {
            prev.decision = Some(record);
        }
        Ok(ControlFlow::Continue((
            prev,
            Some(Decided {
                decision,
                unrecorded,
            }),
        )))
    }

    /// Whether the run is a call in a session: it runs in the session's sandbox, and its stages
    /// are the session's (`session/call.rs`).
    pub(crate) fn is_session_call(&self) -> bool {
        self.run
            .spec
            .python
            .as_ref()
            .is_some_and(|p| p.session.is_some())
    }

    /// Stage 2: the recorded decision and the approval. A Block (or a denied or expired
    /// escalation) ends the run Rejected, an escalation nobody answered yet waits in
    /// AwaitingApproval, anything else goes on (an approval is recorded first).
    async fn gate(&self, mut prev: SandboxRunStatus, tool: Tool) -> Stage<SandboxRunStatus> {
        let Some(decision) = prev.decision.clone() else {
            return Ok(ControlFlow::Continue(prev));
        };
        let approval = gate::approval_state(
            self.run.spec.approval.as_ref(),
            prev.approval_request.as_ref(),
            self.generation,
        );
        let created = self.run.metadata.creation_timestamp.as_ref();
        let since = gate::awaiting_since(&prev, created, self.now);
        let awaiting = prev.phase == Some(Phase::AwaitingApproval);
        match gate::gate(
            &decision,
            approval.clone(),
            since,
            self.ctx.approval_timeout,
            self.now,
        ) {
            Gate::Reject(outcome) => {
                if decision.verdict == Verdict::Escalate {
                    gate::mark_not_approved(
                        &mut prev,
                        &outcome.reason,
                        &outcome.message,
                        self.generation,
                        self.now,
                    );
                }
                let action = self.end(&prev, Some(tool), &outcome, None).await?;
                Ok(ControlFlow::Break(action))
            }
            Gate::Await { deadline } => {
                if (!awaiting || prev.approval_request.is_none())
                    && let ControlFlow::Break(action) = self.begin_waiting(&prev, tool).await?
                {
                    return Ok(ControlFlow::Break(action));
                }
                // A change of spec.approval wakes the run up before this.
                let wait = until(deadline, self.now);
                Ok(ControlFlow::Break(Action::requeue(wait)))
            }
            Gate::Proceed => {
                let newly_approved =
                    decision.verdict == Verdict::Escalate && !audit::approved(&prev);
                if newly_approved {
                    let (by, reason) = (approval.by().unwrap_or_default(), approval.reason());
                    gate::mark_approved(&mut prev, by, reason, self.generation, self.now);
                    self.apply(&prev).await?;
                    info!(run = %self.name, namespace = %self.ns, "run approved");
                    let note = gate::approved_message(by, reason);
                    self.ctx.events.approved(self.run, note).await;
                }
                Ok(ControlFlow::Continue(prev))
            }
        }
    }

    /// Records that the run now waits for a person (`AwaitingApproval`, with
    /// `status.approvalRequest`: when, at which generation, and any approval it already
    /// carries, which will never count). Written only over the run as just read from the API
    /// server, or as the cached copy it was decided on ([`Self::current_run`]), so the
    /// generation and the approval recorded are the ones the write lands on: an
    /// approval written at any moment before is recorded as void, one written after is at a
    /// later generation.
    async fn begin_waiting(&self, prev: &SandboxRunStatus, tool: Tool) -> Stage<()> {
        let Some(fresh) = self.current_run().await? else {
            return Ok(ControlFlow::Break(Action::await_change()));
        };
        let current = fresh.status.clone().unwrap_or_default();
        if is_terminal(&current) {
            return self.finished(&current).await.map(ControlFlow::Break);
        }
        if current.approval_request.is_some() {
            // Already waiting: the cache had not seen our record yet.
            return Ok(ControlFlow::Continue(()));
        }
        let request = gate::approval_request(
            fresh.spec.approval.as_ref(),
            fresh.metadata.generation.unwrap_or(1),
            self.now,
        );
        let approve = gate::approve_command(&self.name, &self.ns);
        let status =
            gate::awaiting_status(prev, tool, &approve, request, self.generation, self.now);
        match self
            .apply_if_unchanged(&status, fresh.resource_version())
            .await
        {
            Ok(_) => {}
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                info!(run = %self.name, "the run changed before it was recorded waiting; looking again");
                return Ok(ControlFlow::Break(Action::requeue(Duration::from_millis(
                    200,
                ))));
            }
            Err(e) => return Err(e),
        }
        info!(run = %self.name, namespace = %self.ns, "run awaits approval");
        self.ctx.metrics.entered(Phase::AwaitingApproval);
        Ok(ControlFlow::Continue(()))
    }

    /// Stage 3: the run passed the gate; execute its tool. `decided` is the decision taken in
    /// this reconciliation, if any (its limits build the sandbox Pod).
    async fn execute(
        &self,
        prev: SandboxRunStatus,
        tool: Tool,
        decided: Option<Decided>,
    ) -> Result<Action, Error> {
        match tool {
            Tool::Python => self.python(prev, decided).await,
            Tool::Sql | Tool::Metrics => self.query(prev, tool, decided).await,
        }
    }

    /// [`Self::apply_recorded`], only if the run is still at `resource_version` (409 Conflict
    /// otherwise): a resourceVersion in an applied object is a precondition.
    pub(crate) async fn apply_if_unchanged(
        &self,
        status: &SandboxRunStatus,
        resource_version: Option<String>,
    ) -> Result<Option<String>, Error> {
        self.apply_status(status, resource_version).await
    }

    /// The terminal status of `outcome`, built on `prev`.
    pub fn terminal(
        &self,
        prev: &SandboxRunStatus,
        tool: Option<Tool>,
        outcome: &Outcome,
        pod: Option<&str>,
    ) -> SandboxRunStatus {
        outcome::outcome_status(prev, tool, outcome, pod, self.generation, self.now)
    }

    /// Ends the run with `outcome`: [`Reconcile::finish`] with its terminal status.
    pub async fn end(
        &self,
        prev: &SandboxRunStatus,
        tool: Option<Tool>,
        outcome: &Outcome,
        pod: Option<&str>,
    ) -> Result<Action, Error> {
        self.finish(self.terminal(prev, tool, outcome, pod), outcome, pod)
            .await
    }

    /// Records the terminal `status` of `outcome` (its tool is `status.tool`), writes the
    /// run's one audit line, then deletes the Pod `pod` and schedules the TTL.
    pub async fn finish(
        &self,
        status: SandboxRunStatus,
        outcome: &Outcome,
        pod: Option<&str>,
    ) -> Result<Action, Error> {
        self.finish_over(status, outcome, pod, None).await
    }

    /// [`Self::finish`]; `written` is the run's resourceVersion after this reconcile's own last
    /// status write, when it made one (`apply_recorded`): the run as it is now, so it is not
    /// read again (the warm path saves a round trip on the call's path).
    pub async fn finish_over(
        &self,
        status: SandboxRunStatus,
        outcome: &Outcome,
        pod: Option<&str>,
        written: Option<String>,
    ) -> Result<Action, Error> {
        self.end_once(status, outcome, pod, written, Overwritten::LookAgain)
            .await
    }

    /// [`Self::finish_over`] for an end that exists only in this reconcile's memory (a query's
    /// result): written over the run as this reconcile's own last write left it (`written`),
    /// and if someone wrote the run since (its caller's cancel, say), over the run as it is now
    /// unless it has ended. Looking again later would lose the result.
    pub(crate) async fn finish_result(
        &self,
        status: SandboxRunStatus,
        outcome: &Outcome,
        written: Option<String>,
    ) -> Result<Action, Error> {
        self.end_once(status, outcome, None, written, Overwritten::ReadAndEnd)
            .await
    }

    async fn end_once(
        &self,
        status: SandboxRunStatus,
        outcome: &Outcome,
        pod: Option<&str>,
        written: Option<String>,
        overwritten: Overwritten,
    ) -> Result<Action, Error> {
        // Written with its audit line owed: if this process dies before the line is out, the
        // next one to reconcile the run writes it (`finished`).
        let mut status = status;
        outcome::set_condition(
            &mut status.conditions,
            CONDITION_AUDITED,
            false,
            AUDIT_OWED,
            "the run's audit line is being written",
            self.generation,
            self.now,
        );
        let mut written = written;
        let result = loop {
            // A run ends once: one terminal status, one audit line, even when this reconcile
            // started from a cached copy that predates a terminal status written by the
            // previous one.
            let over_own_write = written.is_some();
            let read_at = match written.take() {
                Some(rv) => Some(rv),
                None => {
                    let fresh = self.current_run().await?;
                    if let Some(done) = fresh
                        .as_ref()
                        .and_then(|r| r.status.clone())
                        .filter(is_terminal)
                    {
                        return self.finished(&done).await;
                    }
                    fresh.and_then(|r| r.metadata.resource_version)
                }
            };
            // The status first: the Pod (and its log) must outlive the only record of the
            // result. Only over the run as read (or as written): a replica that lost its lease
            // with this very end in flight (held by a slow API server, say) may still deliver
            // it after the new leader ended the run; its late write then fails the
            // precondition instead of ending the run a second time with a second audit line.
            match self.apply_if_unchanged(&status, read_at).await {
                // Someone wrote the run since this reconcile's own last write (its caller's
                // cancel, say): an end that lives only in memory is written over the run as
                // it is now, unless that has ended ([`Self::finish_result`]).
                Err(Error::Kube(kube::Error::Api(conflict)))
                    if conflict.code == 409
                        && over_own_write
                        && overwritten == Overwritten::ReadAndEnd =>
                {
                    info!(run = %self.name, "the run changed since this reconcile wrote it; reading it before its end is recorded");
                }
                other => break other,
            }
        };
        if let Err(e) = result {
            if let Error::Kube(kube::Error::Api(conflict)) = &e
                && conflict.code == 409
            {
                // Not written: someone else wrote the run since it was read. Look again.
                info!(run = %self.name, "the run changed before its end was recorded; looking again");
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
            // It may have committed all the same: then the reconcile that finds the run ended
            // writes the audit line (`finished`); if it did not, this end is simply retried.
            self.ctx.unaudited.lock().expect("not poisoned").insert(
                self.uid(),
                Unaudited {
                    status: status.clone(),
                    phase: outcome.phase,
                    reason: outcome.reason.clone(),
                },
            );
            return Err(e);
        }
        self.ctx
            .unaudited
            .lock()
            .expect("not poisoned")
            .remove(&self.uid());
        self.ctx.ended_here(&self.uid(), self.now);
        self.ctx.feeds.forget(&self.uid());
        if status.tool == Some(Tool::Python) {
            // Out of the queue if it waited there; its sandbox, if it had one, is freed below.
            let run = ObjectRef::new(&self.name).within(&self.ns);
            self.ctx.admission.ended(&run, &self.uid(), self.now);
        }
        info!(run = %self.name, phase = %outcome.phase, reason = %outcome.reason, "run finished");
        self.record_end(&status, outcome.phase, &outcome.reason);
        self.audit_recorded().await;
        if let Some(start) = outcome.started_at {
            let secs = outcome.finished_at.duration_since(start).as_secs_f64();
            self.ctx.metrics.run_duration.observe(secs.max(0.0));
        }
        self.ctx
            .events
            .finished(self.run, outcome.phase, &outcome.reason, &outcome.message)
            .await;
        if let Some(pod) = pod {
            self.delete_finished_pod(pod).await?;
        }
        Ok(after_ttl(self.run, &status, self.now))
    }

    /// An unfinished run its caller cancelled: it ends `Cancelled`, with its audit line, and its
    /// sandbox (if any) is deleted. What ran until now ran; nothing more will.
    async fn cancel(&self, prev: &SandboxRunStatus) -> Result<Action, Error> {
        let tool = self.run.spec.tool();
        let outcome = Outcome::of(
            Phase::Cancelled,
            Reason::CallCancelled,
            "the caller cancelled the call before the run ended (spec.cancelled)".to_owned(),
            prev.start_time.as_ref().map(|t| t.0),
            self.now,
        );
        // A call in a session: the session's sandbox is ended with it if the call still runs.
        self.cancel_session_call(prev).await?;
        let pod = (tool == Some(Tool::Python) && prev.session.is_none()).then(|| {
            prev.pod_name
                .clone()
                .unwrap_or_else(|| crate::python::pod::pod_name(&self.name))
        });
        self.end(prev, tool, &outcome, pod.as_deref()).await
    }

    /// The call's audit line and its metrics: the run is terminal from here on. The line's
    /// duration counts to the run's completion, not to now, so a line written again by another
    /// process (see `owed_audit`) is the same line (its duration to the second: the API server
    /// keeps the completion time in whole seconds).
    fn record_end(&self, status: &SandboxRunStatus, phase: Phase, reason: &str) {
        let tool = status.tool;
        let ended = status.completion_time.as_ref().map_or(self.now, |t| t.0);
        audit::record(self.run, tool, status, phase, reason, ended);
        self.ctx
            .audit_written
            .lock()
            .expect("not poisoned")
            .insert(self.uid());
        let metrics = &self.ctx.metrics;
        metrics.entered(phase);
        metrics.finished_call(
            tool,
            &self.run.spec.agent,
            self.run.spec.environment,
            status.decision.as_ref().map(|d| d.verdict),
            phase,
        );
    }

    /// Records that the run's audit line is out (its `Audited` condition turns True). A failure
    /// only costs a retry: the next reconcile records it, without writing the line again.
    async fn audit_recorded(&self) {
        let patch = json!({
            "apiVersion": SandboxRun::api_version(&()),
            "kind": SandboxRun::kind(&()),
            "status": {"conditions": [{
                "type": CONDITION_AUDITED,
                "status": "True",
                "reason": AUDIT_WRITTEN,
                "message": "the run's audit line was written",
                "lastTransitionTime": Time(self.now),
            }]},
        });
        let mut patch = patch;
        if let Some(generation) = self.generation {
            patch["status"]["conditions"][0]["observedGeneration"] = json!(generation);
        }
        let params = PatchParams::apply(AUDIT_FIELD_MANAGER).force();
        match self
            .runs
            .patch_status(&self.name, &params, &Patch::Apply(&patch))
            .await
        {
            Ok(_) => {
                self.ctx
                    .audit_written
                    .lock()
                    .expect("not poisoned")
                    .remove(&self.uid());
            }
            Err(e) => {
                warn!(run = %self.name, error = %e, "could not record that the audit line was written; retried on the next reconcile");
            }
        }
    }

    /// A terminal run whose audit line is still owed (its `Audited` condition is False): the
    /// process that ended it died, or could not record the line, before recording it. Writes
    /// the line from the run as stored (unless this process already wrote it), then records it.
    async fn owed_audit(&self, status: &SandboxRunStatus) -> Result<(), Error> {
        if !owes_audit(status) {
            return Ok(());
        }
        let written = self
            .ctx
            .audit_written
            .lock()
            .expect("not poisoned")
            .contains(&self.uid());
        if !written {
            // The cached copy is trimmed; the line needs the whole terminal status.
            let Some(stored) = self.runs.get_opt(&self.name).await? else {
                return Ok(());
            };
            // The cache may lag: the stored run may have it recorded already.
            let Some(full) = stored.status.filter(|s| is_terminal(s) && owes_audit(s)) else {
                return Ok(());
            };
            let (Some(phase), Some(reason)) = (full.phase, full.reason.clone()) else {
                return Ok(());
            };
            info!(run = %self.name, "a terminal run still owes its audit line (its operator stopped before recording it); writing it");
            self.record_end(&full, phase, &reason);
        }
        self.audit_recorded().await;
        Ok(())
    }

    /// Whether Pod `name` of the run's namespace is being deleted already: this process deleted
    /// it lately, or the Pods' watch has it terminating. Each change of a terminating Pod
    /// reconciles its finished run, and each sent one more DELETE for it: seven for one warm
    /// call, measured on the API server's request counts.
    fn pod_going(&self, name: &str) -> bool {
        let deleted = self
            .ctx
            .pods_deleted
            .lock()
            .expect("not poisoned")
            .contains_key(&format!("{}/{name}", self.ns));
        deleted
            || self
                .ctx
                .sandbox_pods
                .get(&ObjectRef::new(name).within(&self.ns))
                .is_some_and(|pod| pod.metadata.deletion_timestamp.is_some())
    }

    /// Deletes the Pod of a finished run, and notes it ([`Self::pod_going`]).
    async fn delete_finished_pod(&self, name: &str) -> Result<(), Error> {
        self.delete_pod(name).await?;
        let mut deleted = self.ctx.pods_deleted.lock().expect("not poisoned");
        deleted.retain(|_, at| self.now.duration_since(*at) < POD_CLEANUP_WINDOW);
        deleted.insert(format!("{}/{name}", self.ns), self.now);
        Ok(())
    }

    /// The run's uid (empty if the API server gave none).
    pub(crate) fn uid(&self) -> String {
        self.run.metadata.uid.clone().unwrap_or_default()
    }

    /// A run in a terminal phase: make sure its Pod is gone, delete the run once its TTL passed.
    pub async fn finished(&self, status: &SandboxRunStatus) -> Result<Action, Error> {
        let pending = self
            .ctx
            .unaudited
            .lock()
            .expect("not poisoned")
            .remove(&self.uid());
        if let Some(end) = pending.filter(|end| {
            // Ours, committed although its answer was lost: the same end, to the second (the
            // API server keeps whole seconds).
            let second = |s: &SandboxRunStatus| s.completion_time.as_ref().map(|t| t.0.as_second());
            end.status.phase == status.phase
                && second(&end.status) == second(status)
                && end.status.reason == status.reason
        }) {
            info!(run = %self.name, "the terminal status write committed although it failed; writing its audit line");
            self.record_end(&end.status, end.phase, &end.reason);
        }
        self.owed_audit(status).await?;
        if status.session.is_some() && recently_finished(status, self.now) {
            // A call in a session gives the session back after its end: again, in case this
            // process stopped in between.
            self.session_call_ended(status).await?;
        }
        if let Some(pod) = status
            .pod_name
            .as_ref()
            .filter(|_| recently_finished(status, self.now))
            .filter(|pod| !self.pod_going(pod))
        {
            // Covers a crash between recording the result and deleting the Pod. Only soon after
            // the end: otherwise every relist of the operator would send one DELETE per stored
            // run for Pods long gone. A Pod that outlived the window anyway stops at its own
            // activeDeadlineSeconds and is garbage-collected with its run at the TTL.
            self.delete_finished_pod(pod).await?;
        }
        match ttl_left(self.run, status, self.now) {
            Some(left) => Ok(Action::requeue(left)),
            None => {
                info!(run = %self.name, "TTL expired, deleting run");
                match self
                    .runs
                    .delete(&self.name, &DeleteParams::background())
                    .await
                {
                    Ok(_) => Ok(Action::await_change()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// The run to write over: the cached copy the run was decided on, when this reconcile
    /// decided on it and wrote nothing since (its next write is conditional on that copy, see
    /// [`Self::decide`]); else the run as the API server has it now. `None`: the run is gone.
    async fn current_run(&self) -> Result<Option<SandboxRun>, Error> {
        if self.fenced() {
            return Ok(Some(self.run.clone()));
        }
        Ok(self.runs.get_opt(&self.name).await?)
    }

    /// Before a warm sandbox is claimed on a decision taken on the cached copy and not written
    /// yet: whether the run as the API server has it now is still that copy. A read, not the
    /// decision's own write: the claim's record carries the decision, and stays conditional on
    /// the copy. `Error::Changed` when someone wrote the run since (its caller's cancel), or it
    /// is gone: nothing is claimed, and the run is looked at again.
    pub async fn unchanged_since_decided(&self) -> Result<(), Error> {
        if !self.fenced() {
            return Ok(());
        }
        let now = self.runs.get_opt(&self.name).await?;
        match now.and_then(|run| run.metadata.resource_version) {
            Some(version) if self.known_version().as_ref() == Some(&version) => Ok(()),
            _ => Err(Error::Changed),
        }
    }

    /// The run's status as the API server has it now (never the watch cache): `None` when the
    /// run is gone, else its status.
    pub async fn fresh_status(&self) -> Result<Option<SandboxRunStatus>, Error> {
        let fresh = self.runs.get_opt(&self.name).await?;
        self.know_version(
            fresh
                .as_ref()
                .and_then(|r| r.metadata.resource_version.clone()),
        );
        Ok(fresh.map(|fresh| fresh.status.unwrap_or_default()))
    }

    /// Writes the whole status with server-side apply: fields the operator stops setting are
    /// removed.
    pub async fn apply(&self, status: &SandboxRunStatus) -> Result<(), Error> {
        self.apply_status(status, None).await.map(|_| ())
    }

    /// [`Self::apply`], returning the run's resourceVersion after the write: the run as it is
    /// now, for a later write of this reconcile to be conditional on (see [`Self::finish_over`]).
    pub async fn apply_recorded(&self, status: &SandboxRunStatus) -> Result<Option<String>, Error> {
        self.apply_status(status, None).await
    }

    async fn apply_status(
        &self,
        status: &SandboxRunStatus,
        resource_version: Option<String>,
    ) -> Result<Option<String>, Error> {
        let mut patch = json!({
            "apiVersion": SandboxRun::api_version(&()),
            "kind": SandboxRun::kind(&()),
            "status": status,
        });
        // The first write after a decision taken on the cached copy is conditional on it.
        let fenced = self.fenced.swap(false, std::sync::atomic::Ordering::SeqCst)
            && resource_version.is_none();
        let resource_version = match resource_version {
            Some(rv) => Some(rv),
            None if fenced => self.known_version(),
            None => None,
        };
        if let Some(rv) = resource_version {
            patch["metadata"] = json!({ "resourceVersion": rv });
        }
        let written = self
            .runs
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await;
        // Unknown after a failed write: it may have committed all the same.
        let version = written
            .as_ref()
            .ok()
            .and_then(|w| w.metadata.resource_version.clone());
        self.know_version(version.clone());
        match written {
            Ok(_) => {
                if self.run.status.as_ref().is_none_or(undecided) {
                    self.ctx.wrote_while_undecided(&self.uid());
                }
                Ok(version)
            }
            Err(kube::Error::Api(e)) if fenced && e.code == 409 => Err(Error::Changed),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a Pod; one that is already gone is fine.
    pub async fn delete_pod(&self, name: &str) -> Result<(), Error> {
        Ok(delete_pod(&self.pods, name).await?)
    }
}

/// Deletes the Pod `name` (in the background); one already gone is no error.
pub async fn delete_pod(pods: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    match pods.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Reconciles one SandboxRun.
#[tracing::instrument(skip_all, fields(run = %run.name_any(), namespace = %run.namespace().unwrap_or_default()))]
pub async fn reconcile(run: Arc<SandboxRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.inc();
    let started = std::time::Instant::now();
    // A query executes inside the reconciliation: it gets its own timeout on top.
    let budget = match run.spec.tool() {
        Some(Tool::Sql | Tool::Metrics) => {
            ctx.reconcile_timeout
                + Duration::from_secs(u64::from(run.spec.limits.effective().timeout_seconds))
        }
        _ => ctx.reconcile_timeout,
    };
    let result = match Reconcile::new(&run, &ctx) {
        Ok(r) => tokio::time::timeout(budget, r.stages())
            .await
            .unwrap_or(Err(Error::Timeout(budget))),
        Err(e) => Err(e),
    };
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let action = match result {
        Err(Error::Changed) => {
            info!("the run changed since the copy it was decided on; looking again");
            Action::requeue(Duration::from_millis(200))
        }
        other => other?,
    };
    ctx.failures
        .lock()
        .expect("not poisoned")
        .remove(&ObjectRef::from_obj(run.as_ref()));
    Ok(action)
}

/// What an end written over the run as this reconcile last wrote it does when someone wrote
/// the run since (409 Conflict).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overwritten {
    /// Nothing is written; the run is looked at again (the end can be found again: a sandbox's
    /// log, a refusal decided again on the run as it is then).
    LookAgain,
    /// The run is read as it is now, and ended over that unless it has ended.
    ReadAndEnd,
}

/// Whether `status` shows no decision yet: a run not judged by policy.
fn undecided(status: &SandboxRunStatus) -> bool {
    status.decision.is_none() && status.phase.is_none()
}

/// Default [`Context::reconcile_timeout`].
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long after its end a run's Pod is still deleted on every reconcile of the run.
const POD_CLEANUP_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(600);

/// Whether `status` ended within [`POD_CLEANUP_WINDOW`] of `now` (or says not when).
fn recently_finished(status: &SandboxRunStatus, now: Timestamp) -> bool {
    status
        .completion_time
        .as_ref()
        .is_none_or(|done| now.duration_since(done.0) < POD_CLEANUP_WINDOW)
}

/// Time left before a finished run is deleted (`None`: due now). Counted from its completion
/// time, or from its creation should the completion time be missing.
fn ttl_left(run: &SandboxRun, status: &SandboxRunStatus, now: Timestamp) -> Option<Duration> {
    let completed = status
        .completion_time
        .as_ref()
        .or(run.metadata.creation_timestamp.as_ref())
        .map_or(now, |t| t.0);
    let ttl = ttl::retention(
        run.spec.ttl_seconds_after_finished,
        status.phase,
        status.decision.as_ref().map(|d| d.verdict),
    );
    ttl::time_left(completed, ttl, now)
}

/// Requeue for the TTL of a run that just finished.
fn after_ttl(run: &SandboxRun, status: &SandboxRunStatus, now: Timestamp) -> Action {
    // When due already, reconcile again right away: the terminal path deletes the run.
    Action::requeue(ttl_left(run, status, now).unwrap_or(Duration::from_millis(1)))
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

/// What the operator keeps of a run in its cache. Managed fields and annotations are never read
/// (a `kubectl apply`'s last-applied annotation holds the whole spec, code included). A finished
/// run is only waited on for its TTL, so what it said is dropped and what decides its TTL kept
/// (phase, reason, completion time, Pod, verdict): with ten thousand stored runs the cache holds
/// their phases, not their code, input files, outputs, returned files, queries or conditions. Whatever needs the whole object
/// reads it from the API server (the terminal checks do); an end remembered in memory
/// ([`Context::unaudited`]) carries its own full status.
pub fn trim(run: &mut SandboxRun) {
    run.metadata.managed_fields = None;
    run.metadata.annotations = None;
    let terminal = run.status.as_ref().is_some_and(is_terminal);
    if terminal {
        if let Some(python) = run.spec.python.as_mut() {
            python.code = String::new();
            python.files = Vec::new();
        }
        if let Some(sql) = run.spec.sql.as_mut() {
            sql.query = String::new();
        }
        if let Some(metrics) = run.spec.metrics.as_mut() {
            metrics.query = String::new();
        }
        if let Some(status) = run.status.as_mut() {
            status.stdout = None;
            status.stderr = None;
            status.files = Vec::new();
            status.files_omitted = Vec::new();
            status.result = None;
            status.message = None;
            // Only what a later reconcile acts on: whether the audit line is still owed.
            status.conditions.retain(|c| c.type_ == CONDITION_AUDITED);
            if let Some(decision) = status.decision.as_mut() {
                decision.rule = String::new();
                decision.reason = String::new();
                decision.grant = None;
            }
        }
    }
}

/// Runs the controller until `shutdown` completes; in-flight reconciliations finish first.
/// `namespace` is the one namespace watched (`None`: every namespace, asked for explicitly);
/// at most `concurrency` reconciliations run at once.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (runs, pods): (Api<SandboxRun>, Api<Pod>) = match namespace {
        None => (Api::all(client.clone()), Api::all(client)),
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client, namespace),
        ),
    };
    if let Err(e) = runs.list(&ListParams::default().limit(1)).await {
        warn!(error = %e, "cannot list SandboxRuns: is the CRD installed and RBAC granted?");
    }
    let pod_watch =
        watcher::Config::default().labels(&format!("{}={}", pod::LABEL_MANAGED_BY, pod::MANAGER));
    // The cache holds what reconciling needs, not every run in full: see `trim`.
    let (reader, writer) = reflector::store();
    // While this controller runs, the metrics report its unfinished runs (the leader's count).
    let metrics = ctx.metrics.clone();
    metrics.watch_runs(Some(reader.clone()));
    // A streaming list (the API server's WatchList: the initial state as watch events from its
    // cache): each run is decoded and trimmed on its own, where a paged list holds 500 full runs
    // at once, outputs included, and leaves the allocator that much fragmented (measured with
    // the scale benchmark: e2e/BENCHMARKS.md). Paged where the server serves no streaming list.
    let (strategy, why) = ListStrategy::probe(&runs).await;
    strategy.log(&why);
    let trigger = watcher(runs, strategy.apply(watcher::Config::default()))
        .default_backoff()
        .modify(trim)
        .reflect(writer)
        .touched_objects();
    // Each change of a sandbox Pod goes into the store the reconciles read their run's Pod
    // from (`watched_pods.rs`), then wakes the run, and tells the queue when a node took a
    // run's own Pod (`phase::placed_run` says why the watch, not a reconcile).
    let (pod_store, pod_writer) = reflector::store();
    let _serving = ctx.watched_pods.serve(pod_store);
    let admission = ctx.admission.clone();
    let pod_changes = watcher(pods, pod_watch)
        .default_backoff()
        .modify(|pod| pod.managed_fields_mut().clear())
        .reflect(pod_writer)
        .touched_objects()
        .inspect(move |pod| {
            if let Ok(pod) = pod
                && let Some((run, uid)) = phase::placed_run(pod)
            {
                admission.scheduling(&run, uid, Placement::Placed, Timestamp::now());
            }
        });
    Controller::for_stream(trigger, reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency))
        .owns_stream(pod_changes)
        .reconcile_on(ctx.admission.wakeups())
        .reconcile_on(ctx.feeds.wakeups())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(run = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    metrics.watch_runs(None);
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
