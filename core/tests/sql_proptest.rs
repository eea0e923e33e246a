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

/// One operand of a generated call, and whether the guard may accept it as the operand that
/// multiplies the call's cost (a literal of at most `limit` characters).
fn operand() -> impl Strategy<Value = (String, Option<usize>)> {
    prop_oneof![
        (0usize..300).prop_map(|k| (format!("'{}'", "x".repeat(k)), Some(k))),
        (0usize..300).prop_map(|k| (format!("('{}'::text)", "y".repeat(k)), Some(k))),
        Just(("account".to_owned(), None)),
        Just(("l.account".to_owned(), None)),
        Just(("lower(account)".to_owned(), None)),
        Just(("('a' || 'b')".to_owned(), None)),
        (1u64..3000).prop_map(|n| (format!("concat(''::char({n}))"), None)),
        Just(("(SELECT max(account) FROM ledger)".to_owned(), None)),
    ]
}

/// The subject of a call: any value, padded or not (`None`: too wide a padding).
fn subject() -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        Just(("account".to_owned(), true)),
        Just(("upper(l.account)".to_owned(), true)),
        Just(("'abc'".to_owned(), true)),
        (1u64..3000).prop_map(|n| (format!("concat(''::char({n}))"), n <= 1000)),
    ]
}

/// A superlinear call in one of its spellings, the limit of its cost operand, and the dialect.
fn superlinear_call() -> impl Strategy<Value = (String, bool, SqlDialect)> {
    (0usize..17, subject(), operand()).prop_map(|(form, (s, subject_ok), (o, literal))| {
        use SqlDialect::{Postgres as P, Sqlite as L};
        let (text, limit, dialect) = match form {
            0 => (format!("ltrim({s}, {o})"), 64, P),
            1 => (format!("rtrim({s}, {o})"), 64, P),
            2 => (format!("btrim({s}, {o})"), 64, P),
            3 => (format!("translate({s}, {o}, 'z')"), 64, P),
            4 => (format!("translate({s}, 'z', {o})"), 64, P),
            5 => (format!("TRIM(BOTH {o} FROM {s})"), 64, P),
            6 => (format!("TRIM(LEADING {o} FROM {s})"), 64, P),
            7 => (format!("strpos({s}, {o})"), 64, P),
            8 => (format!("POSITION({o} IN {s})"), 64, P),
            9 => (format!("split_part({s}, {o}, 1)"), 64, P),
            10 => (format!("({s} ~ {o})"), 256, P),
            11 => (format!("regexp_count({s}, {o})"), 256, P),
            12 => (format!("ltrim({s}, {o})"), 64, L),
            13 => (format!("rtrim({s}, {o})"), 64, L),
            14 => (format!("instr({s}, {o})"), 64, L),
            15 => (format!("({s} LIKE {o})"), 256, L),
            _ => (format!("pg_catalog.btrim({s}, {o})"), 64, P),
        };
        let bounded = literal.is_some_and(|k| k <= limit);
        // SQLite ignores the length of char(n): nothing is padded there.
        (
            format!("SELECT {text} AS v FROM ledger AS l"),
            bounded && (subject_ok || dialect == L),
            dialect,
        )
    })
}

proptest! {
    #![proptest_config(config(3_000))]

    /// The guard accepts a superlinear call exactly when its cost operands are short literals
    /// and its subject is padded no wider than allowed.
    #[test]
    fn superlinear_calls_are_accepted_exactly_when_bounded(
        (sql, bounded, dialect) in superlinear_call()
    ) {
        let verdict = guard(&sql, dialect, &rules());
        match (&verdict, bounded) {
            (Ok(_), true) => {}
            (Err(v), false) => prop_assert!(
                matches!(
                    v.kind,
                    sandboxrun_core::sql::ViolationKind::UnboundedWork
                        | sandboxrun_core::sql::ViolationKind::Parse
                ),
                "{dialect:?} {sql}: {v}"
            ),
            (Ok(_), false) => prop_assert!(false, "{dialect:?} accepted the unbounded {sql}"),
            (Err(v), true) => prop_assert!(false, "{dialect:?} refused the bounded {sql}: {v}"),
        }
    }
}
