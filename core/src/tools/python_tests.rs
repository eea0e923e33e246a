use crate::files::{FileCaps, InputFile, OmittedFile, OutputFile, Profile};
use crate::tools::Attachment;
use serde_json::json;

use super::*;
use crate::model::Reason as R;
use crate::runner::fixtures::{envelope, killed, kubelet, local};

fn limits() -> Limits {
    Limits::default()
}

/// The one table of runner outcomes: each row is classified the same whichever platform
/// observed it (the operator's rows are checked against its Pod adapter in
/// `operator/src/python/phase_tests.rs`).
#[test]
fn runner_outcomes_have_one_phase_and_reason() {
    let timed_out = RunnerResult {
        timed_out: true,
        ..killed(9, None)
    };
    let truncated = RunnerResult {
        stdout_truncated: true,
        ..envelope(0)
    };
    // (case, the runner's envelope, what each platform may have seen, phase, reason)
    type Row = (&'static str, Option<RunnerResult>, Vec<Observed>, Phase, R);
    let rows: Vec<Row> = vec![
        (
            "exit 0",
            Some(envelope(0)),
            vec![
                kubelet("Completed", 0),
                local(Some(false), false, 0),
                local(None, false, 0),
            ],
            Phase::Succeeded,
            R::Succeeded,
        ),
        (
            "exit 3",
            Some(envelope(3)),
            vec![
                kubelet("Error", 3),
                local(Some(false), false, 3),
                local(None, false, 3),
            ],
            Phase::Failed,
            R::NonZeroExit,
        ),
        (
            "SIGTERM",
            Some(killed(15, None)),
            vec![
                kubelet("Error", 143),
                local(Some(false), false, 143),
                local(None, false, 143),
            ],
            Phase::Failed,
            R::NonZeroExit,
        ),
        (
            "SIGKILL, cgroup says OOM",
            Some(killed(9, Some(true))),
            vec![
                kubelet("Error", 137),
                local(Some(true), false, 137),
                local(None, false, 137),
            ],
            Phase::Failed,
            R::OomKilled,
        ),
        (
            "SIGKILL, cgroup says no OOM",
            Some(killed(9, Some(false))),
            vec![
                kubelet("Error", 137),
                local(Some(false), false, 137),
                local(None, false, 137),
            ],
            Phase::Failed,
            R::NonZeroExit,
        ),
        (
            // The drift this table ends: the cluster said OOMKilled, embedded NonZeroExit.
            "SIGKILL, the runner could not tell",
            Some(killed(9, None)),
            vec![kubelet("Error", 137), local(None, false, 137)],
            Phase::Failed,
            R::OomKilled,
        ),
        (
            "SIGKILL, the runner could not tell but the platform saw no OOM",
            Some(killed(9, None)),
            vec![local(Some(false), false, 137)],
            Phase::Failed,
            R::NonZeroExit,
        ),
        (
            "the runner's timeout",
            Some(timed_out),
            vec![
                kubelet("Error", 137),
                local(Some(false), false, 137),
                local(Some(true), false, 137),
            ],
            Phase::TimedOut,
            R::DeadlineExceeded,
        ),
        (
            "a non-zero exit in a sandbox the platform saw run out of memory",
            Some(envelope(1)),
            vec![kubelet("OOMKilled", 137), local(Some(true), false, 1)],
            Phase::Failed,
            R::OomKilled,
        ),
        (
            "truncated output",
            Some(truncated),
            vec![kubelet("Completed", 0), local(None, false, 0)],
            Phase::Succeeded,
            R::Succeeded,
        ),
        (
            "no envelope, OOM",
            None,
            vec![kubelet("OOMKilled", 137), local(Some(true), false, 137)],
            Phase::Failed,
            R::OomKilled,
        ),
        (
            "no envelope, the platform's deadline",
            None,
            vec![local(Some(false), true, 137), local(None, true, 137)],
            Phase::TimedOut,
            R::DeadlineExceeded,
        ),
        (
            "no envelope, no reason",
            None,
            vec![
                kubelet("Error", 1),
                local(Some(false), false, 1),
                local(None, false, 1),
            ],
            Phase::Failed,
            R::NoResult,
        ),
    ];
    for (name, env, observations, phase, reason) in rows {
        for seen in observations {
            let c = classify(env.as_ref(), &seen, &limits(), FileCaps::default());
            assert_eq!((c.phase, c.reason), (phase, reason), "{name}: {seen:?}");
            assert_eq!(c.exit_code, env.as_ref().map(|e| e.exit_code), "{name}");
        }
    }
}

#[test]
fn classification_caps_output_and_flags_truncation() {
    let big = RunnerResult {
        stdout: "x".repeat(500),
        ..envelope(0)
    };
    let c = classify(
        Some(&big),
        &Observed::default(),
        &Limits {
            output_bytes: 100,
            ..limits()
        },
        FileCaps::default(),
    );
    assert_eq!(c.stdout.len(), 100);
    assert!(c.truncated);
    assert_eq!(c.duration_millis, Some(7));
    let c = classify(
        Some(&RunnerResult {
            stdout_truncated: true,
            ..envelope(0)
        }),
        &Observed::default(),
        &limits(),
        FileCaps::default(),
    );
    assert!(c.truncated);
}

#[test]
fn no_result_quotes_what_the_platform_saw() {
    let seen = Observed {
        exit_code: Some(1),
        pids_limit_hit: true,
        detail: "bwrap: no".into(),
        ..Observed::default()
    };
    let c = classify(None, &seen, &limits(), FileCaps::default());
    assert_eq!(c.reason, R::NoResult);
    assert!(c.message.contains("exit code 1"), "{}", c.message);
    assert!(c.message.contains("process limit"), "{}", c.message);
    assert!(
        c.message.ends_with("last output: bwrap: no"),
        "{}",
        c.message
    );
    let c = classify(None, &kubelet("Error", 1), &limits(), FileCaps::default());
    assert!(c.message.contains("exit code 1, Error"), "{}", c.message);
}

#[test]
fn signal_deaths_and_exits_are_worded_for_the_model() {
    let out = |r: RunnerResult| {
        let c = classify(
            Some(&r),
            &Observed::default(),
            &limits(),
            FileCaps::default(),
        );
        PythonOutput::from_classified("r".into(), c, 0)
    };
    let text = out(envelope(3)).error_text(30, 600).unwrap();
    assert_eq!(text, "the code exited with status 3; stderr: err");
    let text = out(killed(15, None)).error_text(30, 600).unwrap();
    assert_eq!(
        text,
        "the code was killed by signal 15 (exit code 143); stderr: err"
    );
    let text = out(killed(9, None)).error_text(30, 600).unwrap();
    assert!(text.contains("memory limit of 256Mi"), "{text}");
    assert!(text.contains("use less memory"), "{text}");
}

// The output's own behaviour (moved from the frontend's backend/outcome.rs).

fn output(phase: Phase) -> PythonOutput {
    PythonOutput {
        stdout: String::new(),
        stderr: String::new(),
        exit_code: None,
        truncated: false,
        duration_ms: 0,
        run_name: "r".into(),
        phase,
        reason: None,
        message: None,
        files: Vec::new(),
        files_omitted: Vec::new(),
        retry_after_seconds: None,
        session: None,
        session_ended: None,
    }
}

#[test]
fn missing_fields_default_safely() {
    let out = output(Phase::Failed);
    assert!(
        out.error_text(30, 600)
            .unwrap()
            .contains("no result was recorded")
    );
}

#[test]
fn non_zero_exit_quotes_stderr() {
    let out = PythonOutput {
        exit_code: Some(3),
        stderr: "Traceback...\nValueError: bad\n".into(),
        ..output(Phase::Failed)
    };
    assert_eq!(
        out.error_text(30, 600).unwrap(),
        "the code exited with status 3; stderr: Traceback...\nValueError: bad"
    );
}

#[test]
fn long_stderr_is_quoted_by_its_tail() {
    let out = PythonOutput {
        exit_code: Some(1),
        stderr: format!("{}END", "x".repeat(10_000)),
        ..output(Phase::Failed)
    };
    let text = out.error_text(30, 600).unwrap();
    assert!(text.ends_with("END"));
    assert!(text.len() < STDERR_TAIL_CHARS + 100);
}

#[test]
fn timeout_rejection_and_oom_explain_what_to_do() {
    let t = output(Phase::TimedOut);
    assert!(t.is_error());
    let text = t.error_text(5, 600).unwrap();
    assert!(
        text.contains("5s timeout") && text.contains("at most 600"),
        "{text}"
    );
    let r = PythonOutput {
        reason: Some("PolicyBlocked".into()),
        message: Some("imports of socket are not allowed".into()),
        ..output(Phase::Rejected)
    };
    let text = r.error_text(5, 600).unwrap();
    assert!(
        text.contains("PolicyBlocked") && text.contains("socket"),
        "{text}"
    );
    let oom = PythonOutput {
        reason: Some("OOMKilled".into()),
        exit_code: Some(137),
        ..output(Phase::Failed)
    };
    assert!(oom.error_text(5, 600).unwrap().contains("memory limit"));
}

#[test]
fn reason_is_serialized_only_when_present() {
    let out = PythonOutput {
        reason: Some("DeadlineExceeded".into()),
        ..output(Phase::TimedOut)
    };
    let json = serde_json::to_value(&out).unwrap();
    assert_eq!(json["reason"], "DeadlineExceeded");
    assert!(json.get("exitCode").is_none());
    let json = serde_json::to_value(output(Phase::Succeeded)).unwrap();
    assert!(json.get("reason").is_none());
    assert!(json.get("message").is_none());
}

// Argument validation (moved from the frontend's server.rs).

fn obj(v: Value) -> JsonObject {
    v.as_object().unwrap().clone()
}

#[test]
fn valid_arguments_parse() {
    assert_eq!(
        parse_args(&obj(json!({"code": "print(1)"})), 600),
        Ok(RunPythonArgs {
            code: "print(1)".to_owned(),
            timeout_seconds: None,
            profile: None,
            files: None,
            session: None,
        })
    );
    assert_eq!(
        parse_args(&obj(json!({"code": "x", "timeoutSeconds": 5})), 600),
        Ok(RunPythonArgs {
            code: "x".to_owned(),
            timeout_seconds: Some(5),
            profile: None,
            files: None,
            session: None,
        })
    );
    assert_eq!(
        parse_args(&obj(json!({"code": "x", "timeoutSeconds": null})), 600),
        Ok(RunPythonArgs {
            code: "x".to_owned(),
            timeout_seconds: None,
            profile: None,
            files: None,
            session: None,
        })
    );
}

#[test]
fn each_mistake_gets_its_own_message() {
    let err = |v| parse_args(&obj(v), 60).unwrap_err();
    assert!(err(json!({})).starts_with("missing required argument `code`"));
    assert!(err(json!({"code": 7})).contains("must be a string of Python source, not a number"));
    assert!(err(json!({"code": "  "})).contains("is empty"));
    assert!(err(json!({"code": "x", "timeoutSeconds": "5"})).contains("not a string"));
    assert!(err(json!({"code": "x", "timeoutSeconds": 0})).contains("from 1 to 60"));
    assert!(err(json!({"code": "x", "timeoutSeconds": 61})).contains("from 1 to 60"));
    assert!(err(json!({"code": "x", "timeoutSeconds": 2.5})).contains("is 2.5"));
    assert!(err(json!({"code": "x", "timeout": 5})).contains("unknown argument `timeout`"));
    let big = "#".repeat(MAX_CODE_BYTES as usize + 1);
    assert!(err(json!({ "code": big })).contains("the limit is 262144 bytes"));
}

#[test]
fn the_call_gets_the_defaults_with_the_callers_timeout() {
    let ctx = ParseContext {
        max_timeout_seconds: 10,
        ..ParseContext::default()
    };
    let call = RunPython::parse(&obj(json!({"code": "x", "timeoutSeconds": 3})), &ctx).unwrap();
    assert_eq!(call.limits.timeout_seconds, 3);
    assert_eq!(call.limits.memory, "256Mi");
    let call = RunPython::parse(&obj(json!({"code": "x"})), &ParseContext::default()).unwrap();
    assert_eq!(call.limits.timeout_seconds, 30);
}

// Embedded run_python is judged by the policy file, like a cluster run by the operator.

fn embedded(policy: &str) -> Embedded {
    Embedded {
        policy: crate::policy::PolicyStore::new(
            crate::policy::Policy::from_yaml(policy, "<test>").unwrap(),
        ),
        sandbox: None,
        databases: None,
        calls: crate::metrics::CallStore::new(),
        sessions: Default::default(),
    }
}

fn call() -> PythonCall {
    PythonCall {
        code: "print(1)".into(),
        profile: Profile::Minimal,
        files: Vec::new(),
        limits: limits(),
        max_timeout_seconds: 600,
        session: None,
    }
}

#[tokio::test]
async fn embedded_calls_are_judged_by_the_policy() {
    let e = embedded(
        r#"
default: block
rules:
  - {name: needs-a-person, agents: [intern], tools: [python], verdict: escalate, reason: interns need a reviewer}
  - {name: analysts, agents: [analyst], tools: [python], verdict: allow}
"#,
    );
    let blocked = RunPython::run_embedded(&e, "stranger", "local-1".into(), call(), None)
        .await
        .unwrap();
    assert_eq!(blocked.phase, Phase::Rejected);
    assert_eq!(blocked.reason.as_deref(), Some("PolicyBlocked"));
    let text = blocked.error_text(30, 600).unwrap();
    assert!(
        text.starts_with("the run was rejected (PolicyBlocked)"),
        "{text}"
    );
    assert!(text.contains("blocked by rule default"), "{text}");
    assert_eq!(RunPython::summary(&blocked).verdict, Some(Verdict::Block));

    let escalated = RunPython::run_embedded(&e, "intern", "local-2".into(), call(), None)
        .await
        .unwrap();
    assert_eq!(escalated.phase, Phase::Rejected);
    assert_eq!(escalated.reason.as_deref(), Some("ApprovalUnavailable"));
    let text = escalated.error_text(30, 600).unwrap();
    assert!(text.contains("rule needs-a-person escalated"), "{text}");
    assert!(text.contains("interns need a reviewer"), "{text}");
    assert!(text.contains("only available in cluster mode"), "{text}");
    assert_eq!(
        RunPython::summary(&escalated).verdict,
        Some(Verdict::Escalate)
    );

    // Allowed: it reaches the sandbox (none here, so the call cannot run at all).
    let err = RunPython::run_embedded(&e, "analyst", "local-3".into(), call(), None)
        .await
        .unwrap_err();
    assert!(err.contains("no local sandbox"), "{err}");
}

// Profiles and files: arguments, policy, attachments.

#[test]
fn profile_and_files_arguments_parse_with_actionable_errors() {
    let ok = parse_args(
        &obj(json!({"code": "x", "profile": "data", "files": [
            {"name": "a.csv", "text": "a,b\n1,2\n"},
            {"name": "b.bin", "base64": "AAEC"},
        ]})),
        60,
    )
    .unwrap();
    assert_eq!(ok.profile, Some(Profile::Data));
    let files = ok.files.unwrap();
    assert_eq!(files[0].content, b"a,b\n1,2\n");
    assert_eq!(files[1].content, [0, 1, 2]);

    let err = |v| parse_args(&obj(v), 60).unwrap_err();
    assert!(err(json!({"code": "x", "profile": "gpu"})).contains("\"minimal\""));
    assert!(err(json!({"code": "x", "profile": 1})).contains("not a number"));
    assert!(err(json!({"code": "x", "files": "a.csv"})).contains("must be a list"));
    assert!(err(json!({"code": "x", "files": ["a.csv"]})).contains("files[0] must be an object"));
    for name in [
        "../x",
        "/etc/passwd",
        ".hidden",
        "a/b",
        "a\u{0}b",
        "",
        "a b",
        "é",
    ] {
        let e = err(json!({"code": "x", "files": [{"name": name, "text": "t"}]}));
        assert!(e.contains("files[0] has the name"), "{name:?}: {e}");
    }
    let long = "a".repeat(101);
    assert!(err(json!({"code": "x", "files": [{"name": long, "text": "t"}]})).contains("100"));
    assert!(
        err(json!({"code": "x", "files": [{"name": "a", "text": "t", "base64": "AA=="}]}))
            .contains("both")
    );
    assert!(err(json!({"code": "x", "files": [{"name": "a"}]})).contains("needs its content"));
    assert!(
        err(json!({"code": "x", "files": [{"name": "a", "base64": "!!"}]}))
            .contains("not valid base64")
    );
    assert!(
        err(json!({"code": "x", "files": [{"name": "a", "path": "/etc"}]}))
            .contains("unknown field `path`")
    );
    assert!(
        err(
            json!({"code": "x", "files": [{"name": "a", "text": "1"}, {"name": "a", "text": "2"}]})
        )
        .contains("twice")
    );
    let many: Vec<Value> = (0..21)
        .map(|i| json!({"name": format!("f{i}"), "text": "x"}))
        .collect();
    assert!(err(json!({"code": "x", "files": many})).contains("at most 20"));
    let big = "x".repeat(crate::files::MAX_INPUT_BYTES as usize + 1);
    assert!(err(json!({"code": "x", "files": [{"name": "a", "text": big}]})).contains("bytes"));
}

#[tokio::test]
async fn the_policy_decides_which_profiles_and_how_many_files() {
    let e = embedded(
        r#"
default: block
rules:
  - name: data-team
    agents: [analyst]
    tools: [python]
    verdict: allow
    python: {profiles: [minimal, data], maxInputFiles: 1, maxInputBytes: 10, maxOutputFiles: 3, maxOutputBytes: 1000}
  - {name: everyone, agents: ["*"], tools: [python], verdict: allow}
"#,
    );
    let data = PythonCall {
        profile: Profile::Data,
        ..call()
    };
    // A rule without a python section allows the minimal profile only.
    let refused = RunPython::run_embedded(&e, "intern", "l-1".into(), data.clone(), None)
        .await
        .unwrap();
    assert_eq!(refused.reason.as_deref(), Some("PolicyBlocked"));
    let text = refused.error_text(30, 600).unwrap();
    assert!(text.contains("everyone/python"), "{text}");
    assert!(text.contains("the data profile is not allowed"), "{text}");
    // Allowed by the data team's rule; this embedded server has no sandbox at all.
    let ctx = data.context("analyst");
    let decision = e.policy.evaluate(&ctx);
    assert_eq!(decision.verdict, Verdict::Allow);
    assert_eq!(
        decision.files,
        FileCaps {
            max_files: 3,
            max_bytes: 1000
        }
    );
    let file = |name: &str, n: usize| InputFile {
        name: name.into(),
        content: vec![b'x'; n],
    };
    let two = PythonCall {
        files: vec![file("a", 1), file("b", 1)],
        ..call()
    };
    let decision = e.policy.evaluate(&two.context("analyst"));
    assert_eq!(decision.verdict, Verdict::Block);
    assert!(decision.reason.contains("at most 1"), "{}", decision.reason);
    let big = PythonCall {
        files: vec![file("a", 11)],
        ..call()
    };
    let decision = e.policy.evaluate(&big.context("analyst"));
    assert_eq!(decision.verdict, Verdict::Block);
    assert!(
        decision.reason.contains("at most 10 bytes"),
        "{}",
        decision.reason
    );
    // The policy default, too, allows only the minimal profile.
    let open = embedded("default: allow\n");
    let decision = open.policy.evaluate(&data.context("anyone"));
    assert_eq!(decision.verdict, Verdict::Block);
    assert!(
        decision.reason.contains("policy default"),
        "{}",
        decision.reason
    );
}

#[test]
fn a_python_section_is_validated_when_the_policy_loads() {
    let load = |python: &str| {
        crate::policy::Policy::from_yaml(
            &format!(
                "rules:\n  - {{name: r, agents: ['*'], tools: [python], verdict: allow, python: {python}}}\n"
            ),
            "<test>",
        )
    };
    assert!(load("{profiles: [data]}").is_ok());
    for (bad, says) in [
        ("{profiles: []}", "profiles is empty"),
        ("{profiles: [gpu]}", "gpu"),
        ("{maxInputFiles: 21}", "maxInputFiles is 21"),
        ("{maxOutputBytes: 999999999}", "maxOutputBytes"),
        ("{maxOutput: 1}", "maxOutput"),
    ] {
        let e = load(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    let e = crate::policy::Policy::from_yaml(
        "rules:\n  - {name: r, agents: ['*'], tools: [sql], verdict: allow, python: {profiles: [data]}}\n",
        "<test>",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("tools do not include python"), "{e}");
}

#[test]
fn returned_files_become_attachments_by_kind_and_left_out_ones_a_note() {
    let mut out = output(Phase::Succeeded);
    out.files = vec![
        OutputFile::new("chart.png".into(), b"\x89PNG\r\n\x1a\nrest".to_vec()),
        OutputFile::new("table.csv".into(), b"a,b\n".to_vec()),
        OutputFile::new("model.bin".into(), vec![0, 159, 146]),
    ];
    out.files_omitted = vec![OmittedFile {
        name: "link".into(),
        size: None,
        reason: crate::files::OmitReason::NotARegularFile,
    }];
    let a = RunPython::attachments(&out);
    assert!(matches!(&a[0], Attachment::Image { mime_type, .. } if mime_type == "image/png"));
    assert!(matches!(&a[1], Attachment::Text { text, .. } if text == "a,b\n"));
    assert!(matches!(&a[2], Attachment::Binary { data, .. } if data == &[0, 159, 146]));
    assert!(matches!(&a[3], Attachment::Note(n) if n.contains("link (notARegularFile)")));
    // The structured output lists the files without their bytes.
    let v = serde_json::to_value(&out).unwrap();
    assert_eq!(
        v["files"][0],
        json!({"name": "chart.png", "mimeType": "image/png", "size": 12})
    );
    assert_eq!(v["filesOmitted"][0]["reason"], "notARegularFile");
    assert!(RunPython::attachments(&output(Phase::Succeeded)).is_empty());
}

#[test]
fn a_runner_that_never_started_the_code_ends_the_run_with_its_reason() {
    use crate::runner::{NotRun, NotRunReason};
    let not_run = RunnerResult {
        not_run: Some(NotRun {
            reason: NotRunReason::IsolationNotInForce,
            message: "the canary at 10.0.0.1:8081 was still reachable".into(),
        }),
        // Whatever else the envelope holds describes no run, and returns nothing.
        files: vec![crate::files::RunnerFile {
            name: "a.txt".into(),
            size: 1,
            data: "eA==".into(),
        }],
        ..envelope(123)
    };
    for seen in [kubelet("Error", 123), local(None, false, 123)] {
        let c = classify(Some(&not_run), &seen, &limits(), FileCaps::default());
        assert_eq!((c.phase, c.reason), (Phase::Failed, R::IsolationNotInForce));
        assert_eq!(c.exit_code, None);
        assert!(c.message.contains("still reachable"), "{}", c.message);
        assert!(c.stdout.is_empty() && c.files.is_empty());
        let out = PythonOutput::from_classified("r".into(), c, 0);
        assert_eq!(out.reason.as_deref(), Some("IsolationNotInForce"));
        let text = out.error_text(30, 300).unwrap();
        assert!(
            text.contains("IsolationNotInForce") && text.contains("still reachable"),
            "{text}"
        );
    }
    // A reason from another runner version still ends the run, without a result.
    let line = r#"{"sandboxrun":1,"exitCode":123,"stdout":"","stderr":"","stdoutTruncated":false,"stderrTruncated":false,"signal":null,"notRun":{"reason":"somethingNew","message":"m"}}"#;
    let parsed = crate::runner::parse_envelope(line).unwrap();
    let c = classify(
        Some(&parsed),
        &Observed::default(),
        &limits(),
        FileCaps::default(),
    );
    assert_eq!((c.phase, c.reason), (Phase::Failed, R::NoResult));
}
