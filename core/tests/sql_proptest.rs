//! Property tests of the SQL guard: it never panics, and whatever it accepts is exactly one
//! query whose LIMIT is at most the cap. Bounded so `cargo test` stays within a few seconds.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use sandboxrun_core::sql::{Columns, SqlDialect, SqlRules, TableRule, guard};
use sqlparser::ast::{Expr, LimitClause, Statement, Value};
use sqlparser::dialect::{PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;

const MAX_LIMIT: u64 = 50;

fn rules() -> SqlRules {
    let mut rules = SqlRules {
        max_limit: MAX_LIMIT,
        allow_wildcard: true,
        table_functions: vec!["generate_series".into()],
        ..SqlRules::default()
    };
    rules.tables.insert(
        "ledger".into(),
        TableRule {
            columns: Columns::List(
                ["id", "account", "amount", "booked_at"]
                    .map(String::from)
                    .to_vec(),
            ),
        },
    );
    rules.tables.insert(
        "events".into(),
        TableRule {
            columns: Columns::Any,
        },
    );
    rules
}

/// Runs the guard and, when it accepts, checks the invariants of what it returns.
fn check(sql: &str, dialect: SqlDialect) -> Result<(), TestCaseError> {
    let Ok(g) = guard(sql, dialect, &rules()) else {
        return Ok(());
    };
    prop_assert!(g.limit <= MAX_LIMIT);
    let statements = match dialect {
        SqlDialect::Postgres => Parser::parse_sql(&PostgreSqlDialect {}, &g.sql),
        SqlDialect::Sqlite => Parser::parse_sql(&SQLiteDialect {}, &g.sql),
    };
    let statements =
        statements.map_err(|e| TestCaseError::fail(format!("{sql:?} -> {:?}: {e}", g.sql)))?;
    prop_assert_eq!(statements.len(), 1, "{:?} -> {:?}", sql, g.sql);
    let Statement::Query(query) = &statements[0] else {
        return Err(TestCaseError::fail(format!(
            "{sql:?} -> {:?} is not a query",
            g.sql
        )));
    };
    prop_assert!(query.locks.is_empty());
    let Some(LimitClause::LimitOffset {
        limit: Some(Expr::Value(v)),
        ..
    }) = &query.limit_clause
    else {
        return Err(TestCaseError::fail(format!(
            "{sql:?} -> {:?} has no literal LIMIT",
            g.sql
        )));
    };
    let Value::Number(n, _) = &v.value else {
        return Err(TestCaseError::fail(format!(
            "{:?}: LIMIT is not a number",
            g.sql
        )));
    };
    let n: u64 = n
        .parse()
        .map_err(|_| TestCaseError::fail(format!("{:?}: bad LIMIT", g.sql)))?;
    prop_assert!(n <= MAX_LIMIT, "{:?} -> {:?}", sql, g.sql);
    prop_assert_eq!(n, g.limit);
    Ok(())
}

const FRAGMENTS: &[&str] = &[
    "SELECT",
    "WITH",
    "x",
    "AS",
    "(",
    ")",
    ",",
    ";",
    "FROM",
    "ledger",
    "events",
    "l",
    "e",
    "id",
    "amount",
    "account",
    "secret",
    "*",
    "l.*",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "=",
    "<",
    "1",
    "0",
    "'a'",
    "'; DROP TABLE ledger; --'",
    "--",
    "/*",
    "*/",
    "$$",
    "$$x$$",
    "E'\\x27'",
    "LIMIT",
    "OFFSET",
    "100000",
    "99999999999999999999",
    "ALL",
    "ORDER",
    "BY",
    "GROUP",
    "HAVING",
    "UNION",
    "INTERSECT",
    "EXCEPT",
    "JOIN",
    "LEFT",
    "ON",
    "USING",
    "LATERAL",
    "IN",
    "EXISTS",
    "VALUES",
    "INTO",
    "FOR",
    "UPDATE",
    "SHARE",
    "DELETE",
    "INSERT",
    "DROP",
    "pg_sleep",
    "PG_SLEEP",
    "set_config",
    "count",
    "sum",
    "generate_series",
    "::regclass",
    "::int",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "NULL",
    "FETCH",
    "FIRST",
    "ROWS",
    "ONLY",
    "RECURSIVE",
    "DISTINCT",
    "\"ledger\"",
    "pg_catalog.pg_class",
    "information_schema.tables",
    "\n",
    "\u{3000}",
    "ｓｅｌｅｃｔ",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40).prop_map(|v| v.join(" "))
}

fn column() -> impl Strategy<Value = String> {
    prop::sample::select(
        &[
            "id",
            "amount",
            "account",
            "booked_at",
            "secret",
            "l.id",
            "l.amount",
            "e.anything",
            "count(*)",
            "sum(amount)",
            "pg_sleep(1)",
            "*",
            "l.*",
            "e.*",
            "(SELECT max(id) FROM ledger)",
            "(SELECT secret FROM ledger)",
            "amount::text",
            "'lit'",
            "1 + 2",
        ][..],
    )
    .prop_map(str::to_owned)
}

fn from_item() -> impl Strategy<Value = String> {
    prop::sample::select(
        &[
            "ledger",
            "ledger l",
            "events e",
            "ledger l JOIN events e ON e.id = l.id",
            "public.ledger",
            "audit_log",
            "pg_catalog.pg_class",
            "(SELECT id, amount FROM ledger) l",
            "generate_series(1, 3) g",
            "pg_read_file('/etc/passwd') f",
            "ledger, events",
            "ledger l LEFT JOIN events e USING (id)",
        ][..],
    )
    .prop_map(str::to_owned)
}

fn tail() -> impl Strategy<Value = String> {
    prop::sample::select(
        &[
            "",
            " WHERE amount > 10",
            " WHERE secret = 1",
            " WHERE id IN (SELECT id FROM events)",
            " GROUP BY account",
            " ORDER BY id DESC",
            " LIMIT 5",
            " LIMIT 1000",
            " LIMIT ALL",
            " LIMIT 10 OFFSET 5",
            " OFFSET 999999999",
            " FOR UPDATE",
            " FETCH FIRST 3 ROWS ONLY",
            "; DROP TABLE ledger",
            " UNION SELECT id FROM ledger",
            " -- comment",
            " /* c */",
        ][..],
    )
    .prop_map(str::to_owned)
}

fn structured() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(column(), 1..4),
        from_item(),
        prop::collection::vec(tail(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(cols, from, tails, cte)| {
            let body = format!("SELECT {} FROM {from}{}", cols.join(", "), tails.concat());
            if cte {
                format!("WITH x AS ({body}) SELECT * FROM x")
            } else {
                body
            }
        })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(3_000))]

    #[test]
    fn arbitrary_strings_never_panic(sql in any::<String>()) {
        check(&sql, SqlDialect::Postgres)?;
        check(&sql, SqlDialect::Sqlite)?;
    }

    #[test]
    fn sql_token_soup_never_panics(sql in soup()) {
        check(&sql, SqlDialect::Postgres)?;
        check(&sql, SqlDialect::Sqlite)?;
    }
}

proptest! {
    #![proptest_config(config(8_000))]

    #[test]
    fn structured_queries_hold_the_invariants(sql in structured()) {
        check(&sql, SqlDialect::Postgres)?;
        check(&sql, SqlDialect::Sqlite)?;
    }
}

#[test]
fn some_structured_queries_are_accepted() {
    // The properties mean little if nothing is ever accepted.
    for sql in [
        "SELECT id, amount FROM ledger",
        "SELECT l.id FROM ledger l JOIN events e ON e.id = l.id LIMIT 1000",
        "WITH x AS (SELECT id FROM ledger) SELECT * FROM x",
        "SELECT e.* FROM events e",
    ] {
        assert!(guard(sql, SqlDialect::Postgres, &rules()).is_ok(), "{sql}");
    }
}
