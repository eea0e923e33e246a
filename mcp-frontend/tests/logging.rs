//! What a run prints reaches the client while it runs, as the client asked: log messages
//! (`notifications/message`) to a client that asked for a log level (per request in the stateless
//! 2026-07-28 revision, with `logging/setLevel` in a 2025-11-25 session), else progress
//! notifications to a request with a progress token, and nothing to a request that asked for
//! neither. Raw HTTP against the `sandboxrun-mcp serve` binary running real code in the local
//! sandbox (the sandbox-python root file system must be built: images/build.sh).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-mcp");
const KEY: &str = "key-logging-test";

/// Prints on both streams, with a pause, so that the output is streamed before the result.
const CODE: &str = "import sys, time\nprint('out-line', flush=True)\nprint('err-line', file=sys.stderr, flush=True)\ntime.sleep(0.5)\n";

struct Server {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server of test `name`'s own.
fn start(name: &str) -> Server {
    let dir =
        std::env::temp_dir().join(format!("sandboxrun-logging-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut hash = Command::new(BIN)
        .arg("hash-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    hash.stdin
        .take()
        .unwrap()
        .write_all(KEY.as_bytes())
        .unwrap();
    let sha = String::from_utf8(hash.wait_with_output().unwrap().stdout).unwrap();
    let keys = dir.join("keys.yaml");
    std::fs::write(
        &keys,
        format!("- agent: logging\n  sha256: {}\n", sha.trim()),
    )
    .unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--api-keys-file")
        .arg(&keys)
        .args(["--backend", "local", "--armed-sandboxes", "0"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the server did not listen: {}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Server { child, port, dir }
}

/// One POST to /mcp as HTTP/1.0 (so the answer, an event stream or JSON, ends when the server
/// closes it): the response head and the JSON-RPC messages of its body.
fn post(server: &Server, headers: &[(&str, &str)], body: &Value) -> (String, Vec<Value>) {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let body = body.to_string();
    let mut request = format!(
        "POST /mcp HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n",
        server.port,
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let messages = if body.trim_start().starts_with('{') {
        vec![serde_json::from_str(body).unwrap()]
    } else {
        body.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect()
    };
    (head.to_owned(), messages)
}

/// `tools/call run_python` of the stateless revision with `extra` in its `_meta`.
fn call_stateless(server: &Server, extra: Value) -> Vec<Value> {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "logging-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    meta.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let body = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": CODE}, "_meta": meta}});
    let headers = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "run_python"),
    ];
    let (head, messages) = post(server, &headers, &body);
    assert!(head.contains(" 200 "), "{head}");
    let result = messages.iter().find(|m| m["id"] == 3).expect("the result");
    assert_eq!(result["result"]["isError"], false, "{result}");
    messages
}

fn method<'a>(messages: &'a [Value], name: &str) -> Vec<&'a Value> {
    messages.iter().filter(|m| m["method"] == name).collect()
}

#[test]
fn output_goes_as_log_messages_only_to_a_client_that_asked_for_a_level() {
    let server = start("stateless");

    // Asked for info: both streams, stdout at info and stderr at warning, under the run's name.
    let messages = call_stateless(&server, json!({"io.modelcontextprotocol/logLevel": "info"}));
    let logs = method(&messages, "notifications/message");
    let line = |stream: &str| {
        logs.iter()
            .find(|m| m["params"]["data"]["stream"] == stream)
            .unwrap_or_else(|| panic!("no {stream} log message in {messages:?}"))
    };
    assert_eq!(line("stdout")["params"]["level"], "info");
    assert!(
        line("stdout")["params"]["data"]["text"]
            .as_str()
            .unwrap()
            .contains("out-line")
    );
    assert_eq!(line("stderr")["params"]["level"], "warning");
    assert!(
        line("stderr")["params"]["data"]["text"]
            .as_str()
            .unwrap()
            .contains("err-line")
    );

    // Asked for errors only: neither stream is that severe.
    let messages = call_stateless(
        &server,
        json!({"io.modelcontextprotocol/logLevel": "error"}),
    );
    assert_eq!(
        method(&messages, "notifications/message"),
        Vec::<&Value>::new()
    );

    // No level, a progress token: the output as progress, no log message.
    let messages = call_stateless(&server, json!({"progressToken": "p-1"}));
    assert_eq!(
        method(&messages, "notifications/message"),
        Vec::<&Value>::new()
    );
    let progress = method(&messages, "notifications/progress");
    assert!(
        progress.iter().any(|m| m["params"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("out-line")),
        "{messages:?}"
    );

    // Neither: no notification at all.
    let messages = call_stateless(&server, json!({}));
    assert!(
        messages.iter().all(|m| m.get("method").is_none()),
        "{messages:?}"
    );
}

/// Opens the session's standalone stream (GET /mcp), where rmcp sends a session's log messages;
/// the messages it carries arrive on the returned channel.
fn standalone_stream(server: &Server, session: &str) -> std::sync::mpsc::Receiver<Value> {
    use std::io::BufRead as _;
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let request = format!(
        "GET /mcp HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {KEY}\r\n\
         Accept: text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\n\r\n",
        server.port
    );
    stream.write_all(request.as_bytes()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            if let Some(message) = line
                .strip_prefix("data:")
                .and_then(|data| serde_json::from_str::<Value>(data.trim()).ok())
                && tx.send(message).is_err()
            {
                return;
            }
        }
    });
    rx
}

#[test]
fn a_session_gets_log_messages_at_the_level_it_set() {
    let server = start("session");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "logging-test", "version": "1"}}});
    let (head, _) = post(&server, &[], &init);
    let session = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(name, _)| name.eq_ignore_ascii_case("mcp-session-id"))
                .map(|(_, value)| value.trim().to_owned())
        })
        .expect("a session id");
    let in_session = [
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (head, _) = post(&server, &in_session, &initialized);
    assert!(head.contains(" 202 "), "{head}");
    let standalone = standalone_stream(&server, &session);
    let call = |marker: &str| {
        let code = format!(
            "import sys, time\nprint('out-{marker}', flush=True)\n\
             print('err-{marker}', file=sys.stderr, flush=True)\ntime.sleep(0.5)\n"
        );
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "run_python", "arguments": {"code": code}, "_meta": {"progressToken": "p"}}})
    };

    // Before setLevel: the output as progress, no log message.
    let (_, messages) = post(&server, &in_session, &call("before"));
    assert_eq!(
        method(&messages, "notifications/message"),
        Vec::<&Value>::new()
    );
    assert!(
        method(&messages, "notifications/progress")
            .iter()
            .any(|m| m["params"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("out-before")),
        "{messages:?}"
    );

    let set = json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel",
        "params": {"level": "warning"}});
    let (_, answer) = post(&server, &in_session, &set);
    assert_eq!(answer[0]["result"], json!({}), "{answer:?}");

    // At warning: stderr as a log message (on the session's stream), stdout still as progress.
    let (_, messages) = post(&server, &in_session, &call("after"));
    assert!(
        method(&messages, "notifications/progress")
            .iter()
            .any(|m| m["params"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("out-after")),
        "{messages:?}"
    );
    let log = standalone
        .recv_timeout(Duration::from_secs(30))
        .expect("a log message on the session's stream");
    assert_eq!(log["method"], "notifications/message", "{log}");
    assert_eq!(log["params"]["level"], "warning", "{log}");
    assert_eq!(log["params"]["data"]["stream"], "stderr", "{log}");
    assert!(
        log["params"]["data"]["text"]
            .as_str()
            .unwrap()
            .contains("err-after"),
        "{log}"
    );
    // Nothing of the call made before the level was set, and no stdout.
    while let Ok(more) = standalone.recv_timeout(Duration::from_millis(500)) {
        assert_eq!(more["params"]["data"]["stream"], "stderr", "{more}");
        assert!(!more.to_string().contains("before"), "{more}");
    }
}
