//! The rule settings of the SQL guard in a policy file: `functions`, `allowRecursive`,
//! `maxJoins`, `maxCrossJoins`; what a model reads when they refuse a query; and the ordinary
//! analytics the default allowlist keeps working without any of them.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use sandboxrun_core::model::{Environment, Tool, Verdict};
use sandboxrun_core::policy::{CallContext, Policy};
use sandboxrun_core::sql::{SqlDialect, SqlRules, ViolationKind, default_functions, guard};
use serde_json::json;

fn sample() -> Policy {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/policy/policy.yaml");
    Policy::load(path).expect("the sample policy parses")
}

fn sql(agent: &str, query: &str, dialect: SqlDialect) -> CallContext {
    let mut call = CallContext::new(agent, Tool::Sql, Environment::Sandbox).with_sql("demo", query);
    if let Some(request) = call.sql.as_mut() {
        request.dialect = dialect;
    }
    call
}

/// The rule of the embedded default policy (`EMBEDDED_POLICY` in `mcp-frontend/src/sql.rs`),
/// which lists no functions: the default allowlist must carry ordinary analytics.
const EMBEDDED_LIKE: &str = r#"
default: block
rules:
  - name: embedded-demo-sql
    agents: ["*"]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    limits:
      rows: 1000
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      allowWildcard: false
      maxLimit: 1000
"#;

#[test]
fn the_default_allowlist_carries_ordinary_analytics_in_both_dialects() {
    let policy = Policy::from_yaml(EMBEDDED_LIKE, "<test>").expect("policy");
    let common = [
        "SELECT account, sum(amount) AS total, count(*) AS n, avg(amount) AS mean \
         FROM ledger GROUP BY account ORDER BY total DESC",
        "SELECT account, round(avg(amount), 2), min(amount), max(amount) FROM ledger \
         WHERE amount > 0 GROUP BY account HAVING count(id) > 3",
        "SELECT lower(account), upper(account), coalesce(amount, 0) FROM ledger ORDER BY id",
        "SELECT count(DISTINCT account) FROM ledger",
        "SELECT id, amount, sum(amount) OVER (ORDER BY booked_at) FROM ledger",
        "SELECT account, amount FROM ledger WHERE account IN ('acme', 'globex') LIMIT 10",
        "SELECT CASE WHEN amount < 0 THEN 'debit' ELSE 'credit' END AS kind, count(*) \
         FROM ledger GROUP BY 1",
        "SELECT length(account), substr(account, 1, 3), abs(amount) FROM ledger",
    ];
    let postgres = [
        "SELECT date_trunc('month', booked_at) AS month, sum(amount) FROM ledger \
         GROUP BY date_trunc('month', booked_at) ORDER BY month",
        "SELECT EXTRACT(dow FROM booked_at) AS dow, count(*) FROM ledger GROUP BY 1",
        "SELECT to_char(booked_at, 'YYYY-MM') AS m, sum(amount)::numeric(12, 2) FROM ledger GROUP BY 1",
    ];
    let sqlite = [
        "SELECT strftime('%Y-%m', booked_at) AS month, sum(amount), total(amount) FROM ledger \
         GROUP BY 1 ORDER BY month",
        "SELECT date(booked_at), ifnull(amount, 0), CAST(amount AS INTEGER) FROM ledger",
    ];
    for (dialect, queries) in [
        (SqlDialect::Postgres, common.iter().chain(&postgres)),
        (SqlDialect::Sqlite, common.iter().chain(&sqlite)),
    ] {
        for query in queries {
            let d = policy.evaluate(&sql("anyone", query, dialect));
            assert_eq!(d.verdict, Verdict::Allow, "{dialect:?} {query}: {d}");
        }
    }
}

#[test]
fn a_function_outside_the_allowlist_is_refused_with_the_way_to_allow_it() {
    let d = sample().evaluate(&sql(
        "analyst-01",
        "SELECT account, string_agg(account, ',') FROM ledger GROUP BY account",
        SqlDialect::Postgres,
    ));
    assert_eq!(d.verdict, Verdict::Block, "{d}");
    assert_eq!(d.rule, "analysts-sandbox/sql-guard");
    for needle in [
        "the function string_agg is not allowed by policy",
        "by rule analysts-sandbox",
        "sql.functions",
        "count",
        "date_trunc",
    ] {
        assert!(d.reason.contains(needle), "{needle:?} in {}", d.reason);
    }
}

#[test]
fn the_rule_settings_extend_and_bound_the_guard() {
    let policy = Policy::from_yaml(
        r#"
default: block
rules:
  - name: reporting
    agents: ["*"]
    tools: [sql]
    verdict: allow
    sql:
      databases: ["*"]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      functions: [string_agg, reporting.fiscal_year]
      tableFunctions: [generate_series]
      allowRecursive: true
      maxJoins: 2
      maxCrossJoins: 0
"#,
        "<test>",
    )
    .expect("policy");
    let check = |query: &str| policy.evaluate(&sql("a", query, SqlDialect::Postgres));
    for query in [
        "SELECT string_agg(account, ',') FROM ledger",
        "SELECT reporting.fiscal_year(booked_at) FROM ledger",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r",
        "SELECT a.id FROM ledger a JOIN ledger b ON a.id = b.id JOIN ledger c ON c.id = a.id",
        "SELECT g FROM generate_series(1, 3) AS g",
    ] {
        let d = check(query);
        assert_eq!(d.verdict, Verdict::Allow, "{query}: {d}");
    }
    for (query, needle) in [
        ("SELECT fiscal_year(booked_at) FROM ledger", "sql.functions"),
        (
            "SELECT other.fiscal_year(booked_at) FROM ledger",
            "sql.functions",
        ),
        (
            "SELECT a.id FROM ledger a JOIN ledger b ON a.id = b.id JOIN ledger c ON c.id = a.id \
             JOIN ledger d ON d.id = a.id",
            "sql.maxJoins",
        ),
        ("SELECT a.id FROM ledger a, ledger b", "sql.maxCrossJoins"),
        ("SELECT generate_series(1, 3)", "sql.functions"),
    ] {
        let d = check(query);
        assert_eq!(d.verdict, Verdict::Block, "{query}: {d}");
        assert!(
            d.reason.contains(needle),
            "{query}: {needle:?} in {}",
            d.reason
        );
    }
}

#[test]
fn hard_denied_functions_cannot_be_listed() {
    for (functions, needle) in [
        ("[pg_sleep]", "pg_sleep, which no policy can allow"),
        ("[PG_READ_FILE]", "which no policy can allow"),
        ("[set_config]", "which no policy can allow"),
        ("[query_to_xml]", "which no policy can allow"),
        ("[\"lower()\"]", "write a function name"),
        ("[\"a.b.c\"]", "write a function name"),
    ] {
        let yaml = format!(
            "rules:\n  - name: r\n    agents: [\"*\"]\n    tools: [sql]\n    verdict: allow\n    sql:\n      databases: [\"*\"]\n      functions: {functions}\n"
        );
        let e = Policy::from_yaml(&yaml, "<test>").expect_err(functions);
        assert!(e.to_string().contains(needle), "{functions}: {e}");
    }
    let e = Policy::from_yaml(
        "rules:\n  - name: r\n    agents: [\"*\"]\n    tools: [sql]\n    verdict: allow\n    sql:\n      databases: [\"*\"]\n      tableFunctions: [dblink]\n",
        "<test>",
    )
    .expect_err("dblink");
    assert!(e.to_string().contains("which no policy can allow"), "{e}");
    // Listed or not, a hard-denied function never runs.
    let rules: SqlRules = serde_json::from_value(json!({
        "databases": ["*"],
        "functions": ["pg_sleep"]
    }))
    .expect("rules (validated only when a policy loads)");
    let v = guard("SELECT pg_sleep(1)", SqlDialect::Postgres, &rules).expect_err("denied");
    assert_eq!(v.kind, ViolationKind::DeniedFunction, "{v}");
}

#[test]
fn defaults_do_not_include_what_the_allowlist_is_for() {
    for dialect in [SqlDialect::Postgres, SqlDialect::Sqlite] {
        let defaults = default_functions(dialect);
        for name in [
            "repeat",
            "lpad",
            "rpad",
            "format",
            "printf",
            "replace",
            "regexp_replace",
            "string_agg",
            "array_agg",
            "json_agg",
            "group_concat",
            "to_json",
            "row_to_json",
            "randomblob",
            "zeroblob",
            "ts_rewrite",
            "ts_stat",
            "query_to_xml",
            "xpath",
            "current_user",
            "version",
            "generate_series",
            "unnest",
            "pg_sleep",
        ] {
            assert!(!defaults.contains(&name), "{dialect:?} allows {name}");
        }
        for name in [
            "count", "sum", "avg", "min", "max", "round", "coalesce", "lower",
        ] {
            assert!(defaults.contains(&name), "{dialect:?} lacks {name}");
        }
    }
}

#[test]
fn violations_name_the_new_kinds() {
    let rules: SqlRules = serde_json::from_value(json!({
        "databases": ["*"],
        "tables": {"ledger": {"columns": ["id", "account", "amount", "booked_at"]}}
    }))
    .unwrap();
    for (query, kind) in [
        (
            "SELECT ts_rewrite('x'::tsquery, 'SELECT 1')::text",
            ViolationKind::DeniedFunction,
        ),
        ("SELECT 'x'::tsquery", ViolationKind::CastNotAllowed),
        (
            "SELECT to_tsvector(account) FROM ledger",
            ViolationKind::FunctionNotAllowed,
        ),
        ("SELECT 'x'::xml", ViolationKind::CastNotAllowed),
        (
            "SELECT 'pg_class'::pg_catalog.regclass",
            ViolationKind::DeniedFunction,
        ),
        ("SELECT current_user", ViolationKind::FunctionNotAllowed),
        (
            "SELECT id FROM ledger WHERE account OPERATOR(pg_catalog.~~) 'a%'",
            ViolationKind::FunctionNotAllowed,
        ),
        (
            "WITH RECURSIVE r AS (SELECT 1) SELECT 1 FROM r",
            ViolationKind::Recursive,
        ),
        (
            "SELECT a.id FROM ledger a, ledger b, ledger c",
            ViolationKind::TooManyJoins,
        ),
    ] {
        let v = guard(query, SqlDialect::Postgres, &rules).expect_err(query);
        assert_eq!(v.kind, kind, "{query}: {v}");
    }
}
