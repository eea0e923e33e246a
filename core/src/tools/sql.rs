//! `execute_sql`: one read-only query against a configured database, judged by policy.
//!
//! The flow of one call: the query is judged by the policy (the first matching rule, then the SQL
//! guard on its parsed structure, with the target database's dialect: [`decide`]); a `Block`
//! comes back with the verdict, the rule and the guard's hint; an allowed query runs **the
//! guard's rewritten query** (never the agent's text), read-only, with the rule's row cap, a byte
//! cap and the statement timeout ([`execute`]). An `Escalate` needs a person to approve the run,
//! which only the cluster (a SandboxRun) can offer: the operator passes the approval in, the
//! embedded mode cannot.
//!
//! [`execute`] is the one executor: the operator calls it for sql SandboxRuns (writing
//! [`SqlResult`] into `status.result`), the embedded frontend for its own calls.

use std::time::Duration;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{environment, unknown_argument};
use super::governed::Summary;
use super::{CallSummary, Embedded, JsonObject, ParseContext, ToolSpec};
use crate::model::{Environment, Phase, Reason, Tool, Verdict};
use crate::policy::{CallContext, Decision, PolicyStore};
use crate::query::{Databases, QueryError, QueryLimits, QueryResult};
use crate::sql::{GuardedQuery, SqlDialect};

/// The most bytes of row values one query returns: far below etcd's object limit (about
/// 1.5 MiB) in the cluster, where the rows are written into the run's status, and the same
/// embedded, so both modes return the same rows.
pub const RESULT_MAX_BYTES: u64 = 256 * 1024;

/// The `execute_sql` tool.
pub struct ExecuteSql;

/// Arguments of `execute_sql` (the tool's `inputSchema`), and the validated call. The tool
/// parses the raw arguments itself (see [`parse_args`]) so each mistake gets its own actionable
/// message.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct ExecuteSqlArgs {
    /// Name of a configured database, for example `demo`.
    #[schemars(length(min = 1))]
    pub database: String,
    /// One read-only SELECT (or WITH … SELECT) statement. List the columns you need; a LIMIT is
    /// added or lowered to the policy's cap.
    #[schemars(length(min = 1, max = crate::sql::MAX_QUERY_BYTES))]
    pub query: String,
    /// Environment the query targets: sandbox (default), staging or production.
    #[serde(default)]
    pub environment: Environment,
}

/// Validates the raw arguments of `execute_sql`, or says exactly what to fix.
pub fn parse_args(args: &JsonObject) -> Result<ExecuteSqlArgs, String> {
    const EXAMPLE: &str =
        r#"for example {"database": "demo", "query": "SELECT id, amount FROM ledger"}"#;
    if let Some(unknown) = unknown_argument(args, &["database", "query", "environment"]) {
        return Err(format!(
            "unknown argument `{unknown}`; execute_sql accepts `database` (string, required), \
             `query` (string, required) and `environment` (sandbox, staging or production; \
             optional)"
        ));
    }
    let text = |name: &str, what: &str| match args.get(name) {
        None | Some(Value::Null) => Err(format!(
            "missing required argument `{name}`: pass {what} as a string, {EXAMPLE}"
        )),
        Some(Value::String(s)) if s.trim().is_empty() => Err(format!(
            "argument `{name}` is empty: pass {what}, {EXAMPLE}"
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!(
            "argument `{name}` must be a string ({what}); {EXAMPLE}"
        )),
    };
    let database = text("database", "the name of a configured database")?;
    let query = text("query", "one read-only SELECT statement")?;
    Ok(ExecuteSqlArgs {
        database,
        query,
        environment: environment(args)?,
    })
}

/// The rows of an executed query, as the operator writes them into `status.result` and the
/// frontend reads them back (typed on both sides).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SqlResult {
    /// Column names, in order.
    pub columns: Vec<String>,
    /// One array per row, values in column order.
    pub rows: Vec<Vec<Value>>,
    /// Number of rows returned.
    pub row_count: u64,
    /// Whether rows were left out at the row or byte cap.
    pub truncated: bool,
    /// The query that was executed (the guard's rewrite).
    pub executed_query: String,
}

/// How one judged query ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Execution {
    /// Policy (or the guard) refused it: nothing ran.
    Blocked,
    /// Policy escalated it and no approval can be had here: nothing ran.
    NeedsApproval,
    /// It ran: the rows, or why the database gave none.
    Ran {
        /// The guard's rewrite that was executed.
        executed_query: String,
        /// The rows, or the database's error.
        result: Result<QueryResult, QueryError>,
        /// When it started.
        started: Timestamp,
        /// When it ended.
        finished: Timestamp,
    },
}

impl Execution {
    /// The terminal phase, its reason and the message of this end (the same words in the
    /// operator's status and embedded).
    pub fn outcome(&self, decision: &Decision) -> (Phase, Reason, String) {
        match self {
            Execution::Blocked => (
                Phase::Rejected,
                Reason::PolicyBlocked,
                format!("blocked by rule {}: {}", decision.rule, decision.reason),
            ),
            Execution::NeedsApproval => (
                Phase::Rejected,
                Reason::ApprovalUnavailable,
                format!(
                    "rule {} escalated the query for a human approval, which only cluster mode \
                     offers",
                    decision.rule
                ),
            ),
            Execution::Ran { result: Ok(r), .. } => (
                Phase::Succeeded,
                Reason::QueryCompleted,
                format!(
                    "the query returned {} rows{}",
                    r.row_count,
                    if r.truncated {
                        " (truncated at the row or byte cap)"
                    } else {
                        ""
                    }
                ),
            ),
            Execution::Ran { result: Err(e), .. } => {
                let reason = match e {
                    QueryError::Timeout { .. } => Reason::QueryTimedOut,
                    _ => Reason::QueryFailed,
                };
                (Phase::Failed, reason, e.to_string())
            }
        }
    }

    /// The typed `status.result` of a query that returned rows.
    pub fn result(&self) -> Option<SqlResult> {
        match self {
            Execution::Ran {
                executed_query,
                result: Ok(r),
                ..
            } => Some(SqlResult {
                columns: r.columns.clone(),
                rows: r.rows.clone(),
                row_count: r.row_count,
                truncated: r.truncated,
                executed_query: executed_query.clone(),
            }),
            _ => None,
        }
    }
}

/// What policy sees of an sql call: the call as made (agent, environment, query, requested
/// limits), completed with what only the configuration knows about its target: the database's
/// dialect (the guard parses the query as that database will) and its environment (the call is
/// judged in the database's environment when that is more sensitive than the one it names, so
/// `environment: sandbox` cannot move a production database into a sandbox rule). The one
/// builder of an sql call's context: the embedded server and the operator both judge through it.
pub fn call_context(databases: &Databases, mut call: CallContext) -> CallContext {
    let Some(sql) = call.sql.as_mut() else {
        return call;
    };
    sql.dialect = databases
        .dialect(&sql.database)
        .unwrap_or(SqlDialect::Postgres);
    match databases.environment(&sql.database) {
        Some(bound) => call.reaching(bound),
        None => call,
    }
}

/// Judges an sql call on its full context ([`call_context`]).
pub fn decide(policy: &PolicyStore, databases: &Databases, call: CallContext) -> Decision {
    policy.evaluate(&call_context(databases, call))
}

/// The caps of an allowed query: the decision's timeout and row cap; bytes within
/// [`RESULT_MAX_BYTES`].
pub fn query_limits(decision: &Decision) -> QueryLimits {
    QueryLimits {
        statement_timeout: Duration::from_secs(u64::from(decision.limits.timeout_seconds)),
        max_rows: decision.max_rows,
        max_bytes: u64::from(decision.limits.output_bytes).min(RESULT_MAX_BYTES),
    }
}

/// Runs a judged query. `approved` says whether a person approved an escalated call (the
/// operator's gate); without it only an `Allow` runs.
pub async fn execute(
    databases: &Databases,
    database: &str,
    decision: &Decision,
    approved: bool,
) -> Execution {
    let Some(query) = decision.rewritten_query.clone() else {
        return Execution::Blocked;
    };
    match decision.verdict {
        Verdict::Block => return Execution::Blocked,
        Verdict::Escalate if !approved => return Execution::NeedsApproval,
        Verdict::Allow | Verdict::Escalate => {}
    }
    let guarded = GuardedQuery {
        sql: query.clone(),
        tables: Vec::new(),
        columns: Vec::new(),
        limit: decision.max_rows,
    };
    let started = Timestamp::now();
    let result = databases
        .execute(database, &guarded, query_limits(decision))
        .await;
    Execution::Ran {
        executed_query: query,
        result,
        started,
        finished: Timestamp::now(),
    }
}

/// The result of one `execute_sql` call (the tool's `outputSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct SqlOutput {
    /// Column names, in order (empty when nothing ran).
    pub columns: Vec<String>,
    /// One array per row, values in column order (numbers, strings, booleans, null; `numeric`
    /// as a string, timestamps as ISO 8601).
    pub rows: Vec<Vec<Value>>,
    /// Number of rows returned.
    pub row_count: u64,
    /// Whether rows were left out at the row or byte cap.
    pub truncated: bool,
    /// Execution time in milliseconds.
    pub duration_ms: u64,
    /// The run's name: the SandboxRun's name (cluster) or a generated id (embedded).
    pub run_name: String,
    /// What policy decided: Allow, Block or Escalate.
    pub verdict: Verdict,
    /// The policy rule that decided (`<rule>/sql-guard` when the SQL guard refused the query).
    pub rule: String,
    /// Why policy decided so, in words a model can act on.
    pub reason: String,
    /// Terminal phase: Succeeded, Failed or Rejected.
    pub phase: Phase,
    /// The query that was executed: the checked query as rewritten by the guard, with its LIMIT
    /// (one row above the policy's cap when the cap applies: that row only tells whether rows
    /// were left out, see `truncated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub executed_query: Option<String>,
    /// Human-readable explanation of a failure; used in the error text only.
    #[serde(skip)]
    #[schemars(skip)]
    pub message: Option<String>,
}

impl SqlOutput {
    /// A result with no rows, ending in `phase` after policy decided `verdict`.
    pub fn empty(
        run_name: String,
        verdict: Verdict,
        rule: &str,
        reason: &str,
        phase: Phase,
    ) -> Self {
        Self {
            columns: Vec::new(),
            rows: Vec::new(),
            row_count: 0,
            truncated: false,
            duration_ms: 0,
            run_name,
            verdict,
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            phase,
            executed_query: None,
            message: None,
        }
    }

    /// The same output carrying the rows of `result`.
    pub fn with_result(self, result: SqlResult) -> Self {
        Self {
            columns: result.columns,
            rows: result.rows,
            row_count: result.row_count,
            truncated: result.truncated,
            executed_query: Some(result.executed_query),
            ..self
        }
    }

    /// The output of an embedded execution.
    pub fn of(run_name: String, decision: &Decision, execution: &Execution) -> Self {
        let (phase, _, message) = execution.outcome(decision);
        let mut out = Self::empty(
            run_name,
            decision.verdict,
            &decision.rule,
            &decision.reason,
            phase,
        );
        if let Execution::Ran {
            executed_query,
            result,
            ..
        } = execution
        {
            out.executed_query = Some(executed_query.clone());
            match result {
                Ok(r) => out.duration_ms = r.duration_ms,
                Err(_) => out.message = Some(message),
            }
        }
        match execution.result() {
            Some(result) => out.with_result(result),
            None => out,
        }
    }

    /// Text a model can act on for a result that is not a success.
    pub fn error_text(&self) -> Option<String> {
        Summary {
            subject: "query",
            delivers: "its rows",
            phase: self.phase,
            verdict: self.verdict,
            run_name: &self.run_name,
            rule: &self.rule,
            reason: &self.reason,
            message: self.message.as_deref(),
        }
        .error_text()
    }
}

impl ToolSpec for ExecuteSql {
    const TOOL: Tool = Tool::Sql;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    type Args = ExecuteSqlArgs;
    type Call = ExecuteSqlArgs;
    type Output = SqlOutput;

    fn parse(args: &JsonObject, _: &ParseContext) -> Result<ExecuteSqlArgs, String> {
        parse_args(args)
    }

    fn environment(call: &ExecuteSqlArgs) -> Environment {
        call.environment
    }

    fn summary(output: &SqlOutput) -> CallSummary {
        CallSummary::of(output.phase, Some(output.verdict), &output.run_name)
    }

    fn error_text(_: &ExecuteSqlArgs, output: &SqlOutput, _: &ParseContext) -> Option<String> {
        output.error_text()
    }

    async fn run_embedded(
        embedded: &Embedded,
        agent: &str,
        run_name: String,
        call: ExecuteSqlArgs,
        _output: Option<crate::runner::OutputFn>,
    ) -> Result<SqlOutput, String> {
        let Some(databases) = embedded.databases.as_ref() else {
            return Err("execute_sql has no databases on this server".to_owned());
        };
        let context = CallContext::new(agent, Tool::Sql, call.environment)
            .with_sql(call.database.clone(), call.query.clone());
        let decision = decide(&embedded.policy, databases, context);
        tracing::info!(
            run = %run_name, agent, database = %call.database, verdict = %decision.verdict,
            rule = %decision.rule, "execute_sql decision"
        );
        let execution = execute(databases, &call.database, &decision, false).await;
        Ok(SqlOutput::of(run_name, &decision, &execution))
    }
}

/// The tool's part of the server's instructions ([`ToolSpec::INSTRUCTIONS`]).
pub const INSTRUCTIONS: &str = "execute_sql runs one read-only SQL query (a single SELECT or \
WITH ... SELECT) against a configured database, named in `database`, and returns its columns and \
rows. Name the columns you need: the policy allows only some tables and columns, adds or lowers \
the LIMIT to its cap, and the query as executed comes back in executedQuery.";

/// What a model reads about the tool before calling it (the tool's `description`).
pub const DESCRIPTION: &str = "Run one read-only SQL query (a single SELECT or WITH ... SELECT) against a \
configured database and return its columns and rows. The query is checked by \
policy before it runs: only allowed tables and columns, no SELECT * unless \
allowed, no writes, one statement; a LIMIT is added or lowered to the policy's \
cap, and the executed query is returned in executedQuery. A refused query is an \
error result that names the policy rule and says what to change.";

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;
