//! `sandboxrun-agent` against the frontend in the cluster, over Streamable HTTP with an API key:
//! the model is the agent crate's scripted OpenAI-compatible server (on this machine), the tool
//! calls become SandboxRuns that the operator runs in gVisor Pods.
//!
//! Environment (set by e2e/run-tests.sh): `MCP_URL` (the frontend's NodePort, e.g.
//! http://10.244.0.1:30080/mcp), `MCP_API_KEY`, `MCP_AGENT` (the key's agent), `KUBECONFIG`. The
//! agent binary is target/debug/sandboxrun-agent (`cargo build -p sandboxrun-agent`).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

#[path = "../../agent/tests/common/scripted_model.rs"]
mod scripted_model;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use sandboxrun_e2e::client;
use sandboxrun_e2e::runs::runs;
use scripted_model::{API_KEY, Reply, ScriptedModel};
use serde_json::{Value, json};
use sha2::Digest;

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!(
            "{name} is not set: install the frontend with e2e/install.sh (flags as in \
             e2e/run-tests.sh) and export MCP_URL, MCP_API_KEY and MCP_AGENT"
        )
    })
}

/// The agent binary next to this test's build directory (target/debug).
fn agent_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target directory")?
        .join("sandboxrun-agent");
    ensure!(
        path.is_file(),
        "{} is missing: cargo build -p sandboxrun-agent",
        path.display()
    );
    Ok(path)
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn run_agent(model: &ScriptedModel, api_key: &str, args: &[&str]) -> Result<Output> {
    let home = std::env::temp_dir().join(format!(
        "sandboxrun-e2e-agent-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(agent_binary()?)
            .env_remove("SANDBOXRUN_MCP_URL")
            .env_remove("SANDBOXRUN_AGENT_STATE_URL")
            .env_remove("RUST_LOG")
            .env("OPENAI_API_KEY", API_KEY)
            .env("OPENAI_BASE_URL", model.base_url())
            .env("SANDBOXRUN_API_KEY", api_key)
            .env("XDG_DATA_HOME", &home)
            .args(["--model", "scripted-model", "--url", &env("MCP_URL")?])
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the agent did not finish within 300 s")??;
    let _ = std::fs::remove_dir_all(&home);
    Ok(Output {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// The `stdout` field of a run_python result (JSON after an optional sentence).
fn stdout_of(result: &str) -> String {
    let start = result.find('{').unwrap_or(0);
    serde_json::Deserializer::from_str(&result[start..])
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .and_then(|v| v["stdout"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test]
async fn the_agent_answers_through_the_cluster_frontend() -> Result<()> {
    let api_key = env("MCP_API_KEY")?;
    let agent = env("MCP_AGENT")?;
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let code = format!("import hashlib\nprint(hashlib.sha256(b'{nonce}').hexdigest())");
    let expected = hex::encode(sha2::Sha256::digest(nonce.as_bytes()));
    let model = ScriptedModel::start(move |turn| match turn.index {
        0 => Reply::call("run_python", json!({"code": code})),
        // A failing call first is not needed here: the retry path is the same code as in the
        // agent's own tests; this checks the remote transport and the cluster's results.
        _ => Reply::text(format!(
            "The hash is {}",
            stdout_of(&turn.tool_result()).trim()
        )),
    })
    .await;

    // Right after an install the NodePort can briefly lead to the Pod being replaced: retry a
    // refused connection (the model is only asked once the MCP session exists).
    let mut out = run_agent(&model, &api_key, &["--json", "Hash my secret"]).await?;
    for _ in 0..10 {
        if !out.stderr.contains("error sending request") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        out = run_agent(&model, &api_key, &["--json", "Hash my secret"]).await?;
    }
    ensure!(
        out.code == Some(0),
        "agent failed ({:?}): {}\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let transcript: Value = serde_json::from_str(&out.stdout)?;
    ensure!(
        transcript["answer"] == format!("The hash is {expected}"),
        "{transcript:#}"
    );
    ensure!(model.requests().len() == 2);

    // The call became a SandboxRun of this key's agent, which the operator ran to success.
    let client = client().await?;
    let list = runs(&client).list(&Default::default()).await?;
    let run = list
        .items
        .iter()
        .find(|r| {
            r.spec
                .python
                .as_ref()
                .is_some_and(|p| p.code.contains(&nonce))
        })
        .context("no SandboxRun carries the agent's code")?;
    ensure!(run.spec.agent == agent, "agent {:?}", run.spec.agent);
    ensure!(
        run.status.as_ref().and_then(|s| s.phase) == Some(sandboxrun_core::Phase::Succeeded),
        "{:?}",
        run.status
    );

    // A key the frontend does not know: one clear line, exit 1, the model never asked.
    let before = model.requests().len();
    let out = run_agent(&model, "not-a-valid-key", &["Hash my secret"]).await?;
    if out.code != Some(1) || out.stderr.trim().lines().count() != 1 {
        bail!(
            "expected one line and exit 1: {:?} {}",
            out.code,
            out.stderr
        );
    }
    ensure!(out.stderr.contains("SANDBOXRUN_API_KEY"), "{}", out.stderr);
    ensure!(model.requests().len() == before);
    Ok(())
}
