//! The schema of a database as `execute_sql` may read it: the MCP resource
//! `sandboxrun://databases/{name}/schema`, so a model writes a query the guard accepts on the
//! first try instead of guessing table and column names.
//!
//! A schema read is an sql call of its own (the tool stays `sql`, so the rules that cover an
//! agent's queries cover it): policy judges it on the same context as a query of that database
//! with no environment named ([`super::sql::call_context`]: the database's dialect and
//! environment), the deciding rule's `sql` settings are recorded in the decision
//! ([`Decision::schema`]), and the executor reads the database's catalog with a fixed query and
//! keeps exactly the tables and columns that rule lets queries read, resolved as the guard
//! resolves names ([`crate::sql::Readable`]). A rule that escalates its queries still shows its
//! schema (reading the names a rule allows is not reading data); a blocking rule shows nothing.
//! In a cluster the operator executes it like a query (a SandboxRun with `spec.sql.schema`, its
//! decision, audit line and Event); embedded, [`SqlSchema::run_embedded`].

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::unknown_argument;
use super::governed::Summary;
use super::{CallSummary, Embedded, JsonObject, ParseContext, ToolSpec};
use crate::model::{Environment, Phase, Reason, Tool, Verdict};
use crate::policy::{CallContext, Decision};
use crate::query::catalog::Catalog;
use crate::query::{Databases, QueryError};
use crate::sql::{Readable, SqlDialect, SqlRules};

/// A read of one database's schema.
pub struct SqlSchema;

/// The environment a schema read names: none in particular, so the database's own decides
/// (`CallContext::reaching`).
pub const ENVIRONMENT: Environment = Environment::Sandbox;

/// The argument of a schema read: the database, as the resource's URI names it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, JsonSchema)]
pub struct SchemaArgs {
    /// Name of a configured database.
    pub database: String,
}

/// One column a query may read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SchemaColumn {
    /// Its name.
    pub name: String,
    /// Its type as the database declares it.
    #[serde(rename = "type")]
    pub data_type: String,
}

/// One table a query may read, named as a query names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SchemaTable {
    /// `table`, or `schema.table` outside the default schema.
    pub name: String,
    /// The columns a query may read, in the table's order.
    pub columns: Vec<SchemaColumn>,
}

/// What one agent's queries may read in one database: the operator writes it into
/// `status.result` and the frontend reads it back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaResult {
    /// The database's SQL dialect.
    pub dialect: SqlDialect,
    /// The readable tables, in catalog order.
    pub tables: Vec<SchemaTable>,
    /// Whether `SELECT *` (and `t.*`) may be used over tables whose every column is readable.
    pub allow_wildcard: bool,
    /// The most rows one query returns (its LIMIT is added or lowered to this).
    pub max_rows: u64,
    /// Whether the catalog was too large to read whole.
    pub truncated: bool,
}

/// The readable part of `catalog` under `rules` (pure).
pub fn view(
    catalog: &Catalog,
    rules: &SqlRules,
    dialect: SqlDialect,
    max_rows: u64,
) -> SchemaResult {
    let readable = Readable::new(rules, dialect);
    let mut tables: Vec<SchemaTable> = Vec::new();
    let mut rest = catalog.columns.as_slice();
    while let Some(first) = rest.first() {
        let len = rest
            .iter()
            .take_while(|c| c.schema == first.schema && c.table == first.table)
            .count();
        let (table, after) = rest.split_at(len);
        rest = after;
        let names = table.iter().map(|c| c.column.as_str());
        let Some((name, allowed)) = readable.table(&first.schema, &first.table, names) else {
            continue;
        };
        let columns = table
            .iter()
            .filter(|c| allowed.contains(&c.column.as_str()))
            .map(|c| SchemaColumn {
                name: c.column.clone(),
                data_type: c.data_type.clone(),
            })
            .collect::<Vec<_>>();
        if !columns.is_empty() {
            tables.push(SchemaTable { name, columns });
        }
    }
    SchemaResult {
        dialect,
        tables,
        allow_wildcard: rules.allow_wildcard,
        max_rows: max_rows.min(rules.max_limit),
        truncated: catalog.truncated,
    }
}

/// The context policy judges a schema read of `database` by `agent` on.
pub fn call_context(databases: &Databases, agent: &str, database: &str) -> CallContext {
    super::sql::call_context(
        databases,
        CallContext::new(agent, Tool::Sql, ENVIRONMENT).with_schema_read(database),
    )
}

/// Executes a judged schema read: `None` when the decision lets nothing be read.
pub async fn execute(
    databases: &Databases,
    database: &str,
    decision: &Decision,
) -> Option<Result<SchemaResult, QueryError>> {
    let rules = decision
        .schema
        .as_ref()
        .filter(|_| decision.verdict == Verdict::Allow)?;
    let timeout = Duration::from_secs(u64::from(decision.limits.timeout_seconds.max(1)));
    let dialect = databases.dialect(database).unwrap_or_default();
    Some(
        databases
            .catalog(database, timeout)
            .await
            .map(|catalog| view(&catalog, rules, dialect, decision.max_rows)),
    )
}

/// The terminal phase, reason and message of a schema read (the same words in the operator's
/// status and embedded).
pub fn outcome(
    decision: &Decision,
    read: Option<&Result<SchemaResult, QueryError>>,
) -> (Phase, Reason, String) {
    match read {
        None => (
            Phase::Rejected,
            Reason::PolicyBlocked,
            format!("blocked by rule {}: {}", decision.rule, decision.reason),
        ),
        Some(Ok(r)) => (
            Phase::Succeeded,
            Reason::QueryCompleted,
            format!(
                "the schema shows {} tables{}",
                r.tables.len(),
                if r.truncated {
                    " (the catalog was too large to read whole)"
                } else {
                    ""
                }
            ),
        ),
        Some(Err(e)) => (
            Phase::Failed,
            match e {
                QueryError::Timeout { .. } => Reason::QueryTimedOut,
                _ => Reason::QueryFailed,
            },
            e.to_string(),
        ),
    }
}

/// The content of a schema resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchemaOutput {
    /// The database.
    pub database: String,
    /// What the caller's queries may read (absent when the read did not succeed).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaResult>,
    /// The run's name: the SandboxRun's name (cluster) or a generated id (embedded).
    pub run_name: String,
    /// What policy decided about the read.
    pub verdict: Verdict,
    /// The rule that decided.
    pub rule: String,
    /// Why, in words a model can act on.
    pub reason: String,
    /// Terminal phase: Succeeded, Failed or Rejected.
    pub phase: Phase,
    /// Why a read failed; used in the error text only.
    #[serde(skip)]
    pub message: Option<String>,
}

impl SchemaOutput {
    /// The output of a read of `database` as run `run_name`, ended in `phase` after `verdict`.
    pub fn decided(
        database: &str,
        run_name: String,
        verdict: Verdict,
        rule: &str,
        reason: &str,
        phase: Phase,
    ) -> Self {
        Self {
            database: database.to_owned(),
            schema: None,
            run_name,
            verdict,
            rule: rule.to_owned(),
            reason: reason.to_owned(),
            phase,
            message: None,
        }
    }

    /// Text a model can act on for a read that did not succeed.
    pub fn error_text(&self) -> Option<String> {
        Summary {
            subject: "schema read",
            delivers: "the schema",
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

impl ToolSpec for SqlSchema {
    const TOOL: Tool = Tool::Sql;
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;
    type Args = SchemaArgs;
    type Call = SchemaArgs;
    type Output = SchemaOutput;

    fn parse(args: &JsonObject, _: &ParseContext) -> Result<SchemaArgs, String> {
        if let Some(unknown) = unknown_argument(args, &["database"]) {
            return Err(format!(
                "unknown argument `{unknown}`; a schema read takes `database` only"
            ));
        }
        match args.get("database") {
            Some(Value::String(d)) if !d.trim().is_empty() => Ok(SchemaArgs {
                database: d.clone(),
            }),
            _ => Err("a schema read needs `database`, the name of a configured database".into()),
        }
    }

    fn environment(_: &SchemaArgs) -> Environment {
        ENVIRONMENT
    }

    fn summary(output: &SchemaOutput) -> CallSummary {
        CallSummary::of(output.phase, Some(output.verdict), &output.run_name)
    }

    fn error_text(_: &SchemaArgs, output: &SchemaOutput, _: &ParseContext) -> Option<String> {
        output.error_text()
    }

    async fn run_embedded(
        embedded: &Embedded,
        agent: &str,
        run_name: String,
        call: SchemaArgs,
        _output: Option<crate::runner::OutputFn>,
    ) -> Result<SchemaOutput, String> {
        let Some(databases) = embedded.databases.as_ref() else {
            return Err("this server has no databases".to_owned());
        };
        let decision = embedded
            .policy
            .evaluate(&call_context(databases, agent, &call.database));
        tracing::info!(
            run = %run_name, agent, database = %call.database, verdict = %decision.verdict,
            rule = %decision.rule, "schema read decision"
        );
        let read = execute(databases, &call.database, &decision).await;
        let (phase, _, message) = outcome(&decision, read.as_ref());
        let mut out = SchemaOutput::decided(
            &call.database,
            run_name,
            decision.verdict,
            &decision.rule,
            &decision.reason,
            phase,
        );
        match read {
            Some(Ok(schema)) => out.schema = Some(schema),
            Some(Err(_)) => out.message = Some(message),
            None => {}
        }
        Ok(out)
    }
}

/// What the server's instructions say about schema resources (with `execute_sql`).
pub const INSTRUCTIONS: &str = "Before writing a query, read the resource \
sandboxrun://databases/{database}/schema: it lists exactly the tables and columns your queries \
may read there, with their types.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::catalog::CatalogColumn;

    fn catalog(columns: &[(&str, &str, &str, &str)]) -> Catalog {
        Catalog {
            columns: columns
                .iter()
                .map(|(schema, table, column, data_type)| CatalogColumn {
                    schema: (*schema).to_owned(),
                    table: (*table).to_owned(),
                    column: (*column).to_owned(),
                    data_type: (*data_type).to_owned(),
                })
                .collect(),
            truncated: false,
        }
    }

    #[test]
    fn the_view_keeps_exactly_the_readable_tables_and_columns() {
        let rules: SqlRules = serde_saphyr::from_str(
            "databases: [demo]\nmaxLimit: 50\ntables:\n  ledger: {columns: [id, amount]}\n  \
             audit.events: {columns: '*'}\n",
        )
        .expect("rules");
        let catalog = catalog(&[
            ("audit", "events", "at", "timestamp with time zone"),
            ("audit", "events", "what", "text"),
            ("pg_catalog", "pg_authid", "rolpassword", "text"),
            ("public", "accounts", "id", "integer"),
            ("public", "ledger", "id", "integer"),
            ("public", "ledger", "account", "text"),
            ("public", "ledger", "amount", "numeric"),
        ]);
        let view = view(&catalog, &rules, SqlDialect::Postgres, 1000);
        let shown: Vec<(String, Vec<String>)> = view
            .tables
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.columns.iter().map(|c| c.name.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            vec![
                (
                    "audit.events".to_owned(),
                    vec!["at".to_owned(), "what".to_owned()]
                ),
                (
                    "ledger".to_owned(),
                    vec!["id".to_owned(), "amount".to_owned()]
                ),
            ]
        );
        assert_eq!(view.tables[1].columns[1].data_type, "numeric");
        assert_eq!(view.max_rows, 50);
        assert!(!view.allow_wildcard);
    }

    #[test]
    fn a_table_with_no_readable_column_is_left_out() {
        let rules: SqlRules =
            serde_saphyr::from_str("databases: ['*']\ntables:\n  ledger: {columns: [missing]}\n")
                .expect("rules");
        let view = view(
            &catalog(&[("public", "ledger", "id", "integer")]),
            &rules,
            SqlDialect::Postgres,
            10,
        );
        assert!(view.tables.is_empty(), "{view:?}");
    }
}
