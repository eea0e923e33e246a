use jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::Decision as Recorded;
use sandboxrun_core::Tool;
use sandboxrun_core::files::{InputFile, OmitReason, OmittedFile, OutputFile, Profile};

fn now() -> Timestamp {
    Timestamp::from_second(1_764_410_400).unwrap()
}

fn status(phase: Phase) -> SandboxRunStatus {
    SandboxRunStatus {
        phase: Some(phase),
        ..Default::default()
    }
}

fn python_call() -> PythonCall {
    PythonCall {
        code: "print(1)".into(),
        profile: Profile::Minimal,
        files: Vec::new(),
        limits: Limits {
            timeout_seconds: 7,
            ..Limits::default()
        },
        max_timeout_seconds: 600,
        session: None,
    }
}

#[test]
fn python_spec_carries_agent_code_and_limits() {
    let spec = RunPython::spec("analyst-01", &python_call());
    assert_eq!(spec.agent, "analyst-01");
    assert_eq!(spec.python.as_ref().unwrap().code, "print(1)");
    assert_eq!(spec.limits.timeout_seconds, 7);
    assert_eq!(spec.tool(), Some(Tool::Python));
}

#[test]
fn python_output_only_once_terminal() {
    let call = python_call();
    assert!(RunPython::output("run-x", &SandboxRunStatus::default(), &call).is_none());
    for p in [Phase::Pending, Phase::Running, Phase::AwaitingApproval] {
        assert!(RunPython::output("run-x", &status(p), &call).is_none());
    }
    let st = SandboxRunStatus {
        exit_code: Some(0),
        stdout: Some("42\n".into()),
        stderr: Some(String::new()),
        truncated: Some(false),
        duration_millis: Some(812),
        ..status(Phase::Succeeded)
    };
    let out = RunPython::output("run-abc", &st, &call).unwrap();
    assert_eq!(out.error_text(30, 600), None);
    assert_eq!(
        serde_json::to_value(&out).unwrap(),
        json!({"stdout": "42\n", "stderr": "", "exitCode": 0, "truncated": false,
            "durationMs": 812, "runName": "run-abc", "phase": "Succeeded"})
    );
    let st = SandboxRunStatus {
        duration_millis: Some(-5),
        ..status(Phase::Failed)
    };
    let out = RunPython::output("r", &st, &call).unwrap();
    assert_eq!(
        (out.stdout.as_str(), out.exit_code, out.duration_ms),
        ("", None, 0)
    );
}

#[test]
fn python_spec_carries_profile_and_files() {
    // The default profile is left out: a minimal run's spec is what it always was.
    let spec = RunPython::spec("a", &python_call());
    let python = spec.python.unwrap();
    assert_eq!((python.profile, python.files.len()), (None, 0));
    let call = PythonCall {
        profile: Profile::Data,
        files: vec![InputFile {
            name: "a.csv".into(),
            content: b"x,y\n".to_vec(),
        }],
        ..python_call()
    };
    let python = RunPython::spec("a", &call).python.unwrap();
    assert_eq!(python.profile, Some(Profile::Data));
    assert_eq!(python.files, call.files);
    assert_eq!(python.session, None);
    assert_eq!(
        serde_json::to_value(&python).unwrap(),
        json!({"code": "print(1)", "profile": "data",
            "files": [{"name": "a.csv", "content": "eCx5Cg=="}]})
    );
    let in_session = PythonCall {
        session: Some(sandboxrun_core::tools::python_session::SessionArg::Named(
            "sbs-1".into(),
        )),
        ..python_call()
    };
    let python = RunPython::spec("a", &in_session).python.unwrap();
    assert_eq!(python.session.as_deref(), Some("sbs-1"));
}

#[test]
fn status_files_round_trip_through_the_output() {
    let png = b"\x89PNG\r\n\x1a\nrest".to_vec();
    let written = [
        OutputFile::new("plot.png".into(), png.clone()),
        OutputFile::new("table.csv".into(), b"a,b\n1,2\n".to_vec()),
    ];
    let omitted = vec![OmittedFile {
        name: "big.bin".into(),
        size: Some(1 << 20),
        reason: OmitReason::ByteCount,
    }];
    let st = SandboxRunStatus {
        files: written.iter().map(crate::StatusFile::of).collect(),
        files_omitted: omitted.clone(),
        ..status(Phase::Succeeded)
    };
    // Through the API server and back.
    let st: SandboxRunStatus = serde_json::from_value(serde_json::to_value(&st).unwrap()).unwrap();
    assert_eq!(st.files[0].data, "iVBORw0KGgpyZXN0");
    let out = RunPython::output("r", &st, &python_call()).unwrap();
    assert_eq!(out.files, written);
    assert_eq!(out.files[0].mime_type, "image/png");
    assert_eq!(out.files[1].mime_type, "text/csv");
    assert_eq!(out.files_omitted, omitted);
    // A status that claims a type its content does not have, or holds no base64, does not
    // pass for what it says.
    let forged = SandboxRunStatus {
        files: vec![
            crate::StatusFile {
                name: "x.png".into(),
                mime_type: "image/png".into(),
                size: 2,
                data: "aGk=".into(),
            },
            crate::StatusFile {
                name: "y.txt".into(),
                mime_type: "text/plain".into(),
                size: 2,
                data: "not base64!".into(),
            },
        ],
        ..status(Phase::Succeeded)
    };
    let out = RunPython::output("r", &forged, &python_call()).unwrap();
    assert_eq!(out.files.len(), 1);
    assert_eq!(out.files[0].mime_type, "application/octet-stream");
    assert_eq!(out.files_omitted[0].name, "y.txt");
    assert_eq!(out.files_omitted[0].reason, OmitReason::Unreadable);
}

#[test]
fn sql_spec_carries_database_query_and_environment() {
    let args = ExecuteSqlArgs {
        database: "analytics".into(),
        query: "SELECT id FROM ledger".into(),
        environment: Environment::Production,
    };
    let spec = ExecuteSql::spec("analyst-01", &args);
    assert_eq!(spec.agent, "analyst-01");
    assert_eq!(spec.environment, Environment::Production);
    assert!(spec.python.is_none());
    let sql = spec.sql.as_ref().unwrap();
    assert_eq!(
        (sql.database.as_str(), sql.query.as_str()),
        ("analytics", "SELECT id FROM ledger")
    );
    assert_eq!(spec.tool(), Some(Tool::Sql));
}

#[test]
fn sql_status_maps_to_the_output() {
    let call = ExecuteSqlArgs {
        database: "d".into(),
        query: "q".into(),
        environment: Environment::Sandbox,
    };
    let read = |st: &SandboxRunStatus, name| ExecuteSql::output(name, st, &call);
    let decided = |verdict| Recorded {
        verdict,
        rule: "analysts-sandbox".into(),
        reason: "ok".into(),
        grant: None,
    };
    assert!(read(&status(Phase::Running), "run-1").is_none());
    let done = SandboxRunStatus {
        decision: Some(decided(Verdict::Allow)),
        duration_millis: Some(12),
        result: Some(
            json!({"columns": ["id", "amount"], "rows": [[1, "-420.81"]],
            "rowCount": 1, "truncated": false, "executedQuery": "SELECT id, amount FROM ledger LIMIT 1000"}),
        ),
        ..status(Phase::Succeeded)
    };
    let out = read(&done, "run-1").unwrap();
    assert_eq!(out.columns, ["id", "amount"]);
    assert_eq!(out.rows, vec![vec![json!(1), json!("-420.81")]]);
    assert_eq!(
        (out.row_count, out.duration_ms, out.truncated),
        (1, 12, false)
    );
    assert_eq!(out.verdict, Verdict::Allow);
    assert_eq!(out.rule, "analysts-sandbox");
    assert!(out.executed_query.unwrap().ends_with("LIMIT 1000"));
    assert_eq!(out.run_name, "run-1");

    let awaiting = SandboxRunStatus {
        decision: Some(decided(Verdict::Escalate)),
        message: Some("kubectl patch sandboxrun run-2 ...".into()),
        ..status(Phase::AwaitingApproval)
    };
    let text = read(&awaiting, "run-2").unwrap().error_text().unwrap();
    assert!(text.starts_with("awaiting approval: run-2"), "{text}");

    let rejected = SandboxRunStatus {
        decision: Some(decided(Verdict::Allow)),
        message: Some("no databases are configured in the operator".into()),
        ..status(Phase::Rejected)
    };
    let out = read(&rejected, "run-3").unwrap();
    assert!(out.rows.is_empty() && out.executed_query.is_none());
    assert!(
        out.error_text()
            .unwrap()
            .contains("no databases are configured")
    );

    let denied = SandboxRunStatus {
        decision: Some(decided(Verdict::Escalate)),
        reason: Some("ApprovalDenied".into()),
        message: Some("a person denied it (spec.approval.approved: false)".into()),
        ..status(Phase::Rejected)
    };
    let text = read(&denied, "run-4").unwrap().error_text().unwrap();
    assert!(
        text.contains("ended Rejected: a person denied it") && !text.contains("cluster mode"),
        "{text}"
    );

    let garbled = SandboxRunStatus {
        result: Some(json!({"rows": "not rows"})),
        ..status(Phase::Succeeded)
    };
    let out = read(&garbled, "run-5").unwrap();
    assert_eq!(out.phase, Phase::Failed);
    assert!(out.error_text().unwrap().contains("same version"));
}

fn metrics_call(time: QueryTime) -> MetricsCall {
    MetricsCall {
        query: MetricsQuery {
            query: "up".into(),
            time,
        },
        environment: Environment::Staging,
    }
}

#[test]
fn metrics_spec_carries_query_times_and_environment() {
    let t = |s| Timestamp::from_second(s).unwrap();
    let call = metrics_call(QueryTime::Range {
        start: t(1_764_406_800),
        end: t(1_764_410_400),
        step: Duration::from_secs(30),
    });
    let spec = FetchMetrics::spec("analyst-01", &call);
    assert_eq!(spec.tool(), Some(Tool::Metrics));
    assert_eq!(spec.environment, Environment::Staging);
    let m = spec.metrics.as_ref().unwrap();
    assert_eq!(m.query, "up");
    assert_eq!(m.time, None);
    let r = m.range.as_ref().unwrap();
    assert_eq!(
        (r.start.as_str(), r.end.as_str(), r.step.as_str()),
        ("2025-11-29T09:00:00Z", "2025-11-29T10:00:00Z", "30s")
    );
}

#[test]
fn metrics_status_maps_to_the_output() {
    let call = metrics_call(QueryTime::Instant(now()));
    let done: SandboxRunStatus = serde_json::from_value(json!({
        "phase": "Succeeded",
        "decision": {"verdict": "Allow", "rule": "r", "reason": "ok"},
        "result": {"resultType": "vector", "truncated": false, "seriesTotal": 1,
            "result": [{"metric": {"job": "prometheus"}, "value": [1.5, "1"]}]}
    }))
    .unwrap();
    let out = FetchMetrics::output("run-x", &done, &call).unwrap();
    assert_eq!(out.phase, Phase::Succeeded);
    assert_eq!(out.source, "prometheus");
    assert_eq!(out.result[0].metric["job"], "prometheus");
    assert_eq!(out.result[0].value, Some((1.5, "1".to_owned())));
    assert!(out.error_text().is_none());
    assert!(FetchMetrics::output("run-x", &status(Phase::Running), &call).is_none());
    let failed: SandboxRunStatus = serde_json::from_value(json!({
        "phase": "Failed", "message": "Prometheus answered bad_data: x",
        "decision": {"verdict": "Allow", "rule": "r", "reason": "ok"}
    }))
    .unwrap();
    let out = FetchMetrics::output("run-x", &failed, &call).unwrap();
    assert!(
        out.error_text()
            .unwrap()
            .contains("Prometheus answered bad_data")
    );
}
