use super::*;

const SMALL: &str = r#"
groups:
  analysts: [analyst-01]
rules:
  - name: analysts-sandbox
    agents: ["group:analysts"]
    tools: [sql, python]
    environments: [sandbox]
    verdict: allow
    limits: {timeoutSeconds: 10, rows: 50}
    sql:
      databases: [demo]
      tables:
        ledger: {columns: [id, account, amount, booked_at]}
      maxLimit: 100
"#;

fn small() -> Policy {
    Policy::from_yaml(SMALL, "<test>").unwrap()
}

#[test]
fn first_matching_rule_wins_and_default_blocks() {
    let p = Policy::from_yaml(
        r#"
rules:
  - {name: first, agents: [a], tools: [python], verdict: escalate}
  - {name: second, agents: ["*"], tools: [python], verdict: allow}
"#,
        "<test>",
    )
    .unwrap();
    let d = p.evaluate(&CallContext::new("a", Tool::Python, Environment::Sandbox));
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Escalate, "first"));
    let d = p.evaluate(&CallContext::new("b", Tool::Python, Environment::Sandbox));
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Allow, "second"));
    let d = p.evaluate(&CallContext::new("b", Tool::Metrics, Environment::Sandbox));
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Block, DEFAULT_RULE));
    assert!(d.reason.contains("policy default is Block"), "{}", d.reason);
}

#[test]
fn default_allow_still_blocks_sql_without_rules() {
    let p = Policy::from_yaml("default: allow\n", "<test>").unwrap();
    let d = p.evaluate(&CallContext::new("x", Tool::Python, Environment::Sandbox));
    assert_eq!(d.verdict, Verdict::Allow);
    let d = p.evaluate(
        &CallContext::new("x", Tool::Sql, Environment::Sandbox).with_sql("demo", "SELECT 1"),
    );
    assert_eq!(d.verdict, Verdict::Block);
}

#[test]
fn limits_are_lowered_to_the_rule_ceilings() {
    let mut call = CallContext::new("analyst-01", Tool::Python, Environment::Sandbox);
    call.limits.timeout_seconds = 100;
    call.rows = Some(10_000);
    let d = small().evaluate(&call);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.limits.timeout_seconds, 10);
    assert_eq!(d.max_rows, 50);
    assert!(d.reason.contains("timeoutSeconds 100 → 10"), "{}", d.reason);
}

#[test]
fn sql_limit_never_exceeds_the_row_ceiling() {
    let call = CallContext::new("analyst-01", Tool::Sql, Environment::Sandbox)
        .with_sql("demo", "SELECT id, amount FROM ledger LIMIT 500");
    let d = small().evaluate(&call);
    assert_eq!(d.verdict, Verdict::Allow, "{}", d.reason);
    assert_eq!(
        d.rewritten_query.as_deref(),
        Some("SELECT id, amount FROM ledger LIMIT 51")
    );
    // At most 50 rows are kept; a 51st marks the result truncated.
    assert_eq!(d.max_rows, 50);
    let call = CallContext::new("analyst-01", Tool::Sql, Environment::Sandbox)
        .with_sql("demo", "SELECT id, amount FROM ledger LIMIT 7");
    let d = small().evaluate(&call);
    assert_eq!(
        d.rewritten_query.as_deref(),
        Some("SELECT id, amount FROM ledger LIMIT 7")
    );
    assert_eq!(d.max_rows, 7);
}

#[test]
fn sql_guard_violation_blocks_with_the_guard_rule() {
    let call = CallContext::new("analyst-01", Tool::Sql, Environment::Sandbox)
        .with_sql("demo", "SELECT * FROM ledger");
    let d = small().evaluate(&call);
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rule, "analysts-sandbox/sql-guard");
    assert!(
        d.reason
            .starts_with("SELECT * is not allowed by rule analysts-sandbox: list the columns you need, e.g. SELECT id, account, amount FROM ledger"),
        "{}",
        d.reason
    );
}

#[test]
fn unknown_database_and_missing_query_are_blocked() {
    let call = CallContext::new("analyst-01", Tool::Sql, Environment::Sandbox)
        .with_sql("prod", "SELECT id FROM ledger");
    let d = small().evaluate(&call);
    assert_eq!(d.verdict, Verdict::Block);
    assert!(
        d.reason.contains("database prod is not allowed"),
        "{}",
        d.reason
    );
    let d = small().evaluate(&CallContext::new(
        "analyst-01",
        Tool::Sql,
        Environment::Sandbox,
    ));
    assert_eq!(d.verdict, Verdict::Block);
}

fn invalid(yaml: &str) -> String {
    match Policy::from_yaml(yaml, "<test>") {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted: {yaml}"),
    }
}

#[test]
fn unknown_fields_are_errors_with_line_numbers() {
    let err = Policy::from_yaml(
        "rules:\n  - name: a\n    verdict: allow\n    tools: [python]\n    enviroments: [sandbox]\n",
        "policy.yaml",
    )
    .unwrap_err();
    match &err {
        PolicyError::Syntax { line, message, .. } => {
            assert_eq!(*line, 5, "{err}");
            assert!(
                message.starts_with("unknown field `enviroments`, expected one of"),
                "{err}"
            );
            assert!(!message.contains('\n'), "{err}");
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("line 5"), "{text}");
}

#[test]
fn malformed_yaml_reports_line_and_problem() {
    let err =
        Policy::from_yaml("rules:\n  - name: a\n    verdict: [allow\n", "p.yaml").unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, PolicyError::Syntax { line, .. } if line >= 3),
        "{text}"
    );
    assert!(text.contains("line"), "{text}");
    let err = Policy::from_yaml("rules:\n  - name: a\n    verdict: maybe\n", "p.yaml").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("line 3"), "{text}");
    assert!(text.contains("maybe"), "{text}");
}

#[test]
fn semantic_errors_name_the_rule_and_line() {
    let text = invalid(
        "rules:\n  - name: a\n    agents: [\"group:nope\"]\n    tools: [python]\n    verdict: allow\n",
    );
    assert!(text.contains("rule \"a\" (line 2)"), "{text}");
    assert!(text.contains("unknown group"), "{text}");
    let text = invalid(
        "rules:\n  - {name: a, tools: [python], verdict: allow, limits: {timeoutSeconds: 100000}}\n",
    );
    assert!(text.contains("timeoutSeconds"), "{text}");
    let text =
        invalid("rules:\n  - {name: a, tools: [python], verdict: allow, limits: {memory: 64Gi}}\n");
    assert!(text.contains("memory"), "{text}");
    let text =
        invalid("rules:\n  - {name: a, tools: [python], verdict: allow, limits: {memory: lots}}\n");
    assert!(text.contains("memory"), "{text}");
    let text = invalid(
        "rules:\n  - {name: a, tools: [python], verdict: allow, limits: {outputBytes: 0}}\n",
    );
    assert!(text.contains("outputBytes"), "{text}");
    let text =
        invalid("rules:\n  - {name: a, tools: [python], verdict: allow, limits: {rows: 0}}\n");
    assert!(text.contains("rows"), "{text}");
    let text = invalid(
        "rules:\n  - {name: a, tools: [python], verdict: allow}\n  - {name: a, tools: [python], verdict: block}\n",
    );
    assert!(text.contains("same name"), "{text}");
    let text = invalid("rules:\n  - {name: a, tools: [sql], verdict: allow}\n");
    assert!(text.contains("no sql section"), "{text}");
    let text =
        invalid("rules:\n  - {name: a, tools: [python], verdict: allow, sql: {databases: [x]}}\n");
    assert!(text.contains("do not include sql"), "{text}");
    let text = invalid(
        "rules:\n  - {name: a, tools: [sql], verdict: allow, sql: {databases: [x], maxLimit: 0}}\n",
    );
    assert!(text.contains("maxLimit"), "{text}");
}

#[test]
fn columns_accept_star_or_list() {
    let p = Policy::from_yaml(
        "rules:\n  - name: a\n    tools: [sql]\n    verdict: allow\n    sql:\n      databases: [\"*\"]\n      tables:\n        t: {columns: \"*\"}\n        u: {columns: [x]}\n",
        "<test>",
    )
    .unwrap();
    let sql = p.rules()[0].sql.as_ref().unwrap();
    assert_eq!(sql.tables["t"].columns, crate::sql::Columns::Any);
    assert_eq!(
        sql.tables["u"].columns,
        crate::sql::Columns::List(vec!["x".into()])
    );
    let text = invalid(
        "rules:\n  - name: a\n    tools: [sql]\n    verdict: allow\n    sql:\n      databases: [\"*\"]\n      tables:\n        t: {columns: all}\n",
    );
    assert!(text.contains("line 8"), "{text}");
}

#[test]
fn store_keeps_the_last_good_policy() {
    let dir = std::env::temp_dir().join(format!("sandboxrun-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.yaml");
    std::fs::write(&path, SMALL).unwrap();
    let store = PolicyStore::load(&path).unwrap();
    let call = CallContext::new("analyst-01", Tool::Python, Environment::Sandbox);
    assert_eq!(store.evaluate(&call).verdict, Verdict::Allow);

    std::fs::write(&path, "rules:\n  - name: broken\n    verdct: allow\n").unwrap();
    let err = store.reload_from(&path).unwrap_err();
    assert!(err.to_string().contains("line 3"), "{err}");
    assert_eq!(store.evaluate(&call).verdict, Verdict::Allow);
    assert_eq!(*store.current(), small());

    std::fs::write(&path, "default: block\n").unwrap();
    store.reload_from(&path).unwrap();
    assert_eq!(store.evaluate(&call).verdict, Verdict::Block);
    assert!(store.reload_from(dir.join("missing.yaml")).is_err());
    assert_eq!(store.evaluate(&call).verdict, Verdict::Block);
    std::fs::remove_dir_all(&dir).ok();
}

/// A schema read is judged like a query of its database without a query: the first matching
/// rule decides; its sql settings (capped by its row limit) are the decision's to show; an
/// escalating rule still shows them (and says its queries need a person); a blocking rule, a
/// rule without sql settings, a database the rule does not cover and no rule at all show nothing.
#[test]
fn a_schema_read_records_the_deciding_rules_sql_settings() {
    let read = |agent: &str, env, db: &str| {
        small().evaluate(&CallContext::new(agent, Tool::Sql, env).with_schema_read(db))
    };
    let d = read("analyst-01", Environment::Sandbox, "demo");
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Allow, "analysts-sandbox")
    );
    let rules = d.schema.expect("the rule's sql settings");
    assert_eq!(rules.max_limit, 50, "capped by the rule's rows");
    assert!(rules.tables.contains_key("ledger"));
    assert_eq!(d.rewritten_query, None);
    for (agent, env, db) in [
        ("analyst-01", Environment::Sandbox, "other"),
        ("analyst-01", Environment::Production, "demo"),
        ("someone", Environment::Sandbox, "demo"),
    ] {
        let d = read(agent, env, db);
        assert_eq!(d.verdict, Verdict::Block, "{agent} {env:?} {db}: {d:?}");
        assert_eq!(d.schema, None);
    }
    let p = Policy::from_yaml(
        r#"
rules:
  - name: needs-a-person
    agents: ["*"]
    tools: [sql]
    verdict: escalate
    sql: {databases: [demo], tables: {ledger: {columns: [id]}}}
  - {name: no-sql-section, agents: ["*"], tools: [python], verdict: allow}
"#,
        "<test>",
    )
    .unwrap();
    let d = p
        .evaluate(&CallContext::new("a", Tool::Sql, Environment::Sandbox).with_schema_read("demo"));
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Allow, "needs-a-person")
    );
    assert!(
        d.reason.contains("needs a person's approval"),
        "{}",
        d.reason
    );
    assert!(d.schema.is_some());
    // The same rule still escalates every query.
    let q = p.evaluate(
        &CallContext::new("a", Tool::Sql, Environment::Sandbox)
            .with_sql("demo", "SELECT id FROM ledger"),
    );
    assert_eq!(q.verdict, Verdict::Escalate);
}
