//! Prometheus metrics and the HTTP server that exposes them with a health check.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sandboxrun_api::{SandboxRun, SandboxSession, SessionPhase};
use sandboxrun_core::{Environment, Phase, Tool, Verdict};

/// Label set naming a phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase a run entered.
    pub phase: String,
}

/// Label set naming an error kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The kind of error (see `controller::Error::kind`).
    pub error: String,
}

/// Label set of a Kubernetes API request: its verb (`GET`, `WATCH`, `POST`, `PATCH`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// The HTTP method, or `WATCH` for a watch.
    pub verb: String,
}

/// Label set of a warm-sandbox claim: `hit` (a run took a pool's sandbox), `miss` (a pool
/// fits the run but had no ready sandbox, or lost the race for it: the run went cold).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    /// The pool.
    pub pool: String,
    /// hit or miss.
    pub result: String,
}

/// Label set of a warm hand-over: `held` (over the stream the pool opened while the sandbox
/// idled) or `opened` (attached at the claim).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// held or opened.
    pub stream: String,
}

/// Label set naming a pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool, as namespace/name.
    pub pool: String,
}

/// Label set of a finished tool call: the same labels as the embedded frontend's
/// `sandboxrun_tool_calls_total` (see `sandboxrun_core::metrics::CALLS_METRIC`), so one PromQL
/// query answers in both modes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// The MCP tool: run_python, execute_sql or fetch_metrics.
    pub tool: String,
    /// The calling agent.
    pub agent: String,
    /// sandbox, staging or production.
    pub environment: String,
    /// What policy decided (empty when the run had no decision).
    pub verdict: String,
    /// The terminal phase.
    pub phase: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciliations started.
    pub reconciles: Counter,
    /// Reconciliations that returned an error, by kind.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Runs that entered each phase.
    pub runs: Family<PhaseLabels, Counter>,
    /// Finished runs by tool, agent, environment, verdict and terminal phase.
    pub tool_calls: Family<CallLabels, Counter>,
    /// Execution time of finished runs, seconds.
    pub run_duration: Histogram,
    /// Time from a run's creation to its code starting, seconds.
    pub queue_to_start: Histogram,
    /// Time to hand a started sandbox its program over the attach stream, seconds.
    pub program_feed: Histogram,
    /// Time of one reconciliation (its API calls included; an sql or metrics run's query too).
    pub reconcile_duration: Histogram,
    /// Requests to the Kubernetes API by verb. Per run: divide its rate by that of
    /// `tool_calls_total` (e2e/BENCHMARKS.md has the query).
    pub api_requests: Family<VerbLabels, Counter>,
    /// Python runs that found no room for a sandbox and joined their namespace's queue.
    pub queued: Counter,
    /// Python runs refused for capacity (`NoCapacity`): no sandbox could start them in time.
    pub capacity_refusals: Counter,
    /// Warm-sandbox claims by pool and result (hit, miss).
    pub warm_claims: Family<ClaimLabels, Counter>,
    /// Time to claim a warm sandbox (list the pool's idle Pods, claim one), seconds.
    pub warm_claim: Histogram,
    /// Programs handed to claimed warm sandboxes, by stream (held: opened while it idled).
    warm_handovers: Family<StreamLabels, Counter>,
    /// Ready idle sandboxes per pool, as of its last reconcile (set with
    /// [`Metrics::set_pool_ready`], dropped with [`Metrics::retain_pools`]).
    pool_ready: Family<PoolLabels, prometheus_client::metrics::gauge::Gauge>,
    /// The pools `pool_ready` has a series of.
    pools: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Runs not finished yet, counted at each scrape in the run controller's cache.
    unfinished: Arc<Unfinished>,
    /// Sessions not ended yet, counted at each scrape in the session controller's cache.
    open_sessions: Arc<OpenSessions>,
}

/// The phases of a session before it ends, the `phase` label of `sandboxrun_open_sessions`.
const OPEN_SESSION_PHASES: [SessionPhase; 3] = [
    SessionPhase::Pending,
    SessionPhase::Ready,
    SessionPhase::Busy,
];

/// `sandboxrun_open_sessions{phase}`: the sessions not ended, read at each scrape from the
/// session controller's cache (on the leader only, as [`Unfinished`]). A session whose status
/// is not written yet counts as Pending.
#[derive(Debug, Default)]
struct OpenSessions {
    sessions: std::sync::RwLock<Option<Store<SandboxSession>>>,
}

impl OpenSessions {
    /// The number of sessions in each phase of [`OPEN_SESSION_PHASES`].
    fn count(sessions: &Store<SandboxSession>) -> [usize; 3] {
        let mut out = [0; 3];
        for session in sessions.state() {
            let phase = session
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .unwrap_or(SessionPhase::Pending);
            if let Some(i) = OPEN_SESSION_PHASES.iter().position(|p| *p == phase) {
                out[i] += 1;
            }
        }
        out
    }
}

impl Collector for OpenSessions {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sessions) = self.sessions.read().expect("not poisoned").clone() else {
            return Ok(());
        };
        let number = Family::<PhaseLabels, Gauge>::default();
        for (phase, n) in OPEN_SESSION_PHASES.iter().zip(Self::count(&sessions)) {
            let labels = PhaseLabels {
                phase: phase.as_str().to_owned(),
            };
            number
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        number.encode(encoder.encode_descriptor(
            "open_sessions",
            "Sessions not ended, by phase (Pending: their sandbox starts; Busy: a call runs), in the leader's cache",
            None,
            number.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The phases a run is in before it finishes, the `phase` label of `sandboxrun_unfinished_runs`:
/// `None` (label `""`) is a run the operator has not reconciled yet.
const UNFINISHED_PHASES: [Option<Phase>; 4] = [
    None,
    Some(Phase::Pending),
    Some(Phase::AwaitingApproval),
    Some(Phase::Running),
];

/// `sandboxrun_unfinished_runs{phase}` and `sandboxrun_oldest_unfinished_run_seconds{phase}`,
/// read at each scrape from the cache of the run controller: only while it runs (on the leader),
/// so a standby replica reports neither and `max`/`sum` over replicas count each run once.
#[derive(Debug, Default)]
struct Unfinished {
    runs: std::sync::RwLock<Option<Store<SandboxRun>>>,
}

impl Unfinished {
    /// Per phase of [`UNFINISHED_PHASES`]: the number of runs in it and the age in seconds of
    /// the oldest (since its creation; 0 when there is none), as of `now`.
    fn count(runs: &Store<SandboxRun>, now: jiff::Timestamp) -> [(usize, f64); 4] {
        let mut out = [(0usize, 0f64); 4];
        for run in runs.state() {
            let phase = run.status.as_ref().and_then(|s| s.phase);
            // Terminal phases are not among them.
            let Some(i) = UNFINISHED_PHASES.iter().position(|p| *p == phase) else {
                continue;
            };
            let age = run
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0.0, |t| now.duration_since(t.0).as_secs_f64().max(0.0));
            out[i].0 += 1;
            out[i].1 = out[i].1.max(age);
        }
        out
    }
}

impl Collector for Unfinished {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(runs) = self.runs.read().expect("not poisoned").clone() else {
            return Ok(());
        };
        let counts = Self::count(&runs, jiff::Timestamp::now());
        let number = Family::<PhaseLabels, Gauge>::default();
        let oldest = Family::<PhaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for (phase, (n, age)) in UNFINISHED_PHASES.iter().zip(counts) {
            let labels = PhaseLabels {
                phase: phase.map(|p| p.to_string()).unwrap_or_default(),
            };
            number
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            oldest.get_or_create(&labels).set(age);
        }
        number.encode(encoder.encode_descriptor(
            "unfinished_runs",
            "Runs not finished yet, by phase (empty: not reconciled yet), in the leader's cache",
            None,
            number.metric_type(),
        )?)?;
        oldest.encode(encoder.encode_descriptor(
            "oldest_unfinished_run_seconds",
            "Age since creation of the oldest run not finished yet, by phase (0: none)",
            None,
            oldest.metric_type(),
        )?)?;
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sandboxrun");
        let reconciles = Counter::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let runs = Family::<PhaseLabels, Counter>::default();
        let tool_calls = Family::<CallLabels, Counter>::default();
        // 50 ms to ~10 min: runs are bounded by the 600 s timeout.
        let run_duration = Histogram::new([
            0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
        ]);
        // Sandbox start-up is about a second under gVisor; the tail shows queueing.
        let queue_to_start = Histogram::new([
            0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
        ]);
        // Milliseconds when the stream is warm; seconds would mean the API server or kubelet is
        // struggling.
        let program_feed = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ]);
        // From 100 µs: a finished run's reconcile makes no API call and takes well under a
        // millisecond, and a quantile interpolated inside a 0-1 ms first bucket says nothing.
        let reconcile_duration = Histogram::new([
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0, 30.0,
        ]);
        let api_requests = Family::<VerbLabels, Counter>::default();
        let queued = Counter::default();
        let capacity_refusals = Counter::default();
        registry.register(
            "queued_runs",
            "Python runs that found no room for a sandbox and waited in the queue",
            queued.clone(),
        );
        registry.register(
            "capacity_refusals",
            "Python runs refused because no sandbox could start them within the queue's allowance (NoCapacity)",
            capacity_refusals.clone(),
        );
        let warm_claims = Family::<ClaimLabels, Counter>::default();
        let warm_claim =
            Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
        let warm_handovers = Family::<StreamLabels, Counter>::default();
        registry.register(
            "warm_handovers",
            "Programs handed to claimed warm sandboxes, by stream (held: opened while the sandbox idled; opened: attached at the claim)",
            warm_handovers.clone(),
        );
        let pool_ready = Family::<PoolLabels, prometheus_client::metrics::gauge::Gauge>::default();
        let unfinished = Arc::new(Unfinished::default());
        registry.register_collector(Box::new(unfinished.clone()));
        let open_sessions = Arc::new(OpenSessions::default());
        registry.register_collector(Box::new(open_sessions.clone()));
        registry.register(
            "warm_claims",
            "Python runs that a warm pool fitted, by pool and result (hit: took a ready sandbox; miss: went cold)",
            warm_claims.clone(),
        );
        registry.register(
            "warm_claim_seconds",
            "Time to claim a warm sandbox",
            warm_claim.clone(),
        );
        registry.register(
            "pool_ready_sandboxes",
            "Ready idle sandboxes per pool, as of its last reconcile",
            pool_ready.clone(),
        );
        registry.register(
            "api_requests",
            "Requests the operator sent to the Kubernetes API, by verb",
            api_requests.clone(),
        );
        registry.register(
            "program_feed_seconds",
            "Time to hand a started sandbox its program (attach, send, confirmation)",
            program_feed.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconciliation of a SandboxRun",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciliations of SandboxRuns",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed, by error kind",
            reconcile_errors.clone(),
        );
        registry.register("runs", "Runs that entered each phase", runs.clone());
        registry.register(
            "tool_calls",
            "Finished runs (tool calls) by tool, agent, environment, verdict and terminal phase",
            tool_calls.clone(),
        );
        registry.register(
            "run_duration_seconds",
            "Execution time of finished runs",
            run_duration.clone(),
        );
        registry.register(
            "queue_to_start_seconds",
            "Time from a run's creation to its code starting",
            queue_to_start.clone(),
        );
        // Every phase appears from the start, so rates work before the first run.
        for phase in Phase::ALL {
            let _ = runs.get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            });
        }
        Self {
            registry,
            reconciles,
            reconcile_errors,
            runs,
            tool_calls,
            run_duration,
            queue_to_start,
            program_feed,
            reconcile_duration,
            api_requests,
            queued,
            capacity_refusals,
            warm_claims,
            warm_claim,
            warm_handovers,
            pool_ready,
            pools: Default::default(),
            unfinished,
            open_sessions,
        }
    }
}

impl Metrics {
    /// Reports the unfinished runs of `runs` (the run controller's cache) from now on, `None`:
    /// no more (the controller stopped, e.g. this replica is no longer the leader).
    pub fn watch_runs(&self, runs: Option<Store<SandboxRun>>) {
        *self.unfinished.runs.write().expect("not poisoned") = runs;
    }

    /// Reports the open sessions of `sessions` (the session controller's cache) from now on,
    /// `None`: no more.
    pub fn watch_sessions(&self, sessions: Option<Store<SandboxSession>>) {
        *self.open_sessions.sessions.write().expect("not poisoned") = sessions;
    }

    /// Sets the ready idle sandboxes of pool `pool` (namespace/name).
    pub fn set_pool_ready(&self, pool: &str, ready: usize) {
        let new = self
            .pools
            .lock()
            .expect("not poisoned")
            .insert(pool.to_owned());
        if new {
            // Its claim counters from 0, before its first claim: a rate over them (the warm hit
            // ratio) sees that claim, where a series born at 1 would show no increase.
            for result in ["hit", "miss"] {
                let _ = self.warm_claims.get_or_create(&ClaimLabels {
                    pool: pool.to_owned(),
                    result: result.to_owned(),
                });
            }
        }
        self.pool_ready
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// Drops the ready-sandboxes and claim series of every pool for which `exists` is false: a
    /// deleted pool is never reconciled again, and its last values would stay forever.
    pub fn retain_pools(&self, exists: impl Fn(&str) -> bool) {
        self.pools.lock().expect("not poisoned").retain(|pool| {
            let keep = exists(pool);
            if !keep {
                self.pool_ready.remove(&PoolLabels { pool: pool.clone() });
                for result in ["hit", "miss"] {
                    self.warm_claims.remove(&ClaimLabels {
                        pool: pool.clone(),
                        result: result.to_owned(),
                    });
                }
            }
            keep
        });
    }

    /// Counts one program handed to a claimed warm sandbox, over a `held` stream or a new one.
    pub fn warm_handover(&self, held: bool) {
        self.warm_handovers
            .get_or_create(&StreamLabels {
                stream: if held { "held" } else { "opened" }.to_owned(),
            })
            .inc();
    }

    /// Counts one python run that pool `pool` fitted: `hit` when it took a sandbox.
    pub fn warm_claim_result(&self, pool: &str, hit: bool) {
        self.warm_claims
            .get_or_create(&ClaimLabels {
                pool: pool.to_owned(),
                result: if hit { "hit" } else { "miss" }.to_owned(),
            })
            .inc();
    }

    /// Counts one request to the Kubernetes API (see [`Metrics::api_requests`]).
    pub fn api_request<B>(&self, request: &http::Request<B>) -> &Self {
        let watch = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
        let verb = if watch {
            "WATCH"
        } else {
            request.method().as_str()
        };
        self.api_requests
            .get_or_create(&VerbLabels {
                verb: verb.to_owned(),
            })
            .inc();
        self
    }

    /// Counts a run whose code started at `started` (cold or warm, recorded Running or ended
    /// before it was: every start counts once, so the queue-to-start histogram is not only that
    /// of the runs slow enough to be seen running), and its wait since `created`.
    pub fn started(
        &self,
        created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
        started: jiff::Timestamp,
    ) {
        self.entered(Phase::Running);
        if let Some(created) = created {
            // Whole seconds: Kubernetes timestamps have no finer resolution.
            let wait = started.duration_since(created.0).as_secs_f64();
            self.queue_to_start.observe(wait.max(0.0));
        }
    }

    /// Counts a run entering a phase.
    pub fn entered(&self, phase: Phase) {
        self.runs
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .inc();
    }

    /// Counts a run that reached its terminal `phase`.
    pub fn finished_call(
        &self,
        tool: Option<Tool>,
        agent: &str,
        environment: Environment,
        verdict: Option<Verdict>,
        phase: Phase,
    ) {
        self.tool_calls
            .get_or_create(&CallLabels {
                tool: tool.map(Tool::mcp_name).unwrap_or_default().to_owned(),
                agent: agent.to_owned(),
                environment: environment.as_str().to_owned(),
                verdict: verdict.map(Verdict::as_str).unwrap_or_default().to_owned(),
                phase: phase.to_string(),
            })
            .inc();
    }

    /// Counts a failed reconciliation.
    pub fn error(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                error: kind.to_owned(),
            })
            .inc();
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

/// The HTTP routes: `/metrics` and `/healthz`.
pub fn router(m: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(m)
}

/// Serves the routes until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    m: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    axum::serve(listener, router(m))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, created: &str, phase: Option<&str>) -> SandboxRun {
        let mut run = serde_json::json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": name, "namespace": "r", "creationTimestamp": created},
            "spec": {"agent": "a", "python": {"code": "print(1)"}},
        });
        if let Some(phase) = phase {
            run["status"] = serde_json::json!({"phase": phase});
        }
        serde_json::from_value(run).expect("a valid SandboxRun")
    }

    #[test]
    fn a_deleted_pool_loses_its_series() {
        let m = Metrics::default();
        m.set_pool_ready("r/default", 2);
        m.set_pool_ready("r/gone", 0);
        m.retain_pools(|pool| pool == "r/default");
        let text = m.render();
        assert!(
            text.contains("sandboxrun_pool_ready_sandboxes{pool=\"r/default\"} 2"),
            "{text}"
        );
        assert!(!text.contains("r/gone"), "{text}");
        // A pool's claim counters exist from its first reconcile, at 0 (a rate sees its first
        // claim).
        assert!(
            text.contains("sandboxrun_warm_claims_total{pool=\"r/default\",result=\"hit\"} 0"),
            "{text}"
        );
        m.set_pool_ready("r/gone", 1);
        assert!(
            m.render().contains("r/gone"),
            "a pool created again is reported again"
        );
    }

    #[test]
    fn counts_open_sessions_of_the_cache_while_it_is_watched() {
        let (store, mut writer) = kube::runtime::reflector::store();
        for (name, phase) in [
            ("new", None),
            ("ready", Some(SessionPhase::Ready)),
            ("busy", Some(SessionPhase::Busy)),
            ("also-ready", Some(SessionPhase::Ready)),
            ("over", Some(SessionPhase::Ended)),
        ] {
            let mut s = SandboxSession::new(
                name,
                serde_json::from_value(serde_json::json!({"agent": "a"})).unwrap(),
            );
            s.metadata.namespace = Some("ns".to_owned());
            s.status = phase.map(|phase| sandboxrun_api::SandboxSessionStatus {
                phase: Some(phase),
                ..Default::default()
            });
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(s));
        }
        assert_eq!(OpenSessions::count(&store), [1, 2, 1]);
        let m = Metrics::default();
        assert!(!m.render().contains("open_sessions"));
        m.watch_sessions(Some(store));
        let text = m.render();
        for needle in [
            "# TYPE sandboxrun_open_sessions gauge",
            "sandboxrun_open_sessions{phase=\"Ready\"} 2",
            "sandboxrun_open_sessions{phase=\"Busy\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        m.watch_sessions(None);
        assert!(!m.render().contains("open_sessions"));
    }

    #[test]
    fn counts_unfinished_runs_of_the_cache_while_it_is_watched() {
        let (store, mut writer) = kube::runtime::reflector::store();
        for r in [
            run("new", "2025-01-01T00:58:20Z", None),
            run(
                "waits-long",
                "2025-01-01T00:55:00Z",
                Some("AwaitingApproval"),
            ),
            run("waits", "2025-01-01T00:59:10Z", Some("AwaitingApproval")),
            run("runs", "2025-01-01T00:59:40Z", Some("Running")),
            run("done", "2025-01-01T00:00:00Z", Some("Succeeded")),
            run("failed", "2025-01-01T00:10:00Z", Some("Failed")),
        ] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(r));
        }
        let now: jiff::Timestamp = "2025-01-01T01:00:00Z".parse().unwrap();
        assert_eq!(
            Unfinished::count(&store, now),
            [(1, 100.0), (0, 0.0), (2, 300.0), (1, 20.0)]
        );
        let m = Metrics::default();
        assert!(
            !m.render().contains("unfinished"),
            "nothing before the controller runs"
        );
        m.watch_runs(Some(store));
        let text = m.render();
        for needle in [
            "# TYPE sandboxrun_unfinished_runs gauge",
            "sandboxrun_unfinished_runs{phase=\"AwaitingApproval\"} 2",
            "sandboxrun_unfinished_runs{phase=\"Pending\"} 0",
            "sandboxrun_unfinished_runs{phase=\"\"} 1",
            "# TYPE sandboxrun_oldest_unfinished_run_seconds gauge",
            "sandboxrun_oldest_unfinished_run_seconds{phase=\"Pending\"} 0.0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
        m.watch_runs(None);
        assert!(
            !m.render().contains("unfinished"),
            "nothing once it stopped"
        );
    }

    #[test]
    fn renders_every_metric() {
        let m = Metrics::default();
        m.reconciles.inc();
        m.error("Kube");
        m.entered(Phase::Succeeded);
        m.finished_call(
            Some(Tool::Python),
            "analyst-01",
            Environment::Sandbox,
            Some(Verdict::Allow),
            Phase::Succeeded,
        );
        m.finished_call(
            Some(Tool::Sql),
            "analyst-01",
            Environment::Production,
            Some(Verdict::Block),
            Phase::Rejected,
        );
        m.run_duration.observe(1.2);
        m.queue_to_start.observe(0.8);
        m.program_feed.observe(0.04);
        m.reconcile_duration.observe(0.003);
        let request = |method: &str, uri: &str| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
        };
        m.api_request(&request("GET", "/api/v1/namespaces/r/pods/p"))
            .api_request(&request(
                "GET",
                "/api/v1/namespaces/r/pods?watch=true&timeoutSeconds=290",
            ))
            .api_request(&request(
                "GET",
                "/api/v1/namespaces/r/pods?labelSelector=x&watch=true",
            ))
            .api_request(&request(
                "PATCH",
                "/apis/sandboxrun.dev/v1alpha1/namespaces/r/sandboxruns/x/status",
            ))
            .api_request(&request("GET", "/api/v1/namespaces/r/pods?watch=truely"));
        let text = m.render();
        for needle in [
            "sandboxrun_api_requests_total{verb=\"GET\"} 2",
            "sandboxrun_api_requests_total{verb=\"WATCH\"} 2",
            "sandboxrun_api_requests_total{verb=\"PATCH\"} 1",
            "sandboxrun_program_feed_seconds_count 1",
            "sandboxrun_reconcile_duration_seconds_count 1",
            "sandboxrun_reconciles_total 1",
            "sandboxrun_reconcile_errors_total{error=\"Kube\"} 1",
            "sandboxrun_runs_total{phase=\"Succeeded\"} 1",
            "sandboxrun_runs_total{phase=\"Pending\"} 0",
            "sandboxrun_run_duration_seconds_count 1",
            "sandboxrun_queue_to_start_seconds_count 1",
            "sandboxrun_tool_calls_total{tool=\"run_python\",agent=\"analyst-01\",environment=\"sandbox\",verdict=\"Allow\",phase=\"Succeeded\"} 1",
            "sandboxrun_tool_calls_total{tool=\"execute_sql\",agent=\"analyst-01\",environment=\"production\",verdict=\"Block\",phase=\"Rejected\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
