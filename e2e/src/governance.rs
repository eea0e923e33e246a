//! Helpers for tests of the operator's policy gate: runs in a given environment, approvals,
//! decisions and Events.

use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use sandboxrun_api::{Decision, SandboxRun};

use crate::runs::{RUNS_NAMESPACE, python_run, runs};

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

/// Sets `spec.approval.approved` like the documented `kubectl patch --type merge` one-liner.
pub async fn set_approval(client: &Client, name: &str, approved: bool) -> Result<()> {
    let patch = serde_json::json!({ "spec": { "approval": { "approved": approved } } });
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
