//! MCP tasks on the cluster: the official Rust SDK's client (rmcp), declaring the tasks
//! extension, calls execute_sql in `production` through the frontend's NodePort. Policy
//! (e2e/values-governance.yaml) escalates the query to a person, and the frontend's approval wait
//! (20 s) is over long before anyone decides: a held request would have come back "awaiting
//! approval". As a task the call follows the approval instead: `tasks/get` names the run a person
//! must approve, the task is still working after the approval wait, and once the run is approved
//! it completes with the query's rows. One SandboxRun and one audit line, as for any call.
//!
//! Environment (set by e2e/run-tests.sh): `MCP_URL`, `MCP_API_KEY`, `MCP_AGENT`.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use sandboxrun_e2e::client;
use sandboxrun_e2e::governance::{set_approval, the_audit_line};
use sandboxrun_e2e::runs::runs;
use serde_json::json;

/// From e2e/values-governance.yaml.
const APPROVAL_WAIT: Duration = Duration::from_secs(20);
const PRODUCTION_RULE: &str = "e2e-sql-production-needs-approval";

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: run the suite with e2e/run-tests.sh (it installs the frontend)")
    })
}

#[tokio::test]
async fn an_approval_wait_is_followed_as_a_task_past_the_frontends_approval_wait() -> Result<()> {
    let (url, key, agent) = (env("MCP_URL")?, env("MCP_API_KEY")?, env("MCP_AGENT")?);
    let kube = client().await?;
    // The tree's one rustls provider (ring): reqwest wants one installed before any client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(key),
    );
    let mcp = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("e2e-tasks", "1"),
    )
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await?;

    let marker = format!("task-{}", uuid::Uuid::new_v4().simple());
    let query = format!("/* {marker} */ SELECT id, amount FROM ledger WHERE id <= 2 ORDER BY id");
    let started = Instant::now();
    let args = json!({"database": "analytics", "query": query, "environment": "production"});
    let create = match mcp
        .call_tool_once(
            CallToolRequestParams::new("execute_sql")
                .with_arguments(args.as_object().unwrap().clone()),
        )
        .await?
    {
        CallToolResponse::Task(create) => create,
        other => bail!("a task expected for a call awaiting approval, got {other:?}"),
    };
    let id = create.task.task_id.clone();

    // The status names the run a person must approve; the task outlives the approval wait.
    let mut run_name = None;
    loop {
        let got = mcp.peer().get_task(GetTaskParams::new(id.clone())).await?;
        ensure!(
            got.task.status() == TaskStatus::Working,
            "the task ended before any decision: {got:?}"
        );
        if run_name.is_none() {
            run_name = got
                .task
                .task
                .status_message
                .as_deref()
                .and_then(|m| m.strip_prefix("AwaitingApproval: "))
                .and_then(|m| m.split_whitespace().next())
                .map(str::to_owned);
        }
        if run_name.is_some() && started.elapsed() > APPROVAL_WAIT + Duration::from_secs(5) {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(40),
            "no AwaitingApproval status: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let run_name = run_name.unwrap();
    let run = runs(&kube).get(&run_name).await?;
    ensure!(
        run.spec
            .sql
            .as_ref()
            .is_some_and(|s| s.query.contains(&marker)),
        "the task names this call's run: {run_name}"
    );

    set_approval(&kube, &run_name, true).await?;
    let task = loop {
        let got = mcp.peer().get_task(GetTaskParams::new(id.clone())).await?;
        if got.task.status().is_terminal() {
            break got.task;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the approved run did not finish"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let result: CallToolResult = match task.payload {
        TaskPayload::Completed { result } => serde_json::from_value(result.into())?,
        other => bail!("a completed task expected, got {other:?}"),
    };
    ensure!(result.is_error == Some(false), "{result:?}");
    let out = result.structured_content.context("structured content")?;
    ensure!(out["runName"] == run_name.as_str(), "{out}");
    ensure!(
        out["verdict"] == "Escalate"
            && out["rule"] == PRODUCTION_RULE
            && out["phase"] == "Succeeded",
        "{out}"
    );
    ensure!(
        out["rows"] == json!([[1, "-420.81"], [2, "-341.62"]]),
        "{out}"
    );

    // One run for the call, and one audit line.
    let all = runs(&kube).list(&Default::default()).await?;
    let mine: Vec<_> = all
        .items
        .iter()
        .filter(|r| {
            r.spec
                .sql
                .as_ref()
                .is_some_and(|s| s.query.contains(&marker))
        })
        .collect();
    ensure!(mine.len() == 1, "{} runs for one call", mine.len());
    let line = the_audit_line(&kube, &run_name).await?;
    ensure!(
        line["agent"] == agent.as_str() && line["approved"] == true && line["phase"] == "Succeeded",
        "{line}"
    );
    mcp.cancel().await?;
    Ok(())
}
