//! What the user sees when something outside the model's reach fails: one clear line on stderr
//! and a non-zero exit, never a panic or a backtrace. Also checks that the scripted model's own
//! checks are able to fail (a checker that accepts everything would prove nothing).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod common;

use common::scripted_model::{check_chunk, check_request, chunks};
use common::{Output, Reply, ScriptedModel, agent, run, sandbox_available, temp_dir};
use serde_json::json;

fn assert_one_line_failure(out: &Output, needle: &str) {
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "one line expected: {}", out.stderr);
    assert!(lines[0].starts_with("sandboxrun-agent: "), "{}", lines[0]);
    assert!(
        lines[0].contains(needle),
        "{:?} not in {}",
        needle,
        lines[0]
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[tokio::test]
async fn a_missing_api_key_is_one_line() {
    let home = temp_dir("nokey");
    let mut command = agent("http://127.0.0.1:9/v1", &home);
    command.env_remove("OPENAI_API_KEY").arg("anything");
    assert_one_line_failure(&run(command).await, "OPENAI_API_KEY is not set");
}

#[tokio::test]
async fn a_missing_mcp_server_is_one_line() {
    let home = temp_dir("noserver");
    let mut command = agent("http://127.0.0.1:9/v1", &home);
    command.args(["--server", "/nonexistent/sandboxrun-mcp", "anything"]);
    assert_one_line_failure(&run(command).await, "cannot start the MCP server");
}

#[tokio::test]
async fn an_unreachable_mcp_url_is_one_line() {
    let home = temp_dir("nomcp");
    let mut command = agent("http://127.0.0.1:9/v1", &home);
    command.args([
        "--url",
        &format!("http://127.0.0.1:{}/mcp", closed_port()),
        "anything",
    ]);
    assert_one_line_failure(&run(command).await, "check --url and that the server is up");
}

/// A port nothing listens on: bound, then closed.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn an_unreachable_endpoint_is_one_line() {
    if !sandbox_available().await {
        return;
    }
    let port = closed_port();
    let home = temp_dir("unreachable");
    let mut command = agent(&format!("http://127.0.0.1:{port}/v1"), &home);
    command.arg("anything");
    assert_one_line_failure(&run(command).await, "cannot reach the model endpoint");
}

#[tokio::test]
async fn a_rejected_api_key_is_one_line() {
    if !sandbox_available().await {
        return;
    }
    let model = ScriptedModel::start(|_| Reply::text("never")).await;
    let home = temp_dir("badkey");
    let mut command = agent(&model.base_url(), &home);
    command.env("OPENAI_API_KEY", "sk-wrong").arg("anything");
    let out = run(command).await;
    assert_one_line_failure(&out, "(401 Unauthorized)");
    assert!(
        out.stderr.contains("check OPENAI_API_KEY"),
        "{}",
        out.stderr
    );
    assert!(model.requests().is_empty());
}

#[test]
fn scripted_chunks_follow_the_api_reference_and_the_checker_can_fail() {
    for reply in [
        Reply::text("Hello, wörld: a longer answer in pieces"),
        Reply::Calls(vec![
            ("run_python".into(), r#"{"code": "print(1)"}"#.into()),
            ("execute_sql".into(), "{bad json".into()),
        ]),
        Reply::Hang,
    ] {
        for chunk in chunks("chatcmpl-1", "m", &reply) {
            check_chunk(&chunk).unwrap();
        }
    }
    let good = chunks("chatcmpl-1", "m", &Reply::text("x")).remove(1);
    for broken in [
        {
            let mut c = good.clone();
            c.as_object_mut().unwrap().remove("created");
            c
        },
        {
            let mut c = good.clone();
            c["object"] = json!("chat.completion");
            c
        },
        {
            let mut c = good.clone();
            c["choices"][0]["finish_reason"] = json!("done");
            c
        },
        {
            let mut c = good.clone();
            c["choices"][0]["delta"]["tool_calls"] = json!([{"id": "x", "type": "function"}]);
            c
        },
    ] {
        assert!(check_chunk(&broken).is_err(), "accepted: {broken}");
    }
}

#[test]
fn the_request_checker_enforces_tool_message_order() {
    let call =
        json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}});
    let request =
        |messages: serde_json::Value| json!({"model": "m", "stream": true, "messages": messages});
    check_request(&request(json!([
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ])))
    .unwrap();
    // An unanswered call, a stray tool message, no stream.
    assert!(
        check_request(&request(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "user", "content": "q2"},
        ])))
        .is_err()
    );
    assert!(
        check_request(&request(json!([
            {"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ])))
        .is_err()
    );
    assert!(
        check_request(&json!({"model": "m", "messages": [{"role": "user", "content": "q"}]}))
            .is_err()
    );
}
