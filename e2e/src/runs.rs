//! Helpers for tests that drive the operator through `SandboxRun` resources.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::Phase;

/// Where the chart makes the operator watch for runs.
pub const RUNS_NAMESPACE: &str = "sandboxrun-runs";
/// Where the chart installs the operator.
pub const SYSTEM_NAMESPACE: &str = "sandboxrun-system";

/// The SandboxRun API of the runs namespace.
pub fn runs(client: &Client) -> Api<SandboxRun> {
    Api::namespaced(client.clone(), RUNS_NAMESPACE)
}

/// A Python run named `name` (made unique) with the given extra spec fields merged in.
pub fn python_run(name: &str, code: &str, extra_spec: serde_json::Value) -> SandboxRun {
    let mut spec = serde_json::json!({ "agent": "e2e", "python": { "code": code } });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": { "name": crate::unique_name(name) },
        "spec": spec,
    }))
    .expect("test SandboxRun is valid")
}

/// Creates the run and returns its name.
pub async fn create(client: &Client, run: &SandboxRun) -> Result<String> {
    let created = runs(client).create(&PostParams::default(), run).await?;
    Ok(created.name_any())
}

/// The run's phase, if it has one.
pub fn run_phase(run: &SandboxRun) -> Option<Phase> {
    run.status.as_ref().and_then(|s| s.phase)
}

/// Waits until the run reaches a terminal phase and returns it.
pub async fn wait_terminal(client: &Client, name: &str, timeout: Duration) -> Result<SandboxRun> {
    wait_for(client, name, timeout, |phase| phase.is_terminal()).await
}

/// Waits until the run's phase satisfies `pred`.
pub async fn wait_for(
    client: &Client,
    name: &str,
    timeout: Duration,
    pred: impl Fn(Phase) -> bool,
) -> Result<SandboxRun> {
    let cond = move |run: Option<&SandboxRun>| run.and_then(run_phase).is_some_and(&pred);
    let run = tokio::time::timeout(timeout, await_condition(runs(client), name, cond))
        .await
        .with_context(|| {
            format!("run {name} did not reach the expected phase within {timeout:?}")
        })??;
    run.with_context(|| format!("run {name} disappeared"))
}

/// Pods that belong to the run (by the operator's label), whatever their state.
pub async fn pods_of(client: &Client, name: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), RUNS_NAMESPACE);
    let lp = ListParams::default().labels(&format!("sandboxrun.dev/run={name}"));
    Ok(pods.list(&lp).await?.items)
}

/// Waits until no Pod of the run exists.
pub async fn wait_no_pods(client: &Client, name: &str, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = pods_of(client, name).await?;
        if left.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "run {name} still has pods after {timeout:?}: {:?}",
                left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Operator Pods by name, with their uid and total restart count: a change means an operator
/// was replaced or restarted.
pub async fn operator_pods(
    client: &Client,
) -> Result<std::collections::BTreeMap<String, (String, i32)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    Ok(pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map(|cs| cs.iter().map(|c| c.restart_count).sum())
                .unwrap_or(0);
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect())
}

/// The sum over the operator's Pods of the Prometheus series `series` (a metric name with its
/// labels, exactly as the operator exports it, e.g. `sandboxrun_warm_handovers_total{stream="held"}`),
/// read through the API server's proxy to each Pod's metrics port; a Pod without it counts 0.
pub async fn operator_metric(client: &Client, series: &str) -> Result<f64> {
    let mut sum = 0.0;
    for name in operator_pods(client).await?.keys() {
        let request = http::Request::get(format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods/{name}:8080/proxy/metrics"
        ))
        .body(Vec::new())?;
        let Ok(text) = client.request_text(request).await else {
            // A Pod starting or stopping: its count is not there to read.
            continue;
        };
        sum += text
            .lines()
            .filter_map(|l| l.strip_prefix(series))
            .filter_map(|rest| rest.trim().parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(sum)
}
