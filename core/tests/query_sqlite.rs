//! `sandboxrun_core::query` against the SQLite demo database.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandboxrun_core::query::{Databases, QueryError, QueryLimits, demo};
use sandboxrun_core::sql::{GuardedQuery, SqlDialect, SqlRules, guard};
use serde_json::json;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sandboxrun-query-sqlite-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("demo.db")
}

async fn demo_databases(name: &str) -> (Databases, PathBuf) {
    let path = temp_path(name);
    assert!(demo::ensure_sqlite(&path).await.expect("create demo db"));
    let mut config = BTreeMap::new();
    config.insert("demo".to_owned(), demo::database_config(&path));
    (Databases::from_config(&config).expect("config"), path)
}

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

#[tokio::test]
async fn demo_database_is_created_once() {
    let path = temp_path("once");
    assert!(demo::ensure_sqlite(&path).await.unwrap(), "created");
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert!(!demo::ensure_sqlite(&path).await.unwrap(), "already there");
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        modified
    );
    let mut config = BTreeMap::new();
    config.insert("demo".to_owned(), demo::database_config(&path));
    let dbs = Databases::from_config(&config).unwrap();
    assert_eq!(dbs.dialect("demo"), Some(SqlDialect::Sqlite));
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT count(*) AS n, sum(id) AS s FROM ledger"),
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(r.rows, vec![vec![json!(200), json!(20100)]]);
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT count(*) AS n FROM audit_log"),
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(r.rows[0][0], json!(5));
}

#[tokio::test]
async fn guarded_column_query_returns_rows() {
    let (dbs, _path) = demo_databases("query").await;
    let rules: SqlRules = serde_json::from_value(json!({
        "databases": ["demo"],
        "tables": {"ledger": {"columns": ["id", "account", "amount", "booked_at"]}},
        "maxLimit": 100
    }))
    .unwrap();
    let guarded = guard(
        "SELECT id, account, amount, booked_at FROM ledger WHERE account = 'acme' ORDER BY id",
        SqlDialect::Sqlite,
        &rules,
    )
    .expect("guard");
    let r = dbs.execute("demo", &guarded, limits()).await.expect("rows");
    assert_eq!(r.columns, ["id", "account", "amount", "booked_at"]);
    assert_eq!(r.row_count, 40);
    assert!(!r.truncated);
    assert_eq!(
        r.rows[0],
        vec![
            json!(5),
            json!("acme"),
            json!(-104.05),
            json!("2026-01-01T22:08:00Z")
        ]
    );
    // Empty results keep their columns.
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT id, account FROM ledger WHERE id < 0"),
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(r.columns, ["id", "account"]);
    assert_eq!(r.row_count, 0);
    // Types: NULL, blob, real, text.
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT NULL AS a, x'deadbeef' AS b, 1.5 AS c, 'x' AS d"),
            limits(),
        )
        .await
        .unwrap();
    assert_eq!(
        r.rows[0],
        vec![json!(null), json!("3q2+7w=="), json!(1.5), json!("x")]
    );
}

#[tokio::test]
async fn writes_are_refused() {
    let (dbs, _path) = demo_databases("readonly").await;
    for sql in [
        "DELETE FROM ledger",
        "INSERT INTO audit_log (id, at, actor, action, detail) VALUES (99, 'now', 'x', 'y', 'z')",
        "UPDATE ledger SET amount = 0",
        "DROP TABLE audit_log",
        "CREATE TABLE t (x INTEGER)",
    ] {
        let e = dbs
            .execute("demo", &raw(sql), limits())
            .await
            .expect_err(sql);
        assert!(matches!(e, QueryError::ReadOnly { .. }), "{sql}: {e:?}");
        assert!(
            e.to_string().starts_with("the database refused a write"),
            "{e}"
        );
    }
    let r = dbs
        .execute("demo", &raw("SELECT count(*) FROM ledger"), limits())
        .await
        .unwrap();
    assert_eq!(r.rows[0][0], json!(200));
}

#[tokio::test]
async fn rows_and_bytes_are_capped() {
    let (dbs, _path) = demo_databases("caps").await;
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT id FROM ledger ORDER BY id"),
            QueryLimits {
                max_rows: 10,
                ..limits()
            },
        )
        .await
        .unwrap();
    assert_eq!(r.row_count, 10);
    assert!(r.truncated);
    assert_eq!(r.rows[9][0], json!(10));
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT id FROM ledger ORDER BY id LIMIT 10"),
            QueryLimits {
                max_rows: 10,
                ..limits()
            },
        )
        .await
        .unwrap();
    assert!(!r.truncated, "an exact fit is not truncated");
    let r = dbs
        .execute(
            "demo",
            &raw("SELECT * FROM ledger ORDER BY id"),
            QueryLimits {
                max_bytes: 500,
                ..limits()
            },
        )
        .await
        .unwrap();
    assert!(r.truncated);
    assert!(r.row_count > 0 && r.row_count < 20, "{}", r.row_count);
}

#[tokio::test]
async fn slow_query_is_interrupted() {
    let (dbs, _path) = demo_databases("timeout").await;
    let started = Instant::now();
    let e = dbs
        .execute(
            "demo",
            &raw(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) \
                 SELECT count(*) FROM n",
            ),
            QueryLimits {
                statement_timeout: Duration::from_millis(500),
                ..limits()
            },
        )
        .await
        .expect_err("interrupted");
    assert!(matches!(e, QueryError::Timeout { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn unknown_database_and_missing_file() {
    let (dbs, path) = demo_databases("unknown").await;
    let e = dbs
        .execute("nope", &raw("SELECT 1"), limits())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown database \"nope\"; configured databases: demo"
    );
    // A missing file is not created (read-only open).
    let missing = path.with_file_name("missing.db");
    let mut config = BTreeMap::new();
    config.insert("gone".to_owned(), demo::database_config(&missing));
    let dbs = Databases::from_config(&config).unwrap();
    let e = dbs
        .execute("gone", &raw("SELECT 1"), limits())
        .await
        .unwrap_err();
    assert!(matches!(e, QueryError::Connect { .. }), "{e:?}");
    assert!(!missing.exists());
}
