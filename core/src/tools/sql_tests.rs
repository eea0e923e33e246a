use serde_json::json;

use super::*;

fn obj(v: Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

fn decision(verdict: Verdict) -> Decision {
    Decision {
        verdict,
        rule: "r".into(),
        reason: "because".into(),
        limits: crate::limits::Limits::default(),
        max_rows: 1000,
        rewritten_query: None,
        schema: None,
        metrics: None,
        files: crate::files::FileCaps::default(),
        sessions: None,
    }
}

#[test]
fn arguments_parse_with_actionable_errors() {
    let a = parse_args(&obj(json!({"database": "demo", "query": "SELECT 1"}))).unwrap();
    assert_eq!(a.environment, Environment::Sandbox);
    let a = parse_args(&obj(
        json!({"database": "demo", "query": "SELECT 1", "environment": "production"}),
    ))
    .unwrap();
    assert_eq!(a.environment, Environment::Production);
    let err = |v| parse_args(&obj(v)).unwrap_err();
    assert!(err(json!({"query": "x"})).starts_with("missing required argument `database`"));
    assert!(err(json!({"database": "d"})).starts_with("missing required argument `query`"));
    assert!(err(json!({"database": "d", "query": 3})).contains("must be a string"));
    assert!(err(json!({"database": "d", "query": " "})).contains("is empty"));
    assert!(
        err(json!({"database": "d", "query": "q", "environment": "prod"}))
            .contains("sandbox, staging, production")
    );
    assert!(
        err(json!({"database": "d", "query": "q", "sql": 1})).contains("unknown argument `sql`")
    );
}

#[test]
fn output_maps_rows_and_decisions() {
    let mut allow = decision(Verdict::Allow);
    allow.rewritten_query = Some("SELECT id FROM ledger LIMIT 1000".into());
    let t = Timestamp::UNIX_EPOCH;
    let ran = Execution::Ran {
        executed_query: "SELECT id FROM ledger LIMIT 1000".into(),
        result: Ok(QueryResult {
            columns: vec!["id".into()],
            rows: vec![vec![json!(1)], vec![json!(2)]],
            truncated: false,
            row_count: 2,
            duration_ms: 7,
        }),
        started: t,
        finished: t,
    };
    let out = SqlOutput::of("local-1".into(), &allow, &ran);
    assert!(out.error_text().is_none());
    assert_eq!(
        serde_json::to_value(&out).unwrap(),
        json!({"columns": ["id"], "rows": [[1], [2]], "rowCount": 2, "truncated": false,
            "durationMs": 7, "runName": "local-1", "verdict": "Allow", "rule": "r",
            "reason": "because", "phase": "Succeeded",
            "executedQuery": "SELECT id FROM ledger LIMIT 1000"})
    );
    assert_eq!(
        ran.result().unwrap(),
        SqlResult {
            columns: vec!["id".into()],
            rows: vec![vec![json!(1)], vec![json!(2)]],
            row_count: 2,
            truncated: false,
            executed_query: "SELECT id FROM ledger LIMIT 1000".into(),
        }
    );

    let blocked = SqlOutput::of(
        "local-2".into(),
        &decision(Verdict::Block),
        &Execution::Blocked,
    );
    let sc = serde_json::to_value(&blocked).unwrap();
    assert_eq!(
        (sc["phase"].as_str(), sc["verdict"].as_str()),
        (Some("Rejected"), Some("Block"))
    );
    assert!(sc.get("executedQuery").is_none());
    assert_eq!(
        blocked.error_text().unwrap(),
        "the query was blocked by policy (verdict Block, rule r) and nothing was executed: \
         because"
    );

    let escalated = SqlOutput::of(
        "local-3".into(),
        &decision(Verdict::Escalate),
        &Execution::NeedsApproval,
    );
    assert_eq!(escalated.phase, Phase::Rejected);
    assert!(
        escalated
            .error_text()
            .unwrap()
            .contains("only available in cluster mode")
    );

    let failed = Execution::Ran {
        executed_query: "SELECT x FROM ledger".into(),
        result: Err(QueryError::Database {
            code: None,
            message: "no such column".into(),
        }),
        started: t,
        finished: t,
    };
    let out = SqlOutput::of("local-4".into(), &allow, &failed);
    assert_eq!(out.phase, Phase::Failed);
    assert!(out.error_text().unwrap().ends_with("no such column"));
    assert_eq!(failed.outcome(&allow).1, Reason::QueryFailed);
}

#[test]
fn errors_map_to_their_reasons() {
    let t = Timestamp::UNIX_EPOCH;
    let e = QueryError::Timeout {
        timeout: Duration::from_secs(2),
    };
    let timed = Execution::Ran {
        executed_query: String::new(),
        result: Err(e.clone()),
        started: t,
        finished: t,
    };
    let (phase, reason, message) = timed.outcome(&decision(Verdict::Allow));
    assert_eq!((phase, reason), (Phase::Failed, Reason::QueryTimedOut));
    assert_eq!(message, e.to_string());
    assert!(timed.result().is_none());
}

#[test]
fn byte_cap_stays_within_the_status_budget() {
    let d = decision(Verdict::Allow);
    let mut big = d.clone();
    big.limits.output_bytes = u32::MAX;
    assert_eq!(query_limits(&big).max_bytes, RESULT_MAX_BYTES);
    assert_eq!(query_limits(&d).max_rows, d.max_rows);
}

#[test]
fn schemas_describe_the_wire_format() {
    let input = serde_json::to_value(schemars::schema_for!(ExecuteSqlArgs)).unwrap();
    assert_eq!(input["required"], json!(["database", "query"]));
    let output = serde_json::to_value(schemars::schema_for!(SqlOutput)).unwrap();
    for field in [
        "columns",
        "rows",
        "rowCount",
        "truncated",
        "durationMs",
        "runName",
        "verdict",
        "rule",
        "reason",
        "phase",
        "executedQuery",
    ] {
        assert!(output["properties"].get(field).is_some(), "{field}");
    }
    let text = output.to_string() + &input.to_string();
    assert!(
        !text.contains("\"null\"") && !text.contains("uint"),
        "{text}"
    );
}

#[tokio::test]
async fn the_target_database_decides_the_environment_not_the_caller() {
    let dir = std::env::temp_dir().join(format!("sandboxrun-env-{}", uuid_like()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("demo.sqlite");
    crate::query::demo::ensure_sqlite(&path).await.unwrap();
    let mut config = crate::query::demo::database_config(&path);
    config.environment = Some(Environment::Production);
    let databases = Databases::from_config(&std::collections::BTreeMap::from([(
        "demo".to_owned(),
        config,
    )]))
    .unwrap();
    let policy = PolicyStore::new(
        crate::policy::Policy::from_yaml(
            r#"
default: block
rules:
  - name: sandbox-reads
    tools: [sql]
    environments: [sandbox]
    verdict: allow
    sql: {databases: [demo], tables: {ledger: {columns: [id]}}}
  - name: production-needs-a-person
    tools: [sql]
    environments: [production]
    verdict: escalate
    sql: {databases: [demo], tables: {ledger: {columns: [id]}}}
"#,
            "<test>",
        )
        .unwrap(),
    );
    // The caller says "sandbox" (or says nothing): the database is production's, and so is
    // the rule that judges the query.
    for environment in [Environment::Sandbox, Environment::Staging] {
        let call =
            CallContext::new("a", Tool::Sql, environment).with_sql("demo", "SELECT id FROM ledger");
        let d = decide(&policy, &databases, call);
        assert_eq!(
            (d.verdict, d.rule.as_str()),
            (Verdict::Escalate, "production-needs-a-person"),
            "{environment}: {d}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    )
}
