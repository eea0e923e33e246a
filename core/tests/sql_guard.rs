//! The SQL guard against the governance scenarios and the scoping rules.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use sandboxrun_core::sql::{
    Columns, GuardViolation, GuardedQuery, SqlDialect, SqlRules, TableRule, ViolationKind, guard,
};

fn rules() -> SqlRules {
    let mut rules = SqlRules {
        databases: vec!["demo".into()],
        max_limit: 100,
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
        "accounts".into(),
        TableRule {
            columns: Columns::List(["id", "name", "owner"].map(String::from).to_vec()),
        },
    );
    rules
}

fn open_rules() -> SqlRules {
    let mut r = rules();
    r.allow_wildcard = true;
    r.tables.insert(
        "public.events".into(),
        TableRule {
            columns: Columns::Any,
        },
    );
    r
}

fn with_functions(functions: &[&str]) -> SqlRules {
    let mut r = rules();
    r.functions = functions.iter().map(|f| f.to_string()).collect();
    r
}

fn ok(sql: &str) -> GuardedQuery {
    ok_with(sql, &rules())
}

fn ok_with(sql: &str, rules: &SqlRules) -> GuardedQuery {
    match guard(sql, SqlDialect::Postgres, rules) {
        Ok(g) => g,
        Err(v) => panic!("{sql:?} was refused: {v}"),
    }
}

fn blocked(sql: &str, kind: ViolationKind) -> GuardViolation {
    blocked_with(sql, &rules(), kind)
}

fn blocked_with(sql: &str, rules: &SqlRules, kind: ViolationKind) -> GuardViolation {
    match guard(sql, SqlDialect::Postgres, rules) {
        Ok(g) => panic!("{sql:?} was accepted as {:?}", g.sql),
        Err(v) => {
            assert_eq!(v.kind, kind, "{sql:?}: {v}");
            assert!(!v.hint.is_empty());
            v
        }
    }
}

#[test]
fn legit_column_query_passes_and_gets_a_limit() {
    let g = ok("SELECT id, amount FROM ledger WHERE amount > 100 ORDER BY booked_at DESC");
    assert_eq!(
        g.sql,
        "SELECT id, amount FROM ledger WHERE amount > 100 ORDER BY booked_at DESC LIMIT 100"
    );
    assert_eq!(g.limit, 100);
    assert_eq!(g.tables, ["ledger"]);
    assert_eq!(
        g.columns,
        ["ledger.amount", "ledger.booked_at", "ledger.id"]
    );
}

#[test]
fn limits_are_lowered_kept_or_replaced() {
    assert_eq!(ok("SELECT id FROM ledger LIMIT 10").limit, 10);
    assert_eq!(
        ok("SELECT id FROM ledger LIMIT 5000").sql,
        "SELECT id FROM ledger LIMIT 100"
    );
    assert_eq!(ok("SELECT id FROM ledger LIMIT ALL").limit, 100);
    assert_eq!(ok("SELECT id FROM ledger LIMIT 2 + 2").limit, 100);
    assert_eq!(ok("SELECT id FROM ledger LIMIT $1").limit, 100);
    assert_eq!(
        ok("SELECT id FROM ledger FETCH FIRST 7 ROWS ONLY").sql,
        "SELECT id FROM ledger LIMIT 7"
    );
    assert_eq!(
        ok("SELECT id FROM ledger LIMIT 20 OFFSET 40").sql,
        "SELECT id FROM ledger LIMIT 20 OFFSET 40"
    );
    assert_eq!(
        ok("SELECT id FROM ledger UNION SELECT id FROM accounts").sql,
        "SELECT id FROM ledger UNION SELECT id FROM accounts LIMIT 100"
    );
    blocked(
        "SELECT id FROM ledger OFFSET 10000000",
        ViolationKind::Offset,
    );
    blocked(
        "SELECT id FROM ledger OFFSET (SELECT 1)",
        ViolationKind::Offset,
    );
    blocked(
        "SELECT id FROM ledger FETCH FIRST 5 ROWS WITH TIES",
        ViolationKind::Limit,
    );
    blocked(
        "SELECT id FROM ledger LIMIT (SELECT count(*) FROM secrets)",
        ViolationKind::TableNotAllowed,
    );
}

#[test]
fn select_star_is_blocked_with_an_actionable_reason() {
    let v = blocked("SELECT * FROM ledger", ViolationKind::Wildcard);
    assert_eq!(v.problem, "SELECT * is not allowed");
    assert_eq!(
        v.hint,
        "list the columns you need, e.g. SELECT id, account, amount FROM ledger"
    );
    blocked("SELECT l.* FROM ledger l", ViolationKind::Wildcard);
    // row_to_json is not on the default allowlist; where a rule lists it, a wildcard argument
    // is still a wildcard.
    blocked(
        "SELECT row_to_json(l.*) FROM ledger l",
        ViolationKind::FunctionNotAllowed,
    );
    blocked_with(
        "SELECT row_to_json(l.*) FROM ledger l",
        &with_functions(&["row_to_json"]),
        ViolationKind::Wildcard,
    );
    // `TABLE t` means `SELECT * FROM t` (refused, whether or not the dialect parses it).
    assert!(guard("TABLE ledger", SqlDialect::Postgres, &rules()).is_err());
    // count(*) reads no column.
    ok("SELECT count(*) FROM ledger");
}

#[test]
fn wildcards_only_over_fully_open_tables() {
    let r = open_rules();
    ok_with("SELECT * FROM events", &r);
    ok_with("SELECT e.* FROM public.events e", &r);
    let v = blocked_with("SELECT * FROM ledger", &r, ViolationKind::Wildcard);
    assert!(v.problem.contains("not allowed"), "{v}");
    ok_with(
        "WITH x AS (SELECT id, amount FROM ledger) SELECT * FROM x",
        &r,
    );
}

#[test]
fn table_name_injection_is_blocked_as_multiple_statements() {
    let v = blocked(
        "SELECT id FROM ledger; DROP TABLE audit_log--",
        ViolationKind::MultipleStatements,
    );
    assert!(v.problem.contains("2 statements"), "{v}");
    assert!(v.problem.contains("DROP"), "{v}");
    assert!(v.hint.contains("';'"), "{v}");
}

#[test]
fn write_and_admin_statements_are_blocked() {
    for (sql, word) in [
        ("DROP TABLE ledger", "DROP"),
        ("DELETE FROM ledger", "DELETE"),
        ("UPDATE ledger SET amount = 0", "UPDATE"),
        ("TRUNCATE ledger", "TRUNCATE"),
        ("GRANT SELECT ON ledger TO public", "GRANT"),
        ("INSERT INTO ledger (id) VALUES (1)", "INSERT"),
        ("  drop table ledger", "DROP"),
    ] {
        let v = blocked(sql, ViolationKind::NotAQuery);
        assert!(v.problem.starts_with(word), "{sql}: {v}");
        assert!(v.hint.contains("read-only"), "{sql}: {v}");
    }
    blocked("SELECT 1; SELECT 2", ViolationKind::MultipleStatements);
    // A trailing semicolon is fine.
    ok("SELECT id FROM ledger;");
}

#[test]
fn data_modifying_cte_is_blocked() {
    let v = blocked(
        "WITH x AS (DELETE FROM ledger RETURNING *) SELECT * FROM x",
        ViolationKind::DataModifyingCte,
    );
    assert!(v.problem.contains("DELETE"), "{v}");
    blocked(
        "WITH x AS (UPDATE ledger SET amount = 0 RETURNING id) SELECT id FROM x",
        ViolationKind::DataModifyingCte,
    );
    blocked(
        "WITH x AS (INSERT INTO ledger (id) VALUES (1) RETURNING id) SELECT id FROM x",
        ViolationKind::DataModifyingCte,
    );
}

#[test]
fn side_effect_functions_locking_and_into_are_blocked() {
    let v = blocked(
        "SELECT set_config('x','y',false)",
        ViolationKind::DeniedFunction,
    );
    assert!(v.problem.contains("set_config"), "{v}");
    blocked("SELECT pg_sleep(10)", ViolationKind::DeniedFunction);
    blocked(
        "SELECT * FROM pg_read_file('/etc/passwd')",
        ViolationKind::DeniedFunction,
    );
    blocked(
        "SELECT id FROM ledger WHERE amount > (SELECT PG_CATALOG.PG_SLEEP(1))",
        ViolationKind::DeniedFunction,
    );
    blocked(
        "SELECT current_setting('secret')",
        ViolationKind::DeniedFunction,
    );
    let v = blocked(
        "SELECT id FROM ledger FOR UPDATE",
        ViolationKind::LockingClause,
    );
    assert!(v.hint.contains("FOR UPDATE"), "{v}");
    blocked(
        "SELECT id FROM ledger FOR SHARE",
        ViolationKind::LockingClause,
    );
    blocked(
        "SELECT id FROM (SELECT id FROM ledger FOR UPDATE) s",
        ViolationKind::LockingClause,
    );
    let v = blocked("SELECT id INTO t FROM ledger", ViolationKind::SelectInto);
    assert!(v.hint.contains("INTO"), "{v}");
    blocked("SELECT 'pg_sleep'::regproc", ViolationKind::DeniedFunction);
    blocked(
        "SELECT id FROM generate_series(1, 10) AS g(id)",
        ViolationKind::TableFunction,
    );
    let mut r = rules();
    r.table_functions.push("generate_series".into());
    ok_with("SELECT g FROM generate_series(1, 10) AS g", &r);
}

#[test]
fn catalogs_and_unknown_tables_are_blocked() {
    blocked(
        "SELECT relname FROM pg_catalog.pg_class",
        ViolationKind::SystemCatalog,
    );
    blocked("SELECT usename FROM pg_user", ViolationKind::SystemCatalog);
    blocked(
        "SELECT table_name FROM information_schema.tables",
        ViolationKind::SystemCatalog,
    );
    let v = blocked("SELECT id FROM secrets", ViolationKind::TableNotAllowed);
    assert!(v.hint.contains("accounts, ledger"), "{v}");
    blocked(
        "SELECT id FROM other.ledger",
        ViolationKind::TableNotAllowed,
    );
    ok("SELECT id FROM public.ledger");
    ok("SELECT ledger.id FROM public.ledger");
    let mut r = rules();
    r.tables.insert(
        "information_schema.columns".into(),
        TableRule {
            columns: Columns::List(vec!["column_name".into()]),
        },
    );
    ok_with("SELECT column_name FROM information_schema.columns", &r);
    let mut r = rules();
    r.tables.insert(
        "*".into(),
        TableRule {
            columns: Columns::Any,
        },
    );
    ok_with("SELECT anything FROM whatever", &r);
    blocked_with(
        "SELECT relname FROM pg_class",
        &r,
        ViolationKind::SystemCatalog,
    );
}

#[test]
fn columns_outside_the_allow_list_are_blocked_everywhere() {
    let v = blocked("SELECT secret FROM ledger", ViolationKind::ColumnNotAllowed);
    assert_eq!(
        v.problem,
        "the column secret of table ledger is not allowed"
    );
    assert!(v.hint.contains("id, account, amount, booked_at"), "{v}");
    blocked(
        "SELECT id FROM ledger WHERE secret = 1",
        ViolationKind::ColumnNotAllowed,
    );
    blocked(
        "SELECT id FROM ledger ORDER BY secret",
        ViolationKind::ColumnNotAllowed,
    );
    blocked(
        "SELECT account, count(id) FROM ledger GROUP BY account HAVING max(secret) > 1",
        ViolationKind::ColumnNotAllowed,
    );
    blocked(
        "SELECT l.secret FROM ledger l",
        ViolationKind::ColumnNotAllowed,
    );
    // A whole-row reference exposes every column.
    blocked("SELECT l FROM ledger l", ViolationKind::ColumnNotAllowed);
    blocked_with(
        "SELECT row_to_json(ledger) FROM ledger",
        &with_functions(&["row_to_json"]),
        ViolationKind::ColumnNotAllowed,
    );
    blocked(
        "SELECT id FROM ledger l JOIN accounts a USING (secret)",
        ViolationKind::ColumnNotAllowed,
    );
    blocked(
        "SELECT l.id FROM ledger l NATURAL JOIN accounts a",
        ViolationKind::Unsupported,
    );
    blocked("SELECT x.id FROM ledger l", ViolationKind::UnknownColumn);
}

#[test]
fn aliases_ctes_and_subqueries_resolve() {
    let g = ok("SELECT l.id, a.name FROM ledger AS l JOIN accounts a ON a.id = l.account");
    assert_eq!(g.tables, ["accounts", "ledger"]);
    assert_eq!(
        g.columns,
        [
            "accounts.id",
            "accounts.name",
            "ledger.account",
            "ledger.id"
        ]
    );
    ok("SELECT amount AS a FROM ledger ORDER BY a");
    ok(
        "WITH big AS (SELECT id, amount AS amt FROM ledger WHERE amount > 10) SELECT id, amt FROM big",
    );
    ok("WITH big(x, y) AS (SELECT id, amount FROM ledger) SELECT x, y FROM big");
    blocked(
        "WITH big AS (SELECT id FROM ledger) SELECT amount FROM big",
        ViolationKind::UnknownColumn,
    );
    blocked(
        "WITH big AS (SELECT id, secret FROM ledger) SELECT id FROM big",
        ViolationKind::ColumnNotAllowed,
    );
    ok("SELECT s.total FROM (SELECT sum(amount) AS total FROM ledger) AS s");
    ok("SELECT id FROM ledger WHERE account IN (SELECT id FROM accounts WHERE owner = 'x')");
    ok("SELECT id FROM ledger l WHERE EXISTS (SELECT 1 FROM accounts a WHERE a.id = l.account)");
    blocked(
        "SELECT id FROM ledger WHERE account IN (SELECT secret FROM accounts)",
        ViolationKind::ColumnNotAllowed,
    );
    // Unqualified names shared by two tables are ambiguous.
    let v = blocked(
        "SELECT id FROM ledger, accounts",
        ViolationKind::AmbiguousColumn,
    );
    assert!(v.hint.contains("qualify"), "{v}");
    ok("SELECT name, amount FROM ledger JOIN accounts ON accounts.id = ledger.account");
    // A CTE name shadows a table of the same name.
    ok("WITH ledger AS (SELECT id AS n FROM accounts) SELECT n FROM ledger");
    // Recursion only where the rule allows it.
    let recursive = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT n FROM r";
    blocked(recursive, ViolationKind::Recursive);
    let mut r = rules();
    r.allow_recursive = true;
    ok_with(recursive, &r);
    ok("SELECT id, amount FROM ledger WHERE booked_at > now() - interval '7 days'");
    ok("SELECT account, sum(amount) AS total FROM ledger GROUP BY account ORDER BY total DESC");
    ok("VALUES (1, 'a'), (2, 'b')");
    ok("SELECT 1");
}

#[test]
fn unqualified_columns_never_fall_through_to_hidden_ones() {
    let r = open_rules();
    // `secret` is not allowed on ledger but could live there: must be qualified.
    blocked_with(
        "SELECT secret FROM ledger, events",
        &r,
        ViolationKind::AmbiguousColumn,
    );
    ok_with("SELECT events.secret FROM ledger, events", &r);
    // A correlated subquery over an open table could still resolve to the outer ledger.
    blocked_with(
        "SELECT id FROM ledger WHERE EXISTS (SELECT 1 FROM events WHERE secret = 1)",
        &r,
        ViolationKind::AmbiguousColumn,
    );
    ok_with(
        "SELECT id FROM ledger WHERE EXISTS (SELECT 1 FROM events e WHERE e.secret = 1)",
        &r,
    );
}

#[test]
fn parse_errors_say_why() {
    let v = blocked("SELECT id FROM ledger WHERE", ViolationKind::Parse);
    assert!(v.problem.contains("not valid PostgreSQL SQL"), "{v}");
    blocked("SELECT 'unterminated", ViolationKind::Parse);
    blocked("", ViolationKind::Size);
    blocked(" ;; ", ViolationKind::Size);
    blocked(&"x".repeat(20_000), ViolationKind::Size);
}

#[test]
fn deep_expressions_do_not_overflow_the_stack() {
    // Token count bounds the depth; this is the deepest the limit allows.
    let sql = format!("SELECT {}1 FROM ledger", "1 + ".repeat(990));
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || guard(&sql, SqlDialect::Postgres, &rules()).is_ok())
        .unwrap();
    handle.join().expect("guard overflowed a 2 MiB stack");
    let sql = format!("SELECT {}1{} FROM ledger", "(".repeat(600), ")".repeat(600));
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || guard(&sql, SqlDialect::Postgres, &rules()).is_err())
        .unwrap();
    assert!(handle.join().expect("guard overflowed a 2 MiB stack"));
}

#[test]
fn sqlite_dialect() {
    let g = guard(
        "select ID, Amount from LEDGER limit 5000",
        SqlDialect::Sqlite,
        &rules(),
    )
    .unwrap();
    assert_eq!(g.limit, 100);
    assert_eq!(g.tables, ["ledger"]);
    for sql in [
        "SELECT id FROM sqlite_master",
        "SELECT load_extension('x')",
        "SELECT readfile('/etc/passwd')",
        "ATTACH DATABASE '/tmp/x' AS x",
        "PRAGMA writable_schema = 1",
    ] {
        assert!(guard(sql, SqlDialect::Sqlite, &rules()).is_err(), "{sql}");
    }
}
