//! `sql` and `metrics` runs: queries the operator executes itself, in the reconcile, on core's
//! executors ([`sandboxrun_core::tools::sql`], [`sandboxrun_core::tools::metrics`]), so a query
//! is judged, capped and classified exactly as it is embedded. The operator holds the
//! credentials (a databases file mounted from a Secret, `--databases-file`; the Prometheus of
//! `--prometheus-url`, chart value `operator.prometheus.url`); the internet-facing frontend only
//! creates the SandboxRun.
//!
//! A query run that passed the gate (allowed, or escalated and approved) is judged once more (a
//! policy reload may have blocked it since; an sql query is judged with its database's dialect
//! and only the SQL guard's **rewritten** query runs, never the text in the spec). It ends
//! `Succeeded` with its typed result in `status.result` (core's [`SqlResult`] or
//! [`MetricsResult`], written with `serde_json::to_value`), `Failed` or `TimedOut` with a
//! message that says what to change, or `Rejected` when nothing may run. Without databases (or
//! a Prometheus) such runs end `Rejected` (`ToolNotImplemented`).

use std::time::Duration;

use jiff::Timestamp;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::metrics::{
    MetricsError, MetricsQuery, MetricsResult, PrometheusClient, TimeArgs,
};
use sandboxrun_core::tools::metrics::{self as metrics_tool, Source};
use sandboxrun_core::tools::sql::{self as sql_tool, Execution};
use sandboxrun_core::{Databases, Decision, Phase, PolicyStore, Reason, Tool, Verdict};
use serde_json::Value;

use crate::gate;
use crate::outcome::{Outcome, millis_between, rejected};

/// The message of an sql run when the operator has no databases.
pub const NO_DATABASES: &str = "no databases are configured in the operator";
/// The message of a metrics run when the operator has no Prometheus.
pub const NO_PROMETHEUS: &str = "no Prometheus is configured in the operator: set the chart value \
operator.prometheus.url (operator flag --prometheus-url) to the base URL of a Prometheus";

/// What a query run ends with: its outcome and its `status.result`.
pub type Ended = (Outcome, Option<Value>);

/// The typed result as `status.result`.
fn to_status<T: serde::Serialize>(result: &T) -> Value {
    serde_json::to_value(result).expect("a query result serializes to JSON")
}

/// An outcome without output that ran from `started` to `finished`.
fn ran(
    phase: Phase,
    reason: Reason,
    message: String,
    started: Timestamp,
    finished: Timestamp,
) -> Outcome {
    Outcome::of(phase, reason, message, Some(started), finished)
}

/// Judges and executes an sql run that passed the gate.
pub async fn sql(
    run: &SandboxRun,
    databases: Option<&Databases>,
    policy: Option<&PolicyStore>,
    now: Timestamp,
) -> Ended {
    let Some(databases) = databases else {
        return (
            rejected(Reason::ToolNotImplemented, NO_DATABASES.to_owned(), now),
            None,
        );
    };
    let Some(policy) = policy else {
        let message = "sql runs need a policy with sql rules to check the query: start the \
                       operator with --policy-file";
        return (
            rejected(Reason::PolicyRequired, message.to_owned(), now),
            None,
        );
    };
    let Some(spec) = run.spec.sql.as_ref() else {
        return (
            rejected(Reason::NoQuery, "the run has no spec.sql".to_owned(), now),
            None,
        );
    };
    let decision = sql_decision(run, databases, policy);
    // The gate let the run through (allowed, or escalated and approved): `approved` is true. A
    // Block, or a query the guard could not rewrite, runs nothing.
    let execution = sql_tool::execute(databases, &spec.database, &decision, true).await;
    sql_outcome(&execution, &decision, now)
}

/// The decision of an sql run: core's, on the run's agent, environment, query and requested
/// limits.
fn sql_decision(run: &SandboxRun, databases: &Databases, policy: &PolicyStore) -> Decision {
    sql_tool::decide(policy, databases, gate::call_context(&run.spec, Tool::Sql))
}

/// The outcome and `status.result` of a judged query (`now`: when nothing ran).
pub fn sql_outcome(execution: &Execution, decision: &Decision, now: Timestamp) -> Ended {
    let (phase, reason, message) = execution.outcome(decision);
    let Execution::Ran {
        result,
        started,
        finished,
        ..
    } = execution
    else {
        return (Outcome::of(phase, reason, message, None, now), None);
    };
    let mut outcome = ran(phase, reason, message, *started, *finished);
    if let Ok(r) = result {
        outcome.truncated = Some(r.truncated);
        outcome.duration_millis = Some(i64::try_from(r.duration_ms).unwrap_or(i64::MAX));
    }
    (outcome, execution.result().as_ref().map(to_status))
}

/// Judges and executes a metrics run that passed the gate.
pub async fn metrics(
    run: &SandboxRun,
    prometheus: Option<&PrometheusClient>,
    policy: Option<&PolicyStore>,
    now: Timestamp,
) -> Ended {
    let Some(prometheus) = prometheus else {
        return (
            rejected(Reason::ToolNotImplemented, NO_PROMETHEUS.to_owned(), now),
            None,
        );
    };
    let Some(spec) = run.spec.metrics.as_ref() else {
        return (
            rejected(
                Reason::NoQuery,
                "the run has no spec.metrics".to_owned(),
                now,
            ),
            None,
        );
    };
    let call = gate::call_context(&run.spec, Tool::Metrics);
    let decision = match policy {
        Some(policy) => {
            let decision = policy.evaluate(&call);
            if decision.verdict == Verdict::Block {
                let message = format!("blocked by rule {}: {}", decision.rule, decision.reason);
                return (rejected(Reason::PolicyBlocked, message, now), None);
            }
            Some(decision)
        }
        None => None,
    };
    let timeout_seconds = decision
        .as_ref()
        .map_or(call.limits.timeout_seconds, |d| d.limits.timeout_seconds);
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
        Err(e) => {
            let outcome = ran(Phase::Failed, Reason::InvalidQuery, e.to_string(), now, now);
            return (outcome, None);
        }
    };
    // What the deciding rule lets the query read (its metric names and pinned labels).
    let query = match decision
        .as_ref()
        .map(|d| metrics_tool::scoped(&query, d, None))
    {
        None => query,
        Some(Ok(scoped)) => scoped,
        Some(Err(e)) => {
            let outcome = ran(Phase::Failed, Reason::InvalidQuery, e.to_string(), now, now);
            return (outcome, None);
        }
    };
    let timeout = Duration::from_secs(u64::from(timeout_seconds.max(1)));
    let started = Timestamp::now();
    // Core's executor checks the syntax first (an error comes back with its position without
    // a round trip) and caps the result to its byte budget.
    let result = metrics_tool::execute(Source::Prometheus(prometheus), &query, timeout).await;
    if let Err(e) = &result {
        tracing::info!(prometheus = prometheus.url(), error = %e, "metrics query failed");
    }
    metrics_outcome(&result, started, Timestamp::now())
}

/// The outcome and `status.result` of an executed metrics query.
pub fn metrics_outcome(
    result: &Result<MetricsResult, MetricsError>,
    started: Timestamp,
    finished: Timestamp,
) -> Ended {
    let (phase, reason, message) = metrics_tool::outcome(result);
    let mut outcome = ran(phase, reason, message, started, finished);
    match result {
        Ok(r) => {
            outcome.truncated = Some(r.truncated);
            outcome.duration_millis = Some(millis_between(started, finished));
            (outcome, Some(to_status(r)))
        }
        Err(_) => (outcome, None),
    }
}

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
