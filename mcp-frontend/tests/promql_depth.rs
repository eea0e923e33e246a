//! Hostile PromQL through the real entry point: `sandboxrun-mcp stdio --enable-metrics` (the
//! embedded server) gets fetch_metrics calls whose queries nest tens of thousands of levels
//! deep, in every way PromQL nests. Each is refused with a message that says how deep is allowed
//! and what to change, and the same process then answers a valid query. Before the depth bound,
//! one such call (a run of signs, which has no brackets) aborted the process: the parser built a
//! tree tens of thousands of nodes deep and dropping it overflowed the async worker's stack.
//!
//! Only fetch_metrics is called, but the server checks its local sandbox at start-up: the
//! sandbox-python root file system must be built (images/build.sh; `SANDBOXRUN_ROOTFS` names
//! another place). The same through the pipeline in-process, without a sandbox, is
//! `server::tests::deep_promql_is_refused_and_the_server_keeps_answering`.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-mcp");
/// The embedded store's counter.
const METRIC: &str = "sandboxrun_tool_calls_total";
/// How long an answer may take before the test gives up on the server (a bound on a hang, not
/// an expectation of speed: answers come in milliseconds).
const PATIENCE: Duration = Duration::from_secs(120);

/// A `sandboxrun-mcp stdio` process and its protocol lines.
struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    next_id: u64,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Self {
        let mut child = Command::new(BIN)
            .args([
                "stdio",
                "--backend",
                "local",
                "--enable-metrics",
                "--armed-sandboxes",
                "0",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        let mut server = Self {
            child,
            stdin,
            lines,
            next_id: 1,
        };
        let init = server.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "promql-depth", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "sandboxrun", "{init}");
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and waits for its response (notifications in between are skipped).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => {
                    let status = self.child.try_wait().unwrap();
                    panic!("no answer to {method} ({e}); the server's exit status: {status:?}")
                }
            };
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// A fetch_metrics call: whether it failed, and its text.
    fn fetch(&mut self, query: &str) -> (bool, String, Value) {
        let r = self.request(
            "tools/call",
            json!({"name": "fetch_metrics", "arguments": {"query": query}}),
        );
        let result = &r["result"];
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        (
            result["isError"] == json!(true),
            text,
            result["structuredContent"].clone(),
        )
    }

    fn is_up(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

fn nest(open: &str, inner: &str, close: &str, n: usize) -> String {
    format!("{}{inner}{}", open.repeat(n), close.repeat(n))
}

#[test]
fn deep_promql_is_refused_and_the_server_keeps_answering() {
    let mut server = Server::start();
    let m = METRIC;
    // The 100,000-operator chain of the issue (over the size limit), and each way of nesting
    // with as many levels as fit in 64 KiB.
    let hostile = [
        ("100,000 signs", format!("{}{m}", "- ".repeat(100_000))),
        ("signs without spaces", format!("{}{m}", "-".repeat(60_000))),
        ("signs on a number", format!("{}1", "-".repeat(60_000))),
        ("plus signs", format!("{}{m}", "+".repeat(60_000))),
        (
            "signs between comments and newlines",
            format!("{}{m}", "-#\n+\n".repeat(12_000)),
        ),
        ("signs in parentheses", nest("-(", m, ")", 20_000)),
        ("parentheses", nest("(", m, ")", 30_000)),
        ("a left-deep sum", format!("1{}", "+1".repeat(30_000))),
        ("a mixed chain", format!("1{}", " + -1 * -1".repeat(6_000))),
        ("a right-deep power", format!("{}{m}", "2^".repeat(30_000))),
        ("function calls", nest("abs(", m, ")", 12_000)),
        ("aggregations", nest("sum(", m, ")", 12_000)),
        (
            "grouped aggregations",
            nest("sum by (tool) (", m, ")", 3_000),
        ),
        ("subqueries", format!("{m}{}", "[5m:1m]".repeat(9_000))),
        ("calls over subqueries", nest("rate(", m, "[5m:1m])", 3_000)),
        ("@ modifiers", format!("{m}{}", " @ 100".repeat(10_000))),
    ];
    let mut slowest = Duration::ZERO;
    for (name, q) in &hostile {
        let started = Instant::now();
        let (failed, text, _) = server.fetch(q);
        let took = started.elapsed();
        slowest = slowest.max(took);
        println!("{name} ({} bytes): refused in {took:?}: {text}", q.len());
        assert!(failed, "{name}: {text}");
        assert!(
            text.contains("passes 64 levels, the most accepted")
                || text.contains("at most 65536 are accepted"),
            "{name}: {text}"
        );
        assert!(server.is_up(), "{name}: the server exited");
    }
    // A generous bound (a debug build on a busy machine); the release binary takes a few
    // milliseconds. No test may depend on how fast the machine is: this only catches the work
    // becoming quadratic again.
    assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    // The message says what to change.
    let (_, text, _) = server.fetch(&format!("{}{m}", "-".repeat(100)));
    assert!(text.contains("at line 1, column 64 (at `-`)"), "{text}");
    assert!(text.contains("Remove repeated signs"), "{text}");
    // The same process answers a valid query (the calls above were counted).
    let (failed, text, out) = server.fetch(&format!("sum({m}{{tool=\"fetch_metrics\"}})"));
    assert!(!failed, "{text}");
    let count: f64 = out["result"][0]["value"][1]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(count >= hostile.len() as f64, "{out}");
    // And a deep but accepted one: 60 signs.
    let (failed, text, _) = server.fetch(&format!("{}{m}", "- ".repeat(60)));
    assert!(!failed, "{text}");
    assert!(server.is_up());
}
