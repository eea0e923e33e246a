//! The agent's loop end to end: the real binary, the scripted model over HTTP, the embedded
//! `sandboxrun-mcp stdio` (or `serve` over Streamable HTTP) running code in the local sandbox.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Reply, ScriptedModel, agent, run, sandbox_available, stdout_of, temp_dir};
use serde_json::{Value, json};
use sha2::Digest;

/// Python that prints a hash of a value only the test knows: the scripted model never computes
/// it, so an answer that contains it came from the sandbox.
fn hashing_code(nonce: &str) -> String {
    format!("import hashlib\nprint(hashlib.sha256(b'{nonce}').hexdigest())")
}

fn sha256_hex(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

fn nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[tokio::test]
async fn run_python_answer_carries_the_sandbox_output() {
    if !sandbox_available().await {
        return;
    }
    let nonce = nonce();
    let code = hashing_code(&nonce);
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": code})),
        _ => Reply::text(format!(
            "The SHA-256 is {}.",
            stdout_of(&turn.tool_result()).trim()
        )),
    })
    .await;
    let home = temp_dir("python");
    let mut command = agent(&model.base_url(), &home);
    command.arg("What is the SHA-256 of my secret?");
    let out = run(command).await.success();

    // Streamed to stdout, exactly the answer; nothing else there.
    assert_eq!(
        out.stdout,
        format!("The SHA-256 is {}.\n", sha256_hex(&nonce))
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    // The tools were offered with their MCP schemas.
    let tools = requests[0]["tools"].as_array().unwrap();
    let run_python = tools
        .iter()
        .find(|t| t["function"]["name"] == "run_python")
        .expect("run_python offered");
    assert_eq!(
        run_python["function"]["parameters"]["required"],
        json!(["code"])
    );
    assert!(
        run_python["function"]["description"]
            .as_str()
            .unwrap()
            .contains("sandbox")
    );
    let roles: Vec<&str> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert!(
        requests[1]["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("The tool server's instructions")
    );
}

#[tokio::test]
async fn json_transcript_records_the_run() {
    if !sandbox_available().await {
        return;
    }
    let model = ScriptedModel::start(|turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": "print(sum(range(1000)))"})),
        _ => Reply::text(format!(
            "The sum is {}",
            stdout_of(&turn.tool_result()).trim()
        )),
    })
    .await;
    let home = temp_dir("json");
    let mut command = agent(&model.base_url(), &home);
    command.args(["--json", "Sum", "0..999"]);
    let out = run(command).await.success();
    let t = out.transcript();
    assert_eq!(t["question"], "Sum 0..999");
    assert_eq!(t["model"], "scripted-model");
    assert_eq!(t["stop"], "answered");
    assert_eq!(t["answer"], "The sum is 499500");
    assert_eq!(t["steps"], 2);
    assert_eq!(t["thread"], Value::Null);
    let call = &t["toolCalls"][0];
    assert_eq!(call["name"], "run_python");
    assert_eq!(call["isError"], false);
    assert_eq!(call["rejected"], false);
    assert!(call["durationMs"].is_u64());
    assert_eq!(stdout_of(call["result"].as_str().unwrap()), "499500\n");
    let roles: Vec<&str> = t["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn a_tool_error_goes_back_and_the_retry_succeeds() {
    if !sandbox_available().await {
        return;
    }
    let nonce = nonce();
    let broken = format!("raise ValueError('wrong-{nonce}')");
    let expected_error = format!("ValueError: wrong-{nonce}");
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": broken})),
        1 => {
            // The model reads the error and fixes its code.
            let result = turn.tool_result();
            if result.contains(&expected_error) && result.starts_with("error") {
                Reply::call("run_python", json!({"code": "print(6*7)"}))
            } else {
                Reply::text(format!("no error reached me: {result}"))
            }
        }
        _ => Reply::text(format!(
            "Fixed; the answer is {}",
            stdout_of(&turn.tool_result()).trim()
        )),
    })
    .await;
    let home = temp_dir("retry");
    let mut command = agent(&model.base_url(), &home);
    command.args(["--json", "What is six times seven?"]);
    let t = run(command).await.success().transcript();
    assert_eq!(t["answer"], "Fixed; the answer is 42", "{t:#}");
    assert_eq!(t["toolCalls"][0]["isError"], true);
    assert_eq!(t["toolCalls"][0]["rejected"], false);
    assert_eq!(t["toolCalls"][1]["isError"], false);
    assert_eq!(t["steps"], 3);
    assert_eq!(model.requests().len(), 3);
}

#[tokio::test]
async fn the_step_limit_stops_a_looping_model() {
    if !sandbox_available().await {
        return;
    }
    // A model that never stops calling tools.
    let model = ScriptedModel::start(|turn| {
        Reply::call(
            "run_python",
            json!({"code": format!("print({})", turn.index)}),
        )
    })
    .await;
    let home = temp_dir("steps");
    let mut command = agent(&model.base_url(), &home);
    command.args(["--json", "--max-steps", "3", "Loop forever"]);
    let out = run(command).await;
    assert_eq!(out.code, Some(3), "{out:?}");
    assert!(out.stderr.contains("--max-steps"), "{}", out.stderr);
    let t = out.transcript();
    assert_eq!(t["stop"], "maxSteps");
    assert_eq!(t["answer"], Value::Null);
    assert_eq!(t["steps"], 3);
    assert_eq!(t["toolCalls"].as_array().unwrap().len(), 3);
    assert_eq!(model.requests().len(), 3, "no model call beyond the limit");
}

#[tokio::test]
async fn malformed_tool_calls_are_reported_to_the_model() {
    if !sandbox_available().await {
        return;
    }
    let model = ScriptedModel::start(|turn| match turn.index {
        0 => Reply::Calls(vec![
            // Cut-off JSON, a misspelt tool, arguments that are not an object, and one good call.
            ("run_python".into(), r#"{"code": "print(1)""#.into()),
            ("run_pyhton".into(), r#"{"code": "print(2)"}"#.into()),
            ("run_python".into(), "[1, 2]".into()),
            ("run_python".into(), r#"{"code": "print(5*5)"}"#.into()),
        ]),
        _ => {
            let results = turn.tool_results();
            let summary: Vec<String> = results.iter().map(|(_, text)| text.clone()).collect();
            Reply::text(serde_json::to_string(&summary).unwrap())
        }
    })
    .await;
    let home = temp_dir("malformed");
    let mut command = agent(&model.base_url(), &home);
    command.args(["--json", "Try some calls"]);
    let t = run(command).await.success().transcript();
    let results: Vec<String> = serde_json::from_str(t["answer"].as_str().unwrap()).unwrap();
    assert_eq!(results.len(), 4, "every call is answered: {results:?}");
    assert!(results[0].contains("not valid JSON"), "{}", results[0]);
    assert!(
        results[1].contains("no tool named `run_pyhton`") && results[1].contains("run_python"),
        "{}",
        results[1]
    );
    assert!(
        results[2].contains("must be a JSON object"),
        "{}",
        results[2]
    );
    assert_eq!(stdout_of(&results[3]), "25\n");
    let calls = t["toolCalls"].as_array().unwrap();
    let rejected: Vec<bool> = calls
        .iter()
        .map(|c| c["rejected"].as_bool().unwrap())
        .collect();
    assert_eq!(rejected, [true, true, true, false]);
    // The model's own (malformed) calls are kept verbatim in the history it is sent back.
    let requests = model.requests();
    let assistant = &requests[1]["messages"][2];
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"code": "print(1)""#
    );
    assert_eq!(assistant["tool_calls"][1]["function"]["name"], "run_pyhton");
}

/// A `sandboxrun-mcp serve` on a free loopback port with one API key.
struct HttpServer {
    child: tokio::process::Child,
    url: String,
}

impl HttpServer {
    async fn start(dir: &std::path::Path, key: &str) -> Self {
        let keys = dir.join("keys.yaml");
        std::fs::write(
            &keys,
            format!("- agent: agent-test\n  sha256: {}\n", sha256_hex(key)),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let child = tokio::process::Command::new(common::mcp_binary())
            .args(["serve", "--backend", "local", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--api-keys-file")
            .arg(&keys)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        for _ in 0..600 {
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await
                && r.status().is_success()
            {
                return Self {
                    child,
                    url: format!("{base}/mcp"),
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "sandboxrun-mcp serve did not become healthy: {}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
    }
}

#[tokio::test]
async fn remote_server_over_streamable_http_with_an_api_key() {
    if !sandbox_available().await {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let home = temp_dir("http");
    let key = format!("key-{}", nonce());
    let mut server = HttpServer::start(&home, &key).await;
    let nonce = nonce();
    let code = hashing_code(&nonce);
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": code})),
        _ => Reply::text(stdout_of(&turn.tool_result())),
    })
    .await;

    let mut command = agent(&model.base_url(), &home);
    command
        .env("SANDBOXRUN_API_KEY", &key)
        .args(["--url", &server.url, "Hash it remotely"]);
    let out = run(command).await.success();
    assert_eq!(out.stdout.trim(), sha256_hex(&nonce));

    // A wrong key: one clear line, non-zero exit, the model never asked.
    let before = model.requests().len();
    let mut command = agent(&model.base_url(), &home);
    command.env("SANDBOXRUN_API_KEY", "not-the-key").args([
        "--url",
        &server.url,
        "Hash it remotely",
    ]);
    let out = run(command).await;
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("SANDBOXRUN_API_KEY"), "{}", out.stderr);
    assert_eq!(model.requests().len(), before);
    let _ = server.child.kill().await;
}
