//! MCP tasks (the `io.modelcontextprotocol/tasks` extension) through a client this project did
//! not write: the official Rust SDK's (rmcp) client over Streamable HTTP, in both protocol eras
//! (the initialize handshake, and the stateless 2026-07-28 revision with `server/discover`),
//! against the `sandboxrun-mcp serve` binary running real code in the local sandbox (the
//! sandbox-python root file system must be built: images/build.sh).
//!
//! In the 2026-07-28 revision, a client that declares the extension gets a task for a call that
//! takes a while, follows it with `tasks/get` (the status message shows what the code prints) to
//! the call's very result, and stops it with `tasks/cancel`; another agent cannot see or cancel
//! it. A quick call, any call of a client without the extension, and any call under the
//! initialize handshake (where server-directed tasks are not negotiated: the MCP Inspector
//! declares the extension there and takes only results) is answered on its request.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, GetTaskParams, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-mcp");
const KEYS: [(&str, &str); 2] = [("analyst-01", "key-analyst"), ("ci-bot", "key-ci")];

/// A program that prints at once, then runs past the inline window (two seconds).
const SLOW: &str = "import time\nprint('started', flush=True)\ntime.sleep(5)\nprint('done')\n";

struct Server {
    child: Child,
    base: String,
    _dir: tempdir::Dir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory without another crate.
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "sandboxrun-tasks-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn hash_key(key: &str) -> String {
    let mut child = Command::new(BIN)
        .arg("hash-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(key.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn start() -> Server {
    let dir = tempdir::Dir::new();
    let keys = dir.0.join("keys.yaml");
    let text: String = KEYS
        .iter()
        .map(|(agent, key)| format!("- agent: {agent}\n  sha256: {}\n", hash_key(key)))
        .collect();
    std::fs::write(&keys, text).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.0.join("serve.log")).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--api-keys-file")
        .arg(&keys)
        .args(["--backend", "local"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the server did not listen: {}",
            std::fs::read_to_string(dir.0.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Server {
        child,
        base,
        _dir: dir,
    }
}

#[derive(Clone, Copy, Debug)]
enum Era {
    /// The initialize handshake (2025-11-25), a session.
    Initialize,
    /// The stateless 2026-07-28 revision: `server/discover`, one POST per request.
    Discover,
}

const ERAS: [Era; 2] = [Era::Initialize, Era::Discover];

async fn connect(
    server: &Server,
    agent: &str,
    era: Era,
    tasks: bool,
) -> RunningService<RoleClient, ClientConfig> {
    let key = KEYS.iter().find(|(a, _)| *a == agent).unwrap().1;
    // The tree's one rustls provider (ring): reqwest wants one installed before any client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", server.base))
            .auth_header(key),
    );
    let capabilities = if tasks {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    let config = ClientConfig::new(capabilities, Implementation::new("tasks-test", "1"));
    let lifecycle = match era {
        Era::Initialize => ClientLifecycleMode::Initialize,
        Era::Discover => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    };
    config
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .unwrap_or_else(|e| panic!("{era:?}: cannot connect: {e}"))
}

fn python(code: &str) -> CallToolRequestParams {
    CallToolRequestParams::new("run_python")
        .with_arguments(json!({ "code": code }).as_object().unwrap().clone())
}

/// Polls the task at the interval it suggests until it ends; returns the status messages seen.
async fn follow(
    client: &RunningService<RoleClient, ClientConfig>,
    id: &str,
    timeout: Duration,
) -> (rmcp::model::DetailedTask, Vec<String>) {
    let deadline = Instant::now() + timeout;
    let mut messages = Vec::new();
    loop {
        let got = client
            .peer()
            .get_task(GetTaskParams::new(id))
            .await
            .expect("tasks/get");
        if let Some(m) = &got.task.task.status_message
            && messages.last() != Some(m)
        {
            messages.push(m.clone());
        }
        if got.task.status().is_terminal() {
            return (got.task, messages);
        }
        assert!(
            Instant::now() < deadline,
            "task {id} still running: {messages:?}"
        );
        let poll = got.task.task.poll_interval_ms.unwrap_or(500);
        tokio::time::sleep(Duration::from_millis(poll)).await;
    }
}

fn result_of(task: &rmcp::model::DetailedTask) -> CallToolResult {
    match &task.payload {
        TaskPayload::Completed { result } => {
            serde_json::from_value(serde_json::Value::Object(result.clone())).unwrap()
        }
        other => panic!("a completed task expected, got {other:?}"),
    }
}

fn cancelled_calls(server: &Server) -> f64 {
    let text = http_get(&format!("{}/metrics", server.base));
    text.lines()
        .find(|l| {
            l.starts_with(
                "sandboxrun_mcp_tool_calls_total{tool=\"run_python\",outcome=\"cancelled\"}",
            )
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// GET with the standard library: the metrics endpoint is plain text on loopback.
fn http_get(url: &str) -> String {
    use std::io::Read as _;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_call_is_followed_as_a_task_to_its_result() {
    let server = start();
    for era in [Era::Discover] {
        let client = connect(&server, "analyst-01", era, true).await;
        let info = client.peer_info().expect("server info");
        assert!(
            info.capabilities.supports_tasks(),
            "{era:?}: the server declares the tasks extension"
        );

        // A quick call is answered on its request.
        match client.call_tool_once(python("print(6*7)")).await.unwrap() {
            CallToolResponse::Complete(r) => {
                assert_eq!(r.structured_content.unwrap()["stdout"], "42\n", "{era:?}")
            }
            other => panic!("{era:?}: a result expected, got {other:?}"),
        }

        // A long one becomes a task, which shows what the code prints while it runs. The task
        // comes before the call ends: it is still working when it arrives (by cause, not by a
        // clock: the code sleeps past any wait for a quick result).
        let create = match client.call_tool_once(python(SLOW)).await.unwrap() {
            CallToolResponse::Task(create) => create,
            other => panic!("{era:?}: a task expected, got {other:?}"),
        };
        assert_eq!(
            create.task.status,
            TaskStatus::Working,
            "{era:?}: the task came before the call ended"
        );
        assert!(create.task.ttl_ms.is_some() && create.task.poll_interval_ms.is_some());
        let (task, messages) = follow(&client, &create.task.task_id, Duration::from_secs(60)).await;
        assert!(
            messages.iter().any(|m| m == "stdout: started"),
            "{era:?}: the status showed the output while it ran: {messages:?}"
        );
        let result = result_of(&task);
        assert_eq!(result.is_error, Some(false), "{era:?}: {result:?}");
        let out = result.structured_content.expect("structured content");
        assert_eq!(out["stdout"], "started\ndone\n", "{era:?}");
        assert_eq!(out["phase"], "Succeeded", "{era:?}");

        // The result stays for the client to fetch again.
        let again = client
            .peer()
            .get_task(GetTaskParams::new(create.task.task_id.clone()))
            .await
            .unwrap();
        assert_eq!(result_of(&again.task).structured_content, Some(out));
        client.cancel().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_task_stops_its_run_and_no_other_agent_reaches_it() {
    let server = start();
    for era in [Era::Discover] {
        let client = connect(&server, "analyst-01", era, true).await;
        let other = connect(&server, "ci-bot", era, true).await;
        let before = cancelled_calls(&server);
        let create = match client
            .call_tool_once(python("import time\ntime.sleep(120)"))
            .await
            .unwrap()
        {
            CallToolResponse::Task(create) => create,
            other => panic!("{era:?}: a task expected, got {other:?}"),
        };
        let id = create.task.task_id.clone();

        // Another agent is told the task does not exist, as for a made-up id, and stops nothing.
        let theirs = other
            .peer()
            .get_task(GetTaskParams::new(id.clone()))
            .await
            .unwrap_err()
            .to_string();
        let made_up = other
            .peer()
            .get_task(GetTaskParams::new("d0e1f2a3-0000-4000-8000-000000000000"))
            .await
            .unwrap_err()
            .to_string();
        assert!(theirs.contains("unknown task"), "{era:?}: {theirs}");
        assert_eq!(
            theirs.replace(&id, "ID"),
            made_up.replace("d0e1f2a3-0000-4000-8000-000000000000", "ID")
        );
        assert!(
            other
                .peer()
                .cancel_task(CancelTaskParams::new(id.clone()))
                .await
                .is_err()
        );
        let still = client
            .peer()
            .get_task(GetTaskParams::new(id.clone()))
            .await
            .unwrap();
        assert_eq!(still.task.status(), TaskStatus::Working, "{era:?}");

        // Its owner cancels it: the run stops at once, and is counted as cancelled.
        let asked = Instant::now();
        client
            .peer()
            .cancel_task(CancelTaskParams::new(id.clone()))
            .await
            .unwrap();
        let (task, _) = follow(&client, &id, Duration::from_secs(30)).await;
        assert_eq!(task.status(), TaskStatus::Cancelled, "{era:?}");
        assert!(asked.elapsed() < Duration::from_secs(20), "{era:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while cancelled_calls(&server) < before + 1.0 {
            assert!(
                Instant::now() < deadline,
                "{era:?}: the cancelled call was not counted"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And the agent's next call runs.
        match client
            .call_tool_once(python("print('next')"))
            .await
            .unwrap()
        {
            CallToolResponse::Complete(r) => assert_eq!(r.is_error, Some(false), "{era:?}"),
            other => panic!("{era:?}: a result expected, got {other:?}"),
        }
        client.cancel().await.unwrap();
        other.cancel().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn under_the_initialize_handshake_a_long_call_is_answered_on_its_request() {
    // The extension declared, as the MCP Inspector declares it in both eras.
    let server = start();
    let client = connect(&server, "analyst-01", Era::Initialize, true).await;
    match client.call_tool_once(python(SLOW)).await.unwrap() {
        CallToolResponse::Complete(r) => {
            assert_eq!(r.is_error, Some(false), "{r:?}");
            assert_eq!(r.structured_content.unwrap()["stdout"], "started\ndone\n");
        }
        other => panic!("the result on the request expected, got {other:?}"),
    }
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_without_tasks_gets_every_result_on_its_request() {
    let server = start();
    for era in ERAS {
        let client = connect(&server, "analyst-01", era, false).await;
        let result = client
            .call_tool(python(SLOW))
            .await
            .unwrap_or_else(|e| panic!("{era:?}: {e}"));
        assert_eq!(
            result.structured_content.unwrap()["stdout"],
            "started\ndone\n"
        );
        // tasks/* are refused to it, as the extension requires: it did not declare it.
        match client.peer().get_task(GetTaskParams::new("any")).await {
            Err(rmcp::ServiceError::McpError(e)) => {
                assert_eq!(
                    e.code.0, -32021,
                    "{era:?}: missing client capability: {e:?}"
                )
            }
            other => panic!("{era:?}: a refusal expected, got {other:?}"),
        }
        client.cancel().await.unwrap();
    }
}
