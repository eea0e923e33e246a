//! The `execute_sql` tool's domain side in the frontend: the arguments, the result the agent
//! sees, the early policy check and (embedded mode) the execution against a configured database.
//!
//! The flow of one call: the query is judged by the policy (the first matching rule, then the SQL
//! guard on its parsed structure); a `Block` comes back as a tool error with the verdict, the rule
//! and the guard's hint; an `Allow` runs **the guard's rewritten query** (never the agent's text),
//! read-only, with the rule's row and byte caps and statement timeout; an `Escalate` needs a
//! person to approve the run, which only the cluster (a SandboxRun) can offer.
//!
//! In cluster mode (`--backend kube`) each call becomes a SandboxRun with `spec.sql`; the
//! operator, which alone holds the database credentials, judges it authoritatively, runs it and
//! writes `status.result`, which [`from_status`] maps to the same output. A run that awaits
//! approval comes back as an error result "awaiting approval: <run name>" (`phase:
//! AwaitingApproval`): at once, or after `--approval-wait` when no person decided within it (the
//! call sends progress notifications meanwhile and returns the final result when they do).
//!
//! ## The embedded default policy
//!
//! `config/policy/policy.yaml` is a sample for clusters, not a safe default for a laptop. When no
//! `--policy-file` is given, [`EMBEDDED_POLICY`] applies: any agent may run `sql` on the `demo`
//! database in the `sandbox` environment, reading only the `ledger` columns `id, account, amount,
//! booked_at`, without `SELECT *`, with a LIMIT of at most 1000; `fetch_metrics` over the
//! server's own call counters is allowed (any agent, any environment); everything else is
//! blocked.
//! Without `--databases-file` the `demo` database is the SQLite demo file
//! `$SANDBOXRUN_CACHE/demo.sqlite` (default `~/.cache/sandboxrun/demo.sqlite`), created on first
//! use from `config/demo/demo.sql` and opened read-only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::model::{CallToolResult, JsonObject};
use sandboxrun_api::SandboxRunStatus;
use sandboxrun_core::policy::Policy as PolicyRules;
use sandboxrun_core::query::demo;
use sandboxrun_core::sql::GuardedQuery;
use sandboxrun_core::{
    CallContext, Databases, Decision, Environment, Phase, PolicyStore, QueryLimits, QueryResult,
    SqlDialect, Tool, Verdict,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::backend::kube::KubeBackend;
use crate::backend::{BackendError, ProgressFn};

/// The name of the demo database in the embedded default configuration.
pub const DEMO_DATABASE: &str = "demo";

/// The policy used when no `--policy-file` is given (see the module documentation).
pub const EMBEDDED_POLICY: &str = r#"
default: block
rules:
  - name: embedded-demo-sql
    agents: ["*"]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    reason: the embedded default policy allows read-only queries on the demo database in the sandbox
    limits:
      rows: 1000
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      allowWildcard: false
      maxLimit: 1000
  - name: embedded-own-metrics
    agents: ["*"]
    tools: [metrics]
    environments: ["*"]
    verdict: allow
    reason: the embedded default policy allows fetch_metrics over this server's own call counters
  - name: embedded-block-everything-else
    agents: ["*"]
    tools: ["*"]
    environments: ["*"]
    verdict: block
    reason: the embedded default policy only allows execute_sql on the demo database (table ledger, columns id, account, amount, booked_at) in the sandbox environment; start the server with --policy-file for anything else
"#;

/// Arguments of `execute_sql` (the tool's `inputSchema`). The tool parses the raw arguments
/// itself (see [`parse_args`]) so each mistake gets its own actionable message.
#[derive(Debug, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::portable)]
pub struct ExecuteSqlArgs {
    /// Name of a configured database, for example `demo`.
    #[schemars(length(min = 1))]
    pub database: String,
    /// One read-only SELECT (or WITH … SELECT) statement. List the columns you need; a LIMIT is
    /// added or lowered to the policy's cap.
    #[schemars(length(min = 1, max = sandboxrun_core::sql::MAX_QUERY_BYTES))]
    pub query: String,
    /// Environment the query targets: sandbox (default), staging or production.
    #[serde(default)]
    pub environment: Environment,
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
    /// A result with no rows for `decision`, ending in `phase`.
    pub fn empty(run_name: String, decision: &Decision, phase: Phase) -> Self {
        Self {
            columns: Vec::new(),
            rows: Vec::new(),
            row_count: 0,
            truncated: false,
            duration_ms: 0,
            run_name,
            verdict: decision.verdict,
            rule: decision.rule.clone(),
            reason: decision.reason.clone(),
            phase,
            executed_query: None,
            message: None,
        }
    }

    /// The result of an executed query.
    pub fn from_result(
        run_name: String,
        decision: &Decision,
        executed: String,
        result: QueryResult,
    ) -> Self {
        Self {
            columns: result.columns,
            rows: result.rows,
            row_count: result.row_count,
            truncated: result.truncated,
            duration_ms: result.duration_ms,
            executed_query: Some(executed),
            ..Self::empty(run_name, decision, Phase::Succeeded)
        }
    }

    /// Text a model can act on for a result that is not a success.
    pub fn error_text(&self) -> Option<String> {
        crate::governed::Summary {
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

    /// The MCP result: `structuredContent` always, the same JSON as text, and for anything but
    /// success first a sentence saying what happened and what to change.
    pub fn tool_result(&self) -> CallToolResult {
        let value = serde_json::to_value(self).expect("SqlOutput serializes");
        crate::governed::tool_result(value, self.error_text())
    }
}

/// Validates the raw arguments of `execute_sql`, or says exactly what to fix.
pub fn parse_args(args: &JsonObject) -> Result<ExecuteSqlArgs, String> {
    const EXAMPLE: &str =
        r#"for example {"database": "demo", "query": "SELECT id, amount FROM ledger"}"#;
    if let Some(unknown) = args
        .keys()
        .find(|k| !matches!(k.as_str(), "database" | "query" | "environment"))
    {
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
    let environment = match args.get("environment") {
        None | Some(Value::Null) => Environment::Sandbox,
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            format!("argument `environment` is {v}; it must be one of sandbox, staging, production")
        })?,
    };
    Ok(ExecuteSqlArgs {
        database,
        query,
        environment,
    })
}

/// The frontend's policy (local backend): `--policy-file`, else [`EMBEDDED_POLICY`].
pub fn load_policy(policy_file: Option<&Path>) -> anyhow::Result<PolicyStore> {
    Ok(match policy_file {
        Some(path) => PolicyStore::load(path)?,
        None => PolicyStore::new(embedded_policy()),
    })
}

/// Where `execute_sql` calls are judged and executed.
pub enum SqlService {
    /// Embedded: the frontend judges with its policy and runs the query itself.
    Local {
        /// The policy (a `--policy-file`, or [`EMBEDDED_POLICY`]).
        policy: PolicyStore,
        /// The databases (a `--databases-file`, or the demo database).
        databases: Databases,
    },
    /// Cluster: each call becomes a SandboxRun with `spec.sql`; the operator, which holds the
    /// database credentials, judges it (authoritatively), runs it and writes `status.result`.
    Cluster(Box<KubeBackend>),
}

impl SqlService {
    /// Loads the policy (`--policy-file`, else [`EMBEDDED_POLICY`]) and the databases
    /// (`--databases-file`, else the demo SQLite file, created when missing).
    pub async fn load_local(
        policy_file: Option<&Path>,
        databases_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let policy = load_policy(policy_file)?;
        let config = match databases_file {
            Some(path) => sandboxrun_core::load_databases_file(path)?,
            None => {
                let path = demo_database_path();
                demo::ensure_sqlite(&path).await?;
                BTreeMap::from([(DEMO_DATABASE.to_owned(), demo::database_config(&path))])
            }
        };
        let databases = Databases::from_config(&config)?;
        tracing::info!(databases = ?databases.names(), "execute_sql ready");
        Ok(Self::Local { policy, databases })
    }

    /// Judges and (when allowed) executes one query for `agent`.
    pub async fn execute(
        &self,
        agent: &str,
        args: &ExecuteSqlArgs,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<SqlOutput, BackendError> {
        match self {
            Self::Local { policy, databases } => tokio::select! {
                out = execute_local(policy, databases, agent, args) => Ok(out),
                () = cancel.cancelled() => Err(BackendError::Cancelled),
            },
            Self::Cluster(kube) => kube.execute_sql(agent, args, progress, cancel).await,
        }
    }
}

/// The embedded path: policy, then the rewritten query on the local databases.
async fn execute_local(
    policy: &PolicyStore,
    databases: &Databases,
    agent: &str,
    args: &ExecuteSqlArgs,
) -> SqlOutput {
    let run_name = format!("local-{}", uuid::Uuid::new_v4().simple());
    let dialect = databases
        .dialect(&args.database)
        .unwrap_or(SqlDialect::Postgres);
    let mut call = CallContext::new(agent, Tool::Sql, args.environment)
        .with_sql(args.database.clone(), args.query.clone());
    if let Some(sql) = call.sql.as_mut() {
        sql.dialect = dialect;
    }
    let decision = policy.evaluate(&call);
    tracing::info!(
        run = %run_name, agent, database = %args.database, verdict = ?decision.verdict,
        rule = %decision.rule, "execute_sql decision"
    );
    let Some(rewritten) = decision.rewritten_query.clone() else {
        return SqlOutput::empty(run_name, &decision, Phase::Rejected);
    };
    if decision.verdict != Verdict::Allow {
        return SqlOutput::empty(run_name, &decision, Phase::Rejected);
    }
    let guarded = GuardedQuery {
        sql: rewritten.clone(),
        tables: Vec::new(),
        columns: Vec::new(),
        limit: decision.max_rows,
    };
    match databases
        .execute(&args.database, &guarded, query_limits(&decision))
        .await
    {
        Ok(result) => SqlOutput::from_result(run_name, &decision, rewritten, result),
        Err(e) => SqlOutput {
            executed_query: Some(rewritten),
            message: Some(e.to_string()),
            ..SqlOutput::empty(run_name, &decision, Phase::Failed)
        },
    }
}

/// Reads the result of an sql SandboxRun: `None` until it is terminal or awaits approval.
pub fn from_status(name: &str, status: &SandboxRunStatus) -> Option<SqlOutput> {
    let phase = status.phase?;
    if !phase.is_terminal() && phase != Phase::AwaitingApproval {
        return None;
    }
    let (verdict, rule, reason) = match &status.decision {
        Some(d) => (d.verdict, d.rule.clone(), d.reason.clone()),
        None => (Verdict::Allow, String::new(), String::new()),
    };
    let result = status.result.as_ref();
    let field = |k: &str| result.and_then(|r| r.get(k));
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let rows: Vec<Vec<Value>> = field("rows")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .map(|r| r.as_array().cloned().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    Some(SqlOutput {
        columns: strings(field("columns")),
        row_count: field("rowCount")
            .and_then(Value::as_u64)
            .unwrap_or(rows.len() as u64),
        rows,
        truncated: field("truncated")
            .and_then(Value::as_bool)
            .or(status.truncated)
            .unwrap_or(false),
        duration_ms: status
            .duration_millis
            .and_then(|d| u64::try_from(d).ok())
            .unwrap_or(0),
        run_name: name.to_owned(),
        verdict,
        rule,
        reason,
        phase,
        executed_query: field("executedQuery")
            .and_then(Value::as_str)
            .map(str::to_owned),
        message: status.message.clone(),
    })
}

/// The caps of an allowed query: the decision's row cap, its output bytes and its timeout.
pub fn query_limits(decision: &Decision) -> QueryLimits {
    QueryLimits {
        statement_timeout: Duration::from_secs(u64::from(decision.limits.timeout_seconds)),
        max_rows: decision.max_rows,
        max_bytes: u64::from(decision.limits.output_bytes),
    }
}

/// The embedded default policy, parsed.
pub fn embedded_policy() -> PolicyRules {
    PolicyRules::from_yaml(EMBEDDED_POLICY, "<embedded default policy>")
        .expect("the embedded policy is valid")
}

/// `$SANDBOXRUN_CACHE/demo.sqlite`, else `~/.cache/sandboxrun/demo.sqlite`.
pub fn demo_database_path() -> PathBuf {
    let cache = std::env::var_os("SANDBOXRUN_CACHE")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
                .join(".cache")
                .join("sandboxrun")
        });
    cache.join("demo.sqlite")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    fn decision(verdict: Verdict) -> Decision {
        Decision {
            verdict,
            rule: "r".into(),
            reason: "because".into(),
            limits: sandboxrun_core::Limits::default(),
            max_rows: 1000,
            rewritten_query: None,
        }
    }

    #[test]
    fn embedded_policy_parses_and_allows_only_the_demo_ledger() {
        let p = embedded_policy();
        let call = |env, q: &str| {
            let mut c = CallContext::new("anyone", Tool::Sql, env).with_sql("demo", q);
            c.sql.as_mut().unwrap().dialect = SqlDialect::Sqlite;
            p.evaluate(&c)
        };
        let ok = call(Environment::Sandbox, "SELECT id, amount FROM ledger");
        assert_eq!(ok.verdict, Verdict::Allow, "{ok}");
        assert!(ok.rewritten_query.unwrap().ends_with("LIMIT 1001"));
        assert_eq!(ok.max_rows, 1000);
        assert_eq!(
            call(Environment::Sandbox, "SELECT * FROM ledger").verdict,
            Verdict::Block
        );
        assert_eq!(
            call(Environment::Sandbox, "SELECT detail FROM audit_log").verdict,
            Verdict::Block
        );
        assert_eq!(
            call(Environment::Production, "SELECT id FROM ledger").verdict,
            Verdict::Block
        );
        let metrics = p.evaluate(&CallContext::new(
            "anyone",
            Tool::Metrics,
            Environment::Staging,
        ));
        assert_eq!(metrics.verdict, Verdict::Allow, "{metrics}");
        assert_eq!(metrics.rule, "embedded-own-metrics");
        let python = p.evaluate(&CallContext::new(
            "anyone",
            Tool::Python,
            Environment::Sandbox,
        ));
        assert_eq!(python.verdict, Verdict::Block);
    }

    #[test]
    fn arguments_parse_with_actionable_errors() {
        let a = parse_args(&obj(json!({"database": "demo", "query": "SELECT 1"}))).unwrap();
        assert_eq!(a.environment, Environment::Sandbox);
        let a = parse_args(&obj(
            json!({"database": "demo", "query": "SELECT 1", "environment": "production"}),
        ))
        .unwrap();
        assert_eq!(a.environment, Environment::Production);
        let err = |v| parse_args(&obj(v)).unwrap_err();
        assert!(err(json!({"query": "x"})).starts_with("missing required argument `database`"));
        assert!(err(json!({"database": "d"})).starts_with("missing required argument `query`"));
        assert!(err(json!({"database": "d", "query": 3})).contains("must be a string"));
        assert!(err(json!({"database": "d", "query": " "})).contains("is empty"));
        assert!(
            err(json!({"database": "d", "query": "q", "environment": "prod"}))
                .contains("sandbox, staging, production")
        );
        assert!(
            err(json!({"database": "d", "query": "q", "sql": 1}))
                .contains("unknown argument `sql`")
        );
    }

    #[test]
    fn output_maps_rows_and_decisions() {
        let mut allow = decision(Verdict::Allow);
        allow.rewritten_query = Some("SELECT id FROM ledger LIMIT 1000".into());
        let result = QueryResult {
            columns: vec!["id".into()],
            rows: vec![vec![json!(1)], vec![json!(2)]],
            truncated: false,
            row_count: 2,
            duration_ms: 7,
        };
        let out = SqlOutput::from_result(
            "local-1".into(),
            &allow,
            "SELECT id FROM ledger LIMIT 1000".into(),
            result,
        );
        let r = out.tool_result();
        assert_eq!(r.is_error, Some(false));
        assert_eq!(
            r.structured_content.unwrap(),
            json!({"columns": ["id"], "rows": [[1], [2]], "rowCount": 2, "truncated": false,
                "durationMs": 7, "runName": "local-1", "verdict": "Allow", "rule": "r",
                "reason": "because", "phase": "Succeeded",
                "executedQuery": "SELECT id FROM ledger LIMIT 1000"})
        );

        let blocked =
            SqlOutput::empty("local-2".into(), &decision(Verdict::Block), Phase::Rejected);
        let r = blocked.tool_result();
        assert_eq!(r.is_error, Some(true));
        let sc = r.structured_content.clone().unwrap();
        assert_eq!(
            (sc["phase"].as_str(), sc["verdict"].as_str()),
            (Some("Rejected"), Some("Block"))
        );
        assert!(sc.get("executedQuery").is_none());
        let text = serde_json::to_value(&r.content[0]).unwrap()["text"].clone();
        assert_eq!(
            text,
            "the query was blocked by policy (verdict Block, rule r) and nothing was executed: \
             because"
        );

        let escalated = SqlOutput::empty(
            "local-3".into(),
            &decision(Verdict::Escalate),
            Phase::Rejected,
        );
        assert!(
            escalated
                .error_text()
                .unwrap()
                .contains("only available in cluster mode")
        );

        let failed = SqlOutput {
            message: Some("the database reported an error: no such column".into()),
            ..SqlOutput::empty("local-4".into(), &allow, Phase::Failed)
        };
        assert!(failed.error_text().unwrap().ends_with("no such column"));
    }

    #[test]
    fn cluster_status_maps_to_the_output() {
        use sandboxrun_api::Decision as Recorded;
        let decided = |verdict| Recorded {
            verdict,
            rule: "analysts-sandbox".into(),
            reason: "ok".into(),
        };
        let running = SandboxRunStatus {
            phase: Some(Phase::Running),
            ..Default::default()
        };
        assert!(from_status("run-1", &running).is_none());
        let done = SandboxRunStatus {
            phase: Some(Phase::Succeeded),
            decision: Some(decided(Verdict::Allow)),
            duration_millis: Some(12),
            result: Some(
                json!({"columns": ["id", "amount"], "rows": [[1, "-420.81"]],
                "rowCount": 1, "truncated": false, "executedQuery": "SELECT id, amount FROM ledger LIMIT 1000"}),
            ),
            ..Default::default()
        };
        let out = from_status("run-1", &done).unwrap();
        assert_eq!(out.columns, ["id", "amount"]);
        assert_eq!(out.rows, vec![vec![json!(1), json!("-420.81")]]);
        assert_eq!(
            (out.row_count, out.duration_ms, out.truncated),
            (1, 12, false)
        );
        assert_eq!(out.verdict, Verdict::Allow);
        assert_eq!(out.rule, "analysts-sandbox");
        assert!(out.executed_query.unwrap().ends_with("LIMIT 1000"));
        assert_eq!(out.run_name, "run-1");

        let awaiting = SandboxRunStatus {
            phase: Some(Phase::AwaitingApproval),
            decision: Some(decided(Verdict::Escalate)),
            message: Some("kubectl patch sandboxrun run-2 ...".into()),
            ..Default::default()
        };
        let out = from_status("run-2", &awaiting).unwrap();
        let r = out.tool_result();
        assert_eq!(r.is_error, Some(true));
        let text = serde_json::to_value(&r.content[0]).unwrap()["text"].clone();
        assert!(
            text.as_str()
                .unwrap()
                .starts_with("awaiting approval: run-2"),
            "{text}"
        );

        let rejected = SandboxRunStatus {
            phase: Some(Phase::Rejected),
            decision: Some(decided(Verdict::Allow)),
            message: Some("no databases are configured in the operator".into()),
            ..Default::default()
        };
        let out = from_status("run-3", &rejected).unwrap();
        assert!(out.rows.is_empty() && out.executed_query.is_none());
        assert!(
            out.error_text()
                .unwrap()
                .contains("no databases are configured")
        );

        let denied = SandboxRunStatus {
            phase: Some(Phase::Rejected),
            decision: Some(decided(Verdict::Escalate)),
            reason: Some("ApprovalDenied".into()),
            message: Some("a person denied it (spec.approval.approved: false)".into()),
            ..Default::default()
        };
        let text = from_status("run-4", &denied).unwrap().error_text().unwrap();
        assert!(
            text.contains("ended Rejected: a person denied it") && !text.contains("cluster mode"),
            "{text}"
        );
    }

    #[test]
    fn schemas_describe_the_wire_format() {
        let input = serde_json::to_value(schemars::schema_for!(ExecuteSqlArgs)).unwrap();
        assert_eq!(input["required"], json!(["database", "query"]));
        let output = serde_json::to_value(schemars::schema_for!(SqlOutput)).unwrap();
        for field in [
            "columns",
            "rows",
            "rowCount",
            "truncated",
            "durationMs",
            "runName",
            "verdict",
            "rule",
            "reason",
            "phase",
            "executedQuery",
        ] {
            assert!(output["properties"].get(field).is_some(), "{field}");
        }
        let text = output.to_string() + &input.to_string();
        assert!(
            !text.contains("\"null\"") && !text.contains("uint"),
            "{text}"
        );
    }
}
