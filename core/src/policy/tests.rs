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

const SESSIONS: &str = r#"
rules:
  - name: with-sessions
    agents: [a]
    tools: [python]
    verdict: allow
    python:
      profiles: [minimal, data]
      sessions: {maxPerAgent: 5, maxLifetimeSeconds: 1800, idleTimeoutSeconds: 120}
  - name: escalated-sessions
    agents: [e]
    tools: [python]
    verdict: escalate
    python: {sessions: {}}
  - name: without-sessions
    agents: [b]
    tools: [python]
    verdict: allow
    python: {profiles: [minimal]}
  - {name: no-python-section, agents: [c], tools: [python], verdict: allow}
"#;

/// A python call asking for `session` in the sandbox.
fn python_call(agent: &str, session: Option<SessionUse>) -> CallContext {
    let mut call = CallContext::new(agent, Tool::Python, Environment::Sandbox);
    call.python = Some(PythonRequest {
        session,
        ..PythonRequest::default()
    });
    call
}

#[test]
fn a_sessions_section_parses_with_its_defaults_and_is_absent_otherwise() {
    let p = Policy::from_yaml(SESSIONS, "<test>").unwrap();
    let sessions = |name: &str| {
        let rule = p.rules().iter().find(|r| r.name == name).unwrap();
        rule.python.as_ref().and_then(|python| python.sessions)
    };
    assert_eq!(
        sessions("with-sessions"),
        Some(SessionRules {
            max_per_agent: 5,
            max_lifetime_seconds: 1800,
            idle_timeout_seconds: 120,
        })
    );
    assert_eq!(
        sessions("escalated-sessions"),
        Some(SessionRules {
            max_per_agent: 3,
            max_lifetime_seconds: 3600,
            idle_timeout_seconds: 600,
        })
    );
    assert_eq!(
        sessions("escalated-sessions"),
        Some(SessionRules::default())
    );
    assert_eq!(sessions("without-sessions"), None);
    assert_eq!(sessions("no-python-section"), None);
    assert_eq!(PythonRules::default().sessions, None);
    let err = Policy::from_yaml(
        "rules:\n  - name: a\n    tools: [python]\n    verdict: allow\n    python:\n      sessions: {maxPerAgnet: 2}\n",
        "<test>",
    )
    .unwrap_err();
    assert!(
        matches!(&err, PolicyError::Syntax { line: 6, message, .. } if message.contains("unknown field `maxPerAgnet`")),
        "{err}"
    );
}

#[test]
fn session_bounds_are_checked_at_load_time() {
    let with = |sessions: &str| {
        invalid(&format!(
            "rules:\n  - {{name: a, tools: [python], verdict: allow, python: {{sessions: {sessions}}}}}\n"
        ))
    };
    for (sessions, expected) in [
        (
            "{maxPerAgent: 50}",
            "python.sessions.maxPerAgent is 50; the most allowed is 20",
        ),
        (
            "{maxPerAgent: 0}",
            "python.sessions.maxPerAgent is 0; the least allowed is 1",
        ),
        (
            "{maxLifetimeSeconds: 3601}",
            "python.sessions.maxLifetimeSeconds is 3601; the most allowed is 3600",
        ),
        (
            "{maxLifetimeSeconds: 59, idleTimeoutSeconds: 10}",
            "python.sessions.maxLifetimeSeconds is 59; the least allowed is 60",
        ),
        (
            "{idleTimeoutSeconds: 3601}",
            "python.sessions.idleTimeoutSeconds is 3601; the most allowed is 3600",
        ),
        (
            "{idleTimeoutSeconds: 9}",
            "python.sessions.idleTimeoutSeconds is 9; the least allowed is 10",
        ),
        (
            "{maxLifetimeSeconds: 300, idleTimeoutSeconds: 600}",
            "python.sessions.idleTimeoutSeconds is 600, above maxLifetimeSeconds 300",
        ),
    ] {
        let text = with(sessions);
        assert!(text.contains(expected), "{sessions}: {text}");
        assert!(text.contains("rule \"a\""), "{sessions}: {text}");
    }
    // The bounds themselves are accepted.
    for sessions in [
        "{maxPerAgent: 1, maxLifetimeSeconds: 60, idleTimeoutSeconds: 10}",
        "{maxPerAgent: 20, maxLifetimeSeconds: 3600, idleTimeoutSeconds: 3600}",
    ] {
        let yaml = format!(
            "rules:\n  - {{name: a, tools: [python], verdict: allow, python: {{sessions: {sessions}}}}}\n"
        );
        Policy::from_yaml(&yaml, "<test>").unwrap_or_else(|e| panic!("{sessions}: {e}"));
    }
}

#[test]
fn a_session_needs_a_rule_with_a_sessions_section() {
    let p = Policy::from_yaml(SESSIONS, "<test>").unwrap();
    for agent in ["b", "c"] {
        for session in [SessionUse::Open, SessionUse::Continue] {
            let d = p.evaluate(&python_call(agent, Some(session)));
            assert_eq!(d.verdict, Verdict::Block, "{agent} {session:?}: {d}");
            assert!(d.rule.ends_with("/python"), "{d}");
            assert!(
                d.reason.starts_with("sessions are not allowed by rule "),
                "{d}"
            );
            assert!(d.reason.contains("call run_python without session"), "{d}");
            assert!(d.reason.contains("python.sessions section"), "{d}");
            assert_eq!(d.sessions, None);
        }
    }
    // No rule matches: the defaults, which allow here, have no sessions.
    let open = Policy::from_yaml("default: allow\n", "<test>").unwrap();
    let d = open.evaluate(&python_call("anyone", Some(SessionUse::Open)));
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Block, DEFAULT_RULE));
    assert!(
        d.reason
            .starts_with("sessions are not allowed by the policy default"),
        "{d}"
    );
    assert_eq!(d.sessions, None);
}

#[test]
fn an_allowed_or_escalated_session_call_carries_the_rules_session_bounds() {
    let p = Policy::from_yaml(SESSIONS, "<test>").unwrap();
    for session in [SessionUse::Open, SessionUse::Continue] {
        let d = p.evaluate(&python_call("a", Some(session)));
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (Verdict::Allow, "with-sessions"),
            "{d}"
        );
        assert_eq!(
            d.sessions,
            Some(SessionRules {
                max_per_agent: 5,
                max_lifetime_seconds: 1800,
                idle_timeout_seconds: 120,
            })
        );
    }
    let d = p.evaluate(&python_call("e", Some(SessionUse::Open)));
    assert_eq!(d.verdict, Verdict::Escalate, "{d}");
    assert_eq!(d.sessions, Some(SessionRules::default()));
    // A call without a session records no session bounds, even under a rule that has them.
    let d = p.evaluate(&python_call("a", None));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    assert_eq!(d.sessions, None);
}

#[test]
fn calls_without_a_session_are_judged_as_before() {
    let p = Policy::from_yaml(SESSIONS, "<test>").unwrap();
    for agent in ["b", "c"] {
        let d = p.evaluate(&python_call(agent, None));
        assert_eq!(d.verdict, Verdict::Allow, "{agent}: {d}");
        assert_eq!(d.sessions, None);
        let d = p.evaluate(&CallContext::new(agent, Tool::Python, Environment::Sandbox));
        assert_eq!(d.verdict, Verdict::Allow, "{agent}: {d}");
    }
    let open = Policy::from_yaml("default: allow\n", "<test>").unwrap();
    let d = open.evaluate(&python_call("anyone", None));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    // The profile is still checked first, with its own message.
    let mut call = python_call("b", Some(SessionUse::Open));
    call.python.as_mut().unwrap().profile = crate::files::Profile::Data;
    let d = p.evaluate(&call);
    assert!(d.reason.contains("the data profile is not allowed"), "{d}");
}

#[test]
fn a_session_use_serializes_in_camel_case_and_only_when_set() {
    let json = serde_json::to_value(python_call("a", Some(SessionUse::Continue)).python).unwrap();
    assert_eq!(json["session"], serde_json::json!("continue"));
    let json = serde_json::to_value(python_call("a", None).python).unwrap();
    assert!(json.get("session").is_none(), "{json}");
    let d = Policy::from_yaml(SESSIONS, "<test>")
        .unwrap()
        .evaluate(&python_call("a", Some(SessionUse::Open)));
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(
        json["sessions"],
        serde_json::json!({"maxPerAgent": 5, "maxLifetimeSeconds": 1800, "idleTimeoutSeconds": 120})
    );
    let back: Decision = serde_json::from_value(json).unwrap();
    assert_eq!(back, d);
}
