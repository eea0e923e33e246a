//! The sample policy in `config/policy/policy.yaml` parses and decides the governance scenarios.

// Tests state what they expect with unwrap and expect: a failure is the message.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use sandboxrun_core::model::{Environment, Tool, Verdict};
use sandboxrun_core::policy::{
    CallContext, Policy, PolicyStore, PythonRequest, SessionRules, SessionUse,
};

fn sample_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/policy/policy.yaml")
}

fn sample() -> Policy {
    Policy::load(sample_path()).expect("the sample policy parses")
}

fn sql(agent: &str, env: Environment, query: &str) -> CallContext {
    CallContext::new(agent, Tool::Sql, env).with_sql("demo", query)
}

#[test]
fn sample_parses_with_its_rules_in_order() {
    let p = sample();
    let names: Vec<&str> = p.rules().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "oncall-production",
            "production-needs-approval",
            "analysts-sandbox",
            "analysts-metrics",
            "block-everything-else"
        ]
    );
    assert_eq!(p.default_verdict(), Verdict::Block);
    assert!(p.rules().iter().all(|r| r.line > 0));
    PolicyStore::load(sample_path()).unwrap();
}

#[test]
fn analyst_column_query_in_sandbox_is_allowed_with_a_limit() {
    let d = sample().evaluate(&sql(
        "analyst-01",
        Environment::Sandbox,
        "SELECT id, account, amount FROM ledger WHERE amount > 100",
    ));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    assert_eq!(d.rule, "analysts-sandbox");
    assert_eq!(
        d.rewritten_query.as_deref(),
        Some("SELECT id, account, amount FROM ledger WHERE amount > 100 LIMIT 1001")
    );
    assert_eq!(d.max_rows, 1000);
    assert_eq!(d.limits.timeout_seconds, 30);
}

#[test]
fn select_star_is_blocked_with_the_rule_and_a_fix() {
    let d = sample().evaluate(&sql(
        "analyst-02",
        Environment::Sandbox,
        "SELECT * FROM ledger",
    ));
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rule, "analysts-sandbox/sql-guard");
    assert_eq!(
        d.reason,
        "SELECT * is not allowed by rule analysts-sandbox: list the columns you need, e.g. SELECT id, account, amount FROM ledger"
    );
}

#[test]
fn injections_and_writes_are_blocked_by_the_guard() {
    let p = sample();
    for query in [
        "SELECT id FROM ledger; DROP TABLE audit_log--",
        "DROP TABLE ledger",
        "DELETE FROM ledger",
        "UPDATE ledger SET amount = 0",
        "TRUNCATE ledger",
        "GRANT ALL ON ledger TO analyst",
        "SELECT 1; SELECT 2",
        "WITH x AS (DELETE FROM ledger RETURNING *) SELECT * FROM x",
        "SELECT set_config('x','y',false)",
        "SELECT secret FROM ledger",
    ] {
        let d = p.evaluate(&sql("analyst-01", Environment::Sandbox, query));
        assert_eq!(d.verdict, Verdict::Block, "{query}: {d}");
        assert_eq!(d.rule, "analysts-sandbox/sql-guard", "{query}");
        assert!(d.rewritten_query.is_none());
    }
}

#[test]
fn production_escalates_unless_oncall() {
    let p = sample();
    let d = p.evaluate(&sql(
        "analyst-01",
        Environment::Production,
        "SELECT id FROM ledger",
    ));
    assert_eq!(d.verdict, Verdict::Escalate, "{d}");
    assert_eq!(d.rule, "production-needs-approval");
    assert_eq!(
        d.rewritten_query.as_deref(),
        Some("SELECT id FROM ledger LIMIT 1001")
    );
    let d = p.evaluate(&CallContext::new(
        "someone",
        Tool::Python,
        Environment::Production,
    ));
    assert_eq!(d.verdict, Verdict::Escalate);
    // Nobody is asked to approve a query the guard refuses.
    let d = p.evaluate(&sql(
        "analyst-01",
        Environment::Production,
        "DROP TABLE ledger",
    ));
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rule, "production-needs-approval/sql-guard");

    let d = p.evaluate(&sql(
        "sre-01",
        Environment::Production,
        "SELECT * FROM ledger",
    ));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    assert_eq!(d.rule, "oncall-production");
    assert_eq!(d.max_rows, 5000);
}

#[test]
fn everything_else_is_blocked() {
    let p = sample();
    let d = p.evaluate(&CallContext::new(
        "analyst-01",
        Tool::Python,
        Environment::Staging,
    ));
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rule, "block-everything-else");
    assert!(d.reason.contains("ask an operator"), "{d}");
    let d = p.evaluate(&sql(
        "stranger",
        Environment::Sandbox,
        "SELECT id FROM ledger",
    ));
    assert_eq!(d.verdict, Verdict::Block);
    let d = p.evaluate(&CallContext::new(
        "analyst-01",
        Tool::Metrics,
        Environment::Staging,
    ));
    assert_eq!(d.verdict, Verdict::Allow);
}

#[test]
fn analysts_may_use_sessions_in_the_sandbox_with_the_default_bounds() {
    let p = sample();
    let session = |agent: &str, env| {
        let mut call = CallContext::new(agent, Tool::Python, env);
        call.python = Some(PythonRequest {
            session: Some(SessionUse::Open),
            ..PythonRequest::default()
        });
        p.evaluate(&call)
    };
    let d = session("analyst-01", Environment::Sandbox);
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Allow, "analysts-sandbox"),
        "{d}"
    );
    assert_eq!(d.sessions, Some(SessionRules::default()));
    // Production escalates, and its rule has no sessions: the session is what blocks it.
    let d = session("analyst-01", Environment::Production);
    assert_eq!(d.verdict, Verdict::Block, "{d}");
    assert!(d.reason.contains("sessions are not allowed"), "{d}");
}
