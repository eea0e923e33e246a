//! Regression tests for the SQL guard: one per known bypass and per variant of it. Every query
//! under `refused` was accepted by the guard before the function allowlist, the reference
//! resolution and the cast allowlist (commit fa17490); the ones under `accepted` are the plain
//! analytics the stricter guard must keep accepting.
//!
//! Only the guard's original API is used here, so the file also builds against that commit.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use sandboxrun_core::sql::{Columns, SqlDialect, SqlRules, TableRule, guard};

fn rules() -> SqlRules {
    let mut rules = SqlRules {
        databases: vec!["demo".into()],
        max_limit: 100,
        ..SqlRules::default()
    };
    for (table, columns) in [
        ("ledger", &["id", "account", "amount", "booked_at"][..]),
        ("users", &["id", "name"][..]),
    ] {
        rules.tables.insert(
            table.into(),
            TableRule {
                columns: Columns::List(columns.iter().map(|c| c.to_string()).collect()),
            },
        );
    }
    rules
}

fn refused(dialect: SqlDialect, queries: &[&str]) {
    let rules = rules();
    let accepted: Vec<String> = queries
        .iter()
        .filter_map(|q| match guard(q, dialect, &rules) {
            Ok(g) => Some(format!("{q}\n    -> {}", g.sql)),
            Err(v) => {
                assert!(!v.problem.is_empty() && !v.hint.is_empty(), "{q}: {v}");
                None
            }
        })
        .collect();
    assert!(
        accepted.is_empty(),
        "accepted, but must be refused:\n  {}",
        accepted.join("\n  ")
    );
}

fn accepted(dialect: SqlDialect, queries: &[&str]) {
    let rules = rules();
    let refused: Vec<String> = queries
        .iter()
        .filter_map(|q| {
            guard(q, dialect, &rules)
                .err()
                .map(|v| format!("{q}\n    -> {v}"))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "refused, but must be accepted:\n  {}",
        refused.join("\n  ")
    );
}

/// Class 1: functions that evaluate SQL text, read what the table rules protect, or allocate
/// without bound ran because only a denylist stood in their way.
#[test]
fn functions_outside_the_allowlist_are_refused() {
    refused(
        SqlDialect::Postgres,
        &[
            // SQL text evaluated by the server, bypassing the table rules.
            "SELECT ts_rewrite('x'::tsquery, 'SELECT detail FROM audit_log')::text",
            "SELECT ts_rewrite('a', 'SELECT ''a''::tsquery, ''b''::tsquery')",
            "SELECT id FROM ledger WHERE ts_rewrite('a', 'SELECT 1') IS NOT NULL",
            "SELECT id FROM ledger ORDER BY ts_rewrite('a', 'SELECT 1')",
            "SELECT pg_catalog.ts_rewrite('a', 'SELECT 1')",
            "SELECT xpath('/a', '<a/>')",
            // Catalogs, settings, sessions.
            "SELECT has_table_privilege('audit_log', 'select')",
            "SELECT version()",
            "SELECT inet_server_addr()",
            "SELECT current_user",
            "SELECT session_user",
            "SELECT current_schema",
            "SELECT current_schema()",
            "SELECT current_database()",
            "SELECT obj_description(1)",
            "SELECT format_type(23, -1)",
            "SELECT to_tsvector('english', account) FROM ledger",
            // Unbounded memory.
            "SELECT length(repeat(account, 50000000)) FROM ledger",
            "SELECT lpad(account, 1000000000) FROM ledger",
            "SELECT rpad(account, 1000000000, 'x') FROM ledger",
            "SELECT format('%1000000000s', account) FROM ledger",
            "SELECT replace(replace(account, 'a', account || account), 'a', account) FROM ledger",
            "SELECT regexp_replace(account, 'a', 'aaaaaaaa', 'g') FROM ledger",
            "SELECT encode(convert_to(account, 'UTF8'), 'hex') FROM ledger",
            "SELECT to_json(to_json(account)::text) FROM ledger",
            "SELECT string_agg(account, ',') FROM ledger",
            "SELECT array_agg(account) FROM ledger",
            "SELECT json_agg(account) FROM ledger",
            "SELECT ARRAY(SELECT account FROM ledger)",
            // Set-returning functions in the select list multiply rows.
            "SELECT generate_series(1, 100000000)",
            "SELECT unnest(ARRAY[1, 2])",
            // Functions of other schemas, and names that are a different function when quoted.
            "SELECT public.lower(account) FROM ledger",
            "SELECT \"LOWER\"(account) FROM ledger",
            // Operators are functions: only the built-in ones.
            "SELECT account OPERATOR(public.===) 'x' FROM ledger",
            "SELECT id FROM ledger WHERE account OPERATOR(pg_catalog.~~) 'a%'",
            "SELECT id FROM ledger WHERE account @@ 'a'",
            "SELECT 5 !",
            "SELECT !! 5",
            "SELECT CONVERT(account, 'UTF8', 'LATIN1') FROM ledger",
        ],
    );
}

#[test]
fn sqlite_functions_outside_the_allowlist_are_refused() {
    refused(
        SqlDialect::Sqlite,
        &[
            "SELECT randomblob(999999999)",
            "SELECT length(randomblob(999999999))",
            "SELECT zeroblob(999999999)",
            "SELECT printf('%.*c', 999999999, 'x')",
            "SELECT format('%.*c', 999999999, 'x')",
            "SELECT hex(hex(hex(account))) FROM ledger",
            "SELECT quote(account) FROM ledger",
            "SELECT group_concat(account) FROM ledger",
            "SELECT replace(account, 'a', account) FROM ledger",
            "SELECT json_group_array(account) FROM ledger",
            "SELECT changes()",
            "SELECT last_insert_rowid()",
            "SELECT current_user",
        ],
    );
}

/// Syntax the guard does not know as an allowed call is refused, whether the parser reads it as
/// a call or a special form (the old guard accepted json_object, typed tsquery literals,
/// IS NORMALIZED, CONVERT … USING, TRY_CAST, ARRAY(subquery), IN UNNEST, string_agg and
/// IGNORE NULLS), or not at all (XML functions, IS JSON, json_table: refused only because the
/// parser rejects them; the allowlist keeps them refused when a parser upgrade reads them).
#[test]
fn special_forms_outside_the_allowlist_are_refused() {
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT xmlelement(name foo, account) FROM ledger",
            "SELECT xmlparse(document '<a/>')",
            "SELECT xmlexists('//a' PASSING BY REF '<a/>')",
            "SELECT xmlserialize(content '<a/>' AS text)",
            "SELECT account IS JSON FROM ledger",
            "SELECT * FROM json_table('[]', '$' COLUMNS (a int)) AS j",
            "SELECT json_object('a': 1)",
            "SELECT regclass 'pg_authid'",
            "SELECT xml '<a/>'",
            "SELECT tsquery 'a & b'",
            "SELECT account IS NFC NORMALIZED FROM ledger",
            "SELECT CONVERT(account USING utf8) FROM ledger",
            "SELECT TRY_CAST(account AS int) FROM ledger",
            "SELECT MATCH (account) AGAINST ('x') FROM ledger",
            "SELECT id FROM ledger WHERE id = ANY (ARRAY(SELECT id FROM ledger))",
            "SELECT count(*) FROM ledger WHERE id IN UNNEST(ARRAY[1])",
            "SELECT string_agg(account, ',' ORDER BY id) FROM ledger",
            "SELECT first_value(account) IGNORE NULLS OVER () FROM ledger",
        ],
    );
}

/// Syntax that is a function call in another form goes through the same allowlist.
#[test]
fn special_call_syntax_of_allowed_functions_is_accepted() {
    accepted(
        SqlDialect::Postgres,
        &[
            "SELECT EXTRACT(year FROM booked_at), SUBSTRING(account FROM 1 FOR 2), \
             POSITION('a' IN account), TRIM(BOTH 'x' FROM account), \
             OVERLAY(account PLACING 'x' FROM 1), booked_at AT TIME ZONE 'UTC', \
             account COLLATE \"C\", CEIL(amount), FLOOR(amount) FROM ledger",
            "SELECT account, sum(amount), count(*), avg(amount), min(amount), max(amount), \
             round(sum(amount), 2) FROM ledger GROUP BY account ORDER BY 2 DESC",
            "SELECT date_trunc('month', booked_at) AS month, count(id) FROM ledger \
             GROUP BY date_trunc('month', booked_at) ORDER BY month",
            "SELECT coalesce(lower(account), upper(account)), length(account), \
             substr(account, 1, 3) FROM ledger WHERE booked_at > now() - interval '7 days'",
            "SELECT pg_catalog.lower(account) FROM ledger",
            "SELECT row_number() OVER (PARTITION BY account ORDER BY booked_at) FROM ledger",
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FROM ledger",
            "SELECT count(*) FILTER (WHERE amount > 0) FROM ledger",
            "SELECT account || ':' || id, CASE WHEN amount > 0 THEN 'in' ELSE 'out' END FROM ledger",
            "SELECT ROW(id, account), ARRAY[id, id] FROM ledger",
            "SELECT current_date, current_timestamp, localtime",
            "WITH monthly AS (SELECT date_trunc('month', booked_at) AS m, account, \
             sum(amount) AS total FROM ledger GROUP BY 1, 2), \
             ranked AS (SELECT m, account, total, \
             rank() OVER (PARTITION BY m ORDER BY total DESC) AS r FROM monthly) \
             SELECT m, account || ' (' || to_char(m, 'YYYY-MM') || ')' AS label, total \
             FROM ranked WHERE r <= 3 ORDER BY m, r",
            "SELECT l.account, count(*) FILTER (WHERE l.amount < 0) AS debits, \
             sum(l.amount) / nullif(count(*), 0) AS mean FROM ledger l \
             JOIN users u ON u.name = l.account GROUP BY l.account HAVING count(*) > 1",
        ],
    );
    accepted(
        SqlDialect::Sqlite,
        &[
            "SELECT strftime('%Y-%m', booked_at) AS month, sum(amount), count(*), \
             round(avg(amount), 2) FROM ledger GROUP BY 1 ORDER BY month",
            "SELECT coalesce(lower(account), upper(account)), ifnull(amount, 0), \
             substr(account, 1, 2) FROM ledger",
            "SELECT date(booked_at), datetime(booked_at), julianday(booked_at) FROM ledger",
        ],
    );
}

/// Class 2: a reference through a subscript or a qualified chain was checked as unrelated
/// bare names (`u`, `secret`) and matched the columns of another FROM item.
#[test]
fn references_resolve_against_the_relation_they_name() {
    let decoy = "(SELECT id AS u, id AS secret, id AS public, id AS users, id AS x FROM users) s";
    let queries: Vec<String> = [
        "SELECT u.secret[1] FROM users u, {decoy}",
        "SELECT u.secret[1:2] FROM users u, {decoy}",
        "SELECT u.secret[1].x FROM users u, {decoy}",
        "SELECT u.secret[1] ->> 'k' FROM users u, {decoy}",
        "SELECT length(u.secret[1]) FROM users u, {decoy}",
        "SELECT s.u FROM users u, {decoy} WHERE u.secret[1] = 'x'",
        "SELECT s.u FROM users u, {decoy} ORDER BY u.secret[1]",
        "SELECT count(s.u) FROM users u, {decoy} GROUP BY u.secret[1]",
        "SELECT public.users.secret[1] FROM users, {decoy}",
        "SELECT users.secret[1] FROM users, {decoy}",
        "SELECT (SELECT u.secret[1]) FROM users u, {decoy}",
    ]
    .iter()
    .map(|q| q.replace("{decoy}", decoy))
    .collect();
    refused(
        SqlDialect::Postgres,
        &queries.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT (u).secret FROM users u",
            "SELECT (u.*).secret FROM users u",
            "SELECT (u).name FROM users u, (SELECT id AS x FROM ledger) l2 WHERE (u).secret = 1",
            "SELECT u FROM users u",
            "SELECT count(u) FROM users u",
            "SELECT u FROM users u, (SELECT id AS x FROM users) s",
            "SELECT secret FROM users u, (SELECT 1 AS x) secret",
        ],
    );
    // An ON condition sees only the two sides of its join: `secret` there is users.secret,
    // not the decoy joined later or listed earlier (found by sql_explain_differential.rs).
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT u.id FROM users u JOIN ledger l ON l.account = secret \
             JOIN (SELECT id AS secret FROM users) z ON z.secret = u.id",
            "SELECT u.id FROM users u LEFT JOIN ledger l ON u.id = l.id AND secret = 1 \
             LEFT JOIN (SELECT id AS secret FROM users) z ON true",
            "SELECT u.id FROM (SELECT id AS secret FROM users) z, users u \
             JOIN ledger l ON l.id = secret",
            "SELECT u.id FROM (SELECT id AS secret FROM users) z, \
             (users u JOIN ledger l ON l.id = secret)",
        ],
    );
    accepted(
        SqlDialect::Postgres,
        &[
            "SELECT u.name, s.u FROM users u, (SELECT id AS u FROM users) s",
            "SELECT u.name FROM users u WHERE u.id = 1",
            "SELECT s FROM (SELECT id, name FROM users) s",
            "SELECT (s).name FROM (SELECT id, name FROM users) s",
        ],
    );
}

/// Class 3: cast targets were compared as rendered text, so a qualified or quoted spelling
/// of a catalog lookup type passed.
#[test]
fn cast_types_are_compared_by_name_and_allowlisted() {
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT 'pg_authid'::pg_catalog.regclass",
            "SELECT 'pg_authid'::\"regclass\"",
            "SELECT 'pg_authid'::pg_catalog.\"regclass\"",
            "SELECT '{pg_authid}'::pg_catalog.regclass[]",
            "SELECT '{pg_authid}'::\"regclass\"[]",
            "SELECT CAST('pg_authid' AS pg_catalog.regclass)",
            "SELECT CAST('pg_authid' AS \"regclass\")",
            "SELECT 'pg_sleep'::pg_catalog.regproc",
            "SELECT 'postgres'::pg_catalog.regrole",
            "SELECT 'x'::xml",
            "SELECT '<a/>'::pg_catalog.xml",
            "SELECT 'a & b'::tsquery",
            "SELECT '$.a'::jsonpath",
            "SELECT '(1,x)'::public.users",
            "SELECT '(1,x)'::users",
            "SELECT 'x'::information_schema.sql_identifier",
            "SELECT id::money FROM ledger",
        ],
    );
    accepted(
        SqlDialect::Postgres,
        &[
            "SELECT amount::numeric(10, 2), booked_at::date, id::text, account::varchar(10), \
             amount::double precision, id::bigint, '1 day'::interval, ARRAY[1]::int[], \
             CAST(amount AS integer), 1::\"int4\", 1::pg_catalog.int8, date '2026-01-01', \
             timestamptz '2026-01-01 00:00:00+00', '{}'::jsonb, 'true'::boolean FROM ledger",
        ],
    );
    accepted(
        SqlDialect::Sqlite,
        &["SELECT CAST(amount AS INTEGER), CAST(id AS TEXT), CAST(amount AS REAL) FROM ledger"],
    );
}

/// Class 4 (the guard's part): recursion and row multiplication.
#[test]
fn recursion_and_cross_joins_are_refused() {
    for dialect in [SqlDialect::Postgres, SqlDialect::Sqlite] {
        refused(
            dialect,
            &[
                "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(n) FROM r",
                "SELECT count(DISTINCT a.account || b.account || c.account) FROM ledger a, ledger b, ledger c",
                "SELECT count(*) FROM ledger a CROSS JOIN ledger b CROSS JOIN ledger c",
                "SELECT count(*) FROM ledger a JOIN ledger b ON true JOIN ledger c ON 1 = 1",
                "SELECT count(*) FROM ledger a, (SELECT b.id FROM ledger b, ledger c) x",
            ],
        );
        accepted(
            dialect,
            &[
                "SELECT count(*) FROM ledger a JOIN ledger b ON a.id = b.id JOIN ledger c ON c.id = b.id",
                "SELECT a.id, b.id FROM ledger a, ledger b WHERE a.id = b.id",
            ],
        );
    }
}

/// Class 4, a variant: values combined again at every level of a CTE chain double each time,
/// so a short query asks the server for a value of 2^n times a stored one, and an expression
/// of 2^n terms once the CTEs are substituted.
#[test]
fn values_combined_across_nested_queries_are_bounded() {
    let chain = |levels: usize, combine: &str| {
        let mut ctes = vec!["c0 AS (SELECT account AS s FROM ledger)".to_owned()];
        for i in 1..=levels {
            ctes.push(format!(
                "c{i} AS (SELECT {} AS s FROM c{})",
                combine.replace('x', "s"),
                i - 1
            ));
        }
        format!("WITH {} SELECT length(s) FROM c{levels}", ctes.join(", "))
    };
    let doubling: Vec<String> = ["x || x", "concat(x, x)", "concat_ws(',', x, x)", "x || '-' || x"]
        .iter()
        .map(|c| chain(12, c))
        .chain([
            "SELECT length(d.s || d.s || d.s || d.s || d.s) FROM (SELECT c.s || c.s || c.s || c.s AS s FROM \
             (SELECT b.s || b.s || b.s || b.s AS s FROM (SELECT a.account || a.account || \
             a.account || a.account AS s FROM ledger a) b) c) d"
                .to_owned(),
            "SELECT length(x.s) FROM ledger l, LATERAL (SELECT l.account || l.account AS s) y, \
             LATERAL (SELECT y.s || y.s || y.s || y.s || y.s || y.s || y.s || y.s || y.s || y.s AS s) z, \
             LATERAL (SELECT z.s || z.s || z.s || z.s || z.s || z.s || z.s || z.s || z.s || z.s \
             || z.s || z.s || z.s || z.s AS s) x"
                .to_owned(),
        ])
        .collect();
    // Referring to a column twice at every level does not grow the value, but PostgreSQL
    // substitutes the CTEs into one expression of 2^n terms; planning it ignores the statement
    // timeout (a 24-level `s || s` chain held a backend at 18 GB after 70 s until it was
    // killed; 27 levels got the server OOM-killed and restarted).
    let doubling: Vec<String> = doubling
        .into_iter()
        .chain(
            [
                "greatest(x, x)",
                "coalesce(x, x)",
                "CASE WHEN x > 'a' THEN x END",
                "nullif(x, x)",
            ]
            .iter()
            .map(|c| chain(20, c)),
        )
        .chain([chain(24, "x || x"), chain(27, "x || x")])
        .collect();
    for dialect in [SqlDialect::Postgres, SqlDialect::Sqlite] {
        refused(
            dialect,
            &doubling.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        accepted(
            dialect,
            &[
                chain(3, "x || x").as_str(),
                chain(12, "lower(x)").as_str(),
                chain(12, "substr(x, 1, 3)").as_str(),
                "WITH a AS (SELECT account || ':' || id AS k FROM ledger) \
                 SELECT k || '/' || k FROM a",
                "SELECT CASE WHEN amount > 100 THEN 'a' WHEN amount > 50 THEN 'b' \
                 WHEN amount > 10 THEN 'c' ELSE 'd' END || account FROM ledger",
            ],
        );
    }
}

/// Names PostgreSQL reads as something else than a column of the FROM item they seem to name.
#[test]
fn names_that_are_calls_in_disguise() {
    let mut open = rules();
    open.tables.insert(
        "events".into(),
        TableRule {
            columns: Columns::Any,
        },
    );
    // Attribute notation: `e.f` calls f(e) when e has no column f.
    for q in [
        "SELECT e.pg_sleep FROM events e",
        "SELECT e.pg_read_file FROM events e",
        "SELECT e.set_config FROM events e",
        "SELECT e.current_setting FROM events e",
    ] {
        assert!(guard(q, SqlDialect::Postgres, &open).is_err(), "{q}");
    }
    assert!(
        guard(
            "SELECT e.anything FROM events e",
            SqlDialect::Postgres,
            &open
        )
        .is_ok()
    );
    // Field selection on a value is a call: (x).f is f(x) unless x is a row. Measured on
    // PostgreSQL 15: ('SELECT to_tsvector(detail) FROM audit_log'::text).ts_stat returns the
    // words of audit_log.detail; (0.1).pg_sleep sleeps; ('x'::text).current_setting reads it.
    for q in [
        "SELECT ('SELECT to_tsvector(detail) FROM audit_log'::text).ts_stat FROM events",
        "SELECT ('statement_timeout'::text).current_setting FROM events",
        "SELECT (0.1).pg_sleep FROM events",
        "SELECT (e.x).pg_sleep FROM events e",
        "SELECT (e.payload).ts_stat FROM events e",
        "SELECT (lower(e.x)).current_setting FROM events e",
        "SELECT (SELECT e.x FROM events e LIMIT 1).current_setting FROM events",
        "SELECT (l.account).upper FROM ledger l",
        "SELECT (e).x FROM events e",
        "SELECT (e.*).x FROM events e",
        "SELECT e.tags[1].current_setting FROM events e",
        "SELECT g.ts_stat FROM events e, (SELECT e2.x AS y FROM events e2) g",
    ] {
        assert!(guard(q, SqlDialect::Postgres, &open).is_err(), "{q}");
    }
    // Keywords that are functions in PostgreSQL are plain names in SQLite.
    assert!(guard("SELECT user FROM events", SqlDialect::Sqlite, &open).is_ok());
    assert!(guard("SELECT user FROM events", SqlDialect::Postgres, &open).is_err());
    assert!(guard("SELECT \"user\" FROM events", SqlDialect::Postgres, &open).is_ok());
}

/// A listed table function is the built-in one: `public.generate_series` is another function.
#[test]
fn table_functions_of_other_schemas_are_not_the_listed_ones() {
    let mut r = rules();
    r.table_functions = vec!["generate_series".into()];
    assert!(
        guard(
            "SELECT g FROM generate_series(1, 3) AS g",
            SqlDialect::Postgres,
            &r
        )
        .is_ok()
    );
    assert!(
        guard(
            "SELECT g FROM pg_catalog.generate_series(1, 3) AS g",
            SqlDialect::Postgres,
            &r
        )
        .is_ok()
    );
    for q in [
        "SELECT g FROM public.generate_series(1, 3) AS g",
        "SELECT g FROM reporting.generate_series(1, 3) AS g",
    ] {
        assert!(guard(q, SqlDialect::Postgres, &r).is_err(), "{q}");
    }
}

/// lpad/rpad return exactly `width` characters: allowed with a small literal width only.
#[test]
fn padding_is_allowed_with_a_small_literal_width() {
    accepted(
        SqlDialect::Postgres,
        &[
            "SELECT lpad(id::text, 6, '0'), rpad(account, 12) FROM ledger",
            "SELECT lpad(lpad(account, 1000, 'x'), 1000, 'y') FROM ledger",
        ],
    );
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT lpad(account, 1001) FROM ledger",
            "SELECT lpad(account, id) FROM ledger",
            "SELECT rpad(account, 10 * 100000000) FROM ledger",
            "SELECT public.lpad(account, 10) FROM ledger",
        ],
    );
}

/// `FROM ONLY t` reads t; the parser reads a table `only` with the alias t.
#[test]
fn from_only_is_not_a_table_named_only() {
    let mut r = rules();
    r.tables.insert(
        "*".into(),
        TableRule {
            columns: Columns::Any,
        },
    );
    for q in [
        "SELECT secret FROM ONLY ledger",
        "SELECT ledger.secret FROM ONLY ledger",
        "SELECT id FROM ONLY ledger",
    ] {
        assert!(guard(q, SqlDialect::Postgres, &r).is_err(), "{q}");
    }
    assert!(guard("SELECT x FROM \"only\"", SqlDialect::Postgres, &r).is_ok());
}

/// PostgreSQL reads `U&"\0073ecret"` as the name `secret`; the tokenizer saw `U & "\0073ecret"`,
/// two names a decoy subquery could provide. (What runs is the guard's rendering, `U & "…"` with
/// spaces, which PostgreSQL reads as the guard did; refused anyway, because the query as the
/// agent wrote it means something else than what the guard judged.)
#[test]
fn unicode_escaped_names_are_refused() {
    refused(
        SqlDialect::Postgres,
        &[
            "SELECT U&\"\\0073ecret\" FROM users u, (SELECT 1 AS u, 2 AS \"\\0073ecret\") d",
            "SELECT u&\"\\0073ecret\" FROM users, (SELECT 1 AS u, 2 AS \"\\0073ecret\") d",
        ],
    );
    accepted(
        SqlDialect::Postgres,
        &["SELECT name FROM users WHERE name = U&'\\0041'"],
    );
}
