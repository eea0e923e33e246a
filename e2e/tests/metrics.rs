//! metrics runs (fetch_metrics in a cluster), executed by the operator against a real Prometheus.
//!
//! run-tests.sh starts a Prometheus on the node's bridge address (reachable from the operator's
//! Pod), installs the chart with `operator.prometheus.url` pointing at it and exports
//! `SANDBOXRUN_E2E_PROMETHEUS_URL`. Without that variable these tests are skipped with a note,
//! unless `SANDBOXRUN_REQUIRE_PROMETHEUS=1`, where they fail. Runs are created directly, as
//! `kubectl apply` would: the operator judges them with the chart's default policy (metrics allowed
//! in `sandbox` and `staging`, escalated in `production`).

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use anyhow::{Result, ensure};
use sandboxrun_api::SandboxRun;
use sandboxrun_core::{Phase, Verdict};
use sandboxrun_e2e::client;
use sandboxrun_e2e::governance::decision;
use sandboxrun_e2e::runs::*;
use serde_json::json;

const RUN_TIMEOUT: Duration = Duration::from_secs(90);

fn prometheus_configured() -> bool {
    match std::env::var("SANDBOXRUN_E2E_PROMETHEUS_URL") {
        Ok(url) if !url.trim().is_empty() => true,
        _ => {
            if std::env::var("SANDBOXRUN_REQUIRE_PROMETHEUS").as_deref() == Ok("1") {
                panic!(
                    "SANDBOXRUN_REQUIRE_PROMETHEUS=1 but SANDBOXRUN_E2E_PROMETHEUS_URL is not set: \
                     start a Prometheus on the node address (SANDBOXRUN_PROM_LISTEN=10.244.0.1 \
                     e2e/prometheus/start.sh) and install with --set operator.prometheus.url=<it>"
                );
            }
            eprintln!("note: skipping metrics e2e test: SANDBOXRUN_E2E_PROMETHEUS_URL is not set");
            false
        }
    }
}

/// A metrics run of agent `e2e` in `environment` with the given `spec.metrics`.
fn metrics_run(name: &str, environment: &str, metrics: serde_json::Value) -> SandboxRun {
    serde_json::from_value(json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": { "name": sandboxrun_e2e::unique_name(name) },
        "spec": { "agent": "e2e", "environment": environment, "metrics": metrics },
    }))
    .expect("test SandboxRun is valid")
}

#[tokio::test]
async fn an_instant_query_returns_prometheus_samples() -> Result<()> {
    if !prometheus_configured() {
        return Ok(());
    }
    let client = client().await?;
    let run = metrics_run("e2e-metrics-up", "sandbox", json!({"query": "up"}));
    let name = create(&client, &run).await?;
    let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(run_phase(&run) == Some(Phase::Succeeded), "{st:?}");
    ensure!(
        decision(&run).is_some_and(|d| d.verdict == Verdict::Allow),
        "{st:?}"
    );
    ensure!(st.pod_name.is_none(), "a metrics run needs no Pod: {st:?}");
    let result = st.result.clone().unwrap_or_default();
    ensure!(result["resultType"] == "vector", "{result}");
    let own = result["result"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["metric"]["job"] == "prometheus");
    ensure!(
        own.is_some_and(|s| s["value"][1] == "1"),
        "no up{{job=\"prometheus\"}} = 1 in {result}"
    );
    Ok(())
}

#[tokio::test]
async fn a_range_query_returns_a_matrix() -> Result<()> {
    if !prometheus_configured() {
        return Ok(());
    }
    let client = client().await?;
    let end = jiff::Timestamp::now();
    let start = end - jiff::SignedDuration::from_secs(20);
    let run = metrics_run(
        "e2e-metrics-range",
        "staging",
        json!({"query": "up{job=\"prometheus\"}",
               "range": {"start": start.to_string(), "end": end.to_string(), "step": "5s"}}),
    );
    let name = create(&client, &run).await?;
    let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(run_phase(&run) == Some(Phase::Succeeded), "{st:?}");
    let result = st.result.clone().unwrap_or_default();
    ensure!(result["resultType"] == "matrix", "{result}");
    let values = result["result"][0]["values"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(!values.is_empty(), "{result}");
    Ok(())
}

#[tokio::test]
async fn invalid_promql_fails_with_its_position() -> Result<()> {
    if !prometheus_configured() {
        return Ok(());
    }
    let client = client().await?;
    let run = metrics_run(
        "e2e-metrics-bad",
        "sandbox",
        json!({"query": "sum(rate(up[5m])) by job"}),
    );
    let name = create(&client, &run).await?;
    let run = wait_terminal(&client, &name, RUN_TIMEOUT).await?;
    let st = run.status.clone().unwrap_or_default();
    ensure!(run_phase(&run) == Some(Phase::Failed), "{st:?}");
    ensure!(st.reason.as_deref() == Some("InvalidQuery"), "{st:?}");
    ensure!(
        st.message
            .as_deref()
            .is_some_and(|m| m.contains("line 1, column 22 (at `job`)")),
        "{st:?}"
    );
    Ok(())
}
