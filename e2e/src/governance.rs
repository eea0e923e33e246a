//! Helpers for tests of the operator's policy gate: runs in a given environment, approvals,
//! decisions, Events and the operator's audit lines.

use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::{Api, ListParams, LogParams, Patch, PatchParams};
use sandboxrun_api::{Decision, SandboxRun};

use crate::runs::{RUNS_NAMESPACE, SYSTEM_NAMESPACE, python_run, runs};

/// A Python run of agent `e2e` in `environment`, with the given extra spec fields.
pub fn python_run_in(
    name: &str,
    environment: &str,
    code: &str,
    mut extra: serde_json::Value,
) -> SandboxRun {
    if let Some(obj) = extra.as_object_mut() {
        obj.insert("environment".to_owned(), environment.into());
    }
    python_run(name, code, extra)
}

/// Sets `spec.approval` like the documented `kubectl patch --type merge` one-liner: the decision
/// and the client's own name as the one who made it.
pub async fn set_approval(client: &Client, name: &str, approved: bool) -> Result<()> {
    let by = crate::identity::whoami(client).await?;
    let patch = serde_json::json!({ "spec": { "approval": { "approved": approved, "by": by } } });
    runs(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The decision recorded in the run's status.
pub fn decision(run: &SandboxRun) -> Option<Decision> {
    run.status.as_ref().and_then(|s| s.decision.clone())
}

/// Reasons of the Events about the run, oldest first.
pub async fn event_reasons(client: &Client, name: &str) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.name={name},involvedObject.kind=SandboxRun"
    ));
    let mut items = events.list(&lp).await?.items;
    items.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    Ok(items.into_iter().filter_map(|e| e.reason).collect())
}

/// Waits until the run has an Event with each of `reasons`.
pub async fn wait_events(
    client: &Client,
    name: &str,
    reasons: &[&str],
    timeout: Duration,
) -> Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = event_reasons(client, name).await?;
        if reasons.iter().all(|r| seen.iter().any(|s| s == r)) {
            return Ok(seen);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("run {name}: expected events {reasons:?}, saw {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `fields` of the operator's JSON audit lines about the run (target `audit`), from the logs
/// of every operator Pod.
pub async fn audit_lines(client: &Client, run: &str) -> Result<Vec<serde_json::Value>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    let mut lines = Vec::new();
    for pod in pods.list(&lp).await?.items {
        let name = pod.metadata.name.unwrap_or_default();
        let log = pods.logs(&name, &LogParams::default()).await?;
        for line in log.lines() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if entry["target"] == "audit" && entry["fields"]["run"] == run {
                lines.push(entry["fields"].clone());
            }
        }
    }
    Ok(lines)
}

/// Exactly one audit line about the run, which follows its terminal status closely.
pub async fn the_audit_line(client: &Client, run: &str) -> Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while audit_lines(client, run).await?.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A duplicate would follow the first line closely.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut lines = audit_lines(client, run).await?;
    if lines.len() != 1 {
        bail!("run {run}: expected exactly one audit line, found {lines:?}");
    }
    Ok(lines.remove(0))
}
