//! Execution of `sql` runs. The operator holds the database credentials (a databases file mounted
//! from a Secret, `--databases-file`); the internet-facing frontend never sees them.
//!
//! An sql run that passed the gate (allowed, or escalated and approved) is judged once more with
//! the target database's dialect, and the SQL guard's **rewritten** query (never the text in the
//! spec) runs read-only with the decision's statement timeout and row cap, and a byte cap that
//! keeps `status.result` far below etcd's object size limit. The run ends `Succeeded` with
//! `status.result = {columns, rows, rowCount, truncated, executedQuery}`, or `Failed` with the
//! executor's message. Without databases, sql runs end `Rejected` (`ToolNotImplemented`).

use std::time::Duration;

use jiff::Timestamp;
use sandboxrun_api::SandboxRun;
use sandboxrun_core::sql::GuardedQuery;
use sandboxrun_core::{
    Databases, Decision, Phase, PolicyStore, QueryError, QueryLimits, QueryResult, SqlDialect,
    Tool, Verdict,
};
use serde_json::json;

use crate::gate;
use crate::phase::{self, Outcome};

/// The most bytes of row values an sql run writes into its status (etcd allows about 1.5 MiB per
/// object; the rest of the status and the spec need room too).
pub const RESULT_MAX_BYTES: u64 = 256 * 1024;
/// The message of an sql run when the operator has no databases.
pub const NO_DATABASES: &str = "no databases are configured in the operator";

/// Judges and executes an sql run that passed the gate; returns its outcome and `status.result`.
pub async fn execute(
    run: &SandboxRun,
    databases: Option<&Databases>,
    policy: Option<&PolicyStore>,
    now: Timestamp,
) -> (Outcome, Option<serde_json::Value>) {
    let Some(databases) = databases else {
        return (
            phase::rejected("ToolNotImplemented", NO_DATABASES.to_owned(), now),
            None,
        );
    };
    let Some(policy) = policy else {
        return (
            phase::rejected(
                "PolicyRequired",
                "sql runs need a policy with sql rules to check the query: start the operator \
                 with --policy-file"
                    .to_owned(),
                now,
            ),
            None,
        );
    };
    let Some(spec) = run.spec.sql.as_ref() else {
        return (
            phase::rejected("NoQuery", "the run has no spec.sql".to_owned(), now),
            None,
        );
    };
    let mut call = gate::call_context(&run.spec, Tool::Sql);
    if let Some(sql) = call.sql.as_mut() {
        sql.dialect = databases
            .dialect(&spec.database)
            .unwrap_or(SqlDialect::Postgres);
    }
    let decision = policy.evaluate(&call);
    let Some(query) = decision.rewritten_query.clone() else {
        return (blocked(&decision, now), None);
    };
    if decision.verdict == Verdict::Block {
        return (blocked(&decision, now), None);
    }
    let guarded = GuardedQuery {
        sql: query.clone(),
        tables: Vec::new(),
        columns: Vec::new(),
        limit: decision.max_rows,
    };
    let started = Timestamp::now();
    let result = databases
        .execute(&spec.database, &guarded, query_limits(&decision))
        .await;
    to_outcome(result, query, started, Timestamp::now())
}

fn blocked(decision: &Decision, now: Timestamp) -> Outcome {
    phase::rejected(
        "PolicyBlocked",
        format!("blocked by rule {}: {}", decision.rule, decision.reason),
        now,
    )
}

/// The caps of an allowed query: the decision's timeout and row cap; bytes within the status
/// budget.
pub fn query_limits(decision: &Decision) -> QueryLimits {
    QueryLimits {
        statement_timeout: Duration::from_secs(u64::from(decision.limits.timeout_seconds)),
        max_rows: decision.max_rows,
        max_bytes: u64::from(decision.limits.output_bytes).min(RESULT_MAX_BYTES),
    }
}

/// The outcome and `status.result` of an executed query.
pub fn to_outcome(
    result: Result<QueryResult, QueryError>,
    executed: String,
    started: Timestamp,
    finished: Timestamp,
) -> (Outcome, Option<serde_json::Value>) {
    let base = |phase, reason: &str, message: String| Outcome {
        phase,
        started_at: Some(started),
        ..phase::rejected(reason, message, finished)
    };
    match result {
        Ok(r) => {
            let mut outcome = base(
                Phase::Succeeded,
                "QueryCompleted",
                format!(
                    "the query returned {} rows{}",
                    r.row_count,
                    if r.truncated {
                        " (truncated at the row or byte cap)"
                    } else {
                        ""
                    }
                ),
            );
            outcome.truncated = Some(r.truncated);
            outcome.duration_millis = Some(i64::try_from(r.duration_ms).unwrap_or(i64::MAX));
            let value = json!({
                "columns": r.columns,
                "rows": r.rows,
                "rowCount": r.row_count,
                "truncated": r.truncated,
                "executedQuery": executed,
            });
            (outcome, Some(value))
        }
        Err(e) => {
            let reason = match e {
                QueryError::Timeout { .. } => "QueryTimedOut",
                _ => "QueryFailed",
            };
            (base(Phase::Failed, reason, e.to_string()), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_maps_rows_into_the_result() {
        let t = Timestamp::UNIX_EPOCH;
        let r = QueryResult {
            columns: vec!["id".into()],
            rows: vec![vec![json!(1)]],
            truncated: true,
            row_count: 1,
            duration_ms: 5,
        };
        let (o, v) = to_outcome(Ok(r), "SELECT id FROM ledger LIMIT 1".into(), t, t);
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
    fn errors_fail_with_the_executor_message() {
        let t = Timestamp::UNIX_EPOCH;
        let e = QueryError::Timeout {
            timeout: Duration::from_secs(2),
        };
        let (o, v) = to_outcome(Err(e.clone()), String::new(), t, t);
        assert_eq!(
            (o.phase, o.reason.as_str()),
            (Phase::Failed, "QueryTimedOut")
        );
        assert_eq!(o.message, e.to_string());
        assert!(v.is_none());
    }

    #[test]
    fn byte_cap_stays_within_the_status_budget() {
        let d = gate::allow_all(&sandboxrun_core::CallContext::new(
            "a",
            Tool::Sql,
            sandboxrun_core::Environment::Sandbox,
        ));
        let mut big = d.clone();
        big.limits.output_bytes = u32::MAX;
        assert_eq!(query_limits(&big).max_bytes, RESULT_MAX_BYTES);
        assert_eq!(query_limits(&d).max_rows, d.max_rows);
    }
}
