//! Query runs on core's executors: sql against the SQLite demo database, metrics against a real
//! Prometheus (skipped without one), and the mapping of every end into outcome and result.

use std::collections::BTreeMap;

use sandboxrun_api::SandboxRunStatus;
use sandboxrun_core::metrics::{ResultType, Series};
use sandboxrun_core::tools::sql::SqlResult;
use sandboxrun_core::{CallContext, Environment, PolicyStore, QueryError, QueryResult, Tool};

use crate::fixtures::demo_databases;
use crate::gate;
use serde_json::json;

use super::*;

// ---- sql ----------------------------------------------------------------------------------

fn sql_run(environment: &str, database: &str, query: &str) -> SandboxRun {
    serde_json::from_value(json!({
        "apiVersion": "sandboxrun.dev/v1alpha1",
        "kind": "SandboxRun",
        "metadata": {"name": "q", "namespace": "n"},
        "spec": {"agent": "e2e", "environment": environment,
            "sql": {"database": database, "query": query}},
    }))
    .unwrap()
}

fn allow_all() -> Decision {
    gate::allow_all(&CallContext::new("a", Tool::Sql, Environment::Sandbox))
}

/// The run's `status.result` read back as the frontend reads it.
fn typed<T: serde::de::DeserializeOwned>(result: Option<Value>) -> Option<T> {
    SandboxRunStatus {
        result,
        ..Default::default()
    }
    .typed_result::<T>()
    .map(|r| r.expect("the result reads back typed"))
}

/// What the operator executes for `run`: judged once on its full context by `policy` (no
/// policy: allowed, as with `--allow-all-without-policy`), and again by `current` at execution
/// (a policy reload since may tighten it), with the gate's record of a person's approval.
fn recorded_by(
    run: &SandboxRun,
    databases: Option<&Databases>,
    policy: Option<&PolicyStore>,
    current: Option<&PolicyStore>,
    approved: bool,
) -> Recorded {
    let tool = run.spec.tool().unwrap_or(Tool::Sql);
    // The tests' Prometheus belongs to the sandbox, as the e2e suite's does.
    let call = gate::full_context(&run.spec, tool, databases, Some(Environment::Sandbox));
    Recorded {
        decision: policy.map_or_else(|| gate::allow_all(&call), |p| p.evaluate(&call)),
        approved,
        recheck: current.map(|p| p.evaluate(&call)),
    }
}

/// [`recorded_by`] one policy, unchanged since, with no approval.
fn recorded(
    run: &SandboxRun,
    databases: Option<&Databases>,
    policy: Option<&PolicyStore>,
) -> Recorded {
    recorded_by(run, databases, policy, policy, false)
}

/// Executes `run` as [`recorded`] by `policy`.
async fn as_recorded(
    run: &SandboxRun,
    databases: &Databases,
    policy: &PolicyStore,
    now: Timestamp,
) -> Ended {
    let recorded = recorded(run, Some(databases), Some(policy));
    sql(run, Some(databases), &recorded, now).await
}

fn embedded_policy() -> PolicyStore {
    PolicyStore::new(sandboxrun_core::policy::embedded::embedded_policy())
}

#[tokio::test]
async fn sql_runs_execute_the_rewritten_query_and_write_the_typed_result() {
    let (databases, dir) = demo_databases("sql").await;
    let policy = embedded_policy();
    let now = Timestamp::now();
    let run = sql_run(
        "sandbox",
        "demo",
        "SELECT id, account FROM ledger ORDER BY id LIMIT 2",
    );
    let (o, v) = as_recorded(&run, &databases, &policy, now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Succeeded, "QueryCompleted"),
        "{}",
        o.message
    );
    assert_eq!(o.truncated, Some(false));
    assert!(o.started_at.is_some() && o.duration_millis.is_some());
    let v = v.unwrap();
    for field in ["columns", "rows", "rowCount", "truncated", "executedQuery"] {
        assert!(v.get(field).is_some(), "{field} in {v}");
    }
    let result: SqlResult = typed(Some(v)).unwrap();
    assert_eq!(result.columns, ["id", "account"]);
    assert_eq!(result.row_count, 2);
    assert_eq!(result.rows[0], [json!(1), json!("umbrella")]);
    assert!(result.executed_query.contains("LIMIT"), "{result:?}");

    // The guard refuses `SELECT *` under this policy: nothing runs.
    let star = sql_run("sandbox", "demo", "SELECT * FROM ledger");
    let (o, v) = as_recorded(&star, &databases, &policy, now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Rejected, "PolicyBlocked")
    );
    assert!(o.message.starts_with("blocked by rule"), "{}", o.message);
    assert_eq!(o.started_at, None, "nothing executed");
    assert!(v.is_none());

    // A policy reload that blocks the run since the gate: nothing runs either.
    let blocked = PolicyStore::new(
        sandboxrun_core::Policy::from_yaml("default: block\nrules: []\n", "p").unwrap(),
    );
    let since = recorded_by(&run, Some(&databases), Some(&policy), Some(&blocked), false);
    let (o, _) = sql(&run, Some(&databases), &since, now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Rejected, "PolicyBlocked")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A schema read (`spec.sql.schema`) is decided like a query of its database and executed from
/// the record: the catalog filtered by the deciding rule, typed in `status.result`; a database
/// the rule does not cover reads nothing.
#[tokio::test]
async fn schema_runs_show_what_the_recorded_rule_lets_queries_read() {
    use sandboxrun_core::tools::sql_schema::SchemaResult;
    let (databases, dir) = demo_databases("schema").await;
    let policy = embedded_policy();
    let now = Timestamp::now();
    let mut run = sql_run("sandbox", "demo", "");
    if let Some(sql) = run.spec.sql.as_mut() {
        sql.schema = true;
    }
    let recorded = recorded(&run, Some(&databases), Some(&policy));
    assert_eq!(recorded.decision.verdict, Verdict::Allow);
    assert!(
        recorded.decision.schema.is_some(),
        "{:?}",
        recorded.decision
    );
    assert_eq!(recorded.decision.rewritten_query, None);
    let (o, v) = sql(&run, Some(&databases), &recorded, now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Succeeded, "QueryCompleted"),
        "{}",
        o.message
    );
    let schema: SchemaResult = typed(v).unwrap();
    let tables: Vec<(&str, Vec<&str>)> = schema
        .tables
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.columns.iter().map(|c| c.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        tables,
        [("ledger", vec!["id", "account", "amount", "booked_at"])]
    );

    let mut elsewhere = sql_run("sandbox", "other", "");
    if let Some(sql) = elsewhere.spec.sql.as_mut() {
        sql.schema = true;
    }
    let (o, v) = as_recorded(&elsewhere, &databases, &policy, now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Rejected, "PolicyBlocked"),
        "{}",
        o.message
    );
    assert_eq!(v, None);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn sql_runs_without_databases_policy_or_query_are_rejected() {
    let now = Timestamp::now();
    let run = sql_run("sandbox", "demo", "SELECT id FROM ledger");
    let (o, v) = sql(
        &run,
        None,
        &recorded(&run, None, Some(&embedded_policy())),
        now,
    )
    .await;
    assert_eq!(
        (o.phase, o.reason.as_str(), o.message.as_str()),
        (Phase::Rejected, "ToolNotImplemented", NO_DATABASES)
    );
    assert!(v.is_none());
    let (databases, dir) = demo_databases("reject").await;
    let (o, _) = sql(
        &run,
        Some(&databases),
        &recorded(&run, Some(&databases), None),
        now,
    )
    .await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Rejected, "PolicyRequired")
    );
    assert!(o.message.contains("--policy-file"), "{}", o.message);
    let mut no_query = run.clone();
    no_query.spec.sql = None;
    let (o, _) = sql(
        &no_query,
        Some(&databases),
        &recorded(&no_query, Some(&databases), Some(&embedded_policy())),
        now,
    )
    .await;
    assert_eq!((o.phase, o.reason.as_str()), (Phase::Rejected, "NoQuery"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sql_success_maps_rows_into_the_result() {
    let t = Timestamp::UNIX_EPOCH;
    let r = QueryResult {
        columns: vec!["id".into()],
        rows: vec![vec![json!(1)]],
        truncated: true,
        row_count: 1,
        duration_ms: 5,
    };
    let execution = Execution::Ran {
        executed_query: "SELECT id FROM ledger LIMIT 1".into(),
        result: Ok(r),
        started: t,
        finished: t,
    };
    let (o, v) = sql_outcome(&execution, &allow_all(), t);
    assert_eq!(o.phase, Phase::Succeeded);
    assert_eq!(o.truncated, Some(true));
    assert_eq!(o.duration_millis, Some(5));
    assert_eq!(
        v.unwrap(),
        json!({"columns": ["id"], "rows": [[1]], "rowCount": 1, "truncated": true,
            "executedQuery": "SELECT id FROM ledger LIMIT 1"})
    );
}

#[test]
fn sql_errors_fail_with_the_executor_message() {
    let (t, e) = (
        Timestamp::UNIX_EPOCH,
        QueryError::Timeout {
            timeout: Duration::from_secs(2),
        },
    );
    let (o, v) = sql_outcome(
        &Execution::Ran {
            result: Err(e.clone()),
            executed_query: String::new(),
            finished: t,
            started: t,
        },
        &allow_all(),
        t,
    );
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Failed, "QueryTimedOut")
    );
    assert_eq!(o.message, e.to_string());
    assert_eq!(o.started_at, Some(t));
    assert!(v.is_none());
}

#[test]
fn sql_blocked_runs_nothing() {
    let t = Timestamp::UNIX_EPOCH;
    let mut decision = allow_all();
    decision.verdict = Verdict::Block;
    decision.rule = "r".into();
    decision.reason = "because".into();
    let (o, v) = sql_outcome(&Execution::Blocked, &decision, t);
    assert_eq!(
        (o.phase, o.reason.as_str(), o.message.as_str()),
        (
            Phase::Rejected,
            "PolicyBlocked",
            "blocked by rule r: because"
        )
    );
    assert_eq!(o.started_at, None);
    assert!(v.is_none());
}

#[test]
fn sql_byte_cap_stays_within_the_status_budget() {
    let d = allow_all();
    let mut big = d.clone();
    big.limits.output_bytes = u32::MAX;
    assert_eq!(
        sql_tool::query_limits(&big).max_bytes,
        sql_tool::RESULT_MAX_BYTES
    );
    assert_eq!(sql_tool::query_limits(&d).max_rows, d.max_rows);
}

#[tokio::test]
async fn sql_runs_are_judged_with_their_requested_limits() {
    let (databases, dir) = demo_databases("limits").await;
    let mut run = sql_run("sandbox", "demo", "SELECT id FROM ledger");
    run.spec.limits.timeout_seconds = 7;
    let decision = recorded(&run, Some(&databases), Some(&embedded_policy())).decision;
    assert_eq!(decision.verdict, Verdict::Allow, "{}", decision.reason);
    // The statement timeout is the run's own, not the default.
    assert_eq!(decision.limits.timeout_seconds, 7);
    assert_eq!(
        sql_tool::query_limits(&decision).statement_timeout,
        Duration::from_secs(7)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_query_is_judged_in_its_databases_environment_and_runs_as_recorded() {
    let dir = std::env::temp_dir().join(format!("sbr-operator-bound-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("demo.sqlite");
    sandboxrun_core::query::demo::ensure_sqlite(&path)
        .await
        .unwrap();
    let production = sandboxrun_core::query::DatabaseConfig {
        environment: Some(Environment::Production),
        ..sandboxrun_core::query::demo::database_config(&path)
    };
    let databases =
        Databases::from_config(&BTreeMap::from([("demo".to_owned(), production)])).unwrap();
    // Production queries wait for a person; sandbox ones run.
    let policy = PolicyStore::new(
        sandboxrun_core::Policy::from_yaml(
            "default: block\nrules:\n\
             - {name: prod, agents: ['*'], tools: [sql], environments: [production], verdict: escalate,\
                sql: {databases: [demo], tables: {ledger: {columns: [id]}}}}\n\
             - {name: sandbox, agents: ['*'], tools: [sql], environments: [sandbox], verdict: allow,\
                sql: {databases: [demo], tables: {ledger: {columns: [id]}}}}\n",
            "p",
        )
        .unwrap(),
    );
    let now = Timestamp::now();
    // The run says sandbox; its database is production's: judged there, escalated.
    let run = sql_run(
        "sandbox",
        "demo",
        "SELECT id FROM ledger ORDER BY id LIMIT 1",
    );
    let call = gate::full_context(&run.spec, Tool::Sql, Some(&databases), None);
    assert_eq!(call.environment, Environment::Production);
    let unapproved = recorded(&run, Some(&databases), Some(&policy));
    assert_eq!(unapproved.decision.verdict, Verdict::Escalate);
    assert_eq!(unapproved.decision.rule, "prod");
    // Without the gate's record of an approval nothing runs.
    let (o, v) = sql(&run, Some(&databases), &unapproved, now).await;
    assert_eq!(o.phase, Phase::Rejected, "{}", o.message);
    assert_eq!(o.started_at, None, "nothing executed");
    assert!(v.is_none());
    // With it, the recorded query runs.
    let approved = recorded_by(&run, Some(&databases), Some(&policy), Some(&policy), true);
    let (o, v) = sql(&run, Some(&databases), &approved, now).await;
    assert_eq!(o.phase, Phase::Succeeded, "{}", o.message);
    let result: SqlResult = typed(v).unwrap();
    assert_eq!(result.rows, [[json!(1)]]);
    // A more sensitive environment named by the call stands: production on a sandbox database.
    let sandbox_db = Databases::from_config(&BTreeMap::from([(
        "demo".to_owned(),
        sandboxrun_core::query::demo::database_config(&path),
    )]))
    .unwrap();
    let run = sql_run("production", "demo", "SELECT id FROM ledger LIMIT 1");
    let call = gate::full_context(&run.spec, Tool::Sql, Some(&sandbox_db), None);
    assert_eq!(call.environment, Environment::Production);
    // A database configured without an environment is production's.
    let unbound = sandboxrun_core::query::DatabaseConfig {
        environment: None,
        ..sandboxrun_core::query::demo::database_config(&path)
    };
    let unbound = Databases::from_config(&BTreeMap::from([("demo".to_owned(), unbound)])).unwrap();
    assert_eq!(unbound.environment("demo"), Some(Environment::Production));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- metrics --------------------------------------------------------------------------------

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

fn metrics_run(environment: &str, metrics: Value) -> SandboxRun {
    serde_json::from_value(json!({
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
async fn metrics_runs_query_a_real_prometheus() {
    let Some(prometheus) = test_prometheus() else {
        return;
    };
    let policy = chart_policy();
    let now = Timestamp::now();
    let run = metrics_run("sandbox", json!({"query": "up"}));
    let (o, v) = metrics(
        &run,
        Some(&prometheus),
        &recorded(&run, None, Some(&policy)),
        now,
    )
    .await;
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
    let typed: MetricsResult = typed(Some(v)).unwrap();
    assert_eq!(typed.result_type, ResultType::Vector);

    let start = now - jiff::SignedDuration::from_secs(20);
    let run = metrics_run(
        "staging",
        json!({"query": "up{job=\"prometheus\"}",
            "range": {"start": start.to_string(), "end": now.to_string(), "step": "5s"}}),
    );
    let (o, v) = metrics(
        &run,
        Some(&prometheus),
        &recorded(&run, None, Some(&policy)),
        now,
    )
    .await;
    assert_eq!(o.phase, Phase::Succeeded, "{}", o.message);
    let v = v.unwrap();
    assert_eq!(v["resultType"], "matrix");
    assert!(
        !v["result"][0]["values"].as_array().unwrap().is_empty(),
        "{v}"
    );

    let run = metrics_run("sandbox", json!({"query": "sum(rate(up[5m])) by job"}));
    let (o, v) = metrics(
        &run,
        Some(&prometheus),
        &recorded(&run, None, Some(&policy)),
        now,
    )
    .await;
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
        json!({"query": "up", "range": {"start": "1", "end": "0", "step": "1s"}}),
    );
    let (o, _) = metrics(
        &run,
        Some(&prometheus),
        &recorded(&run, None, Some(&policy)),
        now,
    )
    .await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Failed, "InvalidQuery")
    );
    assert!(o.message.contains("swap them"), "{}", o.message);
}

#[tokio::test]
async fn metrics_without_prometheus_or_outside_policy_nothing_is_queried() {
    let now = Timestamp::now();
    let run = metrics_run("sandbox", json!({"query": "up"}));
    let (o, v) = metrics(&run, None, &recorded(&run, None, None), now).await;
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
    let (o, _) = metrics(
        &blocked,
        Some(&nowhere),
        &recorded(&blocked, None, Some(&policy)),
        now,
    )
    .await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Rejected, "PolicyBlocked")
    );
    // A syntax error is reported with its position without asking the (unreachable)
    // Prometheus.
    let bad = metrics_run("sandbox", json!({"query": "sum(rate(up[5m])) by job"}));
    let (o, _) = metrics(&bad, Some(&nowhere), &recorded(&bad, None, None), now).await;
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Failed, "InvalidQuery")
    );
    assert!(o.message.contains("line 1, column 22"), "{}", o.message);
}

#[test]
fn metrics_success_maps_series_into_the_result() {
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
    let (o, v) = metrics_outcome(&Ok(r.clone()), t, t);
    assert_eq!(
        (o.phase, o.reason.as_str()),
        (Phase::Succeeded, "QueryCompleted")
    );
    assert_eq!(o.message, "the query returned 1 series with 1 samples");
    assert_eq!(
        v.clone().unwrap(),
        json!({"resultType": "vector", "truncated": false, "seriesTotal": 1,
            "result": [{"metric": {"job": "prometheus"}, "value": [1.0, "1"]}]})
    );
    assert_eq!(typed::<MetricsResult>(v), Some(r));
}

#[test]
fn metrics_errors_map_to_phases_with_the_message() {
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
        let (o, v) = metrics_outcome(&Err(e.clone()), t, t);
        assert_eq!((o.phase, o.reason.as_str()), (phase, reason), "{e:?}");
        assert_eq!(o.message, e.to_string());
        assert!(v.is_none());
    }
}
