//! A SandboxRun created directly (no frontend in front of it) with a hostile PromQL query: the
//! operator's metrics path refuses it before parsing, on the scoped path (a policy rule decides)
//! and on the unscoped one, and keeps answering the next run. Before the depth bound, a run of
//! tens of thousands of signs built a tree whose drop overflowed the async worker's stack and
//! aborted the operator.

use std::time::{Duration, Instant};

use jiff::Timestamp;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::metrics::{MAX_EXPR_DEPTH, MAX_QUERY_BYTES, PrometheusClient};
use sandboxrun_core::{Environment, Phase, PolicyStore, Tool};
use serde_json::{Value, json};

use crate::gate;
use crate::query::{Recorded, metrics};

/// What the operator executes for `run`: judged once on its full context by `policy` (none:
/// allowed, as with `--allow-all-without-policy`).
fn recorded(run: &SandboxRun, policy: Option<&PolicyStore>) -> Recorded {
    let call = gate::full_context(&run.spec, Tool::Metrics, None, Some(Environment::Sandbox));
    Recorded {
        decision: policy.map_or_else(|| gate::allow_all(&call), |p| p.evaluate(&call)),
        approved: false,
        recheck: policy.map(|p| p.evaluate(&call)),
    }
}

fn metrics_run(query: &str) -> SandboxRun {
    let metrics: Value = json!({ "query": query });
    serde_json::from_value(json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "m", "namespace": "n"},
        "spec": {"agent": "e2e", "environment": "sandbox", "metrics": metrics},
    }))
    .expect("a run")
}

/// The chart's default policy: metrics allowed outside production (its rule scopes queries).
fn chart_policy() -> PolicyStore {
    PolicyStore::new(
        sandboxrun_core::Policy::from_yaml(
            include_str!("../tests/fixtures/chart-default-policy.yaml"),
            "chart",
        )
        .expect("the chart policy"),
    )
}

#[tokio::test]
async fn hostile_queries_are_refused_and_the_next_run_is_answered() {
    // Unreachable on purpose: nothing hostile may get as far as asking it.
    let nowhere =
        PrometheusClient::new("http://127.0.0.1:9", Duration::from_secs(1)).expect("a client");
    let policy = chart_policy();
    let now = Timestamp::now();
    let hostile = [
        format!("{}up", "- ".repeat(100_000)),
        format!("{}up", "-".repeat(MAX_QUERY_BYTES - 2)),
        format!("1{}", "+1".repeat(MAX_QUERY_BYTES / 2 - 1)),
        format!("{}up{}", "abs(".repeat(10_000), ")".repeat(10_000)),
        format!("up{}", "[5m:1m]".repeat(9_000)),
    ];
    for q in &hostile {
        for policy in [Some(&policy), None] {
            let started = Instant::now();
            let run = metrics_run(q);
            let (o, v) = metrics(&run, Some(&nowhere), &recorded(&run, policy), now).await;
            println!(
                "{} bytes, scoped: {}: {:?} in {:?}: {}",
                q.len(),
                policy.is_some(),
                o.phase,
                started.elapsed(),
                o.message
            );
            assert_eq!(
                (o.phase, o.reason.as_str()),
                (Phase::Failed, "InvalidQuery"),
                "{}",
                o.message
            );
            assert!(
                o.message.contains("at most 65536")
                    || o.message
                        .contains(&format!("passes {MAX_EXPR_DEPTH} levels")),
                "{}",
                o.message
            );
            assert!(v.is_none());
        }
    }
    // Still answering: a valid query goes on to (the unreachable) Prometheus.
    let run = metrics_run("sum(up)");
    let (o, _) = metrics(&run, Some(&nowhere), &recorded(&run, None), now).await;
    assert_eq!(o.phase, Phase::Failed);
    assert_eq!(o.reason.as_str(), "PrometheusUnavailable", "{}", o.message);
}
