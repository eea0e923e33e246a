//! `sandboxrun_core::query` against a real PostgreSQL started by `e2e/postgres/start.sh`.
//!
//! The tests read `SANDBOXRUN_TEST_POSTGRES_URL` (the reader role's URL printed by start.sh).
//! Without it they are skipped with a note, unless `SANDBOXRUN_REQUIRE_POSTGRES=1` (CI), where
//! they fail.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod postgres_common;

use postgres_common::postgres_url;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sandboxrun_core::query::{DatabaseConfig, Databases, QueryError, QueryLimits};
use sandboxrun_core::sql::{GuardedQuery, SqlDialect, SqlRules, guard};
use serde_json::json;

fn password(url: &str) -> String {
    let rest = &url[url.find("://").unwrap() + 3..];
    let userinfo = &rest[..rest.rfind('@').unwrap()];
    userinfo[userinfo.find(':').unwrap() + 1..].to_owned()
}

fn databases(url: &str, max_connections: u32) -> Databases {
    let mut config = BTreeMap::new();
    let mut db = DatabaseConfig::with_url(SqlDialect::Postgres, url);
    db.max_connections = Some(max_connections);
    config.insert("main".to_owned(), db);
    Databases::from_config(&config).expect("config")
}

/// A query that did not go through the guard (on purpose: the executor must hold on its own).
fn raw(sql: &str) -> GuardedQuery {
    GuardedQuery {
        sql: sql.to_owned(),
        tables: vec![],
        columns: vec![],
        limit: 0,
    }
}

fn limits() -> QueryLimits {
    QueryLimits {
        statement_timeout: Duration::from_secs(5),
        max_rows: 1000,
        max_bytes: 1 << 20,
    }
}

fn assert_no_password(url: &str, e: &QueryError) {
    let p = password(url);
    assert!(!e.to_string().contains(&p), "password in error: {e}");
    assert!(
        !format!("{e:?}").contains(&p),
        "password in error debug: {e:?}"
    );
}

#[tokio::test]
async fn legit_column_query_returns_typed_rows() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 2);
    let rules: SqlRules = serde_json::from_value(json!({
        "databases": ["main"],
        "tables": {"ledger": {"columns": ["id", "account", "amount", "booked_at"]}},
        "allowWildcard": false,
        "maxLimit": 100
    }))
    .expect("rules");
    let guarded = guard(
        "SELECT id, account, amount, booked_at FROM ledger WHERE id <= 3 ORDER BY id",
        SqlDialect::Postgres,
        &rules,
    )
    .expect("guard accepts the query");
    let result = dbs.execute("main", &guarded, limits()).await.expect("rows");
    assert_eq!(result.columns, ["id", "account", "amount", "booked_at"]);
    assert_eq!(result.row_count, 3);
    assert!(!result.truncated);
    assert_eq!(
        result.rows[0],
        vec![
            json!(1),
            json!("umbrella"),
            json!("-420.81"),
            json!("2026-01-01T09:00:00Z")
        ]
    );
    assert_eq!(result.rows[2][0], json!(3));
    assert_eq!(result.rows[2][1], json!("hooli"));
}

#[tokio::test]
async fn values_are_converted_by_type() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 1);
    let r = dbs
        .execute(
            "main",
            &raw(
                "SELECT 1::int2 AS a, 2::int4 AS b, 3::int8 AS c, 1.5::float8 AS d, \
                  'NaN'::float8 AS e, 12345.678::numeric AS f, true AS g, 'x'::text AS h, \
                  '\\xdeadbeef'::bytea AS i, NULL::int AS j, '2026-02-03'::date AS k, \
                  '2026-02-03 04:05:06.5'::timestamp AS l, '{\"k\":[1,2]}'::jsonb AS m, \
                  ARRAY[1,2] AS n, interval '1 day' AS o, \
                  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS p, '04:05:06'::time AS q",
            ),
            limits(),
        )
        .await
        .expect("row");
    assert_eq!(
        r.columns,
        [
            "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"
        ]
    );
    assert_eq!(
        r.rows[0],
        vec![
            json!(1),
            json!(2),
            json!(3),
            json!(1.5),
            json!("NaN"),
            json!("12345.678"),
            json!(true),
            json!("x"),
            json!("3q2+7w=="),
            json!(null),
            json!("2026-02-03"),
            json!("2026-02-03T04:05:06.5"),
            json!({"k": [1, 2]}),
            json!("{1,2}"),
            json!("1 day"),
            json!("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            json!("04:05:06"),
        ]
    );
}

#[tokio::test]
async fn empty_result_still_has_columns() {
    let Some(url) = postgres_url() else { return };
    let r = databases(&url, 1)
        .execute(
            "main",
            &raw("SELECT id, account FROM ledger WHERE id < 0"),
            limits(),
        )
        .await
        .expect("empty");
    assert_eq!(r.columns, ["id", "account"]);
    assert_eq!(r.row_count, 0);
    assert!(!r.truncated);
}

#[tokio::test]
async fn set_config_cannot_escape_the_read_only_transaction() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 1);
    // The brief's literal probe: refused (no such parameter).
    let e = dbs
        .execute("main", &raw("SELECT set_config('x','y',false)"), limits())
        .await
        .expect_err("set_config('x') fails");
    assert_no_password(&url, &e);
    // Turning the transaction read-write is refused inside the read-only transaction.
    let e = dbs
        .execute(
            "main",
            &raw("SELECT set_config('transaction_read_only','off',false)"),
            limits(),
        )
        .await
        .expect_err("cannot switch to read-write");
    assert!(matches!(e, QueryError::ReadOnly { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("the database refused a write"),
        "{e}"
    );
    // A session-level setting is undone by the ROLLBACK: the (only) pooled connection is clean.
    dbs.execute(
        "main",
        &raw("SELECT set_config('sandboxrun.probe','leaked',false)"),
        limits(),
    )
    .await
    .expect("set_config on a custom parameter runs");
    let r = dbs
        .execute(
            "main",
            &raw("SELECT current_setting('sandboxrun.probe', true) AS v"),
            limits(),
        )
        .await
        .expect("read it back");
    assert_ne!(
        r.rows[0][0],
        json!("leaked"),
        "setting survived the rollback"
    );
}

#[tokio::test]
async fn writing_function_fails_in_the_read_only_transaction() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 1);
    let e = dbs
        .execute("main", &raw("SELECT sandboxrun_write_probe()"), limits())
        .await
        .expect_err("the write probe must fail");
    assert!(matches!(e, QueryError::ReadOnly { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with(
            "the database refused a write: cannot execute INSERT in a read-only transaction"
        ),
        "{e}"
    );
    assert_no_password(&url, &e);
    let e = dbs
        .execute("main", &raw("SELECT nextval('probe_seq')"), limits())
        .await
        .expect_err("nextval must fail");
    assert!(
        matches!(
            e,
            QueryError::PermissionDenied { .. } | QueryError::ReadOnly { .. }
        ),
        "{e:?}"
    );
    let r = dbs
        .execute(
            "main",
            &raw("SELECT count(*) AS n FROM probe_log"),
            limits(),
        )
        .await
        .expect("count");
    assert_eq!(r.rows[0][0], json!(0), "the probe wrote a row");
}

#[tokio::test]
async fn reader_role_cannot_write_even_in_a_read_write_transaction() {
    use sqlx::Connection;
    let Some(url) = postgres_url() else { return };
    // Outside sandboxrun: the role itself lacks the privileges.
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql("BEGIN READ WRITE")
        .execute(&mut conn)
        .await
        .expect("begin");
    let e = sqlx::query("SELECT sandboxrun_write_probe()")
        .execute(&mut conn)
        .await
        .expect_err("no INSERT privilege");
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42501"),
        "{e}"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    sqlx::raw_sql("BEGIN READ WRITE")
        .execute(&mut conn)
        .await
        .expect("begin");
    let e = sqlx::query("SELECT nextval('probe_seq')")
        .execute(&mut conn)
        .await
        .expect_err("no sequence privilege");
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42501"),
        "{e}"
    );
}

#[tokio::test]
async fn slow_query_stops_at_the_statement_timeout() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 1);
    let started = Instant::now();
    let e = dbs
        .execute(
            "main",
            &raw("SELECT pg_sleep(5)"),
            QueryLimits {
                statement_timeout: Duration::from_secs(1),
                ..limits()
            },
        )
        .await
        .expect_err("times out");
    let took = started.elapsed();
    eprintln!("pg_sleep(5) with a 1 s timeout: {took:?}: {e}");
    assert!(matches!(e, QueryError::Timeout { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("the query ran longer than 1s and was cancelled"),
        "{e}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // The connection is usable afterwards.
    dbs.execute("main", &raw("SELECT 1 AS one"), limits())
        .await
        .expect("next query");
}

#[tokio::test]
async fn million_rows_are_capped_and_streamed() {
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 1);
    let started = Instant::now();
    let r = dbs
        .execute("main", &raw("SELECT * FROM big"), limits())
        .await
        .expect("rows");
    let took = started.elapsed();
    eprintln!("SELECT * FROM big, max_rows 1000: {took:?}");
    assert_eq!(r.columns, ["id", "payload", "amount"]);
    assert_eq!(r.row_count, 1000);
    assert_eq!(r.rows.len(), 1000);
    assert!(r.truncated);
    // Loading a million rows takes seconds; the cursor fetches only 1001.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // An exact fit is not truncated.
    let r = dbs
        .execute(
            "main",
            &raw("SELECT id FROM big ORDER BY id LIMIT 1000"),
            limits(),
        )
        .await
        .expect("rows");
    assert_eq!(r.row_count, 1000);
    assert!(!r.truncated);
}

#[tokio::test]
async fn byte_cap_truncates() {
    let Some(url) = postgres_url() else { return };
    let r = databases(&url, 1)
        .execute(
            "main",
            &raw("SELECT id, payload FROM big ORDER BY id"),
            QueryLimits {
                max_bytes: 1000,
                ..limits()
            },
        )
        .await
        .expect("rows");
    assert!(r.truncated);
    assert!(r.row_count > 0 && r.row_count < 30, "{}", r.row_count);
    let bytes: usize = r
        .rows
        .iter()
        .map(|row| serde_json::to_string(row).unwrap().len())
        .sum();
    assert!(bytes <= 1000, "{bytes}");
}

#[tokio::test]
async fn unknown_database_lists_configured_names() {
    let Some(url) = postgres_url() else { return };
    let e = databases(&url, 1)
        .execute("nope", &raw("SELECT 1"), limits())
        .await
        .expect_err("unknown");
    assert_eq!(
        e.to_string(),
        "unknown database \"nope\"; configured databases: main"
    );
}

#[tokio::test]
async fn password_never_appears_in_errors() {
    let Some(url) = postgres_url() else { return };
    let p = password(&url);
    // Wrong password: the connection error must not echo either password.
    let bad = url.replacen(&p, "wrong-secret-123", 1);
    let dbs = databases(&bad, 1);
    let e = dbs
        .execute("main", &raw("SELECT 1"), limits())
        .await
        .expect_err("authentication fails");
    assert!(matches!(e, QueryError::Connect { .. }), "{e:?}");
    assert!(!e.to_string().contains("wrong-secret-123"), "{e}");
    assert!(!format!("{dbs:?}").contains("wrong-secret-123"));
    // A query that echoes the password back in an error message.
    let dbs = databases(&url, 1);
    let e = dbs
        .execute(
            "main",
            &raw(&format!("SELECT 1/0 AS \"{p}\" FROM nosuchtable_{p}")),
            limits(),
        )
        .await
        .expect_err("fails");
    assert_no_password(&url, &e);
    for sql in [
        "SELECT pg_sleep(5)",
        "SELECT sandboxrun_write_probe()",
        "SELEC 1",
    ] {
        let e = dbs
            .execute(
                "main",
                &raw(sql),
                QueryLimits {
                    statement_timeout: Duration::from_millis(300),
                    ..limits()
                },
            )
            .await
            .expect_err(sql);
        assert_no_password(&url, &e);
    }
}

#[tokio::test]
async fn multiple_statements_are_refused() {
    let Some(url) = postgres_url() else { return };
    let e = databases(&url, 1)
        .execute("main", &raw("SELECT 1; DELETE FROM ledger"), limits())
        .await
        .expect_err("refused");
    assert!(matches!(e, QueryError::Database { .. }), "{e:?}");
}

/// The whole path of a policy-checked query (as the operator runs it): the rule's cap lowers
/// the LIMIT, at most the cap comes back, and the result says rows were left out.
#[tokio::test]
async fn policy_capped_query_on_a_million_rows_is_flagged_truncated() {
    use sandboxrun_core::policy::Policy;
    use sandboxrun_core::{CallContext, Environment, Tool, Verdict};
    let Some(url) = postgres_url() else { return };
    let policy = Policy::from_yaml(
        r#"
rules:
  - name: big-reader
    agents: ["*"]
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    limits: {rows: 1000}
    sql:
      databases: [main]
      tables: {big: {columns: [id, amount]}}
      maxLimit: 5000
"#,
        "test",
    )
    .expect("policy");
    let dbs = databases(&url, 1);
    let run = |query: &str| {
        let mut call =
            CallContext::new("a", Tool::Sql, Environment::Sandbox).with_sql("main", query);
        call.sql.as_mut().unwrap().dialect = SqlDialect::Postgres;
        let d = policy.evaluate(&call);
        assert_eq!(d.verdict, Verdict::Allow, "{d}");
        let guarded = GuardedQuery {
            sql: d.rewritten_query.clone().unwrap(),
            tables: vec![],
            columns: vec![],
            limit: d.max_rows,
        };
        let limits = QueryLimits {
            max_rows: d.max_rows,
            ..limits()
        };
        let dbs = dbs.clone();
        async move { dbs.execute("main", &guarded, limits).await.expect("rows") }
    };
    for query in [
        "SELECT id, amount FROM big",
        "SELECT id FROM big ORDER BY id LIMIT 500000",
    ] {
        let r = run(query).await;
        assert_eq!((r.row_count, r.truncated), (1000, true), "{query}");
    }
    // A LIMIT below the cap is what the agent asked for: complete, not truncated.
    let r = run("SELECT id FROM big ORDER BY id LIMIT 10").await;
    assert_eq!((r.row_count, r.truncated), (10, false));
    assert_eq!(r.rows.last().unwrap(), &vec![json!(10)]);
}

/// The schema resource's read on PostgreSQL: the reader role's catalog, filtered by a rule, is
/// exactly the rule's tables and columns with their declared types; system catalogs stay out
/// under `*`.
#[tokio::test]
async fn the_schema_view_of_a_rule_is_its_tables_and_columns() {
    use sandboxrun_core::tools::sql_schema::view;
    let Some(url) = postgres_url() else { return };
    let dbs = databases(&url, 2);
    let catalog = dbs
        .catalog("main", Duration::from_secs(10))
        .await
        .expect("catalog");
    assert!(!catalog.truncated);
    let listed: SqlRules = serde_json::from_value(json!({
        "databases": ["main"],
        "tables": {"ledger": {"columns": ["id", "amount"]}, "public.audit_log": {"columns": ["actor"]}},
        "maxLimit": 100
    }))
    .expect("rules");
    let shown = view(&catalog, &listed, SqlDialect::Postgres, 1000);
    let names: Vec<(String, Vec<(String, String)>)> = shown
        .tables
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.columns
                    .iter()
                    .map(|c| (c.name.clone(), c.data_type.clone()))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            (
                "audit_log".to_owned(),
                vec![("actor".to_owned(), "text".to_owned())]
            ),
            (
                "ledger".to_owned(),
                vec![
                    ("id".to_owned(), "integer".to_owned()),
                    ("amount".to_owned(), "numeric".to_owned())
                ]
            ),
        ]
    );
    assert_eq!(shown.max_rows, 100);
    let any: SqlRules = serde_json::from_value(json!({
        "databases": ["*"], "tables": {"*": {"columns": "*"}}
    }))
    .expect("rules");
    let everything = view(&catalog, &any, SqlDialect::Postgres, 1000);
    let tables: Vec<&str> = everything.tables.iter().map(|t| t.name.as_str()).collect();
    assert!(
        tables.contains(&"ledger") && tables.contains(&"audit_log"),
        "{tables:?}"
    );
    assert!(
        tables
            .iter()
            .all(|t| !t.starts_with("pg_") && !t.starts_with("information_schema.")),
        "{tables:?}"
    );
}
