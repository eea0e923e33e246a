//! A scripted Kubernetes API server for reconcile tests: just enough of the API for one
//! SandboxRun and its sandbox Pod, served over HTTP on localhost to a real `kube::Client`, with
//! every request recorded so a test can assert what the operator did, and in which order.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Namespace of every object of the fake.
pub const NS: &str = "runs";

/// What the fake API server holds, and what it was asked.
#[derive(Default)]
pub struct ApiState {
    /// The SandboxRun as the API server has it (`None`: there is none).
    pub run: Option<Value>,
    /// The sandbox Pod (`None`: there is none).
    pub pod: Option<Value>,
    /// The sandbox container's log.
    pub log: String,
    /// When set, creating a Pod fails with this HTTP status.
    pub refuse_pods: Option<u16>,
    /// When set, creating a Pod fails with this HTTP status, Status reason and message (as the
    /// quota admission plugin answers, for example).
    pub refuse_pods_with: Option<(u16, &'static str, &'static str)>,
    /// When set, a log read never answers (a stalled kubelet).
    pub stall_logs: bool,
    /// When set, no request is ever answered (a stalled API server).
    pub stall_all: bool,
    /// While set, a Pod create is held unanswered (a create on its way), then answered.
    pub hold_pod_creates: bool,
    /// While set, an Event's create is held unanswered, then answered.
    pub hold_events: bool,
    /// Status writes that commit but answer 504 (the response lost on the way back), counted
    /// down per write.
    pub lose_status_responses: u32,
    /// Status writes refused with 500 and not applied (an API server failing), counted down
    /// per write.
    pub refuse_status_writes: u32,
    /// Reads of the run after which someone else writes it (its resourceVersion moves on),
    /// counted down per read: a concurrent writer, such as a second leader.
    pub write_after_reads: u32,
    /// Status writes of the run after which someone else writes it, counted down per write
    /// that commits: a caller's cancel landing while the operator works on the run.
    pub write_after_status_writes: u32,
    /// The status that write leaves, when set (another replica's end, say); else only the
    /// resourceVersion moves on.
    pub written_status: Option<Value>,
    /// Idle sandboxes of warm pools (listed by label selector, claimed by a patch that the
    /// resourceVersion precondition guards; a claimed one becomes [`ApiState::pod`]).
    pub pool_pods: Vec<Value>,
    /// Claims answered 409 Conflict (another run took the Pod first), counted down per claim.
    pub lose_claims: u32,
    /// Claims answered 504 and held back instead of applied (a slow API server that applies a
    /// request after its client gave up), counted down per claim; [`FakeApi::apply_held_claims`]
    /// applies them later.
    pub hold_claims: u32,
    /// The claims held back, as (Pod name, patch).
    pub held_claims: Vec<(String, Value)>,
    /// SandboxSessions (listed, read, created, deleted; their status replaced under a
    /// resourceVersion precondition).
    pub sessions: Vec<Value>,
    /// Reads of a session after which someone else writes it (its resourceVersion moves on),
    /// counted down per read.
    pub session_write_after_reads: u32,
    /// Other SandboxRuns of the namespace, read by name (the run holding a session, say).
    pub other_runs: Vec<Value>,
    /// ConfigMaps (the runner's, made before the first sandbox Pod), by name.
    pub config_maps: std::collections::BTreeMap<String, Value>,
    /// When set, creating a ConfigMap fails with this HTTP status.
    pub refuse_config_maps: Option<u16>,
    /// Every request, as `METHOD path`, in order.
    pub requests: Vec<String>,
    /// The reasons of the Events published, in order.
    pub events: Vec<String>,
    /// The notes of the Events published, in the same order.
    pub event_notes: Vec<String>,
}

/// A handle on a running fake API server.
#[derive(Clone)]
pub struct FakeApi {
    /// Its state, shared with the server.
    pub state: Arc<Mutex<ApiState>>,
    /// A client of it.
    pub client: kube::Client,
}

impl FakeApi {
    /// Starts a fake API server holding `run`.
    pub async fn start(run: Value) -> Self {
        let state = Arc::new(Mutex::new(ApiState {
            run: Some(run),
            ..ApiState::default()
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url: Uri = format!("http://{addr}").parse().unwrap();
        let mut config = kube::Config::new(url);
        config.default_namespace = NS.to_owned();
        // A 5xx is answered at once by tests that script one; the client must not retry it for
        // minutes.
        config.default_retry = false;
        let client = kube::Client::try_from(config).unwrap();
        Self { state, client }
    }

    /// Runs `f` on the state.
    pub fn with<T>(&self, f: impl FnOnce(&mut ApiState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Applies the claims held back by [`ApiState::hold_claims`] now, as a slow API server would;
    /// whether each one committed (its precondition still held).
    pub fn apply_held_claims(&self) -> Vec<bool> {
        self.with(|s| {
            let held = std::mem::take(&mut s.held_claims);
            held.into_iter()
                .map(|(name, body)| {
                    let i = s
                        .pool_pods
                        .iter()
                        .position(|p| p["metadata"]["name"] == name);
                    i.is_some_and(|i| claim(s, i, &body).is_some())
                })
                .collect()
        })
    }

    /// The requests so far, leaving Events out; clears the record.
    pub fn take_requests(&self) -> Vec<String> {
        self.with(|s| std::mem::take(&mut s.requests))
            .into_iter()
            .filter(|r| !r.contains("/events"))
            .collect()
    }

    /// The run's status as the API server has it.
    pub fn status(&self) -> Value {
        self.with(|s| s.run.as_ref().map(|r| r["status"].clone()))
            .unwrap_or(Value::Null)
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap(),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn status(code: u16, reason: &str) -> Response {
    json_response(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("fake API server: {reason}"), "reason": reason, "code": code}),
    )
}

/// Applies a claim patch to pool Pod `i` if its resourceVersion precondition holds: the Pod
/// becomes the run's ([`ApiState::pod`]). `None`: a conflict.
fn claim(s: &mut ApiState, i: usize, body: &Value) -> Option<Value> {
    let mut pod = s.pool_pods[i].clone();
    if body["metadata"]["resourceVersion"] != pod["metadata"]["resourceVersion"] {
        return None;
    }
    merge(&mut pod, body);
    bump(&mut pod);
    s.pool_pods.remove(i);
    s.pod = Some(pod.clone());
    Some(pod)
}

/// A write: the object's resourceVersion moves on.
fn bump(object: &mut Value) {
    let rv = object["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    object["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
}

/// A JSON merge patch (RFC 7386), as the API server applies `Patch::Merge`.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in fields {
        if v.is_null() {
            target.as_object_mut().unwrap().remove(k);
        } else {
            merge(&mut target[k], v);
        }
    }
}

fn found(object: Option<&Value>) -> Response {
    match object {
        Some(o) => json_response(200, o),
        None => status(404, "NotFound"),
    }
}

/// A request about SandboxSessions; `rest` is the path after the collection.
fn session_request(s: &mut ApiState, method: &Method, rest: &str, body: Value) -> Response {
    let rest = rest.trim_start_matches('/');
    let (name, of_status) = match rest.strip_suffix("/status") {
        Some(name) => (name, true),
        None => (rest, false),
    };
    let at = s
        .sessions
        .iter()
        .position(|o| !name.is_empty() && o["metadata"]["name"] == name);
    match (method.clone(), name.is_empty(), of_status) {
        (Method::GET, true, _) => json_response(
            200,
            &json!({"kind": "SandboxSessionList", "apiVersion": "sandboxrun.dev/v1alpha1",
                "metadata": {}, "items": s.sessions}),
        ),
        (Method::POST, true, _) => {
            let wanted = body["metadata"]["name"].clone();
            if s.sessions.iter().any(|o| o["metadata"]["name"] == wanted) {
                return status(409, "AlreadyExists");
            }
            let mut created = body;
            created["metadata"]["uid"] = json!(format!("session-uid-{}", s.sessions.len()));
            created["metadata"]["resourceVersion"] = json!("1");
            created["metadata"]["generation"] = json!(1);
            created["metadata"]["creationTimestamp"] = json!(jiff::Timestamp::now().to_string());
            s.sessions.push(created.clone());
            json_response(201, &created)
        }
        (Method::GET, false, false) => {
            let answer = found(at.map(|i| &s.sessions[i]));
            if let Some(i) = at.filter(|_| s.session_write_after_reads > 0) {
                s.session_write_after_reads -= 1;
                bump(&mut s.sessions[i]);
            }
            answer
        }
        (Method::PUT, false, true) => match at {
            Some(i)
                if body["metadata"]["resourceVersion"]
                    != s.sessions[i]["metadata"]["resourceVersion"] =>
            {
                status(409, "Conflict")
            }
            Some(i) => {
                let session = &mut s.sessions[i];
                session["status"] = body["status"].clone();
                bump(session);
                json_response(200, session)
            }
            None => status(404, "NotFound"),
        },
        (Method::DELETE, false, false) => match at {
            Some(i) => json_response(200, &s.sessions.remove(i)),
            None => status(404, "NotFound"),
        },
        _ => status(405, "MethodNotAllowed"),
    }
}

async fn handle(
    State(state): State<Arc<Mutex<ApiState>>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let stall = {
        let mut s = state.lock().unwrap();
        s.requests.push(format!("{method} {path}"));
        s.stall_all || (s.stall_logs && path.ends_with("/log"))
    };
    if stall {
        return std::future::pending().await;
    }
    if method == Method::POST && path == format!("/api/v1/namespaces/{NS}/pods") {
        while state.lock().unwrap().hold_pod_creates {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if method == Method::POST && path.ends_with("/events") {
        // Recorded as it arrives, so that a test sees which Events were sent while held.
        {
            let mut s = state.lock().unwrap();
            s.events
                .push(body["reason"].as_str().unwrap_or_default().to_owned());
            s.event_notes
                .push(body["note"].as_str().unwrap_or_default().to_owned());
        }
        while state.lock().unwrap().hold_events {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        return json_response(201, &body);
    }
    let mut s = state.lock().unwrap();
    let runs = format!("/apis/sandboxrun.dev/v1alpha1/namespaces/{NS}/sandboxruns/");
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let sessions = format!("/apis/sandboxrun.dev/v1alpha1/namespaces/{NS}/sandboxsessions");
    let config_maps = format!("/api/v1/namespaces/{NS}/configmaps");
    if let Some(rest) = path.strip_prefix(&config_maps) {
        let name = rest.trim_start_matches('/');
        return match (method, name.is_empty()) {
            (Method::POST, true) => {
                if let Some(code) = s.refuse_config_maps {
                    return status(code, "Forbidden");
                }
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                if s.config_maps.contains_key(name) {
                    return status(409, "AlreadyExists");
                }
                s.config_maps.insert(name.to_owned(), body.clone());
                json_response(201, &body)
            }
            (Method::GET, false) => match s.config_maps.get(name) {
                Some(cm) => json_response(200, cm),
                None => status(404, "NotFound"),
            },
            (Method::DELETE, false) => match s.config_maps.remove(name) {
                Some(cm) => json_response(200, &cm),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        };
    }
    if let Some(rest) = path.strip_prefix(&sessions) {
        return session_request(&mut s, &method, rest, body);
    }
    if let Some(other) = path.strip_prefix(&runs).filter(|name| {
        method == Method::GET && s.other_runs.iter().any(|r| r["metadata"]["name"] == *name)
    }) {
        return found(s.other_runs.iter().find(|r| r["metadata"]["name"] == other));
    }
    if let Some(rest) = path.strip_prefix(&runs) {
        return match (method, rest.ends_with("/status")) {
            (Method::GET, false) => {
                let answer = found(s.run.as_ref());
                if s.write_after_reads > 0 {
                    s.write_after_reads -= 1;
                    if let Some(run) = s.run.as_mut() {
                        bump(run);
                    }
                }
                answer
            }
            (Method::PATCH, true) if s.refuse_status_writes > 0 => {
                s.refuse_status_writes -= 1;
                status(500, "InternalError")
            }
            (Method::PATCH, true) => match s.run.as_mut() {
                // A resourceVersion in the patch is a precondition, as on a real API server.
                Some(run)
                    if body["metadata"]["resourceVersion"].is_string()
                        && body["metadata"]["resourceVersion"]
                            != run["metadata"]["resourceVersion"] =>
                {
                    status(409, "Conflict")
                }
                Some(run) => {
                    bump(run);
                    if uri
                        .query()
                        .unwrap_or_default()
                        .contains("sandboxrun-operator-audit")
                    {
                        // The audit condition's own field manager: server-side apply merges
                        // its conditions into the list (a map keyed by type), nothing else.
                        let mut conditions = run["status"]["conditions"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default();
                        for c in body["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                        {
                            conditions.retain(|o| o["type"] != c["type"]);
                            conditions.push(c.clone());
                        }
                        run["status"]["conditions"] = json!(conditions);
                    } else {
                        // Server-side apply with force by the operator's field manager: the
                        // status is what was applied.
                        run["status"] = body["status"].clone();
                    }
                    let answer = json_response(200, run);
                    if s.write_after_status_writes > 0 {
                        s.write_after_status_writes -= 1;
                        let written = s.written_status.take();
                        if let Some(run) = s.run.as_mut() {
                            bump(run);
                            if let Some(status) = written {
                                run["status"] = status;
                            }
                        }
                    }
                    if s.lose_status_responses > 0 {
                        s.lose_status_responses -= 1;
                        return status(504, "Timeout");
                    }
                    answer
                }
                None => status(404, "NotFound"),
            },
            (Method::DELETE, false) => match s.run.take() {
                Some(run) => json_response(200, &run),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        };
    }
    if path == pods && method == Method::POST {
        if let Some(code) = s.refuse_pods {
            return status(code, "Invalid");
        }
        if let Some((code, reason, message)) = s.refuse_pods_with {
            return json_response(
                code,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": message, "reason": reason, "code": code}),
            );
        }
        if s.pod.is_some() {
            return status(409, "AlreadyExists");
        }
        let mut pod = body;
        pod["metadata"]["creationTimestamp"] = json!(jiff::Timestamp::now().to_string());
        pod["status"] = json!({"phase": "Pending"});
        s.pod = Some(pod.clone());
        return json_response(201, &pod);
    }
    if path == pods && method == Method::GET {
        let selector = uri
            .query()
            .unwrap_or_default()
            .replace("%2F", "/")
            .replace("%3D", "=")
            .replace("%2C", ",");
        let items: Vec<Value> = if selector.contains("sandboxrun.dev/pool=") {
            s.pool_pods.clone()
        } else {
            s.pod.iter().cloned().collect()
        };
        return json_response(
            200,
            &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
        );
    }
    if let Some(name) = path.strip_prefix(&format!("{pods}/"))
        && method == Method::PATCH
    {
        let Some(i) = s
            .pool_pods
            .iter()
            .position(|p| p["metadata"]["name"] == name)
        else {
            return status(404, "NotFound");
        };
        if s.lose_claims > 0 {
            s.lose_claims -= 1;
            return status(409, "Conflict");
        }
        if s.hold_claims > 0 {
            s.hold_claims -= 1;
            s.held_claims.push((name.to_owned(), body));
            return status(504, "Timeout");
        }
        return match claim(&mut s, i, &body) {
            Some(pod) => json_response(200, &pod),
            None => status(409, "Conflict"),
        };
    }
    if let Some(rest) = path.strip_prefix(&format!("{pods}/")) {
        return match (method, rest.ends_with("/log")) {
            (Method::GET, true) => match s.pod {
                Some(_) => (StatusCode::OK, s.log.clone()).into_response(),
                None => status(404, "NotFound"),
            },
            (Method::GET, false) => found(
                s.pod
                    .iter()
                    .chain(&s.pool_pods)
                    .find(|p| p["metadata"]["name"] == rest),
            ),
            (Method::DELETE, false) => match s.pod.take() {
                Some(pod) => json_response(200, &pod),
                None => status(404, "NotFound"),
            },
            _ => status(405, "MethodNotAllowed"),
        };
    }
    status(404, "NotFound")
}

/// The SQLite demo database (`config/demo/demo.sql`) as the operator's `demo` database, in a
/// directory of its own (returned, for the test to remove).
pub async fn demo_databases(tag: &str) -> (sandboxrun_core::Databases, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sbr-operator-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("demo.sqlite");
    sandboxrun_core::query::demo::ensure_sqlite(&path)
        .await
        .unwrap();
    let config = std::collections::BTreeMap::from([(
        "demo".to_owned(),
        sandboxrun_core::query::demo::database_config(&path),
    )]);
    (
        sandboxrun_core::Databases::from_config(&config).unwrap(),
        dir,
    )
}
