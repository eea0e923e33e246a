//! Bounded work in `execute_sql` (issue 24, items 4–6), one section per class:
//!
//! 1. One function call must not do unbounded work the database cannot interrupt: superlinear
//!    functions and operators take their cost-multiplying operands as short literals, and no
//!    operand is padded (`''::char(n)`, `lpad`, numeric scales) beyond a small width and the
//!    query's total budget. Checked on the guard's refusal directly, in both dialects.
//! 2. The guard and PostgreSQL read the text alike: the executor forces the session settings
//!    the guard assumes (`standard_conforming_strings`, `search_path`), whatever the server,
//!    database, role or URL say.
//! 3. SQLite's eponymous virtual tables (`dbstat`, …) are catalogs: a `"*"` tables rule does not
//!    cover them.
//! 4. No PostgreSQL backend of ours runs past its timeout plus one second: after hostile
//!    queries that no machine can finish, `pg_stat_activity` shows no busy backend of ours.
//!
//! PostgreSQL tests read `SANDBOXRUN_TEST_POSTGRES_URL` (see `query_postgres.rs`) and are
//! skipped without it unless `SANDBOXRUN_REQUIRE_POSTGRES=1`.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

mod postgres_common;

use postgres_common::postgres_url;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandboxrun_core::query::{DatabaseConfig, Databases, QueryError, QueryLimits, demo};
use sandboxrun_core::sql::{
    GuardedQuery, MAX_OPERAND_CHARS, MAX_PADDED_WIDTH, SqlDialect, SqlRules, ViolationKind, guard,
};
use serde_json::json;
use sqlx::Connection;

fn rules(tables: serde_json::Value) -> SqlRules {
    serde_json::from_value(json!({"databases": ["*"], "tables": tables, "allowWildcard": true}))
        .expect("rules")
}

/// The demo ledger, every column.
fn ledger_rules() -> SqlRules {
    rules(json!({"ledger": {"columns": "*"}}))
}

fn refused(query: &str, dialect: SqlDialect, rules: &SqlRules, kind: ViolationKind) {
    let v = guard(query, dialect, rules)
        .err()
        .unwrap_or_else(|| panic!("{dialect:?} accepted {query}"));
    assert_eq!(v.kind, kind, "{dialect:?} {query}: {v}");
    assert!(!v.hint.is_empty(), "{v}");
}

fn accepted(query: &str, dialect: SqlDialect, rules: &SqlRules) {
    if let Err(v) = guard(query, dialect, rules) {
        panic!("{dialect:?} refused {query}: {v}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Superlinear calls and padding.

#[test]
fn superlinear_calls_need_short_literal_operands_in_postgres() {
    let r = ledger_rules();
    let long = format!("'{}'", "x".repeat(MAX_OPERAND_CHARS + 1));
    let pg = SqlDialect::Postgres;
    for q in [
        // The issue's shape and its relatives: the set, the needle, the pattern computed.
        "SELECT ltrim(account, concat(''::char(1000), 'x')) FROM ledger",
        "SELECT btrim(account, account) FROM ledger",
        "SELECT rtrim(account, lpad('', 900, 'y')) FROM ledger",
        "SELECT pg_catalog.btrim(account, account) FROM ledger",
        "SELECT ltrim(account, 'x' || account) FROM ledger",
        "SELECT ltrim(account, (SELECT max(account) FROM ledger)) FROM ledger",
        "SELECT translate(account, account, 'x') FROM ledger",
        "SELECT translate(account, 'ab', upper(account)) FROM ledger",
        "SELECT TRIM(BOTH account FROM account) FROM ledger",
        "SELECT TRIM(LEADING concat(''::char(100)) FROM account) FROM ledger",
        "SELECT strpos(account, account) FROM ledger",
        "SELECT POSITION(account IN account) FROM ledger",
        "SELECT split_part(account, account, 1) FROM ledger",
        "SELECT account ~ account FROM ledger",
        "SELECT account !~* lower(account) FROM ledger",
        "SELECT account ~ ANY(ARRAY[account, 'a']) FROM ledger",
        "SELECT account SIMILAR TO account FROM ledger",
        "SELECT regexp_count(account, account) FROM ledger",
        "SELECT regexp_like(account, 'a', account) FROM ledger",
        "SELECT id FROM ledger WHERE regexp_match(account, account::text) IS NULL",
        "WITH s AS (SELECT account AS a FROM ledger) SELECT btrim(a, a) FROM s",
    ] {
        refused(q, pg, &r, ViolationKind::UnboundedWork);
    }
    refused(
        &format!("SELECT ltrim(account, {long}) FROM ledger"),
        pg,
        &r,
        ViolationKind::UnboundedWork,
    );
    refused(
        &format!("SELECT translate(account, 'a', {long}) FROM ledger"),
        pg,
        &r,
        ViolationKind::UnboundedWork,
    );
    // The ordinary forms stay allowed.
    for q in [
        "SELECT ltrim(account, 'x'), btrim(account), rtrim(account, ' -') FROM ledger",
        "SELECT translate(account, 'abc', 'xyz') FROM ledger",
        "SELECT TRIM(BOTH 'x' FROM account), TRIM(account) FROM ledger",
        "SELECT strpos(account, 'a'), POSITION('a' IN account), split_part(account, '-', 1) FROM ledger",
        "SELECT id FROM ledger WHERE account ~ '^a' AND account SIMILAR TO '(a|g)%'",
        "SELECT regexp_count(account, 'a+', 1, 'i') FROM ledger",
        "SELECT account::char(10), CAST(account AS varchar(5000)) FROM ledger",
        "SELECT amount::numeric(12, 2) FROM ledger",
    ] {
        accepted(q, pg, &r);
    }
}

#[test]
fn padding_is_bounded_per_value_and_per_query() {
    let r = ledger_rules();
    let pg = SqlDialect::Postgres;
    let wide = MAX_PADDED_WIDTH + 1;
    for q in [
        format!("SELECT concat(''::char({wide}))"),
        "SELECT concat(''::char(100000))".to_owned(),
        format!("SELECT length(CAST('' AS character({wide})))"),
        format!("SELECT octet_length(''::bpchar({wide}))"),
        format!("SELECT octet_length(''::pg_catalog.bpchar({wide}))"),
        format!("SELECT octet_length(char({wide}) 'x')"),
        format!("SELECT cardinality('{{}}'::char({wide})[])"),
        format!("SELECT 1::numeric(1000, {})", MAX_PADDED_WIDTH + 1),
        format!("SELECT lpad(account, {wide}) FROM ledger"),
    ] {
        let v = guard(&q, pg, &r).expect_err(&q);
        assert!(
            matches!(
                v.kind,
                ViolationKind::UnboundedWork | ViolationKind::FunctionNotAllowed
            ),
            "{q}: {v}"
        );
    }
    // Each padding is small, together they are not: the query's budget is its own size.
    let many = ["''::char(1000)"; 17].join(", ");
    refused(
        &format!("SELECT concat({many})"),
        pg,
        &r,
        ViolationKind::UnboundedWork,
    );
    let mixed = format!(
        "SELECT concat({}, {})",
        ["lpad('', 1000)"; 9].join(", "),
        ["''::char(1000)"; 9].join(", ")
    );
    refused(&mixed, pg, &r, ViolationKind::UnboundedWork);
    accepted("SELECT concat(''::char(1000), lpad('x', 1000))", pg, &r);
}

#[test]
fn functions_a_rule_adds_keep_their_widths_bounded() {
    let pg_rules: SqlRules = serde_json::from_value(json!({
        "databases": ["*"], "tables": {"ledger": {"columns": "*"}},
        "functions": ["format", "repeat", "replace", "regexp_replace"]
    }))
    .unwrap();
    let pg = SqlDialect::Postgres;
    for q in [
        "SELECT format('%*s', 100000000, '') ",
        "SELECT format('%1$*2$s', account, id) FROM ledger",
        "SELECT format('%5000s', account) FROM ledger",
        "SELECT format(account, id) FROM ledger",
        "SELECT repeat(account, 100000) FROM ledger",
        "SELECT repeat(account, id) FROM ledger",
        "SELECT replace(account, account, 'x') FROM ledger",
        "SELECT regexp_replace(account, account, 'x') FROM ledger",
    ] {
        refused(q, pg, &pg_rules, ViolationKind::UnboundedWork);
    }
    accepted(
        "SELECT format('%s: %10s', id, account), repeat('-', 10), replace(account, 'a', 'b') FROM ledger",
        pg,
        &pg_rules,
    );
    let lite_rules: SqlRules = serde_json::from_value(json!({
        "databases": ["*"], "tables": {"ledger": {"columns": "*"}},
        "functions": ["printf", "zeroblob", "replace"]
    }))
    .unwrap();
    let lite = SqlDialect::Sqlite;
    for q in [
        "SELECT printf('%*d', 100000000, 1)",
        "SELECT printf('%.100000f', amount) FROM ledger",
        "SELECT length(zeroblob(100000000))",
        "SELECT zeroblob(id) FROM ledger",
        "SELECT replace(account, account, account) FROM ledger",
    ] {
        refused(q, lite, &lite_rules, ViolationKind::UnboundedWork);
    }
    accepted(
        "SELECT printf('%5d %s', id, account), zeroblob(16) FROM ledger",
        lite,
        &lite_rules,
    );
}

#[test]
fn numeric_values_are_not_made_huge_from_small_literals() {
    let r = ledger_rules();
    let pg = SqlDialect::Postgres;
    for q in [
        "SELECT power(7::numeric, 100000)",
        "SELECT pow(amount, 5000) FROM ledger",
        "SELECT power(amount, id) FROM ledger",
        "SELECT pg_catalog.power(7.0, (100000))",
        "SELECT 7::numeric ^ 100000",
        "SELECT amount ^ (id * 1000) FROM ledger",
        "SELECT exp(200000::numeric)",
        "SELECT exp(amount) FROM ledger",
        "SELECT sqrt(1e100000)",
        "SELECT sqrt('1e100000'::numeric)",
        "SELECT amount + '1E+5000' FROM ledger",
        "SELECT 1e-5000 + amount FROM ledger",
        "SELECT sqrt(numeric '1e100000')",
    ] {
        refused(q, pg, &r, ViolationKind::UnboundedWork);
    }
    for q in [
        "SELECT power(amount, 2), amount ^ 3, exp(1), power(2, 10) FROM ledger",
        "SELECT power(amount::float8, id), amount::double precision ^ id FROM ledger",
        "SELECT exp(amount::float8), 1.5e10, '2026-01-01' FROM ledger",
        "SELECT power(1.05, -30)",
    ] {
        accepted(q, pg, &r);
    }
}

#[test]
fn sqlite_calls_that_run_inside_one_instruction_are_bounded() {
    let r = ledger_rules();
    let lite = SqlDialect::Sqlite;
    let long = format!("'{}'", "x".repeat(MAX_OPERAND_CHARS + 1));
    for q in [
        "SELECT ltrim(account, account) FROM ledger".to_owned(),
        "SELECT rtrim(account, concat(account, account)) FROM ledger".to_owned(),
        "SELECT rtrim(account, char(120, 121)) FROM ledger".to_owned(),
        "SELECT instr(account, account) FROM ledger".to_owned(),
        "SELECT id FROM ledger WHERE account LIKE account".to_owned(),
        "SELECT id FROM ledger WHERE account NOT LIKE '%' || account".to_owned(),
        format!("SELECT ltrim(account, {long}) FROM ledger"),
    ] {
        refused(&q, lite, &r, ViolationKind::UnboundedWork);
    }
    for q in [
        "SELECT ltrim(account, 'x'), trim(account), instr(account, 'a') FROM ledger",
        "SELECT id FROM ledger WHERE account LIKE 'a%'",
    ] {
        accepted(q, lite, &r);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. SQLite's eponymous virtual tables.

#[test]
fn sqlite_eponymous_virtual_tables_are_catalogs() {
    let any = rules(json!({"*": {"columns": "*"}}));
    for q in [
        "SELECT name FROM dbstat",
        "SELECT * FROM main.dbstat",
        "SELECT name FROM \"DBSTAT\"",
        "SELECT name FROM temp.dbstat",
        "SELECT pgno FROM sqlite_dbpage",
        "SELECT sql FROM sqlite_stmt",
        "SELECT name FROM pragma_table_list",
        "SELECT key FROM json_each",
        "SELECT value FROM generate_series",
        "SELECT d.name FROM ledger l JOIN dbstat d ON d.name = l.account",
        "SELECT (SELECT count(*) FROM dbstat) AS n",
    ] {
        refused(q, SqlDialect::Sqlite, &any, ViolationKind::SystemCatalog);
    }
    // Table-valued forms stay governed by tableFunctions.
    refused(
        "SELECT name FROM dbstat('main')",
        SqlDialect::Sqlite,
        &any,
        ViolationKind::TableFunction,
    );
    // A rule may still list one by name, like any catalog.
    accepted(
        "SELECT name FROM dbstat",
        SqlDialect::Sqlite,
        &rules(json!({"dbstat": {"columns": "*"}})),
    );
    // In PostgreSQL, dbstat is an ordinary name.
    accepted("SELECT name FROM dbstat", SqlDialect::Postgres, &any);
}

// ---------------------------------------------------------------------------------------------
// The executors.

fn postgres(url: &str, max_connections: u32) -> Databases {
    let mut db = DatabaseConfig::with_url(SqlDialect::Postgres, url);
    db.max_connections = Some(max_connections);
    Databases::from_config(&BTreeMap::from([("main".to_owned(), db)])).expect("config")
}

/// A query that did not go through the guard (the executor must hold on its own).
fn raw(sql: &str) -> GuardedQuery {
    GuardedQuery {
        sql: sql.to_owned(),
        tables: vec![],
        columns: vec![],
        limit: 0,
    }
}

fn limits(timeout: Duration, max_rows: u64) -> QueryLimits {
    QueryLimits {
        statement_timeout: timeout,
        max_rows,
        max_bytes: 1 << 30,
    }
}

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The PostgreSQL tests of this file run one at a time: the backend check reads every busy
/// backend of the executor's application name, which another test's query would be.
static POSTGRES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// 2. The session settings the guard assumes.

#[tokio::test]
async fn postgres_sessions_read_text_as_the_guard_does_whatever_the_url_says() {
    let Some(url) = postgres_url() else { return };
    let _one_at_a_time = POSTGRES.lock().await;
    // A URL (like a role or database default) that turns the settings off: the executor's
    // startup options come later and win.
    let hostile = with_param(
        &url,
        "options=-c%20standard_conforming_strings%3Doff%20-c%20search_path%3Dpg_temp%20-c%20client_encoding%3DSJIS",
    );
    let dbs = postgres(&hostile, 1);
    let r = dbs
        .execute(
            "main",
            &raw(
                "SELECT current_setting('standard_conforming_strings') AS scs, \
                  current_setting('search_path') AS path",
            ),
            limits(Duration::from_secs(5), 10),
        )
        .await
        .expect("settings");
    assert_eq!(
        r.rows[0],
        vec![json!("on"), json!("public")],
        "{:?}",
        r.rows
    );

    // The issue's smuggle: for the guard the text between the quotes is a string; with
    // standard_conforming_strings off, '\' would not end the literal for PostgreSQL and the
    // UNION over a hidden column would run.
    let policy = rules(json!({"ledger": {"columns": ["id", "account"]}}));
    for smuggle in [
        "SELECT account FROM ledger WHERE account = '\\' AND account = ' UNION SELECT booked_at::text FROM ledger -- '",
        "SELECT account FROM ledger WHERE account IN ('\\', ') UNION SELECT amount::text FROM ledger --')",
    ] {
        let guarded =
            guard(smuggle, SqlDialect::Postgres, &policy).expect("the guard sees strings");
        let r = dbs
            .execute("main", &guarded, limits(Duration::from_secs(5), 100))
            .await
            .expect(smuggle);
        assert!(r.rows.is_empty(), "{smuggle} read {:?}", r.rows);
    }
}

// 4. No backend outlives its timeout.

/// Busy backends (not idle in the pool) of the reader role opened by the executor, from this
/// machine's own address: CI runs these tests beside the cluster's operator, which connects as
/// the same role, with the same application name, from the Pod network.
async fn busy_backends(watcher: &mut sqlx::PgConnection) -> Vec<(i32, String, String)> {
    sqlx::query_as(
        "SELECT pid, coalesce(state, ''), left(query, 120) FROM pg_stat_activity \
         WHERE usename = current_user AND application_name = 'sandboxrun' \
           AND client_addr IS NOT DISTINCT FROM inet_client_addr() \
           AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'",
    )
    .fetch_all(watcher)
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn no_postgres_backend_outlives_its_timeout_after_hostile_queries() {
    let Some(url) = postgres_url() else { return };
    let _one_at_a_time = POSTGRES.lock().await;
    let dbs = postgres(&url, 2);
    let timeout = Duration::from_secs(2);
    let policy = rules(json!({"big": {"columns": "*"}, "ledger": {"columns": "*"}}));
    // Through the guard: the hostile calls of the issue are refused before they run.
    for q in [
        "SELECT length(ltrim(translate(concat(''::char(100000)), ' ', 'x'), concat(''::char(100000), 'x')))",
        "SELECT length(btrim(payload, payload || payload)) FROM big",
        "SELECT translate(payload, payload, payload) FROM big",
    ] {
        let v = guard(q, SqlDialect::Postgres, &policy).expect_err(q);
        assert_eq!(v.kind, ViolationKind::UnboundedWork, "{q}: {v}");
    }
    let mut watcher = sqlx::PgConnection::connect(&url).await.expect("connect");
    // Past the guard (the executor holds on its own), work no machine finishes: a join of
    // 10^18 rows, and a cursor over a million rows that sleeps at least 0.2 ms per row (200 s
    // on any machine), whose every FETCH stays under the statement timeout while the call as a
    // whole does not: the executor terminates that backend.
    for hostile in [
        "SELECT count(*) FROM big a, big b, big c",
        "SELECT id, pg_sleep(0.0002) FROM big",
    ] {
        let started = Instant::now();
        let err = dbs
            .execute("main", &raw(hostile), limits(timeout, 1_000_000_000))
            .await
            .expect_err(hostile);
        assert!(
            matches!(err, QueryError::Timeout { .. }),
            "{hostile}: {err}"
        );
        // Generous (an upper bound any machine meets): the call ends at the timeout plus its
        // grace; what this catches runs for minutes or hours.
        assert!(
            started.elapsed() < timeout + Duration::from_secs(60),
            "{hostile} returned after {:?}",
            started.elapsed()
        );
        // Its backend is gone or idle soon after the call's end. Generous too (the machine may
        // be busy): left running, the second query's backend would sleep for 200 s.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let busy = busy_backends(&mut watcher).await;
            if busy.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after {hostile}, backends of ours still run: {busy:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The pool hands out a working connection afterwards (the stuck one was discarded).
    let r = dbs
        .execute(
            "main",
            &raw("SELECT count(*) AS n FROM ledger"),
            limits(timeout, 10),
        )
        .await
        .expect("the next query works");
    assert_eq!(r.rows.len(), 1);
}

// SQLite: the call returns at its deadline, and the calls that would run inside one VM
// instruction are refused (above).

async fn sqlite() -> Databases {
    let dir = std::env::temp_dir().join(format!("sandboxrun-bounded-work-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("demo.db");
    demo::ensure_sqlite(&path).await.expect("demo db");
    Databases::from_config(&BTreeMap::from([(
        "main".to_owned(),
        demo::database_config(&path),
    )]))
    .expect("config")
}

#[tokio::test]
async fn sqlite_queries_end_at_their_timeout() {
    let dbs = sqlite().await;
    let timeout = Duration::from_secs(1);
    // Unbounded (a recursive count that never stops), run past the guard.
    let started = Instant::now();
    let err = dbs
        .execute(
            "main",
            &raw(
                "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) \
                  SELECT count(n) FROM r",
            ),
            limits(timeout, 10),
        )
        .await
        .expect_err("unbounded");
    assert!(matches!(err, QueryError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < timeout + Duration::from_secs(60));
    let guarded = guard(
        "SELECT ltrim(account, 'a'), instr(account, 'c') FROM ledger",
        SqlDialect::Sqlite,
        &ledger_rules(),
    )
    .expect("bounded calls");
    dbs.execute("main", &guarded, limits(timeout, 10))
        .await
        .expect("the bounded forms run");
}
