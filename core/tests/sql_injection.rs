//! Every query of `sql_injection_corpus.txt` must be refused, in both dialects.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use sandboxrun_core::sql::{Columns, SqlDialect, SqlRules, TableRule, guard};

fn rules() -> SqlRules {
    let mut rules = SqlRules::default();
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
    rules
}

fn corpus() -> Vec<String> {
    include_str!("sql_injection_corpus.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| l.replace("\\n", "\n"))
        .collect()
}

#[test]
fn corpus_is_large_enough() {
    assert!(corpus().len() >= 40, "{}", corpus().len());
}

#[test]
fn every_injection_attempt_is_blocked() {
    let rules = rules();
    let mut accepted = Vec::new();
    for query in corpus() {
        for dialect in [SqlDialect::Postgres, SqlDialect::Sqlite] {
            match guard(&query, dialect, &rules) {
                Ok(g) => accepted.push(format!("{dialect:?}: {query:?} -> {:?}", g.sql)),
                Err(v) => {
                    assert!(!v.problem.is_empty() && !v.hint.is_empty(), "{query:?}");
                }
            }
        }
    }
    assert!(accepted.is_empty(), "accepted:\n{}", accepted.join("\n"));
}

#[test]
fn the_guard_still_accepts_a_plain_query() {
    // Guards against a corpus that passes only because everything is refused.
    let g = guard(
        "SELECT id, amount FROM ledger WHERE account = 'x'",
        SqlDialect::Postgres,
        &rules(),
    )
    .unwrap();
    assert_eq!(
        g.sql,
        "SELECT id, amount FROM ledger WHERE account = 'x' LIMIT 1000"
    );
}
