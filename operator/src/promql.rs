//! Execution of `metrics` runs: a PromQL query sent to the Prometheus the operator is configured
//! with (`--prometheus-url`, chart value `operator.prometheus.url`). Like the databases of sql
//! runs, the Prometheus address and its credentials stay with the operator; the frontend only
//! creates the SandboxRun.
//!
//! A metrics run that passed the gate is judged once more (a policy reload may have blocked it
//! since), its expression is parsed here first (a syntax error comes back with its position
//! without a round trip), and the query runs with the decision's timeout. The run ends
//! `Succeeded` with `status.result` in the shape of Prometheus's `data` (`resultType`, `result`
//! with `metric` labels and `value`/`values` samples, plus `truncated` and `seriesTotal`),
//! `Failed` with a message that says what to change, or `TimedOut`. Without a Prometheus,
//! metrics runs end `Rejected` (`ToolNotImplemented`).

use std::time::Duration;

use jiff::Timestamp;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::metrics::{
    MetricsError, MetricsQuery, MetricsResult, PrometheusClient, TimeArgs, check_syntax,
};
use sandboxrun_core::{Phase, PolicyStore, Tool, Verdict};

use crate::gate;
use crate::phase::{self, Outcome};

/// The most bytes of result a metrics run writes into its status (etcd allows about 1.5 MiB per
/// object; the rest of the status and the spec need room too).
pub const RESULT_MAX_BYTES: usize = 256 * 1024;
/// The message of a metrics run when the operator has no Prometheus.
pub const NO_PROMETHEUS: &str = "no Prometheus is configured in the operator: set the chart value \
operator.prometheus.url (operator flag --prometheus-url) to the base URL of a Prometheus";

/// Judges and executes a metrics run that passed the gate; returns its outcome and
/// `status.result`.
pub async fn execute(
    run: &SandboxRun,
    prometheus: Option<&PrometheusClient>,
    policy: Option<&PolicyStore>,
    now: Timestamp,
) -> (Outcome, Option<serde_json::Value>) {
    let Some(prometheus) = prometheus else {
        return (
            phase::rejected("ToolNotImplemented", NO_PROMETHEUS.to_owned(), now),
            None,
        );
    };
    let Some(spec) = run.spec.metrics.as_ref() else {
        return (
            phase::rejected("NoQuery", "the run has no spec.metrics".to_owned(), now),
            None,
        );
    };
    let call = gate::call_context(&run.spec, Tool::Metrics);
    let timeout_seconds = match policy {
        Some(policy) => {
            let decision = policy.evaluate(&call);
            if decision.verdict == Verdict::Block {
                return (
                    phase::rejected(
                        "PolicyBlocked",
                        format!("blocked by rule {}: {}", decision.rule, decision.reason),
                        now,
                    ),
                    None,
                );
            }
            decision.limits.timeout_seconds
        }
        None => call.limits.timeout_seconds,
    };
    let time = TimeArgs {
        time: spec.time.clone(),
        start: spec.range.as_ref().map(|r| r.start.clone()),
        end: spec.range.as_ref().map(|r| r.end.clone()),
        step: spec.range.as_ref().map(|r| r.step.clone()),
        range: None,
    };
    let query = match time.resolve(now) {
        Ok(time) => MetricsQuery {
            query: spec.query.clone(),
            time,
        },
        Err(e) => return (failed("InvalidQuery", e.to_string(), now, now), None),
    };
    if let Err(e) = check_syntax(&query.query) {
        return (failed("InvalidQuery", e.to_string(), now, now), None);
    }
    let client = prometheus.with_timeout(Duration::from_secs(u64::from(timeout_seconds.max(1))));
    let started = Timestamp::now();
    let result = client.query(&query).await;
    to_outcome(result, client.url(), started, Timestamp::now())
}

fn failed(reason: &str, message: String, started: Timestamp, finished: Timestamp) -> Outcome {
    Outcome {
        phase: Phase::Failed,
        started_at: Some(started),
        ..phase::rejected(reason, message, finished)
    }
}

/// The outcome and `status.result` of an executed query.
pub fn to_outcome(
    result: Result<MetricsResult, MetricsError>,
    url: &str,
    started: Timestamp,
    finished: Timestamp,
) -> (Outcome, Option<serde_json::Value>) {
    match result {
        Ok(r) => {
            let r = r.capped_to_bytes(RESULT_MAX_BYTES);
            let mut outcome = failed(
                "QueryCompleted",
                format!(
                    "the query returned {} series with {} samples{}",
                    r.result.len(),
                    r.sample_count(),
                    if r.truncated {
                        format!(" (truncated from {} series)", r.series_total)
                    } else {
                        String::new()
                    }
                ),
                started,
                finished,
            );
            outcome.phase = Phase::Succeeded;
            outcome.truncated = Some(r.truncated);
            outcome.duration_millis = Some(finished.duration_since(started).as_millis() as i64);
            let value = serde_json::to_value(&r).expect("MetricsResult serializes");
            (outcome, Some(value))
        }
        Err(e) => {
            let (phase, reason) = match &e {
                MetricsError::Timeout(_) => (Phase::TimedOut, "QueryTimedOut"),
                MetricsError::Unavailable(_) => (Phase::Failed, "PrometheusUnavailable"),
                e if e.is_query_error() => (Phase::Failed, "InvalidQuery"),
                _ => (Phase::Failed, "QueryFailed"),
            };
            tracing::info!(prometheus = url, error = %e, "metrics query failed");
            let mut outcome = failed(reason, e.to_string(), started, finished);
            outcome.phase = phase;
            (outcome, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sandboxrun_core::metrics::{ResultType, Series};

    use super::*;

    /// The Prometheus of `e2e/prometheus/start.sh` (`SANDBOXRUN_TEST_PROMETHEUS_URL`); `None`
    /// skips, unless `SANDBOXRUN_REQUIRE_PROMETHEUS=1`.
    fn test_prometheus() -> Option<PrometheusClient> {
        match std::env::var("SANDBOXRUN_TEST_PROMETHEUS_URL") {
            Ok(url) if !url.trim().is_empty() => {
                Some(PrometheusClient::new(url.trim(), Duration::from_secs(20)).unwrap())
            }
            _ => {
                assert_ne!(
                    std::env::var("SANDBOXRUN_REQUIRE_PROMETHEUS").as_deref(),
                    Ok("1"),
                    "SANDBOXRUN_REQUIRE_PROMETHEUS=1 but SANDBOXRUN_TEST_PROMETHEUS_URL is not set"
                );
                eprintln!("note: skipping: SANDBOXRUN_TEST_PROMETHEUS_URL is not set");
                None
            }
        }
    }

    fn metrics_run(environment: &str, metrics: serde_json::Value) -> SandboxRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sandboxrun.dev/v1alpha1",
            "kind": "SandboxRun",
            "metadata": {"name": "m", "namespace": "n"},
            "spec": {"agent": "e2e", "environment": environment, "metrics": metrics},
        }))
        .unwrap()
    }

    /// The chart's default policy: metrics allowed outside production.
    fn chart_policy() -> PolicyStore {
        PolicyStore::new(
            sandboxrun_core::Policy::from_yaml(
                include_str!("../tests/fixtures/chart-default-policy.yaml"),
                "chart",
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn runs_query_a_real_prometheus() {
        let Some(prometheus) = test_prometheus() else {
            return;
        };
        let policy = chart_policy();
        let now = Timestamp::now();
        let run = metrics_run("sandbox", serde_json::json!({"query": "up"}));
        let (o, v) = execute(&run, Some(&prometheus), Some(&policy), now).await;
        assert_eq!(o.phase, Phase::Succeeded, "{}", o.message);
        let v = v.unwrap();
        assert_eq!(v["resultType"], "vector");
        let own: Vec<_> = v["result"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["metric"]["job"] == "prometheus")
            .collect();
        assert_eq!(own.len(), 1, "{v}");
        assert_eq!(own[0]["value"][1], "1");

        let start = now - jiff::SignedDuration::from_secs(20);
        let run = metrics_run(
            "staging",
            serde_json::json!({"query": "up{job=\"prometheus\"}",
                "range": {"start": start.to_string(), "end": now.to_string(), "step": "5s"}}),
        );
        let (o, v) = execute(&run, Some(&prometheus), Some(&policy), now).await;
        assert_eq!(o.phase, Phase::Succeeded, "{}", o.message);
        let v = v.unwrap();
        assert_eq!(v["resultType"], "matrix");
        assert!(
            !v["result"][0]["values"].as_array().unwrap().is_empty(),
            "{v}"
        );

        let run = metrics_run(
            "sandbox",
            serde_json::json!({"query": "sum(rate(up[5m])) by job"}),
        );
        let (o, v) = execute(&run, Some(&prometheus), Some(&policy), now).await;
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Failed, "InvalidQuery")
        );
        assert!(
            o.message.contains("line 1, column 22 (at `job`)"),
            "{}",
            o.message
        );
        assert!(v.is_none());

        // Times that make no range fail with what to change, before Prometheus is asked.
        let run = metrics_run(
            "sandbox",
            serde_json::json!({"query": "up", "range": {"start": "1", "end": "0", "step": "1s"}}),
        );
        let (o, _) = execute(&run, Some(&prometheus), Some(&policy), now).await;
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Failed, "InvalidQuery")
        );
        assert!(o.message.contains("swap them"), "{}", o.message);
    }

    #[tokio::test]
    async fn without_prometheus_or_outside_policy_nothing_is_queried() {
        let now = Timestamp::now();
        let run = metrics_run("sandbox", serde_json::json!({"query": "up"}));
        let (o, v) = execute(&run, None, None, now).await;
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Rejected, "ToolNotImplemented")
        );
        assert!(o.message.contains("operator.prometheus.url"));
        assert!(v.is_none());
        // Unreachable on purpose: a blocked run must not even try.
        let nowhere = PrometheusClient::new("http://127.0.0.1:9", Duration::from_secs(1)).unwrap();
        let mut blocked = run.clone();
        blocked.spec.agent = "someone".into();
        let policy = PolicyStore::new(
            sandboxrun_core::Policy::from_yaml("default: block\nrules: []\n", "p").unwrap(),
        );
        let (o, _) = execute(&blocked, Some(&nowhere), Some(&policy), now).await;
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Rejected, "PolicyBlocked")
        );
    }

    #[test]
    fn success_maps_series_into_the_result() {
        let t = Timestamp::UNIX_EPOCH;
        let r = MetricsResult {
            result_type: ResultType::Vector,
            result: vec![Series {
                metric: BTreeMap::from([("job".to_owned(), "prometheus".to_owned())]),
                value: Some((1.0, "1".to_owned())),
                values: None,
            }],
            truncated: false,
            series_total: 1,
            warnings: Vec::new(),
        };
        let (o, v) = to_outcome(Ok(r), "http://p", t, t);
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Succeeded, "QueryCompleted")
        );
        assert_eq!(o.message, "the query returned 1 series with 1 samples");
        assert_eq!(
            v.unwrap(),
            serde_json::json!({"resultType": "vector", "truncated": false, "seriesTotal": 1,
                "result": [{"metric": {"job": "prometheus"}, "value": [1.0, "1"]}]})
        );
    }

    #[test]
    fn errors_map_to_phases_with_the_message() {
        let t = Timestamp::UNIX_EPOCH;
        let cases = [
            (
                MetricsError::Timeout(Duration::from_secs(3)),
                Phase::TimedOut,
                "QueryTimedOut",
            ),
            (
                MetricsError::Unavailable("down".into()),
                Phase::Failed,
                "PrometheusUnavailable",
            ),
            (
                MetricsError::Prometheus {
                    error_type: "bad_data".into(),
                    message: "1:5: parse error".into(),
                    hint: String::new(),
                },
                Phase::Failed,
                "InvalidQuery",
            ),
            (
                MetricsError::Prometheus {
                    error_type: "execution".into(),
                    message: "too many samples".into(),
                    hint: String::new(),
                },
                Phase::Failed,
                "QueryFailed",
            ),
        ];
        for (e, phase, reason) in cases {
            let (o, v) = to_outcome(Err(e.clone()), "http://p", t, t);
            assert_eq!((o.phase, o.reason.as_str()), (phase, reason), "{e:?}");
            assert_eq!(o.message, e.to_string());
            assert!(v.is_none());
        }
    }
}
