//! The policy gate: decision and approval → next step, one test per transition.

use super::*;
use sandboxrun_api::{LimitsSpec, PythonSpec, SqlSpec};
use sandboxrun_core::{Environment, Policy};

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const T0: &str = "2026-11-29T08:00:00Z";
const TIMEOUT: SignedDuration = SignedDuration::from_secs(900);

fn decision(verdict: Verdict) -> sandboxrun_api::Decision {
    sandboxrun_api::Decision {
        verdict,
        rule: "r".into(),
        reason: "because".into(),
        grant: None,
    }
}

/// The record of a wait that began at generation 1 with no approval on the run.
fn waiting() -> ApprovalRequest {
    approval_request(None, 1, t(T0))
}

fn rejected_reason(g: Gate) -> (String, String) {
    match g {
        Gate::Reject(o) => {
            assert_eq!(o.phase, Phase::Rejected);
            assert_eq!(o.started_at, None, "nothing executed");
            (o.reason, o.message)
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn spec(agent: &str, environment: Environment) -> SandboxRunSpec {
    SandboxRunSpec {
        agent: agent.into(),
        environment,
        python: Some(PythonSpec {
            code: "print(1)".into(),
            ..Default::default()
        }),
        sql: None,
        metrics: None,
        limits: LimitsSpec::default(),
        ttl_seconds_after_finished: 60,
        approval: None,
        cancelled: false,
    }
}

#[test]
fn allow_proceeds() {
    let g = gate(
        &decision(Verdict::Allow),
        ApprovalState::Pending,
        t(T0),
        TIMEOUT,
        t(T0),
    );
    assert_eq!(g, Gate::Proceed);
}

#[test]
fn block_rejects_with_the_policy_reason() {
    let g = gate(
        &decision(Verdict::Block),
        // Even an approval cannot override a block.
        ApprovalState::Approved {
            by: "alice".into(),
            reason: None,
        },
        t(T0),
        TIMEOUT,
        t(T0),
    );
    let (reason, message) = rejected_reason(g);
    assert_eq!(reason, "PolicyBlocked");
    assert_eq!(message, "blocked by policy rule r: because");
}

#[test]
fn escalate_waits_until_the_timeout() {
    let g = gate(
        &decision(Verdict::Escalate),
        ApprovalState::Pending,
        t(T0),
        TIMEOUT,
        t("2026-11-29T08:14:59Z"),
    );
    assert_eq!(
        g,
        Gate::Await {
            deadline: t("2026-11-29T08:15:00Z")
        }
    );
}

#[test]
fn escalate_times_out() {
    let g = gate(
        &decision(Verdict::Escalate),
        ApprovalState::Pending,
        t(T0),
        TIMEOUT,
        t("2026-11-29T08:15:00Z"),
    );
    let (reason, message) = rejected_reason(g);
    assert_eq!(reason, "ApprovalTimedOut");
    assert!(message.contains("15m"), "{message}");
}

#[test]
fn escalate_approved_proceeds_even_late() {
    let g = gate(
        &decision(Verdict::Escalate),
        ApprovalState::Approved {
            by: "alice".into(),
            reason: None,
        },
        t(T0),
        TIMEOUT,
        t(T0),
    );
    assert_eq!(g, Gate::Proceed);
}

#[test]
fn escalate_denied_rejects() {
    let g = gate(
        &decision(Verdict::Escalate),
        ApprovalState::Denied {
            by: "bob".into(),
            reason: None,
        },
        t(T0),
        TIMEOUT,
        t(T0),
    );
    let (reason, message) = rejected_reason(g);
    assert_eq!(reason, "ApprovalDenied");
    assert!(message.contains("bob denied it"), "{message}");
}

#[test]
fn escalate_denied_with_a_reason_says_it() {
    let g = gate(
        &decision(Verdict::Escalate),
        ApprovalState::Denied {
            by: "bob".into(),
            reason: Some("no production data without a ticket".into()),
        },
        t(T0),
        TIMEOUT,
        t(T0),
    );
    let (reason, message) = rejected_reason(g);
    assert_eq!(reason, "ApprovalDenied");
    assert_eq!(
        message,
        "policy rule r escalated the run (because) and bob denied it \
         (spec.approval.approved: false): no production data without a ticket"
    );
}

#[test]
fn an_approvals_reason_is_recorded_trimmed_and_blank_is_none() {
    let with = |reason: Option<&str>| Approval {
        approved: false,
        by: "bob".into(),
        reason: reason.map(str::to_owned),
    };
    let said = approval_state(
        Some(&with(Some("  not today \n"))),
        Some(&waiting()),
        Some(2),
    );
    assert_eq!(said.reason(), Some("not today"));
    assert_eq!(said.by(), Some("bob"));
    assert_eq!(
        approval_state(Some(&with(Some(" \t"))), Some(&waiting()), Some(2)).reason(),
        None
    );
    assert_eq!(
        approval_state(Some(&with(None)), Some(&waiting()), Some(2)).reason(),
        None
    );
    // At the generation the wait began an approval does not count, nor does what it says.
    assert_eq!(
        approval_state(Some(&with(Some("x"))), Some(&waiting()), Some(1)).reason(),
        None
    );
    let mut approve = with(Some("ticket OPS-1"));
    approve.approved = true;
    let approved = approval_state(Some(&approve), Some(&waiting()), Some(2));
    assert_eq!(approved.reason(), Some("ticket OPS-1"));
    assert_eq!(
        approved_message("alice", approved.reason()),
        "alice approved the run (spec.approval.approved: true): ticket OPS-1"
    );
    assert_eq!(
        approved_message("alice", None),
        "alice approved the run (spec.approval.approved: true)"
    );
}

#[test]
fn approval_counts_only_after_the_wait_began() {
    let yes = Approval {
        approved: true,
        by: "alice".into(),
        reason: None,
    };
    let no = Approval {
        approved: false,
        by: "bob".into(),
        reason: None,
    };
    assert_eq!(
        approval_state(None, Some(&waiting()), Some(3)),
        ApprovalState::Pending
    );
    // There when the wait began (generation 1): not an approval.
    assert_eq!(
        approval_state(Some(&yes), Some(&waiting()), Some(1)),
        ApprovalState::Pending
    );
    assert_eq!(
        approval_state(Some(&no), Some(&waiting()), Some(1)),
        ApprovalState::Pending
    );
    assert_eq!(
        approval_state(Some(&yes), Some(&waiting()), None),
        ApprovalState::Pending
    );
    let approved = approval_state(Some(&yes), Some(&waiting()), Some(2));
    assert_eq!(
        approved,
        ApprovalState::Approved {
            by: "alice".into(),
            reason: None
        }
    );
    assert_eq!(approved.by(), Some("alice"));
    let denied = approval_state(Some(&no), Some(&waiting()), Some(2));
    assert_eq!(
        denied,
        ApprovalState::Denied {
            by: "bob".into(),
            reason: None
        }
    );
    assert_eq!(denied.by(), Some("bob"));
    assert_eq!(
        approval_state(Some(&yes), Some(&waiting()), Some(1)).by(),
        None
    );
}

#[test]
fn awaiting_status_records_the_wait_and_keeps_its_start() {
    let prev = SandboxRunStatus {
        decision: Some(decision(Verdict::Escalate)),
        ..Default::default()
    };
    let s = awaiting_status(
        &prev,
        Tool::Python,
        "kubectl patch …",
        waiting(),
        Some(1),
        t(T0),
    );
    assert_eq!(s.phase, Some(Phase::AwaitingApproval));
    assert_eq!(s.reason.as_deref(), Some("AwaitingApproval"));
    assert_eq!(s.decision, prev.decision);
    assert!(s.message.as_deref().unwrap().contains("kubectl patch"));
    assert_eq!(s.pod_name, None);
    assert_eq!(awaiting_since(&s, None, t("2026-11-29T09:00:00Z")), t(T0));
    // Rewriting it later (with its record, which the schema keeps) does not move the start of
    // the wait.
    let again = awaiting_status(
        &s,
        Tool::Python,
        "x",
        s.approval_request.clone().unwrap(),
        Some(1),
        t("2026-11-29T08:05:00Z"),
    );
    assert_eq!(
        awaiting_since(&again, None, t("2026-11-29T09:00:00Z")),
        t(T0)
    );
    let mut approved = again.clone();
    mark_approved(
        &mut approved,
        "alice",
        None,
        Some(2),
        t("2026-11-29T08:06:00Z"),
    );
    let c = approved
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_APPROVED)
        .unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Approved"));
}

#[test]
fn awaiting_since_falls_back_to_creation() {
    let created = Time(t(T0));
    let now = t("2026-11-29T09:00:00Z");
    assert_eq!(
        awaiting_since(&SandboxRunStatus::default(), Some(&created), now),
        t(T0)
    );
    assert_eq!(awaiting_since(&SandboxRunStatus::default(), None, now), now);
}

#[test]
fn call_context_carries_limits_and_query() {
    let mut s = spec("a", Environment::Staging);
    s.limits.timeout_seconds = 7;
    let call = call_context(&s, Tool::Python);
    assert_eq!(call.agent, "a");
    assert_eq!(call.environment, Environment::Staging);
    assert_eq!(call.limits.timeout_seconds, 7);
    assert_eq!(call.sql, None);
    s.python = None;
    s.sql = Some(SqlSpec {
        database: "demo".into(),
        query: "SELECT 1".into(),
        schema: false,
    });
    let call = call_context(&s, Tool::Sql);
    assert_eq!(call.sql.unwrap().query, "SELECT 1");
}

#[test]
fn without_policy_everything_is_allowed_with_the_requested_limits() {
    let call = call_context(&spec("a", Environment::Production), Tool::Python);
    let d = allow_all(&call);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.rule, NO_POLICY_RULE);
    assert_eq!(d.limits, call.limits);
}

/// The default policy of the Helm chart (`policy:` in values.yaml), as the ConfigMap renders it.
const CHART_DEFAULT_POLICY: &str = include_str!("../tests/fixtures/chart-default-policy.yaml");

#[test]
fn chart_default_policy() {
    let policy = Policy::from_yaml(CHART_DEFAULT_POLICY, "chart").unwrap();
    let verdict = |agent: &str, tool: Tool, env: Environment| {
        let mut s = spec(agent, env);
        if tool == Tool::Sql {
            s.python = None;
            s.sql = Some(SqlSpec {
                database: "demo".into(),
                query: "SELECT 1".into(),
                schema: false,
            });
        }
        policy.evaluate(&call_context(&s, tool)).verdict
    };
    // The existing e2e tests and the sample run: python in the sandbox, any agent.
    assert_eq!(
        verdict("e2e", Tool::Python, Environment::Sandbox),
        Verdict::Allow
    );
    assert_eq!(
        verdict("sample", Tool::Python, Environment::Sandbox),
        Verdict::Allow
    );
    assert_eq!(
        verdict("e2e", Tool::Python, Environment::Production),
        Verdict::Escalate
    );
    assert_eq!(
        verdict("e2e", Tool::Python, Environment::Staging),
        Verdict::Block
    );
    assert_eq!(
        verdict("e2e", Tool::Sql, Environment::Sandbox),
        Verdict::Block
    );
    // fetch_metrics: allowed outside production, escalated in production.
    for env in [Environment::Sandbox, Environment::Staging] {
        assert_eq!(
            verdict("e2e", Tool::Metrics, env),
            Verdict::Allow,
            "{env:?}"
        );
    }
    assert_eq!(
        verdict("e2e", Tool::Metrics, Environment::Production),
        Verdict::Escalate
    );
}

#[test]
fn allowed_limits_never_exceed_the_request() {
    let policy = Policy::from_yaml(CHART_DEFAULT_POLICY, "chart").unwrap();
    let mut s = spec("e2e", Environment::Sandbox);
    s.limits.timeout_seconds = 600;
    s.limits.memory = "4Gi".into();
    let d = policy.evaluate(&call_context(&s, Tool::Python));
    assert_eq!(d.verdict, Verdict::Allow);
    assert!(d.limits.timeout_seconds <= 600);
    let small = policy.evaluate(&call_context(
        &spec("e2e", Environment::Sandbox),
        Tool::Python,
    ));
    assert_eq!(
        small.limits,
        spec("e2e", Environment::Sandbox).limits.effective()
    );
}

#[test]
fn the_approve_command_is_shell_that_writes_the_approvers_name() {
    // Run the one-liner with a stand-in `kubectl` that names the user "alice" and prints the
    // patch it was given: the quoting must survive a real shell and yield the approval JSON.
    let command = approve_command("run-1", "runs");
    let script = format!(
        r#"kubectl() {{ if [ "$1" = auth ]; then printf alice; else printf '%s\n' "$@"; fi; }}
{command}"#
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let args: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        args[..4],
        ["patch", "sandboxrun", "run-1", "-n"],
        "{args:?}"
    );
    let patch: serde_json::Value = serde_json::from_str(args.last().unwrap()).unwrap();
    assert_eq!(
        patch,
        serde_json::json!({"spec": {"approval": {"approved": true, "by": "alice"}}})
    );
}

#[test]
fn python_runs_are_judged_with_their_profile_and_input_files() {
    let mut s = spec("a", Environment::Sandbox);
    let call = call_context(&s, Tool::Python);
    let request = call.python.unwrap();
    assert_eq!(
        (request.profile, request.input_files, request.input_bytes),
        (sandboxrun_core::Profile::Minimal, 0, 0)
    );
    let python = s.python.as_mut().unwrap();
    python.profile = Some(sandboxrun_core::Profile::Data);
    python.files = vec![
        sandboxrun_core::InputFile {
            name: "a.csv".into(),
            content: vec![b'x'; 1000],
        },
        sandboxrun_core::InputFile {
            name: "b.csv".into(),
            content: vec![b'y'; 24],
        },
    ];
    let request = call_context(&s, Tool::Python).python.unwrap();
    assert_eq!(
        (request.profile, request.input_files, request.input_bytes),
        (sandboxrun_core::Profile::Data, 2, 1024)
    );

    // The chart's default allows the data profile in the sandbox, with the global file caps.
    let chart = Policy::from_yaml(CHART_DEFAULT_POLICY, "chart").unwrap();
    let d = chart.evaluate(&call_context(&s, Tool::Python));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    assert_eq!(d.files, sandboxrun_core::FileCaps::default());

    // A rule without a python section allows the minimal profile only: the operator blocks what
    // the frontend would, whoever created the run.
    let strict = Policy::from_yaml(
        r#"
default: block
rules:
  - name: small-files
    agents: ["b"]
    tools: [python]
    environments: [sandbox]
    verdict: allow
    reason: few files
    python: {profiles: [minimal, data], maxInputFiles: 1, maxOutputFiles: 2, maxOutputBytes: 1000}
  - name: sandbox-python
    agents: ["*"]
    tools: [python]
    environments: [sandbox]
    verdict: allow
    reason: minimal only
"#,
        "strict",
    )
    .unwrap();
    let d = strict.evaluate(&call_context(&s, Tool::Python));
    assert_eq!(d.verdict, Verdict::Block, "{d}");
    assert_eq!(d.rule, "sandbox-python/python");
    let mut b = s.clone();
    b.agent = "b".into();
    let d = strict.evaluate(&call_context(&b, Tool::Python));
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Block, "small-files/python")
    );
    b.python.as_mut().unwrap().files.pop();
    let d = strict.evaluate(&call_context(&b, Tool::Python));
    assert_eq!(d.verdict, Verdict::Allow, "{d}");
    assert_eq!(
        d.files,
        sandboxrun_core::FileCaps {
            max_files: 2,
            max_bytes: 1000
        }
    );
    // The blocked run ends Rejected by the gate, nothing executed.
    let blocked = strict.evaluate(&call_context(&s, Tool::Python));
    let (reason, message) = rejected_reason(gate(
        &sandboxrun_api::Decision::record(&blocked, Environment::Sandbox),
        ApprovalState::Pending,
        Timestamp::now(),
        SignedDuration::from_mins(15),
        Timestamp::now(),
    ));
    assert_eq!(reason, "PolicyBlocked");
    assert!(message.contains("data profile"), "{message}");
}
