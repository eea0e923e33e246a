//! `sql` and `metrics` runs: queries the operator executes itself, in the reconcile, on core's
//! executors ([`sandboxrun_core::tools::sql`], [`sandboxrun_core::tools::metrics`]), so a query
//! is judged, capped and classified exactly as it is embedded. The operator holds the
//! credentials (a databases file mounted from a Secret, `--databases-file`; the Prometheus of
//! `--prometheus-url`, chart value `operator.prometheus.url`); the internet-facing frontend only
//! creates the SandboxRun.
//!
//! A query run that passed the gate executes **as recorded**: the decision taken once on its
//! full context (`status.decision`, with its grant: the guard's rewritten query, the row cap,
//! the limits, the metrics scope) and the approval the gate recorded; never the text in the spec,
//! never a second judgement on other inputs. Policy is asked once more only to tighten: a run
//! the current policy blocks (a reload since) runs nothing. It ends
//! `Succeeded` with its typed result in `status.result` (core's [`SqlResult`] or
//! [`MetricsResult`], written with `serde_json::to_value`), `Failed` or `TimedOut` with a
//! message that says what to change, or `Rejected` when nothing may run. Without databases (or
//! a Prometheus) such runs end `Rejected` (`ToolNotImplemented`).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use sandboxrun_api::{SandboxRun, SandboxRunStatus};
use sandboxrun_core::metrics::{
    MetricsError, MetricsQuery, MetricsResult, PrometheusClient, TimeArgs,
};
use sandboxrun_core::tools::metrics::{self as metrics_tool, Source};
use sandboxrun_core::tools::sql::{self as sql_tool, Execution};
use sandboxrun_core::tools::sql_schema;
use sandboxrun_core::{Databases, Decision, Phase, Reason, Tool, Verdict};
use serde_json::Value;
use tracing::info;

use crate::audit;
use crate::controller::{Decided, Error, Reconcile, is_terminal, until};
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

/// What a query run executes: its recorded decision, whether the gate recorded a person's
/// approval, and policy's judgement now (`None`: the operator has no policy), which may only
/// tighten the record.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The decision as recorded when policy judged the run.
    pub decision: Decision,
    /// Whether the gate recorded a person's approval (the `Approved` condition).
    pub approved: bool,
    /// Policy's judgement of the same full context now.
    pub recheck: Option<Decision>,
}

impl Recorded {
    /// The rejection of a run that must not execute: blocked by the record or by policy now, or
    /// escalated without a recorded approval.
    fn refusal(&self, now: Timestamp) -> Option<Outcome> {
        let d = &self.decision;
        if d.verdict == Verdict::Block {
            let message = format!("blocked by rule {}: {}", d.rule, d.reason);
            return Some(rejected(Reason::PolicyBlocked, message, now));
        }
        if let Some(now_d) = self
            .recheck
            .as_ref()
            .filter(|r| r.verdict == Verdict::Block)
        {
            let message = format!(
                "blocked by rule {} since it was decided: {}",
                now_d.rule, now_d.reason
            );
            return Some(rejected(Reason::PolicyBlocked, message, now));
        }
        if d.verdict == Verdict::Escalate && !self.approved {
            let message = format!(
                "rule {} escalated the run ({}) and no approval was recorded",
                d.rule, d.reason
            );
            return Some(rejected(Reason::ApprovalDenied, message, now));
        }
        None
    }
}

/// Executes an sql run that passed the gate, as recorded.
pub async fn sql(
    run: &SandboxRun,
    databases: Option<&Databases>,
    recorded: &Recorded,
    now: Timestamp,
) -> Ended {
    let Some(databases) = databases else {
        return (
            rejected(Reason::ToolNotImplemented, NO_DATABASES.to_owned(), now),
            None,
        );
    };
    if recorded.recheck.is_none() {
        let message = "sql runs need a policy with sql rules to check the query: start the \
                       operator with --policy-file";
        return (
            rejected(Reason::PolicyRequired, message.to_owned(), now),
            None,
        );
    }
    let Some(spec) = run.spec.sql.as_ref() else {
        return (
            rejected(Reason::NoQuery, "the run has no spec.sql".to_owned(), now),
            None,
        );
    };
    if let Some(refusal) = recorded.refusal(now) {
        return (refusal, None);
    }
    let decision = &recorded.decision;
    if spec.schema {
        // The catalog, filtered to what the recorded rule lets queries read.
        let started = Timestamp::now();
        let read = sql_schema::execute(databases, &spec.database, decision).await;
        let (phase, reason, message) = sql_schema::outcome(decision, read.as_ref());
        return match read {
            None => (Outcome::of(phase, reason, message, None, now), None),
            Some(read) => (
                ran(phase, reason, message, started, Timestamp::now()),
                read.as_ref().ok().map(to_status),
            ),
        };
    }
    // Only the guard's rewritten query of the record runs (none: nothing runs), with the
    // record's row cap and limits.
    let execution = sql_tool::execute(databases, &spec.database, decision, recorded.approved).await;
    sql_outcome(&execution, decision, now)
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

/// Executes a metrics run that passed the gate, as recorded.
pub async fn metrics(
    run: &SandboxRun,
    prometheus: Option<&PrometheusClient>,
    recorded: &Recorded,
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
    if let Some(refusal) = recorded.refusal(now) {
        return (refusal, None);
    }
    let decision = &recorded.decision;
    let timeout_seconds = decision.limits.timeout_seconds;
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
    // What the recorded rule lets the query read (its metric names and pinned labels).
    let query = match metrics_tool::scoped(&query, decision, None) {
        Ok(scoped) => scoped,
        Err(e) => {
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

/// The query claim protocol: a query runs at most once, in the reconcile of the replica that
/// claimed it.
impl Reconcile<'_> {
    /// Executes an sql or metrics run on core's executors, in this reconcile, and ends it.
    ///
    /// At most once, even with two operators acting at the same time (leaders overlapping for
    /// a moment, or a cache that lags our own writes): the query runs only after this replica
    /// claimed it, by a status write conditional on the run being unchanged since it was read
    /// (its resourceVersion). A claim found afterwards is never executed again: its holder
    /// finishes it, or, gone past the query's deadline, the run ends `QueryInterrupted`.
    ///
    /// A run decided in this reconcile (`decided`, its Allow not written yet) is claimed over
    /// the copy it was decided on, and the claim records the decision: one write before the
    /// query instead of a decision, a read and a claim. Otherwise the claim is written over the
    /// run as the API server has it now. The end is written over the claim as written, so
    /// nothing is read again on the query's path either.
    pub(crate) async fn query(
        &self,
        prev: SandboxRunStatus,
        tool: Tool,
        decided: Option<Decided>,
    ) -> Result<Action, Error> {
        let claim_message = format!(
            "the query started on operator replica {}",
            self.ctx.identity
        );
        let decided_on = decided
            .filter(|d| d.unrecorded)
            .and_then(|_| self.known_version());
        let (current, read_at) = match decided_on {
            Some(version) => (prev, Some(version)),
            None => {
                let Some(fresh) = self.runs.get_opt(&self.name).await? else {
                    return Ok(Action::await_change());
                };
                let current = fresh.status.clone().unwrap_or_default();
                if is_terminal(&current) {
                    return self.finished(&current).await;
                }
                if current.reason.as_deref() == Some(Reason::QueryStarted.as_str()) {
                    return self.claimed(&current, &claim_message).await;
                }
                (current, fresh.resource_version())
            }
        };
        let claim = SandboxRunStatus {
            phase: Some(Phase::Running),
            tool: Some(tool),
            reason: Some(Reason::QueryStarted.as_str().to_owned()),
            message: Some(claim_message),
            start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                self.now,
            )),
            observed_generation: self.generation,
            ..current
        };
        let claimed_at = match self.apply_if_unchanged(&claim, read_at).await {
            Ok(version) => version,
            // Someone wrote the run since we read it (or since the copy it was decided on:
            // its caller's cancel, say): look again rather than execute.
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 => {
                info!(run = %self.name, "the run changed before the query was claimed; looking again");
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Err(e) => return Err(e),
        };
        let prev = claim;
        let (ctx, now) = (self.ctx, Timestamp::now());
        // Executed as recorded: the decision the gate passed, and the approval it recorded.
        let recorded = Recorded {
            decision: ctx.recorded(self.run, &prev, tool),
            approved: audit::approved(&prev),
            recheck: ctx
                .policy
                .is_some()
                .then(|| ctx.judge(&ctx.call_context(self.run, tool))),
        };
        let (outcome, result) = if tool == Tool::Sql {
            sql(self.run, ctx.databases.as_ref(), &recorded, now).await
        } else {
            metrics(self.run, ctx.prometheus.as_ref(), &recorded, now).await
        };
        let status = SandboxRunStatus {
            result,
            ..self.terminal(&prev, Some(tool), &outcome, None)
        };
        self.finish_result(status, &outcome, claimed_at).await
    }

    /// A query someone claimed: ours, whose terminal write failed (written now), or another
    /// replica's (waited for until the query's deadline, then ended `QueryInterrupted`: it ran at
    /// most once, and may not have).
    async fn claimed(&self, current: &SandboxRunStatus, ours: &str) -> Result<Action, Error> {
        if current.message.as_deref() == Some(ours)
            && let Some(end) = self.ctx.unaudited_end(&self.uid())
        {
            let outcome = Outcome::bare(
                end.phase,
                &end.reason,
                end.status.message.clone().unwrap_or_default(),
                end.status.start_time.as_ref().map(|t| t.0),
                end.status
                    .completion_time
                    .as_ref()
                    .map_or(self.now, |t| t.0),
            );
            return self.finish(end.status, &outcome, None).await;
        }
        let started = current.start_time.as_ref().map_or(self.now, |t| t.0);
        let limit =
            SignedDuration::from_secs(i64::from(self.run.spec.limits.effective().timeout_seconds))
                + CLAIM_SLACK;
        let deadline = started.checked_add(limit).unwrap_or(started);
        if self.now < deadline {
            return Ok(Action::requeue(until(deadline, self.now)));
        }
        let outcome = Outcome::of(
            Phase::Failed,
            Reason::QueryInterrupted,
            format!(
                "{} but no result was recorded by its deadline: it ran at most once and may not \
                 have; call again if you still need it",
                current.message.as_deref().unwrap_or("the query started")
            ),
            Some(started),
            self.now,
        );
        let status = self.terminal(current, current.tool, &outcome, None);
        self.finish(status, &outcome, None).await
    }
}

/// How long past a query's own timeout its claim is waited for before the run ends
/// `QueryInterrupted` (the claiming replica may be slow, not gone).
const CLAIM_SLACK: SignedDuration = SignedDuration::from_secs(60);

#[cfg(test)]
#[path = "query_tests.rs"]
mod tests;
