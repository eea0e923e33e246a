//! Property tests ("fuzzing") of the HTTP frontend's request handling: generated requests go
//! through the real [`router`] in-process (`tower::ServiceExt::oneshot`), with the real API key,
//! Origin/Host, rate limit and body limit layers, the real rmcp Streamable HTTP service, the
//! legacy SSE adapter, and the real embedded backend and policy code behind them.
//!
//! Nothing here can start a sandbox, however many cases run:
//! - the policy is a real policy file (`FUZZ_POLICY`, loaded with the same
//!   `sandboxrun_core::policy::embedded::load` that `--policy-file` uses) whose rules escalate
//!   `run_python` for agent `fuzz-a` and block it for everyone else, so every valid `run_python`
//!   call goes through argument parsing, validation and the policy decision and ends rejected;
//! - and the embedded resources have no local sandbox (`sandbox: None`, as if detection had found
//!   none): even a call the policy allowed would end with "no local sandbox" before any process
//!   could be spawned.
//!
//! `execute_sql` runs against the demo SQLite database (a file in a temporary directory, opened
//! read-only like the embedded default) under the embedded default's SQL rule, so the SQL guard
//! sees every generated query; `fetch_metrics` evaluates PromQL over this process's call record.
//!
//! Each case is one request (or one session flow: initialize, initialized, fuzzed messages within
//! the session, DELETE). Properties of every answer:
//! - no panic anywhere (a panic hook counts panics on the fuzzing threads) and no hang (each
//!   request has [`ANSWER_BOUND`] to answer, and a watchdog aborts on a synchronous hang);
//! - the status is one of [`DOCUMENTED_STATUSES`] (no 5xx);
//! - a body that claims JSON is JSON; an error status's JSON body is a JSON-RPC error object; the
//!   events of a finished event stream carry JSON-RPC messages;
//! - without a valid key anywhere in the request, an MCP route answers only 401, 403 (Origin/Host,
//!   checked first) or 413 (body limit, outermost);
//! - a clean valid key with an allowed Host never gets 401; another agent's session never gets a
//!   success;
//! - the server stays usable: after every [`ROTATE_EVERY`] cases a clean initialize, tools/list
//!   and run_python call (rejected by the fuzz policy) still work, and so does a stateless
//!   2026-07-28 tools/list.
//!
//! Short form (CI, part of `cargo test`): `SANDBOXRUN_FUZZ_CASES` unset, [`DEFAULT_CASES`].
//! Long form: `SANDBOXRUN_FUZZ_CASES=1000000 cargo test --release -p sandboxrun-mcp fuzz --
//! --nocapture`. `SANDBOXRUN_FUZZ_SEED=<u64>` replays a run.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use futures::StreamExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use sandboxrun_core::Databases;
use sandboxrun_core::Limits;
use sandboxrun_core::limits::{MAX_CODE_BYTES, MAX_TIMEOUT_SECONDS};
use sandboxrun_core::metrics::CallStore;
use sandboxrun_core::policy::embedded::{self, DEMO_DATABASE};
use sandboxrun_core::query::demo;
use sandboxrun_core::tools::Embedded;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::{KeyStore, hash_key};
use super::origin::OriginPolicy;
use super::{HttpConfig, router};
use crate::backend::Backend;
use crate::backend::local::LocalBackend;
use crate::inflight::InFlight;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::server::Shared;

pub(super) const KEY_A: &str = "fuzz-key-a-6b1d0c2f9e";
pub(super) const KEY_B: &str = "fuzz-key-b-3a7e5d4c1b";
const AGENT_A: &str = "fuzz-a";
const AGENT_B: &str = "fuzz-b";
/// The default of `--max-body-bytes`.
const BODY_LIMIT: usize = 1 << 20;
/// Cases of the main test when `SANDBOXRUN_FUZZ_CASES` is unset (the CI form).
const DEFAULT_CASES: u32 = 8_000;
/// Every request must be answered within this.
const ANSWER_BOUND: Duration = Duration::from_secs(10);
/// A case that takes longer than this (a synchronous hang the async bound cannot see) aborts.
const WATCHDOG_BOUND: Duration = Duration::from_secs(60);
/// The router (with its sessions, call record and limiter) is rebuilt after this many cases, and
/// checked for usability before it is dropped: sessions opened by fuzzed initialize requests
/// would otherwise accumulate for rmcp's keep-alive (minutes) over a long run.
const ROTATE_EVERY: u32 = 2_000;
/// Statuses the frontend documents, rmcp's included (406 Accept, 415 Content-Type, 405 method,
/// 404 unknown session or path, 422 never, 5xx never).
const DOCUMENTED_STATUSES: [u16; 12] = [200, 202, 204, 400, 401, 403, 404, 405, 406, 413, 415, 429];
const PROTOCOL_VERSIONS: [&str; 5] = [
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// The policy of the fuzzed server: `run_python` is never allowed (see the module docs); SQL as
/// in the embedded default on the demo database, escalated in production for `fuzz-a` (whose key
/// may target production); `fetch_metrics` allowed.
const FUZZ_POLICY: &str = r#"
default: block
rules:
  - name: fuzz-escalate-python
    agents: [fuzz-a]
    tools: [python]
    environments: ["*"]
    verdict: escalate
    reason: the fuzz policy never runs Python (escalations cannot be approved in embedded mode)
  - name: fuzz-block-python
    agents: ["*"]
    tools: [python]
    environments: ["*"]
    verdict: block
    reason: the fuzz policy never runs Python
  - name: fuzz-demo-sql
    agents: ["*"]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    reason: read-only queries on the demo ledger
    limits:
      rows: 100
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      allowWildcard: false
      maxLimit: 100
  - name: fuzz-production-sql
    agents: [fuzz-a]
    tools: [sql]
    environments: [production]
    verdict: escalate
    reason: production needs an approval
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      maxLimit: 100
  - name: fuzz-metrics
    agents: ["*"]
    tools: [metrics]
    environments: ["*"]
    verdict: allow
    reason: own call counters
"#;

// ---------------------------------------------------------------------------------------------
// Panic and hang detection.

thread_local! {
    static FUZZING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Panics on this (fuzzing) thread: the test's own, and every task its runtime ran.
    static LOCAL_PANICS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
/// Panics on the runtime's blocking pool and SQLite's worker threads (shared by the tests).
static WORKER_PANICS: AtomicUsize = AtomicUsize::new(0);

fn panics() -> usize {
    LOCAL_PANICS.with(|p| p.get()) + WORKER_PANICS.load(Ordering::SeqCst)
}

/// Counts panics on fuzzing threads (the test thread, which runs the current-thread runtime and
/// so every task the server spawns, its blocking pool and SQLite's worker threads), also those
/// that rmcp or tokio catch in a spawned task and a client only sees as a dropped stream.
fn install_panic_counter() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            if FUZZING.with(|f| f.get()) {
                LOCAL_PANICS.with(|p| p.set(p.get() + 1));
            } else if name.starts_with("sandboxrun-fuzz") || name.starts_with("sqlx-sqlite") {
                WORKER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// Aborts the process when one case runs longer than [`WATCHDOG_BOUND`], naming it.
struct Watchdog {
    current: Arc<Mutex<Option<(Instant, String)>>>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    /// Watches from the start: every stage of a fuzz run, not only its cases, is begun on the
    /// watchdog (a run once hung for minutes with no case running; see `fuzz`).
    fn start(test: &str, seed: u64) -> Self {
        let current: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (current.clone(), stop.clone());
        let test = test.to_owned();
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(500));
                if let Some((since, what)) = &*c.lock().unwrap_or_else(|e| e.into_inner())
                    && since.elapsed() > WATCHDOG_BOUND
                {
                    eprintln!(
                        "fuzz {test} (SANDBOXRUN_FUZZ_SEED={seed}): HANG: more than \
                         {WATCHDOG_BOUND:?} in: {what}"
                    );
                    std::process::abort();
                }
            }
        });
        Self { current, stop }
    }

    fn begin(&self, what: String) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), what));
    }

    fn end(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn truncated(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

// ---------------------------------------------------------------------------------------------
// The server under test.

fn keys() -> KeyStore {
    let yaml = format!(
        "- agent: {AGENT_A}\n  sha256: {}\n  environments: [sandbox, staging, production]\n\
         - agent: {AGENT_B}\n  sha256: {}\n",
        hash_key(KEY_A),
        hash_key(KEY_B)
    );
    KeyStore::parse(&yaml, "fuzz keys").expect("fuzz keys")
}

/// A directory of this test's own (the policy file and the demo database).
pub(super) fn scratch_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandboxrun-fuzz-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// `Shared` as `main.rs` builds it for `--backend local --policy-file FILE --enable-sql
/// --enable-metrics`, except that there is no local sandbox (see the module docs).
pub(super) async fn shared_state(dir: &Path) -> Arc<Shared> {
    let policy_file = dir.join("policy.yaml");
    std::fs::write(&policy_file, FUZZ_POLICY).expect("write policy");
    let policy = embedded::load(Some(&policy_file)).expect("the fuzz policy is valid");
    let db = dir.join("demo.sqlite");
    demo::ensure_sqlite(&db).await.expect("demo database");
    let databases = Databases::from_config(&BTreeMap::from([(
        DEMO_DATABASE.to_owned(),
        demo::database_config(&db),
    )]))
    .expect("databases");
    let calls = CallStore::new();
    let embedded = Embedded {
        policy,
        // No sandbox: nothing can ever be executed, even if a rule allowed it.
        sandbox: None,
        databases: Some(databases),
        calls: calls.clone(),
        sessions: Default::default(),
    };
    Arc::new(Shared {
        backend: Backend::Local(LocalBackend::new(Arc::new(embedded))),
        policy: Policy::new(MAX_TIMEOUT_SECONDS, Limits::default()),
        metrics: Arc::new(Metrics::new()),
        sql: true,
        fetch_metrics: true,
        calls,
        in_flight: InFlight::new(8),
        tasks: crate::tasks::Tasks::new(std::time::Duration::from_secs(3600)),
        run_files: Default::default(),
        #[cfg(feature = "conformance")]
        fixtures: None,
        environments: keys().environments(),
    })
}

pub(super) fn http_config(rate_per_minute: u32, burst: u32) -> HttpConfig {
    HttpConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        keys: keys(),
        origin: OriginPolicy::new(
            &["https://app.example".to_owned()],
            &[
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
                "sandboxrun.example:8443".to_owned(),
            ],
        ),
        rate_per_minute: NonZeroU32::new(rate_per_minute).expect("rate"),
        rate_burst: NonZeroU32::new(burst).expect("burst"),
        body_limit: BODY_LIMIT,
        oauth: None,
    }
}

/// One router and the sessions the cases refer to.
pub(super) struct Harness {
    app: Router,
    shutdown: CancellationToken,
    /// Streamable HTTP sessions opened by agents A and B (2025-06-18).
    session_a: String,
    session_b: String,
    /// Legacy SSE session ids of A and B; their streams are drained by a task that checks them.
    sse_a: String,
    sse_b: String,
    /// Violations found on the drained SSE streams.
    sse_errors: Arc<Mutex<Vec<String>>>,
    /// Sessions a case ended with a DELETE: unknown ids now, served like any unknown id (no
    /// longer another agent's session).
    ended: Mutex<std::collections::HashSet<String>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Harness {
    pub(super) async fn new(dir: &Path, rate_per_minute: u32, burst: u32) -> Self {
        let shared = shared_state(dir).await;
        let shutdown = CancellationToken::new();
        let app = router(
            &http_config(rate_per_minute, burst),
            shared,
            shutdown.clone(),
        );
        let sse_errors = Arc::default();
        let mut h = Self {
            app,
            shutdown,
            session_a: String::new(),
            session_b: String::new(),
            sse_a: String::new(),
            sse_b: String::new(),
            sse_errors,
            ended: Mutex::default(),
        };
        h.session_a = h.open_session(KEY_A, "2025-06-18").await;
        h.session_b = h.open_session(KEY_B, "2025-06-18").await;
        h.sse_a = h.open_sse(KEY_A).await;
        h.sse_b = h.open_sse(KEY_B).await;
        h
    }

    /// Sends the request `make` builds, again after a short pause while the (tight) rate limit
    /// answers 429: setup and usability checks are clean clients that wait their turn.
    pub(super) async fn send(&self, make: impl Fn() -> Request<Body>) -> Response<Body> {
        loop {
            let resp = tokio::time::timeout(ANSWER_BOUND, self.app.clone().oneshot(make()))
                .await
                .expect("answered in time")
                .expect("infallible");
            if resp.status() != StatusCode::TOO_MANY_REQUESTS {
                return resp;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// initialize + notifications/initialized; the session id.
    pub(super) async fn open_session(&self, key: &str, version: &str) -> String {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "fuzz", "version": "1"}}});
        let resp = self.send(|| clean_post(key, None, None, &init)).await;
        assert_eq!(resp.status(), StatusCode::OK, "initialize");
        let session = resp
            .headers()
            .get("mcp-session-id")
            .expect("session id")
            .to_str()
            .expect("ascii")
            .to_owned();
        let body = read_all(resp.into_body()).await.expect("initialize body");
        let events = sse_data(&body);
        assert!(
            events
                .iter()
                .any(|e| e["id"] == 1 && e["result"].is_object()),
            "initialize result in {events:?}"
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let resp = self
            .send(|| clean_post(key, Some(&session), Some(version), &note))
            .await;
        assert_eq!(resp.status(), StatusCode::ACCEPTED, "initialized");
        session
    }

    /// GET /sse; the session id from the endpoint event. The rest of the stream is drained and
    /// checked by a task.
    async fn open_sse(&self, key: &str) -> String {
        let resp = self
            .send(|| {
                Request::get("/sse")
                    .header("host", "localhost")
                    .header("authorization", format!("Bearer {key}"))
                    .header("accept", "text/event-stream")
                    .body(Body::empty())
                    .expect("request")
            })
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "GET /sse");
        let mut stream = resp.into_body().into_data_stream();
        let mut text = String::new();
        let id = loop {
            let chunk = tokio::time::timeout(ANSWER_BOUND, stream.next())
                .await
                .expect("endpoint event in time")
                .expect("endpoint event")
                .expect("body");
            text.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(i) = text.find("sessionId=") {
                let rest = &text[i + "sessionId=".len()..];
                if let Some(end) = rest.find(['\n', '\r']) {
                    break rest[..end].to_owned();
                }
            }
        };
        let errors = self.sse_errors.clone();
        tokio::spawn(async move {
            let mut pending = String::new();
            while let Some(Ok(chunk)) = stream.next().await {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = pending.find("\n\n") {
                    let event: String = pending.drain(..end + 2).collect();
                    if let Err(e) = check_sse_event(&event) {
                        errors
                            .lock()
                            .expect("errors")
                            .push(truncated(format!("{e}: {event}"), 2_000));
                    }
                }
            }
        });
        id
    }

    /// A clean client still gets its way: initialize, tools/list, a rejected run_python for each
    /// agent, a stateless 2026-07-28 tools/list, /healthz.
    async fn assert_usable(&self) {
        for (key, rule) in [
            (KEY_A, "fuzz-escalate-python"),
            (KEY_B, "fuzz-block-python"),
        ] {
            let session = self.open_session(key, "2025-11-25").await;
            let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
            let resp = self
                .send(|| clean_post(key, Some(&session), Some("2025-11-25"), &list))
                .await;
            assert_eq!(resp.status(), StatusCode::OK, "tools/list");
            let events = sse_data(&read_all(resp.into_body()).await.expect("body"));
            let mut names: Vec<&str> = events
                .iter()
                .filter_map(|e| e["result"]["tools"].as_array())
                .flatten()
                .filter_map(|t| t["name"].as_str())
                .collect();
            names.sort_unstable();
            assert_eq!(
                names,
                [
                    "close_session",
                    "execute_sql",
                    "fetch_metrics",
                    "run_python"
                ],
                "tools in {events:?}"
            );
            let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "print(6*7)"}}});
            let resp = self
                .send(|| clean_post(key, Some(&session), Some("2025-11-25"), &call))
                .await;
            assert_eq!(resp.status(), StatusCode::OK, "tools/call");
            let events = sse_data(&read_all(resp.into_body()).await.expect("body"));
            let result = events
                .iter()
                .find(|e| e["id"] == 3)
                .map(|e| e["result"].clone())
                .unwrap_or_default();
            assert_eq!(result["isError"], true, "{events:?}");
            assert_eq!(result["structuredContent"]["phase"], "Rejected", "{result}");
            assert!(result.to_string().contains(rule), "{rule} in {result}");
            let delete = || {
                Request::delete("/mcp")
                    .header("host", "localhost")
                    .header("authorization", format!("Bearer {key}"))
                    .header("mcp-session-id", &session)
                    .header("mcp-protocol-version", "2025-11-25")
                    .body(Body::empty())
                    .expect("request")
            };
            assert_eq!(self.send(delete).await.status(), StatusCode::NO_CONTENT);
        }
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "1"},
        });
        let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list",
            "params": {"_meta": meta}});
        let resp = self
            .send(|| {
                let mut req = clean_post(KEY_A, None, Some("2026-07-28"), &list);
                req.headers_mut()
                    .insert("mcp-method", HeaderValue::from_static("tools/list"));
                req
            })
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "stateless tools/list");
        let body = read_all(resp.into_body()).await.expect("body");
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("run_python"), "stateless tools/list: {text}");
        let health = || {
            Request::get("/healthz")
                .body(Body::empty())
                .expect("request")
        };
        assert_eq!(self.send(health).await.status(), StatusCode::OK);
        let errors = std::mem::take(&mut *self.sse_errors.lock().expect("errors"));
        assert!(errors.is_empty(), "SSE stream violations: {errors:?}");
    }
}

/// Runs `body` against a fresh harness (no rate limit to speak of) in a scratch directory of
/// its own, on a runtime of its own.
pub(super) fn with_harness(test: &str, body: impl AsyncFnOnce(&Harness)) {
    let dir = scratch_dir(test);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let h = Harness::new(&dir, u32::MAX, u32::MAX).await;
        body(&h).await;
    });
    let _ = std::fs::remove_dir_all(&dir);
}

pub(super) fn clean_post(
    key: &str,
    session: Option<&str>,
    version: Option<&str>,
    body: &Value,
) -> Request<Body> {
    let mut b = Request::post("/mcp")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        b = b.header("mcp-session-id", s);
    }
    if let Some(v) = version {
        b = b.header("mcp-protocol-version", v);
    }
    b.body(Body::from(body.to_string())).expect("request")
}

pub(super) async fn read_all(body: Body) -> Result<Bytes, String> {
    tokio::time::timeout(ANSWER_BOUND, axum::body::to_bytes(body, 64 << 20))
        .await
        .map_err(|_| format!("the body did not end within {ANSWER_BOUND:?}"))?
        .map_err(|e| format!("the body failed: {e}"))
}

/// The JSON `data` of each event of an SSE body (events without data skipped).
pub(super) fn sse_data(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| serde_json::from_str(&event_data(event)).ok())
        .collect()
}

fn event_data(event: &str) -> String {
    event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An SSE event is a comment, a priming event without data, or a JSON-RPC 2.0 message (the
/// legacy `endpoint` event carries a URL).
fn check_sse_event(event: &str) -> Result<(), String> {
    if event
        .lines()
        .any(|l| l == "event: endpoint" || l == "event:endpoint")
    {
        return Ok(());
    }
    let data = event_data(event);
    if data.trim().is_empty() {
        return Ok(());
    }
    let value: Value =
        serde_json::from_str(&data).map_err(|e| format!("event data is not JSON ({e})"))?;
    check_jsonrpc_message(&value)
}

fn check_jsonrpc_message(value: &Value) -> Result<(), String> {
    let Some(o) = value.as_object() else {
        return Err("not a JSON-RPC object".into());
    };
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return Err("jsonrpc is not \"2.0\"".into());
    }
    if o.contains_key("error") {
        return check_jsonrpc_error(value);
    }
    if !(o.contains_key("result") || o.contains_key("method")) {
        return Err("neither result, error nor method".into());
    }
    Ok(())
}

fn check_jsonrpc_error(value: &Value) -> Result<(), String> {
    let o = value.as_object().ok_or("the error body is not an object")?;
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return Err("jsonrpc is not \"2.0\"".into());
    }
    match o.get("id") {
        Some(Value::Null | Value::String(_) | Value::Number(_)) => {}
        other => return Err(format!("id is {other:?}, not null, a string or a number")),
    }
    let e = o
        .get("error")
        .and_then(Value::as_object)
        .ok_or("no error object")?;
    if e.get("code").and_then(Value::as_i64).is_none() {
        return Err("error.code is not an integer".into());
    }
    if e.get("message").and_then(Value::as_str).is_none() {
        return Err("error.message is not a string".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What is generated.

/// Which key a request presents, and how.
#[derive(Clone, Debug)]
enum KeyRef {
    None,
    BearerA,
    BearerB,
    XApiA,
    XApiB,
    /// `Authorization` with these bytes (wrong keys, odd schemes, non-ASCII, empty).
    Authorization(Vec<u8>),
    /// `X-Api-Key` with these bytes.
    XApiKey(Vec<u8>),
    /// A very long key.
    Long(usize),
    /// The valid key of A with an odd spelling of the scheme or spacing.
    OddA(&'static str),
    /// Two Authorization headers: the first (valid or not) and the second.
    Duplicated(bool, bool),
    /// A wrong Bearer key next to a valid X-Api-Key of A.
    WrongBearerValidXApi,
}

/// Which session id a request presents.
#[derive(Clone, Debug)]
enum SessionRef {
    None,
    A,
    B,
    Random(String),
    Bytes(Vec<u8>),
    Both,
}

/// The request target.
#[derive(Clone, Debug)]
enum Target {
    Fixed(&'static str),
    /// `/messages?sessionId=` of the SSE session of A, of B, or random.
    MessagesA,
    MessagesB,
    MessagesRandom(String),
    Random(String),
}

#[derive(Clone, Debug)]
enum BodySpec {
    Empty,
    Json(Value),
    Batch(Vec<Value>),
    Raw(Vec<u8>),
    Text(&'static str),
    /// A message cut after this share (per mille) of its bytes.
    Truncated(Value, u16),
    Trailing(Value, &'static str),
    /// `depth` nested arrays or objects, closed or not, optionally inside a tools/call.
    Nested {
        depth: usize,
        object: bool,
        closed: bool,
        in_call: bool,
    },
    /// A tools/call whose total length is the body limit plus `offset`, padded in `code` or in
    /// whitespace.
    Sized {
        offset: i32,
        whitespace: bool,
    },
    /// A request with a raw (unparsed) escape sequence or byte sequence in a string.
    Escape(&'static [u8]),
}

#[derive(Clone, Debug)]
enum Chunking {
    Full,
    Chunks(usize),
    /// The body fails after this share (per mille) of its bytes: a client that hung up.
    FailAfter(u16),
}

#[derive(Clone, Debug)]
struct Req {
    method: Method,
    target: Target,
    key: KeyRef,
    session: SessionRef,
    host: Option<Vec<u8>>,
    origin: Option<Vec<u8>>,
    content_type: Option<Vec<u8>>,
    accept: Option<Vec<u8>>,
    protocol_version: Option<Vec<u8>>,
    /// `Mcp-Method` values (`=` stands for the body's method).
    mcp_method: Vec<Vec<u8>>,
    other_headers: Vec<(String, Vec<u8>)>,
    body: BodySpec,
    chunking: Chunking,
}

#[derive(Clone, Debug)]
struct Flow {
    version: &'static str,
    key_b: bool,
    version_header: bool,
    steps: Vec<BodySpec>,
    delete: bool,
}

#[derive(Clone, Debug)]
enum Case {
    Single(Box<Req>),
    Flow(Flow),
}

fn header_bytes() -> BoxedStrategy<Vec<u8>> {
    prop::collection::vec(
        prop_oneof![8 => 0x20u8..0x7f, 1 => 0x80u8..=0xff, 1 => Just(b'\t')],
        0..40,
    )
    .boxed()
}

fn weird_string() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z_/]{0,12}",
        2 => "\\PC{0,16}",
        1 => "[\\x00-\\x1f\\x7f]{0,4}",
        1 => prop::sample::select(vec![
            "\u{0}", "\u{FEFF}", "\u{202E}rtl", "\u{10FFFF}", "😀", "../../etc/passwd", "%00",
            "run_python", "tools/call", "initialize", "2025-06-18", "2026-07-28", "__proto__",
            "constructor", "$ref", "null", "true", "1e400",
        ])
        .prop_map(str::to_owned),
    ]
    .boxed()
}

fn any_json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        weird_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(weird_string(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

fn id() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        6 => (0i64..100).prop_map(|i| Some(json!(i))),
        1 => Just(None),
        1 => Just(Some(Value::Null)),
        1 => prop::sample::select(vec![
            json!(u64::MAX), json!(i64::MIN), json!(i64::MAX), json!(-1), json!(0),
            json!(1.5), json!(-0.0), json!(1e300), json!(9_007_199_254_740_993u64),
            json!(true), json!([]), json!([1]), json!({}), json!({"a": {"b": [null]}}),
            json!(""), json!("x"), json!("\u{0}"),
        ])
        .prop_map(Some),
        1 => weird_string().prop_map(|s| Some(json!(s))),
        1 => any_json().prop_map(Some),
    ]
    .boxed()
}

fn protocol_version() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::sample::select(PROTOCOL_VERSIONS.to_vec()).prop_map(Value::from),
        1 => prop::sample::select(vec!["2099-01-01", "", "2025-06-18 ", "latest", "2025-13-45", "1"])
            .prop_map(Value::from),
        1 => weird_string().prop_map(Value::from),
        1 => any_json(),
    ]
    .boxed()
}

fn request_meta() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        4 => Just(None),
        2 => (protocol_version(), prop_oneof![3 => Just(json!({})), 1 => any_json()], any::<bool>())
            .prop_map(|(v, caps, token)| {
                let mut m = json!({
                    "io.modelcontextprotocol/protocolVersion": v,
                    "io.modelcontextprotocol/clientCapabilities": caps,
                    "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "1"},
                });
                if token {
                    m["progressToken"] = json!("p-1");
                }
                Some(m)
            }),
        1 => id().prop_map(|t| Some(json!({"progressToken": t}))),
        1 => any_json().prop_map(Some),
    ]
    .boxed()
}

fn number_like() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => prop::sample::select(vec![
            json!(-1), json!(0), json!(1), json!(30), json!(600), json!(601),
            json!(u64::from(u32::MAX) + 1), json!(u64::MAX), json!(i64::MIN), json!(1.5),
            json!(-0.0), json!(1e300), json!("30"), json!(null), json!(true), json!([30]),
        ]),
        1 => any::<i64>().prop_map(Value::from),
        1 => any_json(),
    ]
    .boxed()
}

fn code() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "print(6*7)", "import os\nos.system('id')", "while True: pass",
            "import socket; socket.create_connection(('1.1.1.1', 80))", "", " ", "\u{0}",
            "print('😀')", "exec(input())", "__import__('ctypes').string_at(0)",
        ])
        .prop_map(Value::from),
        2 => "\\PC{0,64}".prop_map(Value::from),
        1 => (MAX_CODE_BYTES as usize - 2..MAX_CODE_BYTES as usize + 3)
            .prop_map(|n| Value::from("x".repeat(n))),
        1 => any_json(),
    ]
    .boxed()
}

fn sql_query() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "SELECT id, amount FROM ledger",
            "SELECT id, amount FROM ledger LIMIT 100000",
            "SELECT * FROM ledger",
            "SELECT secret FROM ledger",
            "DELETE FROM ledger",
            "SELECT 1; DROP TABLE ledger",
            "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT n FROM r",
            "SELECT id FROM ledger WHERE account = 'x' OR 1=1 --",
            "SELECT id FROM ledger a, ledger b, ledger c, ledger d",
            "ATTACH DATABASE '/tmp/x' AS x",
            "PRAGMA table_info(ledger)",
            "SELECT load_extension('x')",
            "SELECT randomblob(1000000000)",
            "",
        ])
        .prop_map(Value::from),
        2 => "\\PC{0,48}".prop_map(Value::from),
        1 => (1usize..3_000).prop_map(|d| {
            Value::from(format!("SELECT {}1{} FROM ledger", "(".repeat(d), ")".repeat(d)))
        }),
        1 => any_json(),
    ]
    .boxed()
}

fn promql() -> BoxedStrategy<Value> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "sandboxrun_tool_calls_total",
            "sum by (tool) (rate(sandboxrun_tool_calls_total[5m]))",
            "sandboxrun_tool_calls_total{agent=\"fuzz-b\"}",
            "count_values(\"x\", sandboxrun_tool_calls_total)",
            "up",
            "{__name__=~\".+\"}",
            "1/0",
            "",
        ])
        .prop_map(Value::from),
        2 => "\\PC{0,48}".prop_map(Value::from),
        1 => (1usize..3_000).prop_map(|d| Value::from(format!("{}1{}", "(".repeat(d), ")".repeat(d)))),
        1 => any_json(),
    ]
    .boxed()
}

fn time_like() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        4 => Just(None),
        3 => prop::sample::select(vec![
            "now", "2025-01-01T00:00:00Z", "1h", "5m", "1ms", "0s", "-1h", "100000000000000h",
            "1e400", "", "P1D", "9999-12-31T23:59:59Z", "0000-01-01T00:00:00Z", "1s",
        ])
        .prop_map(|s| Some(Value::from(s))),
        1 => number_like().prop_map(Some),
    ]
    .boxed()
}

fn environment() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        3 => Just(None),
        3 => prop::sample::select(vec!["sandbox", "staging", "production", "PRODUCTION", "prod", ""])
            .prop_map(|s| Some(Value::from(s))),
        1 => any_json().prop_map(Some),
    ]
    .boxed()
}

fn object_of(fields: Vec<(&'static str, Option<Value>)>, extra: Option<(String, Value)>) -> Value {
    let mut o = Map::new();
    for (k, v) in fields {
        if let Some(v) = v {
            o.insert(k.to_owned(), v);
        }
    }
    if let Some((k, v)) = extra {
        o.insert(k, v);
    }
    Value::Object(o)
}

fn extra_field() -> BoxedStrategy<Option<(String, Value)>> {
    prop_oneof![5 => Just(None), 1 => (weird_string(), any_json()).prop_map(Some)].boxed()
}

fn tool_arguments() -> BoxedStrategy<Option<Value>> {
    let python = (
        prop::option::weighted(0.9, code()),
        prop::option::weighted(0.4, number_like()),
        extra_field(),
    )
        .prop_map(|(code, timeout, extra)| {
            object_of(vec![("code", code), ("timeoutSeconds", timeout)], extra)
        });
    let sql = (
        prop::option::weighted(
            0.9,
            prop_oneof![
                4 => Just(json!("demo")),
                1 => prop::sample::select(vec!["other", "", " demo", "DEMO"]).prop_map(Value::from),
                1 => any_json(),
            ],
        ),
        prop::option::weighted(0.9, sql_query()),
        environment(),
        extra_field(),
    )
        .prop_map(|(database, query, env, extra)| {
            object_of(
                vec![
                    ("database", database),
                    ("query", query),
                    ("environment", env),
                ],
                extra,
            )
        });
    let metrics = (
        prop::option::weighted(0.9, promql()),
        (
            time_like(),
            time_like(),
            time_like(),
            time_like(),
            time_like(),
        ),
        environment(),
        extra_field(),
    )
        .prop_map(|(query, (time, range, start, end, step), env, extra)| {
            object_of(
                vec![
                    ("query", query),
                    ("time", time),
                    ("range", range),
                    ("start", start),
                    ("end", end),
                    ("step", step),
                    ("environment", env),
                ],
                extra,
            )
        });
    prop_oneof![
        4 => python.prop_map(Some),
        2 => sql.prop_map(Some),
        2 => metrics.prop_map(Some),
        1 => Just(None),
        1 => any_json().prop_map(Some),
    ]
    .boxed()
}

fn tool_name() -> BoxedStrategy<Value> {
    prop_oneof![
        8 => prop::sample::select(vec!["run_python", "execute_sql", "fetch_metrics"]).prop_map(Value::from),
        2 => prop::sample::select(vec!["unknown", "", "RUN_PYTHON", "run_python\u{0}", " run_python"])
            .prop_map(Value::from),
        1 => weird_string().prop_map(Value::from),
        1 => any_json(),
    ]
    .boxed()
}

/// A method and its params (`None`: no params member).
fn method_and_params() -> BoxedStrategy<(Value, Option<Value>)> {
    let initialize = (
        protocol_version(),
        prop_oneof![
            4 => Just(json!({})),
            1 => Just(json!({"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}})),
            1 => any_json(),
        ],
        prop_oneof![
            4 => Just(Some(json!({"name": "fuzz", "version": "1"}))),
            1 => Just(None),
            1 => any_json().prop_map(Some),
        ],
    )
        .prop_map(|(v, caps, info)| {
            let mut p = json!({"protocolVersion": v, "capabilities": caps});
            if let Some(info) = info {
                p["clientInfo"] = info;
            }
            (json!("initialize"), Some(p))
        });
    let call = (tool_name(), tool_arguments(), request_meta()).prop_map(|(name, args, meta)| {
        let mut p = json!({"name": name});
        if let Some(a) = args {
            p["arguments"] = a;
        }
        if let Some(m) = meta {
            p["_meta"] = m;
        }
        (json!("tools/call"), Some(p))
    });
    let simple = (
        prop::sample::select(vec![
            "tools/list",
            "ping",
            "server/discover",
            "resources/list",
            "resources/read",
            "prompts/list",
            "prompts/get",
            "logging/setLevel",
            "completion/complete",
            "resources/templates/list",
            "resources/subscribe",
            "tasks/list",
            "tasks/get",
            "sampling/createMessage",
            "elicitation/create",
            "roots/list",
            "$/cancelRequest",
            "notifications/initialized",
            "notifications/cancelled",
            "notifications/progress",
            "notifications/roots/list_changed",
            "notifications/message",
            "",
        ]),
        request_meta(),
        prop_oneof![
            3 => Just(None),
            1 => Just(Some(json!({"cursor": "x"}))),
            1 => id().prop_map(|i| Some(json!({"requestId": i, "reason": "fuzz"}))),
            1 => any_json().prop_map(Some),
        ],
    )
        .prop_map(|(m, meta, params)| {
            let params = match (params, meta) {
                (Some(Value::Object(mut p)), Some(meta)) => {
                    p.insert("_meta".into(), meta);
                    Some(Value::Object(p))
                }
                (None, Some(meta)) => Some(json!({"_meta": meta})),
                (p, _) => p,
            };
            (json!(m), params)
        });
    prop_oneof![
        2 => initialize,
        5 => call,
        4 => simple,
        1 => (weird_string().prop_map(Value::from), prop::option::of(any_json())),
        1 => (any_json(), prop::option::of(any_json())),
    ]
    .boxed()
}

fn jsonrpc_field() -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        12 => Just(Some(json!("2.0"))),
        1 => Just(None),
        1 => prop::sample::select(vec![json!("1.0"), json!("2"), json!(2.0), json!(null), json!("2.0 "), json!(["2.0"])])
            .prop_map(Some),
    ]
    .boxed()
}

/// A JSON-RPC message: a request, a notification, a response, or something shaped like none.
fn message() -> BoxedStrategy<Value> {
    let request = (
        jsonrpc_field(),
        id(),
        method_and_params(),
        extra_field(),
        0u8..12,
    )
        .prop_map(|(jsonrpc, id, (method, params), extra, drop)| {
            let mut o = Map::new();
            if let Some(v) = jsonrpc {
                o.insert("jsonrpc".into(), v);
            }
            if let Some(id) = id {
                o.insert("id".into(), id);
            }
            o.insert("method".into(), method);
            if let Some(p) = params {
                o.insert("params".into(), p);
            }
            if let Some((k, v)) = extra {
                o.insert(k, v);
            }
            // Now and then a required member goes missing.
            match drop {
                0 => drop_key(&mut o, "method"),
                1 => drop_key(&mut o, "params"),
                _ => {}
            }
            Value::Object(o)
        });
    let response = (id(), prop::bool::ANY, any_json()).prop_map(|(id, ok, v)| {
        let mut o = json!({"jsonrpc": "2.0"});
        if let Some(id) = id {
            o["id"] = id;
        }
        if ok {
            o["result"] = v;
        } else {
            o["error"] = json!({"code": -32000, "message": "fuzz", "data": v});
        }
        o
    });
    prop_oneof![8 => request, 1 => response, 1 => any_json()].boxed()
}

fn drop_key(o: &mut Map<String, Value>, key: &str) {
    o.remove(key);
}

fn body_spec() -> BoxedStrategy<BodySpec> {
    prop_oneof![
        30 => message().prop_map(BodySpec::Json),
        3 => prop::collection::vec(message(), 0..5).prop_map(BodySpec::Batch),
        2 => Just(BodySpec::Empty),
        3 => prop::collection::vec(any::<u8>(), 0..64).prop_map(BodySpec::Raw),
        3 => prop::sample::select(vec![
            r#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":-0,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1E-400,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"initialize"}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(1)","timeoutSeconds":1e400}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print(1)","timeoutSeconds":18446744073709551616}}}"#,
            r#"[]"#, r#"[[]]"#, r#"[{}]"#, r#"null"#, r#"0"#, r#""x""#, r#"{}"#, " ", "\u{FEFF}{}",
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}",
        ])
        .prop_map(BodySpec::Text),
        3 => (message(), 0u16..1000).prop_map(|(m, at)| BodySpec::Truncated(m, at)),
        2 => (message(), prop::sample::select(vec!["x", "}", " {}", "\n{\"jsonrpc\":\"2.0\"}", "\u{0}", "]", ",", "\n\n"]))
            .prop_map(|(m, t)| BodySpec::Trailing(m, t)),
        2 => (
            prop_oneof![3 => 1usize..300, 1 => 300usize..20_000],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(depth, object, closed, in_call)| BodySpec::Nested { depth, object, closed, in_call }),
        1 => (prop_oneof![3 => -64i32..64, 1 => Just(-(BODY_LIMIT as i32) / 2), 1 => Just(BODY_LIMIT as i32)], any::<bool>())
            .prop_map(|(offset, whitespace)| BodySpec::Sized { offset, whitespace }),
        2 => prop::sample::select(vec![
            &br"\ud800"[..], br"\udc00\ud800", br"\uDFFF", br"\u0000", br"\uD83D\uDE00", br"\x41",
            br"\u12", b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\x01", b"\x7f", b"\xf4\x90\x80\x80",
        ])
        .prop_map(BodySpec::Escape),
    ]
    .boxed()
}

fn chunking() -> BoxedStrategy<Chunking> {
    prop_oneof![
        16 => Just(Chunking::Full),
        2 => (1usize..64).prop_map(Chunking::Chunks),
        1 => (0u16..1000).prop_map(Chunking::FailAfter),
    ]
    .boxed()
}

fn choice(common: &'static str, others: Vec<&'static str>) -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        30 => Just(Some(common.as_bytes().to_vec())),
        1 => Just(None),
        3 => prop::sample::select(others).prop_map(|s| Some(s.as_bytes().to_vec())),
        1 => header_bytes().prop_map(Some),
        1 => (1usize..20_000).prop_map(move |n| Some(format!("{common};{}", "a".repeat(n)).into_bytes())),
    ]
    .boxed()
}

fn rare(values: Vec<&'static str>) -> BoxedStrategy<Option<Vec<u8>>> {
    prop_oneof![
        10 => Just(None),
        3 => prop::sample::select(values).prop_map(|s| Some(s.as_bytes().to_vec())),
        1 => header_bytes().prop_map(Some),
    ]
    .boxed()
}

fn key_ref() -> BoxedStrategy<KeyRef> {
    prop_oneof![
        12 => Just(KeyRef::BearerA),
        4 => Just(KeyRef::BearerB),
        2 => Just(KeyRef::XApiA),
        1 => Just(KeyRef::XApiB),
        2 => Just(KeyRef::None),
        2 => prop_oneof![
            prop::sample::select(vec![
                "Bearer wrong", "Bearer ", "Bearer", "", "Basic Zm9vOmJhcg==", "Bearer fuzz-key-a",
                "Bearer fuzz-key-a-6b1d0c2f9E", "Token x", "Bearer \u{0}",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            header_bytes().prop_map(|b| [b"Bearer ".to_vec(), b].concat()),
            header_bytes(),
        ]
        .prop_map(KeyRef::Authorization),
        1 => header_bytes().prop_map(KeyRef::XApiKey),
        1 => (1usize..100_000).prop_map(KeyRef::Long),
        1 => prop::sample::select(vec!["bearer", "BEARER", "Bearer  ", "  Bearer", "Bearer\t", "Basic", "Bearer:"])
            .prop_map(KeyRef::OddA),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(a, b)| KeyRef::Duplicated(a, b)),
        1 => Just(KeyRef::WrongBearerValidXApi),
    ]
    .boxed()
}

fn session_ref() -> BoxedStrategy<SessionRef> {
    prop_oneof![
        8 => Just(SessionRef::None),
        6 => Just(SessionRef::A),
        2 => Just(SessionRef::B),
        1 => "[0-9a-f-]{0,40}".prop_map(SessionRef::Random),
        1 => header_bytes().prop_map(SessionRef::Bytes),
        1 => Just(SessionRef::Both),
    ]
    .boxed()
}

fn target() -> BoxedStrategy<Target> {
    prop_oneof![
        20 => Just(Target::Fixed("/mcp")),
        3 => Just(Target::MessagesA),
        1 => Just(Target::MessagesB),
        1 => "[0-9a-zA-Z%&=]{0,36}".prop_map(Target::MessagesRandom),
        2 => Just(Target::Fixed("/sse")),
        3 => prop::sample::select(vec![
            "/messages", "/messages?sessionId=", "/messages?sessionId=%ZZ", "/messages?sessionId=a&sessionId=b",
            "/healthz", "/metrics", "/", "/mcp/", "/MCP", "//mcp", "/mcp?x=1", "/mcp%2F", "/sse?sessionId=x",
            "/mcp/../sse", "http://localhost/mcp", "http://evil.example/mcp", "http://[::1]:8000/sse",
            "http://sandboxrun.example:8443/mcp", "*",
        ])
        .prop_map(Target::Fixed),
        1 => "/[a-zA-Z0-9%?&=._~/-]{0,40}".prop_map(Target::Random),
    ]
    .boxed()
}

fn method() -> BoxedStrategy<Method> {
    prop_oneof![
        16 => Just(Method::POST),
        3 => Just(Method::GET),
        2 => Just(Method::DELETE),
        1 => prop::sample::select(vec![
            Method::PUT, Method::PATCH, Method::OPTIONS, Method::HEAD, Method::TRACE,
            Method::from_bytes(b"FUZZ").expect("method"),
        ]),
    ]
    .boxed()
}

fn req() -> BoxedStrategy<Req> {
    let headers = (
        choice(
            "localhost",
            vec![
                "localhost:8000",
                "127.0.0.1:8000",
                "[::1]:8000",
                "::1",
                "sandboxrun.example:8443",
                "sandboxrun.example",
                "sandboxrun.example:1",
                "evil.example",
                "localhost.evil.example",
                "",
                "[::1",
                "LOCALHOST:1",
                "localhost:99999",
                "127.0.0.1.nip.io",
                "[::ffff:127.0.0.1]",
            ],
        ),
        prop_oneof![
            30 => Just(None),
            3 => prop::sample::select(vec![
                "https://app.example", "https://app.example/", "HTTPS://APP.EXAMPLE",
                "https://app.example:443", "https://evil.example", "null", "", "http://localhost",
                "http://[::1]:8000", "https://app.example.evil.example",
            ])
            .prop_map(|s| Some(s.as_bytes().to_vec())),
            1 => header_bytes().prop_map(Some),
        ],
        choice(
            "application/json",
            vec![
                "application/json; charset=utf-8",
                "Application/JSON",
                "application/json;",
                "application/json; charset=latin1; boundary=\"x\"",
                "text/plain",
                "application/x-www-form-urlencoded",
                "application/jsonp",
                "",
                "text/event-stream",
                "application/json, text/plain",
                "multipart/form-data; boundary=x",
            ],
        ),
        choice(
            "application/json, text/event-stream",
            vec![
                "application/json",
                "text/event-stream",
                "*/*",
                "text/html",
                "application/*",
                "application/json;q=0, text/event-stream;q=0",
                "",
                "text/event-stream, application/json",
            ],
        ),
        rare(
            PROTOCOL_VERSIONS
                .to_vec()
                .into_iter()
                .chain(["2099-01-01", "", "2026-07-28, 2025-06-18"])
                .collect(),
        ),
        prop_oneof![
            8 => Just(vec![]),
            2 => Just(vec![b"=".to_vec()]),
            1 => prop::sample::select(vec!["tools/call", "initialize", "tools/list", "", "INITIALIZE"])
                .prop_map(|s| vec![s.as_bytes().to_vec()]),
            1 => Just(vec![b"=".to_vec(), b"=".to_vec()]),
            1 => header_bytes().prop_map(|b| vec![b]),
        ],
        prop::collection::vec(
            (
                prop_oneof![
                    prop::sample::select(vec![
                        "last-event-id",
                        "mcp-name",
                        "mcp-param-code",
                        "content-length",
                        "transfer-encoding",
                        "content-encoding",
                        "expect",
                        "x-forwarded-host",
                        "connection",
                        "upgrade",
                        "cookie",
                    ])
                    .prop_map(str::to_owned),
                    "[a-z-]{1,12}",
                ],
                prop_oneof![
                    prop::sample::select(vec![
                        "0",
                        "1",
                        "-1",
                        "abc",
                        "99999999999999999999",
                        "1/2",
                        "run_python",
                        "gzip",
                        "chunked",
                        "100-continue",
                        "websocket",
                        "evil.example",
                        "",
                    ])
                    .prop_map(|s| s.as_bytes().to_vec()),
                    header_bytes(),
                ],
            ),
            0..3,
        ),
    );
    (
        method(),
        target(),
        key_ref(),
        session_ref(),
        headers,
        body_spec(),
        chunking(),
    )
        .prop_map(
            |(
                method,
                target,
                key,
                session,
                (host, origin, content_type, accept, protocol_version, mcp_method, other_headers),
                body,
                chunking,
            )| Req {
                method,
                target,
                key,
                session,
                host,
                origin,
                content_type,
                accept,
                protocol_version,
                mcp_method,
                other_headers,
                body,
                chunking,
            },
        )
        .boxed()
}

fn flow() -> BoxedStrategy<Flow> {
    (
        prop::sample::select(vec!["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]),
        any::<bool>(),
        prop::bool::weighted(0.8),
        prop::collection::vec(
            prop_oneof![6 => message().prop_map(BodySpec::Json), 1 => body_spec()],
            1..6,
        ),
        prop::bool::weighted(0.5),
    )
        .prop_map(|(version, key_b, version_header, steps, delete)| Flow {
            version,
            key_b,
            version_header,
            steps,
            delete,
        })
        .boxed()
}

fn case() -> BoxedStrategy<Case> {
    prop_oneof![
        12 => req().prop_map(|r| Case::Single(Box::new(r))),
        1 => flow().prop_map(Case::Flow),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Turning a case into requests and checking the answers.

fn body_method(spec: &BodySpec) -> Option<String> {
    match spec {
        BodySpec::Json(v) => v.get("method").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

fn body_bytes(spec: &BodySpec) -> Vec<u8> {
    match spec {
        BodySpec::Empty => Vec::new(),
        BodySpec::Json(v) => v.to_string().into_bytes(),
        BodySpec::Batch(vs) => Value::from(vs.clone()).to_string().into_bytes(),
        BodySpec::Raw(b) => b.clone(),
        BodySpec::Text(t) => t.as_bytes().to_vec(),
        BodySpec::Truncated(v, at) => {
            let mut b = v.to_string().into_bytes();
            b.truncate(b.len() * usize::from(*at) / 1000);
            b
        }
        BodySpec::Trailing(v, t) => format!("{v}{t}").into_bytes(),
        BodySpec::Nested {
            depth,
            object,
            closed,
            in_call,
        } => {
            let (open, close) = if *object {
                (r#"{"a":"#, "}")
            } else {
                ("[", "]")
            };
            let mut inner = open.repeat(*depth);
            inner.push('1');
            if *closed {
                inner.push_str(&close.repeat(*depth));
            }
            if *in_call {
                format!(
                    r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"run_python","arguments":{{"code":{inner}}}}}}}"#
                )
                .into_bytes()
            } else {
                inner.into_bytes()
            }
        }
        BodySpec::Sized { offset, whitespace } => {
            let target = (BODY_LIMIT as i64 + i64::from(*offset)).max(0) as usize;
            let head = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run_python","arguments":{"code":""#;
            let tail = r#""}}}"#;
            let fill = target.saturating_sub(head.len() + tail.len());
            if *whitespace {
                let mut b = format!("{head}print(1){tail}").into_bytes();
                b.splice(1..1, std::iter::repeat_n(b' ', target.saturating_sub(b.len())));
                b
            } else {
                format!("{head}{}{tail}", "y".repeat(fill)).into_bytes()
            }
        }
        BodySpec::Escape(seq) => [
            &br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print('"#[..],
            seq,
            br#"')"}}}"#,
        ]
        .concat(),
    }
}

fn request_body(bytes: Vec<u8>, chunking: &Chunking) -> Body {
    match chunking {
        Chunking::Full => Body::from(bytes),
        Chunking::Chunks(n) => {
            let size = bytes.len().div_ceil(*n).max(1);
            let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            Body::from_stream(futures::stream::iter(chunks))
        }
        Chunking::FailAfter(at) => {
            let cut = bytes.len() * usize::from(*at) / 1000;
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::copy_from_slice(&bytes[..cut])),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "client hung up",
                )),
            ];
            Body::from_stream(futures::stream::iter(chunks))
        }
    }
}

/// What the checks need to know about a request besides its answer.
struct Sent {
    method: Method,
    /// The path is /mcp, /sse or /messages (behind the security layers).
    mcp_route: bool,
    /// No header holds a valid key, in any form.
    no_key_anywhere: bool,
    /// A valid key presented cleanly (`Authorization: Bearer KEY` or `X-Api-Key: KEY` only), and
    /// an allowed Host, no Origin, and no `Content-Length`: nothing that may refuse it first.
    clean_auth: bool,
    /// The request presents the other agent's live session (Streamable or SSE) with a clean key.
    foreign_session: bool,
    /// The Mcp-Session-Id presented, when there is one.
    session: Option<String>,
    what: String,
}

fn build(h: &Harness, r: &Req) -> Option<(Request<Body>, Sent)> {
    let uri = match &r.target {
        Target::Fixed(p) => (*p).to_owned(),
        Target::MessagesA => format!("/messages?sessionId={}", h.sse_a),
        Target::MessagesB => format!("/messages?sessionId={}", h.sse_b),
        Target::MessagesRandom(s) => format!("/messages?sessionId={s}"),
        Target::Random(p) => p.clone(),
    };
    let uri: Uri = uri.parse().ok()?;
    let mut req = Request::builder()
        .method(r.method.clone())
        .uri(uri.clone())
        .body(Body::empty())
        .ok()?;
    let headers = req.headers_mut();
    let mut add = |name: &str, value: &[u8]| {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    };
    let bearer = |k: &str| format!("Bearer {k}").into_bytes();
    let mut clean_key = None;
    match &r.key {
        KeyRef::None => {}
        KeyRef::BearerA => {
            add("authorization", &bearer(KEY_A));
            clean_key = Some(AGENT_A);
        }
        KeyRef::BearerB => {
            add("authorization", &bearer(KEY_B));
            clean_key = Some(AGENT_B);
        }
        KeyRef::XApiA => {
            add("x-api-key", KEY_A.as_bytes());
            clean_key = Some(AGENT_A);
        }
        KeyRef::XApiB => {
            add("x-api-key", KEY_B.as_bytes());
            clean_key = Some(AGENT_B);
        }
        KeyRef::Authorization(b) => add("authorization", b),
        KeyRef::XApiKey(b) => add("x-api-key", b),
        KeyRef::Long(n) => add("authorization", &bearer(&"k".repeat(*n))),
        KeyRef::OddA(scheme) => add("authorization", format!("{scheme} {KEY_A} ").as_bytes()),
        KeyRef::Duplicated(first_valid, second_valid) => {
            for valid in [first_valid, second_valid] {
                add(
                    "authorization",
                    &bearer(if *valid { KEY_A } else { "wrong" }),
                );
            }
        }
        KeyRef::WrongBearerValidXApi => {
            add("authorization", b"Bearer wrong");
            add("x-api-key", KEY_A.as_bytes());
        }
    }
    let mut foreign = false;
    match &r.session {
        SessionRef::None => {}
        SessionRef::A => {
            add("mcp-session-id", h.session_a.as_bytes());
            foreign = clean_key == Some(AGENT_B);
        }
        SessionRef::B => {
            add("mcp-session-id", h.session_b.as_bytes());
            foreign = clean_key == Some(AGENT_A);
        }
        SessionRef::Random(s) => add("mcp-session-id", s.as_bytes()),
        SessionRef::Bytes(b) => add("mcp-session-id", b),
        SessionRef::Both => {
            add("mcp-session-id", h.session_a.as_bytes());
            add("mcp-session-id", h.session_b.as_bytes());
        }
    }
    let body_method = body_method(&r.body);
    for (name, value) in [
        ("host", &r.host),
        ("origin", &r.origin),
        ("content-type", &r.content_type),
        ("accept", &r.accept),
        ("mcp-protocol-version", &r.protocol_version),
    ] {
        if let Some(v) = value {
            add(name, v);
        }
    }
    for m in &r.mcp_method {
        if m == b"=" {
            add(
                "mcp-method",
                body_method.as_deref().unwrap_or("ping").as_bytes(),
            );
        } else {
            add("mcp-method", m);
        }
    }
    for (name, value) in &r.other_headers {
        add(name, value);
    }
    let path = uri.path();
    let mcp_route = matches!(path, "/mcp" | "/sse" | "/messages");
    let session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Only /mcp looks at Mcp-Session-Id, and an ended session belongs to no one.
    let foreign = foreign
        && path == "/mcp"
        && !session
            .as_ref()
            .is_some_and(|s| h.ended.lock().expect("ended").contains(s));
    let foreign = foreign
        || match &r.target {
            Target::MessagesA => clean_key == Some(AGENT_B),
            Target::MessagesB => clean_key == Some(AGENT_A),
            _ => false,
        };
    let values: Vec<&[u8]> = req.headers().values().map(HeaderValue::as_bytes).collect();
    let no_key_anywhere = !values.iter().any(|v| {
        v.windows(KEY_A.len())
            .any(|w| w == KEY_A.as_bytes() || w == KEY_B.as_bytes())
    });
    let host_ok = r.host.as_deref().is_some_and(|h| {
        matches!(
            h,
            b"localhost" | b"localhost:8000" | b"127.0.0.1:8000" | b"[::1]:8000" | b"::1"
        )
    });
    let clean_auth = clean_key.is_some()
        && host_ok
        && r.origin.is_none()
        && !r
            .other_headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        && uri.authority().is_none();
    let bytes = body_bytes(&r.body);
    let what = truncated(format!("{r:?}"), 1_500);
    *req.body_mut() = request_body(bytes, &r.chunking);
    Some((
        req,
        Sent {
            method: r.method.clone(),
            mcp_route,
            no_key_anywhere,
            clean_auth,
            foreign_session: foreign && clean_key.is_some(),
            session,
            what,
        },
    ))
}

fn fail(sent: &Sent, status: StatusCode, why: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(format!("{why} (status {status}; request {})", sent.what))
}

/// Sends one request and checks every property of its answer.
async fn exchange(
    h: &Harness,
    req: Request<Body>,
    sent: &Sent,
) -> Result<StatusCode, TestCaseError> {
    let resp = match tokio::time::timeout(ANSWER_BOUND, h.app.clone().oneshot(req)).await {
        Ok(r) => r.expect("infallible"),
        Err(_) => {
            return Err(TestCaseError::fail(format!(
                "no answer within {ANSWER_BOUND:?}: {}",
                sent.what
            )));
        }
    };
    let status = resp.status();
    if !DOCUMENTED_STATUSES.contains(&status.as_u16()) {
        return Err(fail(sent, status, "undocumented status"));
    }
    if sent.mcp_route && sent.no_key_anywhere && !matches!(status.as_u16(), 401 | 403 | 413) {
        return Err(fail(
            sent,
            status,
            "AUTH: an MCP route answered without a valid key",
        ));
    }
    if sent.mcp_route && sent.clean_auth && status == StatusCode::UNAUTHORIZED {
        return Err(fail(sent, status, "a valid key was refused"));
    }
    if sent.foreign_session && status.is_success() {
        return Err(fail(sent, status, "another agent's session answered"));
    }
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("text/event-stream") {
        if sent.method == Method::GET {
            // A standing stream (GET /sse, GET /mcp): properly started is enough; peek at what is
            // ready without waiting, then drop it (which closes the session or stream).
            let mut stream = resp.into_body().into_data_stream();
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            if let Some(Some(Err(e))) = futures::FutureExt::now_or_never(stream.next()) {
                return Err(fail(sent, status, format!("the event stream failed: {e}")));
            }
            return Ok(status);
        }
        // The stream of one POST ends with its answer.
        let body = read_all(resp.into_body())
            .await
            .map_err(|e| fail(sent, status, e))?;
        let text = String::from_utf8_lossy(&body);
        for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
            check_sse_event(event).map_err(|e| {
                fail(
                    sent,
                    status,
                    format!("{e} in event {}", truncated(event.to_owned(), 500)),
                )
            })?;
        }
        return Ok(status);
    }
    let body = read_all(resp.into_body())
        .await
        .map_err(|e| fail(sent, status, e))?;
    // A HEAD answer has headers only.
    if content_type.starts_with("application/json") && sent.method != Method::HEAD {
        let value: Value = serde_json::from_slice(&body).map_err(|e| {
            fail(
                sent,
                status,
                format!(
                    "the body claims JSON but is not ({e}): {}",
                    String::from_utf8_lossy(&body)
                ),
            )
        })?;
        let checked = if status.is_client_error() {
            check_jsonrpc_error(&value)
        } else if let Some(batch) = value.as_array() {
            batch.iter().try_for_each(check_jsonrpc_message)
        } else {
            check_jsonrpc_message(&value)
        };
        checked.map_err(|e| fail(sent, status, format!("{e}: {value}")))?;
    }
    Ok(status)
}

/// Runs one case: every request of it, checked.
async fn run_case(h: &Harness, case: &Case, stats: &RefCell<Stats>) -> Result<(), TestCaseError> {
    match case {
        Case::Single(r) => {
            let Some((req, sent)) = build(h, r) else {
                stats.borrow_mut().unbuildable += 1;
                return Ok(());
            };
            let status = exchange(h, req, &sent).await?;
            if sent.method == Method::DELETE
                && status == StatusCode::NO_CONTENT
                && let Some(session) = sent.session
            {
                h.ended.lock().expect("ended").insert(session);
            }
            stats.borrow_mut().count(status);
        }
        Case::Flow(flow) => {
            let key = if flow.key_b { KEY_B } else { KEY_A };
            let session = h.open_session(key, flow.version).await;
            for step in &flow.steps {
                let r = Req {
                    method: Method::POST,
                    target: Target::Fixed("/mcp"),
                    key: if flow.key_b {
                        KeyRef::BearerB
                    } else {
                        KeyRef::BearerA
                    },
                    session: SessionRef::Random(session.clone()),
                    host: Some(b"localhost".to_vec()),
                    origin: None,
                    content_type: Some(b"application/json".to_vec()),
                    accept: Some(b"application/json, text/event-stream".to_vec()),
                    protocol_version: flow
                        .version_header
                        .then(|| flow.version.as_bytes().to_vec()),
                    mcp_method: vec![],
                    other_headers: vec![],
                    body: step.clone(),
                    chunking: Chunking::Full,
                };
                let (req, sent) = build(h, &r).expect("a flow request builds");
                let status = exchange(h, req, &sent).await?;
                stats.borrow_mut().count(status);
            }
            if flow.delete {
                let delete = |session: &str| {
                    Request::delete("/mcp")
                        .header("host", "localhost")
                        .header("authorization", format!("Bearer {key}"))
                        .header("mcp-session-id", session)
                        .body(Body::empty())
                        .expect("request")
                };
                let status = h.send(|| delete(&session)).await.status();
                prop_assert_eq!(status, StatusCode::NO_CONTENT, "DELETE of an own session");
                let status = h.send(|| delete(&session)).await.status();
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "a second DELETE");
                let ping = json!({"jsonrpc": "2.0", "id": 99, "method": "ping"});
                let status = h
                    .send(|| clean_post(key, Some(&session), None, &ping))
                    .await
                    .status();
                prop_assert_eq!(status, StatusCode::NOT_FOUND, "a deleted session is gone");
            }
        }
    }
    let errors = std::mem::take(&mut *h.sse_errors.lock().expect("errors"));
    prop_assert!(errors.is_empty(), "SSE stream violations: {:?}", errors);
    Ok(())
}

#[derive(Default)]
struct Stats {
    cases: u64,
    unbuildable: u64,
    statuses: BTreeMap<u16, u64>,
}

impl Stats {
    fn count(&mut self, status: StatusCode) {
        *self.statuses.entry(status.as_u16()).or_default() += 1;
    }
}

fn cases_from_env() -> u32 {
    std::env::var("SANDBOXRUN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn runner(cases: u32) -> (TestRunner, u64) {
    let seed = std::env::var("SANDBOXRUN_FUZZ_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        // Each case is one request; a rejected (unbuildable) one is counted, not retried.
        max_global_rejects: u32::MAX,
        ..Config::default()
    };
    (
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)),
        seed,
    )
}

/// Runs `cases` generated cases against harnesses built with this rate limit.
fn fuzz(test: &str, cases: u32, rate_per_minute: u32, burst: u32) -> Stats {
    install_panic_counter();
    FUZZING.with(|f| f.set(true));
    let dir = scratch_dir(test);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("sandboxrun-fuzz")
        .build()
        .expect("runtime");
    let (mut runner, seed) = runner(cases);
    eprintln!("fuzz {test}: {cases} cases, SANDBOXRUN_FUZZ_SEED={seed}");
    let watchdog = Watchdog::start(test, seed);
    watchdog.begin("building the harness".into());
    let harness = RefCell::new(Some(rt.block_on(Harness::new(
        &dir,
        rate_per_minute,
        burst,
    ))));
    watchdog.begin("generating the first case".into());
    let stats = RefCell::new(Stats::default());
    let started = Instant::now();
    let panics_before = panics();
    let result = runner.run(&case(), |case| {
        let n = {
            let mut s = stats.borrow_mut();
            s.cases += 1;
            s.cases
        };
        // Rotation: the server must still serve a clean client, then a fresh one takes over.
        if n % u64::from(ROTATE_EVERY) == 0 {
            watchdog.begin("usability check".into());
            let old = harness.borrow_mut().take().expect("harness");
            rt.block_on(old.assert_usable());
            drop(old);
            let fresh = rt.block_on(Harness::new(&dir, rate_per_minute, burst));
            *harness.borrow_mut() = Some(fresh);
            let rate = n as f64 / started.elapsed().as_secs_f64();
            eprintln!("fuzz {test}: {n} cases, {rate:.0} cases/s");
        }
        watchdog.begin(truncated(format!("{case:?}"), 2_000));
        let guard = harness.borrow();
        let h = guard.as_ref().expect("harness");
        let panics_at_start = panics();
        let outcome = rt.block_on(run_case(h, &case, &stats));
        watchdog.begin("generating the next case, or shrinking".into());
        if panics() != panics_at_start {
            return Err(TestCaseError::fail(
                "a panic on a fuzzing thread (see above)",
            ));
        }
        outcome
    });
    let elapsed = started.elapsed();
    let panicked = panics() != panics_before;
    FUZZING.with(|f| f.set(false));
    let s = stats.into_inner();
    let rate = s.cases as f64 / elapsed.as_secs_f64();
    eprintln!(
        "fuzz {test}: {} cases in {:.1}s ({rate:.0} cases/s), {} unbuildable; statuses {:?}",
        s.cases,
        elapsed.as_secs_f64(),
        s.unbuildable,
        s.statuses
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, case)) => panic!(
            "fuzz {test} (SANDBOXRUN_FUZZ_SEED={seed}): {why}\nminimal case: {}",
            truncated(format!("{case:?}"), 4_000)
        ),
        Err(e) => panic!("fuzz {test}: {e}"),
    }
    let h = harness.borrow_mut().take().expect("harness");
    watchdog.begin("final usability check".into());
    rt.block_on(h.assert_usable());
    // Dropping the runtime waits for its blocking tasks: watched like the cases.
    watchdog.begin("dropping the harness and its runtime".into());
    drop(h);
    drop(rt);
    watchdog.end();
    assert!(!panicked, "panics while fuzzing");
    let _ = std::fs::remove_dir_all(&dir);
    s
}

/// The long-run test: every class of request against a generous rate limit (so that the limiter
/// does not answer the cases).
#[test]
fn fuzz_http_requests() {
    let s = fuzz("requests", cases_from_env(), u32::MAX, u32::MAX);
    assert!(
        !s.statuses.contains_key(&429),
        "the generous limiter answered"
    );
    assert!(
        s.statuses.get(&200).copied().unwrap_or(0) > 0,
        "some requests succeeded"
    );
}

/// The same generator against a tight limiter: 429s (with Retry-After) are among the answers,
/// and every other property still holds (no key is still 401, before the limiter).
#[test]
fn fuzz_http_requests_tight_rate_limit() {
    let cases = (cases_from_env() / 20).max(100);
    let s = fuzz("tight-rate", cases, 6_000, 10);
    assert!(
        s.statuses.get(&429).copied().unwrap_or(0) > 0,
        "the limiter answered"
    );
}

/// Regression (found by `fuzz_http_requests`): rmcp answers a DELETE of any session id with
/// success, so a second DELETE, a DELETE of a made-up id and another agent's DELETE of an ended
/// session all got 204; the spec wants 404 for a session that is unknown or has ended.
#[test]
fn delete_needs_a_live_session_of_the_caller() {
    with_harness("delete", async |h| {
        let delete = |key: &str, session: &str| {
            let (key, session) = (key.to_owned(), session.to_owned());
            move || {
                Request::delete("/mcp")
                    .header("host", "localhost")
                    .header("authorization", format!("Bearer {key}"))
                    .header("mcp-session-id", &session)
                    .body(Body::empty())
                    .expect("request")
            }
        };
        let status = |resp: Response<Body>| resp.status();
        assert_eq!(
            status(h.send(delete(KEY_A, "no-such-session")).await),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(h.send(delete(KEY_B, &h.session_a)).await),
            StatusCode::NOT_FOUND,
            "another agent's live session"
        );
        assert_eq!(
            status(h.send(delete(KEY_A, &h.session_a)).await),
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            status(h.send(delete(KEY_A, &h.session_a)).await),
            StatusCode::NOT_FOUND,
            "a second DELETE"
        );
        assert_eq!(
            status(h.send(delete(KEY_B, &h.session_a)).await),
            StatusCode::NOT_FOUND,
            "another agent's ended session"
        );
    });
}

/// Regression (found by `fuzz_http_requests`): a JSON-RPC response POSTed to the stateless
/// (2026-07-28) endpoint was refused with an error object without `id`; JSON-RPC 2.0 requires
/// `"id": null` when the id is unknown.
#[test]
fn stateless_errors_carry_a_null_id() {
    with_harness("null-id", async |h| {
        let reply = json!({"jsonrpc": "2.0", "id": 0, "error": {"code": -32000, "message": "x"}});
        let resp = h
            .send(|| clean_post(KEY_A, None, Some("2026-07-28"), &reply))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: Value =
            serde_json::from_slice(&read_all(resp.into_body()).await.expect("body")).expect("json");
        assert_eq!(check_jsonrpc_error(&body), Ok(()), "{body}");
        assert_eq!(body["id"], Value::Null);
    });
}
